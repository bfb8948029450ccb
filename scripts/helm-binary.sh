#!/usr/bin/env bash
# Resolves the helm binary that lints and renders the reference operator's chart
# (config/helm/coder-provisioner-operator; checked by conformance/tests/helm_chart.rs) and prints
# its path on stdout; progress goes to stderr.
#
# Order: per-user cache -> `go install` of the pinned version below from the Go module proxy into
# that cache. A helm on the PATH is not used: the chart is checked with the pinned release only.
set -euo pipefail

# The one place where the helm version is pinned.
HELM_VERSION="${HELM_VERSION:-v4.3.2}"

# log, timed (a step with heartbeats every 30 s): a first run's minutes of Go build are never silent.
. "$(dirname "$0")/progress.sh"

cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/coder-provisioner-conformance"
dest="$cache_root/helm-${HELM_VERSION}"
if [ -x "$dest/helm" ]; then
  log "cached: using $dest/helm (built earlier; delete the folder to rebuild)"
  echo "$dest/helm"
  exit 0
fi

command -v go >/dev/null 2>&1 || {
  log "Go is not installed: install Go >= 1.26 (https://go.dev/dl) to build helm ${HELM_VERSION}, or put a helm ${HELM_VERSION} binary at $dest/helm"
  exit 1
}

# Built into a temporary folder and moved into place only when complete, so an interrupted build
# never leaves a half-written binary that a later run would take for the cached one.
mkdir -p "$cache_root"
work="$(mktemp -d "$cache_root/build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0 GOTOOLCHAIN="${GOTOOLCHAIN:-local}" GOBIN="$work/bin"
# What helm's own Makefile stamps for a tagged release, so `helm version` reports the real release.
ldflags="-s -w -X helm.sh/helm/v4/internal/version.version=${HELM_VERSION} -X helm.sh/helm/v4/internal/version.gitTreeState=clean"

# Go's own lines (module downloads, errors) go to stderr with the script's prefix.
install_helm() {
  go install -trimpath -ldflags "$ldflags" "helm.sh/helm/v4/cmd/helm@${HELM_VERSION}" 2>&1 \
    | sed "s/^/[$progress_prefix]   /" >&2
}

start=$SECONDS
timed "building helm ${HELM_VERSION} (go install from the Go module proxy; 2-3 minutes on 2 cores)" install_helm

mkdir -p "$dest"
mv "$work/bin/helm" "$dest/helm"
log "helm ready at $dest/helm ($((SECONDS - start)) s of build, cached for later runs)"
echo "$dest/helm"
