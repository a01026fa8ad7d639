#!/usr/bin/env bash
# Can this host run the fleet drill (`make fleet-drill`)? Used by .ci/run:
#
#   if reason=$(deploy/docker/fleet_host.sh); then make fleet-drill ...; else echo "skipped: $reason"; fi
#
# What podman_host.sh checks (podman, runc, debootstrap, the local base, a hardened container), then
# HAProxy, the drill's load balancer, installed from Debian's package where it is missing (as root, with
# apt-get). Exit 0 and no output when all of that works; otherwise exit 1 and one line on stdout saying
# what failed.
set -uo pipefail
cd "$(dirname "$0")"
reason=$(./podman_host.sh) || { echo "$reason"; exit 1; }
if ! command -v haproxy >/dev/null; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "no haproxy, and no root apt-get to install it (apt-get install haproxy)"
    exit 1
  fi
  log=$(mktemp "${TMPDIR:-/tmp}/kserve-v2-fleet-host.XXXXXX")
  trap 'rm -f "$log"' EXIT
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy; } >"$log" 2>&1 \
    || { echo "apt-get install haproxy failed: $(grep -v '^[[:space:]]*$' "$log" | tail -n 1)"; exit 1; }
fi
haproxy -v >/dev/null 2>&1 || { echo "haproxy is installed but does not run"; exit 1; }
