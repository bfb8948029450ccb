#!/usr/bin/env bash
# Builds the three images of the Docker-backed tiers from binaries already built on the host, with
# no registry: coder-provisioner-operator, fake-coderd and coder-stub (thin Dockerfiles
# operator/Dockerfile.prebuilt and fake-coderd/Dockerfile.prebuilt that copy the binaries onto a
# base image). Progress on stderr; the three image references on stdout, one a line.
#
# Usage: scripts/images.sh [--tag TAG] [--bin-dir DIR] [--wait SECONDS] [--verify]
#   --tag      image tag (default dev: the tag the suite loads into clusters)
#   --bin-dir  folder holding coder-provisioner-operator, fake-coderd and coder-stub (default
#              target/debug; the tiers give the release build of Cargo.toml's [profile.image]:
#              cargo build --workspace --bins --profile image → target/image)
#   --wait     wait up to SECONDS for the binaries to appear (a build still running); default 0
#   --verify   run each image once (`--help` must print a usage line) after building it
# Env: IMAGES_BASE_IMAGE  runtime base (default: the small local base of scripts/small-base-image.sh,
#                         glibc, libgcc and the CA bundle from Debian bookworm, no shell, 3.6 MB;
#                         with internet, gcr.io/distroless/cc-debian12:nonroot is the upstream one)
#
# An image whose content key (binary, Dockerfile, base image) matches the existing image's label is
# not rebuilt (its line says "cached"); every other step prints its elapsed time, and the last line
# sums up; then each image's size. Debug information is stripped from the copies (not from the
# host's binaries).
set -euo pipefail
cd "$(dirname "$0")/.."
here="$PWD/scripts"

tag=dev bin_dir=target/debug wait_s=0 verify=0
while [ $# -gt 0 ]; do
  case "$1" in
    --tag) tag=$2; shift 2 ;;
    --bin-dir) bin_dir=$2; shift 2 ;;
    --wait) wait_s=$2; shift 2 ;;
    --verify) verify=1; shift ;;
    *) echo "usage: scripts/images.sh [--tag TAG] [--bin-dir DIR] [--wait SECONDS] [--verify]" >&2; exit 2 ;;
  esac
done

. "$here/progress.sh"
mb() { awk -v bytes="$1" 'BEGIN { printf "%.1f", bytes / 1e6 }'; }
fail() { printf 'images: %s\n' "$*" >&2; exit 1; }

docker info >/dev/null 2>&1 || fail "no Docker engine answers (run scripts/docker-engine.sh)"

binaries=(coder-provisioner-operator fake-coderd coder-stub)
have_all() { local b; for b in "${binaries[@]}"; do [ -x "$bin_dir/$b" ] || return 1; done; }
waited=0
until have_all; do
  if [ "$waited" -ge "$wait_s" ]; then
    fail "missing binaries in $bin_dir (need ${binaries[*]}): run cargo build --workspace --bins"
  fi
  [ $((waited % 30)) = 0 ] && log "waiting for ${binaries[*]} in $bin_dir (${waited}s of ${wait_s}s)"
  sleep 5; waited=$((waited + 5))
done
# A build that is still linking leaves a binary that changes under us: wait until it is stable.
while [ -n "$(find "$bin_dir" -maxdepth 1 \( -name coder-provisioner-operator -o -name fake-coderd -o -name coder-stub \) -newermt '-5 seconds' 2>/dev/null)" ]; do
  log "binaries in $bin_dir changed in the last 5 s; waiting for the build to settle"; sleep 5
done

base="${IMAGES_BASE_IMAGE:-}"
[ -n "$base" ] || base="$(bash "$here/small-base-image.sh")" || fail "the local base image could not be made (scripts/small-base-image.sh)"
base_id="$(docker image inspect --format '{{.Id}}' "$base" 2>/dev/null)" \
  || fail "base image $base is not in the engine (pull it, or unset IMAGES_BASE_IMAGE to make a local one)"

total_start=$SECONDS built=0
ctx="$(mktemp -d /tmp/images-context.XXXXXX)"
trap 'rm -rf "$ctx"' EXIT
step "copying the ${#binaries[@]} binaries from $bin_dir (debug information stripped)"
for b in "${binaries[@]}"; do
  cp "$bin_dir/$b" "$ctx/$b"
  if command -v strip >/dev/null 2>&1; then strip --strip-debug "$ctx/$b"; fi
done
step_done

# build IMAGE DOCKERFILE TARGET BINARY
build() {
  local image=$1 dockerfile=$2 target=$3 binary=$4 key current
  key="$( { sha256sum "$ctx/$binary" "$dockerfile" | cut -d' ' -f1; echo "$target $base_id"; } | sha256sum | cut -c1-16)"
  current="$(docker image inspect --format '{{index .Config.Labels "coder-conformance.content-key"}}' "$image" 2>/dev/null || true)"
  if [ "$current" = "$key" ]; then
    cached "$image (content key $key)"
  else
    step "building $image from $dockerfile${target:+ (target $target)} on $base"
    heartbeat "building $image" quietly "$ctx.$binary.log" nice -n 19 docker build -q -f "$dockerfile" ${target:+--target "$target"} \
      --build-arg BASE_IMAGE="$base" --label "coder-conformance.content-key=$key" \
      -t "$image" "$ctx" \
      || { cat "$ctx.$binary.log" >&2; rm -f "$ctx.$binary.log"; fail "docker build of $image failed"; }
    rm -f "$ctx.$binary.log"
    step_done "$(docker image inspect --format '{{.Size}}' "$image" | awk '{printf "%d MB", $1/1e6}')"
    built=$((built + 1))
  fi
  if [ $verify = 1 ]; then
    # `--help` prints usage (the stub daemon prints its usage line and exits 2): proof that the
    # binary loads and runs on the base image, as the image's user.
    local out
    out="$(docker run --rm "$image" --help 2>&1)" || true
    grep -qi 'usage' <<<"$out" || fail "$image does not run: docker run --rm $image --help printed: $(head -n 2 <<<"$out")"
    log "  $image runs as user $(docker image inspect --format '{{.Config.User}}' "$image"): $(grep -i -m1 'usage' <<<"$out")"
  fi
  echo "$image"
}

build "coder-provisioner-operator:$tag" operator/Dockerfile.prebuilt "" coder-provisioner-operator
build "fake-coderd:$tag" fake-coderd/Dockerfile.prebuilt fake-coderd fake-coderd
build "coder-stub:$tag" fake-coderd/Dockerfile.prebuilt coder-stub coder-stub
log "${#binaries[@]} images ready in $((SECONDS - total_start)) s ($built built, $((${#binaries[@]} - built)) cached)"
# Sizes (docs/tiers.md lists them): the image, its base, and the binary it adds.
base_size="$(docker image inspect --format '{{.Size}}' "$base")"
for pair in coder-provisioner-operator:coder-provisioner-operator fake-coderd:fake-coderd coder-stub:coder-stub; do
  image="${pair%%:*}:$tag" binary="${pair##*:}"
  size="$(docker image inspect --format '{{.Size}}' "$image")"
  log "$(printf '  size %-34s %6s MB (base %s MB + binary %s MB)' "$image" \
    "$(mb "$size")" "$(mb "$base_size")" \
    "$(mb "$(stat -c %s "$ctx/$binary")")")"
done
