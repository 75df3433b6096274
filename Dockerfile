# rtserve image: TorchServe, the pinned dependencies, the handler and the .mar of ONE model
# version. Build it with `make image MODEL_VERSION=2.0 IMG=registry.example.com/ml/rtserve`,
# which builds the archive first, stages a build context with only what is copied below
# (build/image/<version>/) and tags the image with the model version.
#
# bookworm, not the newer Debian the plain 3.11-slim tag follows: bookworm ships Java 17.
FROM python:3.11.11-slim-bookworm

ARG MODEL_NAME=realtime-classifier
ARG MODEL_VERSION=1.0
# torch's default wheel on PyPI bundles CUDA (gigabytes); the CPU wheel index keeps it small.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

# Java 17 runs TorchServe's frontend; tini is PID 1 (reaps zombies, forwards SIGTERM).
# (The JRE's post-install links man pages into a directory the slim image has removed.)
RUN mkdir -p /usr/share/man/man1 \
 && apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless tini \
 && rm -rf /var/lib/apt/lists/*

# A fixed non-root UID (above 10000) that the Deployment's runAsUser names too.
RUN groupadd --gid 10001 model-server \
 && useradd --uid 10001 --gid 10001 --home-dir /home/model-server --no-create-home \
      --shell /usr/sbin/nologin model-server \
 && mkdir -p /home/model-server/run /etc/rtserve \
 && chown 10001:10001 /home/model-server /home/model-server/run

WORKDIR /opt/rtserve
COPY requirements.txt ./
RUN pip install --no-cache-dir --disable-pip-version-check --root-user-action=ignore \
      --extra-index-url "${TORCH_INDEX}" -r requirements.txt

COPY handler/ ./handler/
COPY rtserve/ ./rtserve/
COPY config/ ./config/
COPY deploy/k8s/base/config.properties /etc/rtserve/config.properties
COPY model_store/${MODEL_NAME}_${MODEL_VERSION}.mar ./model_store/
RUN python -m compileall -q handler rtserve

# The root filesystem is read-only in the cluster: everything TorchServe writes (key_file.json,
# its effective config, logs, the unpacked archive, its PID file) goes to the run directory,
# an emptyDir there. RTSERVE_* are read by rtserve.server and rtserve.probe.
ENV PYTHONPATH=/opt/rtserve \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/home/model-server/run \
    RTSERVE_RUN_DIR=/home/model-server/run \
    RTSERVE_CONFIG=/etc/rtserve/config.properties \
    RTSERVE_MODEL_STORE=/opt/rtserve/model_store \
    RTSERVE_MODEL=${MODEL_NAME} \
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
