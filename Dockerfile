# rtserve image: TorchServe, the pinned dependencies, the handler and the .mar of ONE model
# version. Build it with `make image MODEL_VERSION=2.0` (DOCKER=podman or docker), which builds
# the archive and the wheelhouse first, stages a build context with only what is copied below
# (build/image/<version>/) and tags the image IMG:<model version>. docs/image-and-pod.md has the
# size breakdown and build times.
#
# Two stages: the builder installs the Python dependencies into a virtualenv from the wheelhouse
# (wheels made on the host from the pinned requirements.txt: `pip install --no-index`, so the image
# holds exactly what the tests ran and the build needs no package index); the runtime stage gets
# the virtualenv, a Java 17 runtime, the Java agent (built from agent/ in a stage of its own,
# with a JDK that stays there) and rtserve's own files, nothing else.
#
# The base is a build argument: the official Python 3.11 image on Debian bookworm (bookworm ships
# Java 17), or the equivalent that `make image-base` builds from Debian's packages where no
# registry can be reached. Builder and runtime use the same base, so the virtualenv's python
# link points at the same interpreter in both.
ARG BASE_IMAGE=docker.io/library/python:3.11-slim-bookworm

# Java 17 runs TorchServe's frontend; tini is PID 1 (reaps zombies, forwards SIGTERM). A stage of
# its own: the runtime builds on it and so does the agent's builder, which adds the JDK.
# (The JRE's post-install links man pages into a directory the slim image has removed; ct.sym is
#  javac's symbol table for other releases, which the runtime never reads.)
FROM ${BASE_IMAGE} AS java
RUN mkdir -p /usr/share/man/man1 \
 && apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless tini \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt /var/log/dpkg.log \
      /usr/share/doc/* /usr/share/man/* \
 && rm -f /usr/lib/jvm/java-17-openjdk-*/lib/ct.sym

# The frontend's Java agent (greedy batching, the OIP model routes), built from agent/ with javac
# and jar exactly as the Makefile's build/agent/rtserve-agent.jar rule does (Debian's JDK 17, in
# this stage only). The JRE is reinstalled for the ct.sym the stage above removed: `javac
# --release` reads it.
FROM java AS agent
RUN mkdir -p /usr/share/man/man1 \
 && apt-get update \
 && apt-get install -y --no-install-recommends --reinstall openjdk-17-jre-headless \
 && apt-get install -y --no-install-recommends openjdk-17-jdk-headless \
 && rm -rf /var/lib/apt/lists/*
COPY agent/ /build/agent/
RUN cd /build && mkdir -p build/agent/classes \
 && javac --release 17 -Xlint:all -Werror -d build/agent/classes agent/src/rtserve/agent/*.java \
 && jar --create --file build/agent/rtserve-agent.jar --manifest agent/MANIFEST.MF \
      -C build/agent/classes .

FROM ${BASE_IMAGE} AS builder
COPY wheelhouse/ /wheelhouse/
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-index --find-links /wheelhouse --no-cache-dir \
      --disable-pip-version-check -r /wheelhouse/requirements.txt \
 && /opt/venv/bin/pip uninstall --yes --disable-pip-version-check pip
# Only what runs: no C++ headers, CMake files or static libraries (for building extensions), no
# test suites, and bytecode only for the modules rtserve imports (prune_venv.py says what and why;
# `make image` lists them, so a change to rtserve alone reuses this layer).
COPY prune_venv.py runtime-modules.txt /build/
RUN rm -rf /opt/venv/lib/python3.11/site-packages/torch/include \
      /opt/venv/lib/python3.11/site-packages/torch/share/cmake \
 && find /opt/venv -name '*.a' -delete \
 && cd /build && PYTHONDONTWRITEBYTECODE=1 /opt/venv/bin/python prune_venv.py /opt/venv runtime-modules.txt

FROM java AS runtime
# A fixed non-root UID (above 10000) that the Deployment's runAsUser names too.
RUN groupadd --gid 10001 model-server \
 && useradd --uid 10001 --gid 10001 --home-dir /home/model-server --no-create-home \
      --shell /usr/sbin/nologin model-server \
 && mkdir -p /home/model-server/run /etc/rtserve \
 && chown 10001:10001 /home/model-server /home/model-server/run

COPY --from=builder /opt/venv /opt/venv
WORKDIR /opt/rtserve
COPY handler/ ./handler/
COPY rtserve/ ./rtserve/
COPY config/ ./config/
COPY deploy/k8s/base/config.properties /etc/rtserve/config.properties
# Where rtserve.server looks for it (REPO/build/agent/rtserve-agent.jar, REPO being /opt/rtserve).
COPY --from=agent /build/build/agent/rtserve-agent.jar ./build/agent/rtserve-agent.jar
RUN /opt/venv/bin/python -m compileall -q handler rtserve

# The root filesystem is read-only in the cluster: everything TorchServe writes (key_file.json,
# its effective config, logs, the unpacked archive, its PID file) goes to the run directory,
# an emptyDir there. RTSERVE_* are read by rtserve.server and rtserve.probe. `python` is the
# virtualenv's (rtserve.server finds `torchserve` beside it).
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONPATH=/opt/rtserve \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/home/model-server/run \
    RTSERVE_RUN_DIR=/home/model-server/run \
    RTSERVE_CONFIG=/etc/rtserve/config.properties \
    RTSERVE_MODEL_STORE=/opt/rtserve/model_store

# Last, so that images of different model versions share every layer above.
ARG MODEL_NAME=realtime-classifier
ARG MODEL_VERSION=1.0
COPY model_store/${MODEL_NAME}_${MODEL_VERSION}.mar ./model_store/
ENV RTSERVE_MODEL=${MODEL_NAME} \
    RTSERVE_MODELS=${MODEL_NAME}=${MODEL_NAME}_${MODEL_VERSION}.mar
LABEL org.opencontainers.image.title="rtserve" \
      org.opencontainers.image.version="${MODEL_VERSION}"

USER 10001:10001
WORKDIR /home/model-server/run
# Management and metrics. Inference listens on 127.0.0.1:8090 only: clients come in through
# the pod's gateway sidecar on 8080 (deploy/k8s/base/deployment.yaml).
EXPOSE 8081 8082
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["python", "-m", "rtserve.server", "run"]
