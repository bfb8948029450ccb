#!/usr/bin/env bash
# Resolves kind and prints the path of its binary on stdout; progress goes to stderr.
#
# Order: a `kind` on the PATH whose version is at least $KIND_VERSION -> per-user cache ->
# `go install sigs.k8s.io/kind@$KIND_VERSION` from the Go module proxy into that cache.
set -euo pipefail

KIND_VERSION="${KIND_VERSION:-v0.33.0}"
cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/coder-provisioner-conformance"
dest="$cache_root/kind-${KIND_VERSION}"

log() { printf '[kind-binary] %s\n' "$*" >&2; }
fail() { printf 'kind-binary: %s\n' "$*" >&2; exit 1; }

version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]; }

if path="$(command -v kind 2>/dev/null)"; then
  have="$(kind version 2>/dev/null | awk '{print $2}')"
  if [ -n "$have" ] && version_ge "$have" "$KIND_VERSION"; then
    log "using $path ($have)"
    echo "$path"
    exit 0
  fi
fi

if [ -x "$dest/kind" ]; then
  log "using cached $dest/kind"
  echo "$dest/kind"
  exit 0
fi

command -v go >/dev/null 2>&1 || fail "kind ${KIND_VERSION} is not installed and Go is missing: install kind (https://kind.sigs.k8s.io) or Go >= 1.24"
log "building kind ${KIND_VERSION} from the Go module proxy (about a minute)"
mkdir -p "$dest"
GOBIN="$dest/bin.tmp" GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0 GOTOOLCHAIN="${GOTOOLCHAIN:-local}" \
  nice -n 19 go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kind@${KIND_VERSION}" \
  || fail "go install sigs.k8s.io/kind@${KIND_VERSION} failed"
mv "$dest/bin.tmp/kind" "$dest/kind"
rmdir "$dest/bin.tmp"
log "kind ready: $("$dest/kind" version)"
echo "$dest/kind"
