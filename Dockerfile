# rtserve image: TorchServe, the pinned dependencies, the handler and the .mar of ONE model
# version. Build it with `make image MODEL_VERSION=2.0` (DOCKER=podman or docker), which builds
# the archive and the wheelhouse first, stages a build context with only what is copied below
# (build/image/<version>/) and tags the image IMG:<model version>. docs/image-and-pod.md has the
# size breakdown and build times.
#
# It is built on the dependencies image (deploy/podman/deps.Dockerfile: Java 17, tini, the
# model-server user and the pruned virtualenv), which `make image` builds first, once per set of
# dependencies, and passes as DEPS_IMAGE (localhost/rtserve-deps:<hash of its inputs>). So an
# image of a new version, or of a change to rtserve's code, is a few small layers on it: rtserve's
# files, the Java agent (built from agent/ in a stage of its own, with a JDK that stays there)
# and the archive.
#
# The base is a build argument, as in the dependencies image (the same one is passed to both):
# the official Python 3.11 image on Debian bookworm, or the equivalent that `make image-base`
# builds from Debian's packages where no registry can be reached. Only the agent's stage uses it.
ARG BASE_IMAGE=docker.io/library/python:3.11-slim-bookworm
# No default: `make image` names the dependencies image built from the same wheelhouse.
ARG DEPS_IMAGE

# The frontend's Java agent (greedy batching, the OIP model routes), built from agent/ with javac
# and jar exactly as the Makefile's build/agent/rtserve-agent.jar rule does (Debian's JDK 17, in
# this stage only). On the base rather than the dependencies image: it needs none of them, and
# its JDK layer stays cached when the dependencies change. (The JDK's post-install links man
# pages into a directory the slim image has removed.)
FROM ${BASE_IMAGE} AS agent
RUN mkdir -p /usr/share/man/man1 \
 && apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jdk-headless \
 && rm -rf /var/lib/apt/lists/*
COPY agent/ /build/agent/
RUN cd /build && mkdir -p build/agent/classes \
 && javac --release 17 -Xlint:all -Werror -d build/agent/classes agent/src/rtserve/agent/*.java \
 && jar --create --file build/agent/rtserve-agent.jar --manifest agent/MANIFEST.MF \
      -C build/agent/classes .

FROM ${DEPS_IMAGE} AS runtime
WORKDIR /opt/rtserve
COPY handler/ ./handler/
COPY rtserve/ ./rtserve/
COPY config/ ./config/
COPY deploy/k8s/base/config.properties /etc/rtserve/config.properties
# Where rtserve looks for it (HOME/build/agent/rtserve-agent.jar, rtserve.settings; HOME is the
# directory above the package, /opt/rtserve). rtserve/ is the package tree (its subpackages and
# the frontend's log4j2.xml, a package resource).
COPY --from=agent /build/build/agent/rtserve-agent.jar ./build/agent/rtserve-agent.jar
RUN /opt/venv/bin/python -m compileall -q handler rtserve

# The root filesystem is read-only in the cluster: everything TorchServe writes (key_file.json,
# its effective config, logs, the unpacked archive, its PID file) goes to the run directory,
# an emptyDir there. RTSERVE_* are read once by rtserve.settings (the server, the probes, the
# gateway's key sync). `python` is the virtualenv's (rtserve finds `torchserve` beside it).
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
CMD ["python", "-m", "rtserve", "server", "run"]
