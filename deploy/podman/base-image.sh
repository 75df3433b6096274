#!/usr/bin/env bash
# Print the base image to build on: WANTED when it is here or can be pulled, else the local
# stand-in LOCAL (built by `make image-base` when missing), saying so on stderr.
#   deploy/podman/base-image.sh WANTED LOCAL
set -euo pipefail
wanted=${1:?usage: base-image.sh WANTED LOCAL}
local_base=${2:?usage: base-image.sh WANTED LOCAL}
docker=${DOCKER:-podman}
if "$docker" image inspect "$wanted" >/dev/null 2>&1 || "$docker" pull -q "$wanted" >/dev/null 2>&1; then
  echo "$wanted"
  exit 0
fi
echo ">> $wanted cannot be pulled here: building on $local_base instead (make image-base: Debian bookworm's own Python 3.11)" >&2
if ! "$docker" image inspect "$local_base" >/dev/null 2>&1; then
  DOCKER=$docker "$(dirname "$0")/build-base.sh" "$local_base" build/image-base >&2
fi
echo "$local_base"
