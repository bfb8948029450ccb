#!/usr/bin/env bash
# Builds the suite's image, coder-provisioner-conformance (conformance/Dockerfile.prebuilt), from the
# `conformance` binary built on the host and the pinned kubectl (scripts/k8s-binaries.sh), on the
# small local base of scripts/small-base-image.sh --shell: no registry. Progress on stderr; the image reference on
# stdout. The image is not rebuilt when its content key (binary, kubectl, Dockerfile, base) matches.
#
# Usage: scripts/suite-image.sh [--tag TAG] [--binary PATH]
#   --tag     image tag (default dev)
#   --binary  the conformance binary (default: the release build the tiers make, Cargo.toml's
#             [profile.image] in $CONFORMANCE_IMAGE_TARGET_DIR, default
#             ~/.cache/coder-provisioner-conformance/target-image/image/conformance)
# Env: IMAGES_BASE_IMAGE  runtime base (default: the small local base with bash of
#                         scripts/small-base-image.sh --shell: the tutorial's steps run `bash -c`)
set -euo pipefail
cd "$(dirname "$0")/.."
here="$PWD/scripts"

tag=dev
binary="${CONFORMANCE_IMAGE_TARGET_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/coder-provisioner-conformance/target-image}/image/conformance"
while [ $# -gt 0 ]; do
  case "$1" in
    --tag) tag=$2; shift 2 ;;
    --binary) binary=$2; shift 2 ;;
    *) echo "usage: scripts/suite-image.sh [--tag TAG] [--binary PATH]" >&2; exit 2 ;;
  esac
done

. "$here/progress.sh"
mb() { awk -v bytes="$1" 'BEGIN { printf "%.1f", bytes / 1e6 }'; }
fail() { printf 'suite-image: %s\n' "$*" >&2; exit 1; }

docker info >/dev/null 2>&1 || fail "no Docker engine answers (run scripts/docker-engine.sh)"
[ -x "$binary" ] || fail "no conformance binary at $binary (cargo build --workspace --bins --profile image --target-dir $(dirname "$(dirname "$binary")"))"
assets="$(bash "$here/k8s-binaries.sh")" || fail "kubectl could not be resolved (scripts/k8s-binaries.sh)"
base="${IMAGES_BASE_IMAGE:-}"
[ -n "$base" ] || base="$(bash "$here/small-base-image.sh" --shell)" || fail "the local base image could not be made (scripts/small-base-image.sh --shell)"
base_id="$(docker image inspect --format '{{.Id}}' "$base" 2>/dev/null)" || fail "base image $base is not in the engine"

image="coder-provisioner-conformance:$tag"
ctx="$(mktemp -d /tmp/suite-image-context.XXXXXX)"
trap 'rm -rf "$ctx"' EXIT
cp "$binary" "$ctx/conformance"
cp "$assets/kubectl" "$ctx/kubectl"
if command -v strip >/dev/null 2>&1; then strip --strip-debug "$ctx/conformance"; fi
key="$( { sha256sum "$ctx/conformance" "$ctx/kubectl" conformance/Dockerfile.prebuilt | cut -d' ' -f1; echo "$base_id"; } | sha256sum | cut -c1-16)"
current="$(docker image inspect --format '{{index .Config.Labels "coder-conformance.content-key"}}' "$image" 2>/dev/null || true)"
if [ "$current" = "$key" ]; then
  cached "$image (content key $key)"
else
  step "building $image on $base"
  docker build -q -f conformance/Dockerfile.prebuilt --build-arg BASE_IMAGE="$base" \
    --label "coder-conformance.content-key=$key" -t "$image" "$ctx" >/dev/null \
    || fail "docker build of $image failed"
  step_done "$(docker image inspect --format '{{.Size}}' "$image" | awk '{printf "%d MB", $1/1e6}')"
fi
log "$(printf '  size %-34s %6s MB (base %s MB + conformance %s MB + kubectl %s MB)' "$image" \
  "$(mb "$(docker image inspect --format '{{.Size}}' "$image")")" \
  "$(mb "$(docker image inspect --format '{{.Size}}' "$base")")" \
  "$(mb "$(stat -c %s "$ctx/conformance")")" "$(mb "$(stat -c %s "$ctx/kubectl")")")"
echo "$image"
