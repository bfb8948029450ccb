#!/usr/bin/env bash
# Resolves the control-plane binaries (etcd, kube-apiserver, kube-controller-manager, kubectl)
# and prints the folder that holds them on stdout; progress goes to stderr.
#
# Order: $KUBEBUILDER_ASSETS (envtest convention) -> per-user cache -> build the pinned
# versions below from the Go module proxy into that cache.
set -euo pipefail

# The one place where the control-plane versions are pinned.
KUBERNETES_VERSION="${KUBERNETES_VERSION:-v1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
BINARIES=(etcd kube-apiserver kube-controller-manager kubectl)

# log, timed (a step with heartbeats every 30 s): a first run's many minutes of Go builds are
# never silent.
. "$(dirname "$0")/progress.sh"

have_all() {
  local dir=$1
  for b in "${BINARIES[@]}"; do [ -x "$dir/$b" ] || return 1; done
}

if [ -n "${KUBEBUILDER_ASSETS:-}" ]; then
  # envtest folders hold etcd, kube-apiserver and kubectl; the controller manager is optional there.
  for b in etcd kube-apiserver kubectl; do
    [ -x "$KUBEBUILDER_ASSETS/$b" ] || { log "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS has no executable $b"; exit 1; }
  done
  echo "$KUBEBUILDER_ASSETS"
  exit 0
fi

cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/coder-provisioner-conformance"
dest="$cache_root/k8s-${KUBERNETES_VERSION}-etcd-${ETCD_VERSION}"
if have_all "$dest"; then
  log "cached: using the binaries in $dest (built earlier; delete the folder to rebuild)"
  echo "$dest"
  exit 0
fi

command -v go >/dev/null 2>&1 || {
  log "Go is not installed: install Go >= 1.26 (https://go.dev/dl) or set KUBEBUILDER_ASSETS to a folder holding etcd, kube-apiserver and kubectl"
  exit 1
}

mkdir -p "$dest"
work="$(mktemp -d "$cache_root/build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0 GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
ldflags="-s -w"
# What Kubernetes' own build stamps, so `kubectl version` and /version report the real release.
k8s_minor="${KUBERNETES_VERSION#v1.}"; k8s_minor="${k8s_minor%%.*}"
k8s_ldflags="$ldflags"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  k8s_ldflags+=" -X $pkg.gitVersion=${KUBERNETES_VERSION} -X $pkg.gitMajor=1 -X $pkg.gitMinor=${k8s_minor} -X $pkg.gitTreeState=clean"
done

# Kubernetes: k8s.io/kubernetes is only buildable as a dependency when every staging module
# (required there as v0.0.0) is replaced by its published v0.x.y twin.
staging_version="v0.${KUBERNETES_VERSION#v1.}"
log "resolving k8s.io/kubernetes ${KUBERNETES_VERSION} (staging ${staging_version}) from the Go module proxy"
mkdir -p "$work/k8s" && cd "$work/k8s"
go mod init coder-provisioner-conformance/k8s >/dev/null 2>&1
modfile="$(go mod download -json "k8s.io/kubernetes@${KUBERNETES_VERSION}" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')"
grep -E '^\s+k8s\.io/[a-z0-9-]+ v0\.0\.0$' "$modfile" | awk '{print $1}' | while read -r m; do
  go mod edit -replace "$m=$m@${staging_version}"
done
go mod edit -require "k8s.io/kubernetes@${KUBERNETES_VERSION}"
for cmd in kube-apiserver kube-controller-manager kubectl; do
  log "downloading modules for $cmd"
  go get "k8s.io/kubernetes/cmd/$cmd@${KUBERNETES_VERSION}" 2>&1 | sed 's/^/[k8s-binaries]   /' >&2
done
total_start=$SECONDS
for cmd in kube-apiserver kube-controller-manager kubectl; do
  timed "building $cmd (a few minutes on 2 cores)" \
    go build -trimpath -ldflags "$k8s_ldflags" -o "$work/bin/$cmd" "k8s.io/kubernetes/cmd/$cmd"
done

# etcd: its server module has its own main package; build it in a module of its own so its
# dependencies do not mix with Kubernetes'.
log "building etcd ${ETCD_VERSION}"
mkdir -p "$work/etcd" && cd "$work/etcd"
go mod init coder-provisioner-conformance/etcd >/dev/null 2>&1
go get "go.etcd.io/etcd/server/v3@${ETCD_VERSION}" 2>&1 | sed 's/^/[k8s-binaries]   /' >&2
timed "building etcd" go build -trimpath -ldflags "$ldflags" -o "$work/bin/etcd" go.etcd.io/etcd/server/v3

mv "$work"/bin/* "$dest"/
log "binaries ready in $dest ($((SECONDS - total_start)) s of builds, cached for later runs)"
echo "$dest"
