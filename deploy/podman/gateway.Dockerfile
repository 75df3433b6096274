# Stand-in for the gateway sidecar's image (nginxinc/nginx-unprivileged:1.28.0-alpine in
# deploy/k8s/base/deployment.yaml) where that cannot be pulled: Debian bookworm's nginx package.
# `make image-gateway` builds it; `make pod` uses it only when the manifest's image is missing.
# Where it differs: nginx 1.22 (Debian) instead of 1.28 (mainline), glibc instead of musl, and
# the image's own default user is root (the pod's securityContext runs it as 10001 either way).
# The pod's nginx.conf (a ConfigMap) sets every path it writes, so neither image's defaults apply.
ARG BASE_IMAGE=docker.io/library/debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends nginx-light \
 && rm -rf /var/lib/apt/lists/* /var/log/apt /var/log/dpkg.log /usr/share/doc/* /usr/share/man/* \
      /etc/nginx/sites-enabled/*
EXPOSE 8080
CMD ["nginx", "-g", "daemon off;"]
