#!/usr/bin/env bash
# Can this host build and run the images with podman (`make image-check`)? Used by .ci/run:
#
#   if reason=$(deploy/docker/podman_host.sh); then make image-check; else echo "skipped: $reason"; fi
#
# Installs podman, runc and debootstrap from Debian's packages where they are missing (as root, with
# apt-get), makes or reuses the local base image (local_base.sh), and runs a container in it the way
# the check runs the server (uid 1000, read-only root, a published port). Exit 0 and no output when
# all of that works; otherwise exit 1 and one line on stdout saying what failed and podman's (or
# apt-get's) own last words. podman reads deploy/docker/containers.conf unless CONTAINERS_CONF is set.
set -uo pipefail
cd "$(dirname "$0")"
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/containers.conf}
log=$(mktemp "${TMPDIR:-/tmp}/kserve-v2-podman-host.XXXXXX")
trap 'rm -f "$log"' EXIT

fail() {  # the reason, with the last line of what the failed command printed
  echo "$1: $(grep -v '^[[:space:]]*$' "$log" | tail -n 1)"
  exit 1
}

missing=$(for tool in podman runc debootstrap; do command -v "$tool" >/dev/null || echo "$tool"; done | xargs)
if [ -n "$missing" ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "not root, so cannot install $missing (apt-get install podman runc debootstrap)"
    exit 1
  fi
  if ! command -v apt-get >/dev/null; then
    echo "no apt-get to install $missing (not a Debian host)"
    exit 1
  fi
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc debootstrap; } >"$log" 2>&1 \
    || fail "apt-get install podman runc debootstrap failed"
fi
if [ "$(id -u)" != 0 ]; then
  echo "not root: the local base is made with debootstrap, which needs root"
  exit 1
fi
base=$(./local_base.sh 2>"$log") || fail "the local base image could not be made (deploy/docker/local_base.sh)"
timeout 120 podman run --rm --user=1000 --read-only --read-only-tmpfs=false --tmpfs=/tmp --cap-drop=ALL \
  --publish=127.0.0.1::8080 "$base" python -c "open('/tmp/x', 'w')" >"$log" 2>&1 \
  || fail "podman cannot run a container here"
