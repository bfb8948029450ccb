#!/usr/bin/env bash
# Makes the small runtime base of the images (config/images/small-base.Dockerfile) without any
# image registry, from the local Debian bookworm root of scripts/base-image.sh, and prints its tag
# on stdout; progress on stderr. The tag is keyed by the Dockerfile and the Debian root, so a
# second run says "cached".
#
# Usage: scripts/small-base-image.sh [--shell]
#   --shell  the variant with bash (the suite's image); default: no shell (operator, fake coderd,
#            stub daemon)
set -euo pipefail
cd "$(dirname "$0")/.."
target=small
case "${1:-}" in
  --shell) target=small-shell ;;
  "") ;;
  *) echo "usage: scripts/small-base-image.sh [--shell]" >&2; exit 2 ;;
esac
. scripts/progress.sh
fail() { printf 'small-base-image: %s\n' "$*" >&2; exit 1; }

docker info >/dev/null 2>&1 || fail "no Docker engine answers (run scripts/docker-engine.sh)"
debian="$(bash scripts/base-image.sh)" || fail "the Debian root could not be made (scripts/base-image.sh)"
debian_id="$(docker image inspect --format '{{.Id}}' "$debian")"
key="$( { sha256sum config/images/small-base.Dockerfile | cut -d' ' -f1; echo "$debian_id $target"; } | sha256sum | cut -c1-12)"
tag="coder-conformance/$target:$key"
if docker image inspect "$tag" >/dev/null 2>&1; then
  cached "$tag (in the engine)"
  echo "$tag"
  exit 0
fi
ctx="$(mktemp -d /tmp/small-base-context.XXXXXX)"
trap 'rm -rf "$ctx"' EXIT
step "building $tag from config/images/small-base.Dockerfile on $debian"
docker build -q -f config/images/small-base.Dockerfile --target "$target" --build-arg FROM_IMAGE="$debian" \
  -t "$tag" "$ctx" >"$ctx.log" 2>&1 || { cat "$ctx.log" >&2; rm -f "$ctx.log"; fail "docker build of $tag failed"; }
rm -f "$ctx.log"
step_done "$(docker image inspect --format '{{.Size}}' "$tag" | awk '{printf "%.1f MB", $1/1e6}')"
echo "$tag"
