#!/usr/bin/env bash
# Build a local stand-in for the official python:3.11-slim-bookworm image from Debian's own
# packages (debootstrap), for machines that cannot pull from a container registry.
#   deploy/podman/build-base.sh TAG [WORKDIR]
# Same Debian release (bookworm) and Python minor version (3.11, Debian's 3.11.2 where the
# official image builds 3.11.x from source into /usr/local), pip and venv included, no PEP 668
# marker (the official image has none), apt lists and caches removed.
set -euo pipefail
tag=${1:?usage: build-base.sh TAG [WORKDIR]}
work=${2:-build/image-base}
docker=${DOCKER:-podman}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
packages=python3,python3-pip,python3-venv,python-is-python3,ca-certificates

command -v debootstrap >/dev/null || { echo "error: debootstrap is missing (make pod-deps installs it)"; exit 1; }
rm -rf "$work/rootfs" && mkdir -p "$work"
echo ">> debootstrap bookworm ($packages) from $mirror: about 1.5 min"
debootstrap --variant=minbase --include="$packages" bookworm "$work/rootfs" "$mirror" \
  > "$work/debootstrap.log" 2>&1 || { tail -n 30 "$work/debootstrap.log"; exit 1; }
root=$work/rootfs
rm -f "$root"/usr/lib/python3.11/EXTERNALLY-MANAGED
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/log/* \
  "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/*
printf 'Types: deb\nURIs: %s\nSuites: bookworm bookworm-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
  "$mirror" > "$root/etc/apt/sources.list.d/debian.sources"
rm -f "$root/etc/apt/sources.list"
tar --numeric-owner -C "$root" -c . | "$docker" import \
  --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' \
  --message "rtserve local base: debootstrap bookworm minbase + $packages" - "$tag" >/dev/null
rm -rf "$root"
echo ">> built $tag: $("$docker" image inspect --format '{{.Size}}' "$tag" | numfmt --to=iec) (Debian bookworm, $("$docker" run --rm "$tag" python3 --version 2>&1))"
