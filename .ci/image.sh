#!/usr/bin/env bash
# Build the service's container image from ./Dockerfile with podman, run it, and check
# it: /readyz answers 200 on a port other than 8000, the process runs as uid 10001 and
# the HEALTHCHECK (which must follow that port) passes. Called by .ci/run.
#
# CI machines have no Docker daemon and no registry, so:
# - podman with runc (crun refuses hybrid cgroups), and a containers.conf given through
#   CONTAINERS_CONF whose default_ulimits fit this machine (nofile = the hard limit,
#   nproc <= kernel.pid_max: podman's defaults are refused here);
# - the Dockerfile's base image is stood in for by a Debian bookworm built with
#   debootstrap (python3, pip, venv, CA certificates, with this machine's extra CA
#   certificates so that pip reaches the index), imported under the FROM name; it is
#   cached in $SB_IMAGE_CACHE (default /var/tmp/mla-switchboard-ci) between runs;
# - `podman build --format docker` (the OCI format drops HEALTHCHECK), --network host,
#   --pull=never (the base is local).
# Skipped, with the reason printed, only where podman cannot run at all.
set -euo pipefail
cd "$(dirname "$0")/.."
START=$SECONDS
say() { printf '    [image %4ds] %s\n' "$((SECONDS - START))" "$*"; }
skip() { echo "SKIPPED: container image not built: $*"; exit 0; }

IMAGE=localhost/mla-switchboard:ci
NAME="mla-switchboard-ci-$$"
CACHE="${SB_IMAGE_CACHE:-/var/tmp/mla-switchboard-ci}"
BASE=$(awk 'toupper($1) == "FROM" {print $2; exit}' Dockerfile)
case "$BASE" in */*) BASE_REF="docker.io/$BASE" ;; *) BASE_REF="docker.io/library/$BASE" ;; esac

# --- podman, runc, debootstrap --------------------------------------------------------
missing=()
command -v podman >/dev/null 2>&1 || missing+=(podman)
command -v runc >/dev/null 2>&1 || [ -x /usr/sbin/runc ] || missing+=(runc)
command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    skip "${missing[*]} missing and cannot be installed here (needs root and apt-get)"
  fi
  say "installing ${missing[*]} (Debian packages)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null
fi
export PATH="$PATH:/usr/sbin:/sbin"
[ "$(id -u)" = 0 ] || skip "debootstrap and a rootful podman need root"

# --- containers.conf for this machine ---------------------------------------------------
conf_dir=$(mktemp -d)
cleanup() {
  podman rm -f -t 0 "$NAME" >/dev/null 2>&1 || true
  rm -rf "$conf_dir"
}
trap cleanup EXIT
nofile=$(ulimit -Hn)
[ "$nofile" = unlimited ] && nofile=1048576
nproc=$(cat /proc/sys/kernel/pid_max)
hard_nproc=$(ulimit -Hu)
if [ "$hard_nproc" != unlimited ] && [ "$hard_nproc" -lt "$nproc" ]; then nproc=$hard_nproc; fi
cat >"$conf_dir/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]

[engine]
runtime = "runc"
EOF
export CONTAINERS_CONF="$conf_dir/containers.conf"
podman info >/dev/null 2>&1 || skip "podman cannot run here: $(podman info 2>&1 | tail -1)"

# --- the base image stand-in ------------------------------------------------------------
if podman image exists "$BASE_REF"; then
  say "base $BASE_REF already in podman's store"
else
  mkdir -p "$CACHE"
  tarball="$CACHE/bookworm-python-minbase.tar"
  if [ ! -s "$tarball" ]; then
    say "building the stand-in for $BASE with debootstrap (bookworm, minbase)"
    rootfs=$(mktemp -d "$CACHE/rootfs.XXXXXX")
    debootstrap --variant=minbase \
      --include=python3,python3-pip,python3-venv,python-is-python3,ca-certificates \
      bookworm "$rootfs" http://deb.debian.org/debian >"$CACHE/debootstrap.log" 2>&1 \
      || { tail -20 "$CACHE/debootstrap.log"; rm -rf "$rootfs"; exit 1; }
    rm -f "$rootfs"/usr/lib/python3*/EXTERNALLY-MANAGED
    if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
      cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
      chroot "$rootfs" update-ca-certificates >/dev/null 2>&1
    fi
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
    rm -rf "$rootfs"
  fi
  say "importing $tarball as $BASE_REF"
  podman import --quiet "$tarball" "$BASE_REF" >/dev/null
fi

# --- build ------------------------------------------------------------------------------
say "podman build --format docker -t $IMAGE"
build_start=$SECONDS
podman build --quiet --format docker --network host --pull=never -t "$IMAGE" . >/dev/null
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
say "built in $((SECONDS - build_start)) s, $((size / 1000000)) MB"

# --- run and check ----------------------------------------------------------------------
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
say "podman run (port $port, not the image's default 8000)"
# No systemd here to time the checks (podman says so on stderr, harmlessly): the check
# is run once below with `podman healthcheck run`. stderr is shown only on failure.
podman run -d --name "$NAME" --network host --health-interval=disable \
  -e SWITCHBOARD_PORT="$port" -e SWITCHBOARD_ADMIN_TOKEN=ci-image-check-token \
  "$IMAGE" >/dev/null 2>"$conf_dir/run.err" || { cat "$conf_dir/run.err" >&2; exit 1; }
status=000
for _ in $(seq 1 120); do
  status=$(python3 -c "
import urllib.request, urllib.error
try:
    print(urllib.request.urlopen('http://127.0.0.1:$port/readyz', timeout=2).status)
except urllib.error.HTTPError as e:
    print(e.code)
except OSError:
    print('000')")
  [ "$status" = 200 ] && break
  sleep 0.5
done
fail() {
  echo "container image check failed: $*" >&2
  podman logs "$NAME" 2>&1 | tail -30 >&2
  exit 1
}
[ "$status" = 200 ] || fail "/readyz answered $status"
say "/readyz 200"
uid=$(podman exec "$NAME" id -u)
[ "$uid" = 10001 ] || fail "runs as uid $uid, not 10001"
say "runs as uid $uid"
podman healthcheck run "$NAME" >/dev/null || fail "HEALTHCHECK failed on port $port"
say "HEALTHCHECK healthy on port $port"
if podman exec "$NAME" sh -c 'ls /wheels /src' >/dev/null 2>&1; then
  fail "build leftovers (/wheels or /src) in the image"
fi
if podman exec "$NAME" python -c 'import torch' >/dev/null 2>&1; then
  fail "torch is installed in the service image"
fi
echo "image: $IMAGE, $((size / 1000000)) MB, built in $((SECONDS - build_start)) s;" \
  "/readyz 200, uid $uid, healthy"
