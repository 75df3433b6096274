# rtserve's dependencies image: the base, Java 17, tini, the model-server user and the pinned
# Python dependencies in /opt/venv; the image of each model version (the Dockerfile at the
# repository's root) adds rtserve's own files and one .mar on top of it. `make image` builds it
# first, from a context of its own (build/image/<version>-deps/: this file, the wheelhouse,
# prune_venv.py and runtime-modules.txt), and tags it with the hash of those inputs and of the
# base, localhost/rtserve-deps:<hash>. While they are unchanged the tagged image is used as it
# is, with no build at all: a build whose every layer is cached still re-reads the 2.7 GB of
# wheels and the 4 GB virtualenv to check its cache. docs/image-and-pod.md has the figures.
#
# Two stages before the image's own: the builder installs the Python dependencies into a
# virtualenv from the wheelhouse (wheels made on the host from the pinned requirements.txt: `pip
# install --no-index`, so the image holds exactly what the tests ran and the build needs no
# package index); the last stage gets that virtualenv on the Java stage, nothing else.
#
# The base is a build argument: the official Python 3.11 image on Debian bookworm (bookworm ships
# Java 17), or the equivalent that `make image-base` builds from Debian's packages where no
# registry can be reached. Builder and image use the same base, so the virtualenv's python link
# points at the same interpreter in both.
ARG BASE_IMAGE=docker.io/library/python:3.11-slim-bookworm

# Java 17 runs TorchServe's frontend; tini is PID 1 (reaps zombies, forwards SIGTERM).
# (The JRE's post-install links man pages into a directory the slim image has removed; ct.sym is
#  javac's symbol table for other releases, which the server never reads.)
FROM ${BASE_IMAGE} AS java
RUN mkdir -p /usr/share/man/man1 \
 && apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless tini \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt /var/log/dpkg.log \
      /usr/share/doc/* /usr/share/man/* \
 && rm -f /usr/lib/jvm/java-17-openjdk-*/lib/ct.sym

FROM ${BASE_IMAGE} AS builder
COPY wheelhouse/ /wheelhouse/
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-index --find-links /wheelhouse --no-cache-dir \
      --disable-pip-version-check -r /wheelhouse/requirements.txt \
 && /opt/venv/bin/pip uninstall --yes --disable-pip-version-check pip
# Only what runs: no C++ headers, CMake files or static libraries (for building extensions), no
# test suites, and bytecode only for the modules rtserve imports (prune_venv.py says what and why;
# `make image` lists them, so a change to rtserve alone reuses this image).
COPY prune_venv.py runtime-modules.txt /build/
RUN rm -rf /opt/venv/lib/python3.11/site-packages/torch/include \
      /opt/venv/lib/python3.11/site-packages/torch/share/cmake \
 && find /opt/venv -name '*.a' -delete \
 && cd /build && PYTHONDONTWRITEBYTECODE=1 /opt/venv/bin/python prune_venv.py /opt/venv runtime-modules.txt

FROM java AS deps
# A fixed non-root UID (above 10000) that the Deployment's runAsUser names too; the version's
# image runs as it (USER 10001:10001 there).
RUN groupadd --gid 10001 model-server \
 && useradd --uid 10001 --gid 10001 --home-dir /home/model-server --no-create-home \
      --shell /usr/sbin/nologin model-server \
 && mkdir -p /home/model-server/run /etc/rtserve \
 && chown 10001:10001 /home/model-server /home/model-server/run

COPY --from=builder /opt/venv /opt/venv
