#!/usr/bin/env bash
# A local stand-in for the Dockerfiles' default base (python:3.12-slim-bookworm), made from Debian's
# own packages, for hosts that cannot pull from a container registry (`make image-check`, CI):
#
#   deploy/docker/local_base.sh [IMAGE]     # prints the image name; needs root, podman and debootstrap
#   podman build --build-arg PYTHON_IMAGE=IMAGE ...
#
# Same layout as the official image where the Dockerfile relies on it: `python` on PATH with `venv`
# and `pip`, `useradd`, LANG=C.UTF-8. The Python is bookworm's 3.11 (the official base has 3.12;
# the server needs 3.11 or later). The host's certificate bundle is copied in and named by PIP_CERT,
# so that pip reaches the package index through a host's own certificate authority (a proxy's).
#
# The image is reused while this script and the host's bundle are unchanged (label kserve-v2.base),
# so a CI host that keeps podman's storage builds it once. Mirror: DEBIAN_MIRROR, else the host's
# first Debian source in /etc/apt. The root file system is made under TMPDIR and removed afterwards.
set -euo pipefail

IMAGE=${1:-localhost/kserve-v2-base:bookworm}
SUITE=bookworm
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
KEY=$(cat "$0" "$CA_BUNDLE" | sha256sum | cut -c1-16)

if podman image exists "$IMAGE" \
   && [ "$(podman image inspect --format '{{ index .Labels "kserve-v2.base" }}' "$IMAGE")" = "$KEY" ]; then
  echo "$IMAGE"
  exit 0
fi

mirror=${DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
  # deb822 (.sources: "URIs: ...") or one-line ("deb URI suite ...") sources; the first that is not the security archive
  mirror=$(cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null \
           | sed -n -e 's/^URIs:[[:space:]]*\([^[:space:]]*\).*/\1/p' \
                    -e 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]*\).*/\2/p' \
           | grep -v -e security -e '^$' | head -n 1 || true)
fi
if [ -z "$mirror" ]; then
  echo "local_base.sh: no Debian mirror in /etc/apt; set DEBIAN_MIRROR" >&2
  exit 1
fi

rootfs=$(mktemp -d "${TMPDIR:-/tmp}/kserve-v2-base.XXXXXX")
trap 'rm -rf "$rootfs"' EXIT
echo "local_base.sh: debootstrap $SUITE from $mirror" >&2
debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,passwd "$SUITE" "$rootfs" "$mirror" >&2
# what the slim image leaves out too: package lists and archives, documentation, translations
rm -rf "$rootfs"/var/cache/apt/* "$rootfs"/var/lib/apt/lists/* "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* \
       "$rootfs"/usr/share/locale/*
ln -sf python3 "$rootfs/usr/bin/python"
cp "$CA_BUNDLE" "$rootfs/etc/ssl/certs/host-ca-bundle.crt"
tar --numeric-owner -C "$rootfs" -c . | podman import \
  --change "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
  --change "ENV LANG=C.UTF-8" \
  --change "ENV PIP_CERT=/etc/ssl/certs/host-ca-bundle.crt" \
  --change "LABEL kserve-v2.base=$KEY" \
  --change 'CMD ["python3"]' \
  - "$IMAGE" >&2
echo "$IMAGE"
