#!/usr/bin/env bash
# Builds a kind node image for the pinned Kubernetes version without any image registry and prints
# its tag on stdout; progress goes to stderr.
#
# With internet and a cgroup v2 host, use kind's stock node image instead (the default of
# config/kind/kind-config.yaml). This script is for machines that reach only a Debian mirror and
# the Go module proxy. It follows kind's own base image recipe (images/base in the
# sigs.k8s.io/kind module: the same files, packages and systemd units) and kind's node image build
# (`kind build node-image`: binaries in /usr/bin, component images imported into the node's
# containerd), with every piece made here:
#   - Debian bookworm root from scripts/base-image.sh; systemd, iptables, runc … from the mirror;
#   - kubelet, kubeadm, kube-scheduler, kube-proxy built from k8s.io/kubernetes (Go module proxy;
#     kube-apiserver, kube-controller-manager and kubectl come from scripts/k8s-binaries.sh);
#   - etcd, CoreDNS, containerd, crictl and the CNI plugins built from the Go module proxy;
#     pause compiled from Kubernetes' pause.c;
#   - component images (kube-*, etcd, coredns, pause) built on the local base image and imported
#     into the node's containerd image store with the tags `kubeadm config images list` prints;
#   - networking: the CNI "bridge" plugin (one node, pod range 10.244.0.0/24) baked into
#     /etc/cni/net.d instead of kindnetd, whose image is not part of the kind module.
#
# Caching (per-user cache, $XDG_CACHE_HOME or ~/.cache, folder coder-provisioner-conformance):
#   kind-node-bits/<component>-<version>/  the built binaries, reused by any later build;
#   kind-node/<tag>.tar                    the node image (`docker save`), loaded when the engine
#                                          lacks it; the tag carries a content key over this
#                                          script, the versions and the base image's tag.
#
# Usage: scripts/kind-node-image.sh        # prints e.g. coder-conformance/kind-node:v1.37.2-1a2b3c4d5e6f
# Env:   KIND_NODE_IMAGE_REBUILD=1 ignores the cached node image (not the cached binaries);
#        KIND_NODE_IMAGE_TAG overrides the tag.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
. "$here/progress.sh"
fail() { printf 'kind-node-image: %s\n' "$*" >&2; exit 1; }

# Versions. Kubernetes is pinned in scripts/k8s-binaries.sh (the one place); the others are the
# releases kind v0.33.0's base image uses, or the ones kubeadm of that Kubernetes asks for.
KUBERNETES_VERSION="${KUBERNETES_VERSION:-$(sed -n 's/^KUBERNETES_VERSION="\${KUBERNETES_VERSION:-\(v[0-9.]*\)}"$/\1/p' "$here/k8s-binaries.sh")}"
[ -n "$KUBERNETES_VERSION" ] || fail "cannot read KUBERNETES_VERSION from scripts/k8s-binaries.sh"
KIND_VERSION=v0.33.0
ETCD_VERSION=v3.7.0           # kubeadm v1.37's default etcd (constants.DefaultEtcdVersion 3.7.0-0)
COREDNS_VERSION=v1.14.6       # kubeadm v1.37's CoreDNSVersion
CONTAINERD_VERSION=v2.3.7     # kind v0.33.0 uses v2.3.x
CRICTL_VERSION=v1.37.0
CNI_PLUGINS_VERSION=v1.9.1    # as kind v0.33.0
# runc: Debian's package (its seccomp support needs cgo and libseccomp).

cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/coder-provisioner-conformance"
bits="$cache_root/kind-node-bits"
export GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0 GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

docker info >/dev/null 2>&1 || fail "no Docker engine answers (run scripts/docker-engine.sh)"
base_image="$(bash "$here/base-image.sh")" || fail "the local base image could not be made (scripts/base-image.sh)"
# The base image's tag (it carries scripts/base-image.sh's own key), not its id: a re-import of the
# cached root on a fresh engine gets a new id but must still find the saved node image.
key="$( { cat "$0"; echo "$KUBERNETES_VERSION $KIND_VERSION $ETCD_VERSION $COREDNS_VERSION $CONTAINERD_VERSION $CRICTL_VERSION $CNI_PLUGINS_VERSION $base_image"; } | sha256sum | cut -c1-12)"
tag="${KIND_NODE_IMAGE_TAG:-coder-conformance/kind-node:${KUBERNETES_VERSION}-${key}}"
saved="$cache_root/kind-node/${tag//[\/:]/_}.tar"

if [ "${KIND_NODE_IMAGE_REBUILD:-0}" != 1 ]; then
  if docker image inspect "$tag" >/dev/null 2>&1; then
    cached "node image $tag (in the engine)"
    echo "$tag"; exit 0
  fi
  if [ -s "$saved" ]; then
    step "loading the cached node image $tag from $saved"
    docker load -i "$saved" >/dev/null || fail "docker load -i $saved failed"
    step_done
    echo "$tag"; exit 0
  fi
fi
total_start=$SECONDS
command -v go >/dev/null 2>&1 || fail "Go is needed to build the node image's binaries: install Go >= 1.26"

work="$(mktemp -d /tmp/kind-node-image.XXXXXX)"
build_container=""
cleanup() {
  [ -z "$build_container" ] || docker rm -f "$build_container" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

# go_build DEST MODULE@VERSION LDFLAGS TAGS PKG:NAME...  builds packages of one module (and its
# dependencies as the module requires them) into DEST, in a throwaway module of its own.
go_build() {
  local dest=$1 modver=$2 ldflags=$3 tags=$4; shift 4
  local spec pkg name missing=0
  for spec in "$@"; do [ -x "$dest/${spec##*:}" ] || missing=1; done
  if [ $missing = 0 ]; then cached "$modver ($dest)"; return 0; fi
  step "building ${modver} ($(for s in "$@"; do printf '%s ' "${s##*:}"; done)) from the Go module proxy"
  local mod="$work/mod-${RANDOM}"
  mkdir -p "$mod" "$dest.tmp"
  ( cd "$mod" && go mod init kind-node-image/build >/dev/null 2>&1 && go get "$modver" >"$mod.log" 2>&1 ) \
    || fail "go get $modver failed: $(tail -n 3 "$mod.log")"
  for spec in "$@"; do
    pkg=${spec%%:*}; name=${spec##*:}
    ( cd "$mod" && timed "  go build $name" nice -n 19 go build -trimpath -tags "$tags" -ldflags "-s -w $ldflags" -o "$dest.tmp/$name" "$pkg" ) \
      || fail "go build $pkg ($modver) failed"
  done
  mkdir -p "$dest"; mv "$dest.tmp"/* "$dest"/; rmdir "$dest.tmp"
  step_done
}

# --- binaries ---------------------------------------------------------------------------------
kind_dir="$(cd /tmp && go mod download -json "sigs.k8s.io/kind@${KIND_VERSION}" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')"
[ -d "$kind_dir/images/base/files" ] || fail "sigs.k8s.io/kind@${KIND_VERSION} has no images/base/files (Go module proxy unreachable?)"
k8s_dir="$(cd /tmp && go mod download -json "k8s.io/kubernetes@${KUBERNETES_VERSION}" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')"
[ -f "$k8s_dir/build/pause/linux/pause.c" ] || fail "k8s.io/kubernetes@${KUBERNETES_VERSION} has no build/pause/linux/pause.c"

etcd_dir="$bits/etcd-${ETCD_VERSION}"
go_build "$etcd_dir" "go.etcd.io/etcd/server/v3@${ETCD_VERSION}" "" "" go.etcd.io/etcd/server/v3:etcd

coredns_dir="$bits/coredns-${COREDNS_VERSION}"
go_build "$coredns_dir" "github.com/coredns/coredns@${COREDNS_VERSION}" \
  "-X github.com/coredns/coredns/coremain.GitCommit=${COREDNS_VERSION}" "" github.com/coredns/coredns:coredns

containerd_dir="$bits/containerd-${CONTAINERD_VERSION}"
go_build "$containerd_dir" "github.com/containerd/containerd/v2@${CONTAINERD_VERSION}" \
  "-X github.com/containerd/containerd/v2/version.Version=${CONTAINERD_VERSION} -X github.com/containerd/containerd/v2/version.Package=github.com/containerd/containerd/v2" \
  "no_aufs no_zfs no_btrfs no_devmapper" \
  github.com/containerd/containerd/v2/cmd/containerd:containerd \
  github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2:containerd-shim-runc-v2 \
  github.com/containerd/containerd/v2/cmd/ctr:ctr

crictl_dir="$bits/crictl-${CRICTL_VERSION}"
go_build "$crictl_dir" "sigs.k8s.io/cri-tools@${CRICTL_VERSION}" \
  "-X sigs.k8s.io/cri-tools/pkg/version.Version=${CRICTL_VERSION}" "" sigs.k8s.io/cri-tools/cmd/crictl:crictl

cni_dir="$bits/cni-plugins-${CNI_PLUGINS_VERSION}"
go_build "$cni_dir" "github.com/containernetworking/plugins@${CNI_PLUGINS_VERSION}" "" "" \
  github.com/containernetworking/plugins/plugins/main/bridge:bridge \
  github.com/containernetworking/plugins/plugins/main/loopback:loopback \
  github.com/containernetworking/plugins/plugins/main/ptp:ptp \
  github.com/containernetworking/plugins/plugins/ipam/host-local:host-local \
  github.com/containernetworking/plugins/plugins/meta/portmap:portmap

pause_dir="$bits/pause-${KUBERNETES_VERSION}"
if [ ! -x "$pause_dir/pause" ]; then
  command -v gcc >/dev/null 2>&1 || fail "gcc is needed to compile pause.c (apt-get install gcc libc6-dev)"
  step "compiling pause from k8s.io/kubernetes@${KUBERNETES_VERSION}/build/pause/linux/pause.c"
  mkdir -p "$pause_dir"
  nice -n 19 gcc -Os -Wall -Werror -static -DVERSION="${KUBERNETES_VERSION}-offline" \
    -o "$pause_dir/pause" "$k8s_dir/build/pause/linux/pause.c" || fail "gcc pause.c failed"
  step_done
else
  cached "pause ($pause_dir)"
fi

# Kubernetes: kube-apiserver, kube-controller-manager, kubectl from scripts/k8s-binaries.sh (shared
# with the local tier); kubelet, kubeadm, kube-scheduler, kube-proxy built the same way here.
# Another k8s-binaries.sh may be building right now (CI runs it first): wait instead of building twice.
while pgrep -f 'k8s-binaries\.sh' >/dev/null 2>&1; do
  log "waiting for a running scripts/k8s-binaries.sh to finish"; sleep 20
done
k8s_shared="$(bash "$here/k8s-binaries.sh")" || fail "scripts/k8s-binaries.sh failed"
k8s_node_dir="$bits/kubernetes-${KUBERNETES_VERSION}"
k8s_cmds=(kubelet kubeadm kube-scheduler kube-proxy)
missing=0
for c in "${k8s_cmds[@]}"; do [ -x "$k8s_node_dir/$c" ] || missing=1; done
if [ $missing = 1 ]; then
  step "building ${k8s_cmds[*]} ${KUBERNETES_VERSION} from the Go module proxy (several minutes on 2 cores)"
  k8s_minor="${KUBERNETES_VERSION#v1.}"; k8s_minor="${k8s_minor%%.*}"
  k8s_ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    k8s_ldflags+=" -X $pkg.gitVersion=${KUBERNETES_VERSION} -X $pkg.gitMajor=1 -X $pkg.gitMinor=${k8s_minor} -X $pkg.gitTreeState=clean"
  done
  staging_version="v0.${KUBERNETES_VERSION#v1.}"
  mkdir -p "$work/k8s" "$k8s_node_dir.tmp"
  ( cd "$work/k8s"
    go mod init kind-node-image/k8s >/dev/null 2>&1
    modfile="$(go mod download -json "k8s.io/kubernetes@${KUBERNETES_VERSION}" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')"
    grep -E '^\s+k8s\.io/[a-z0-9-]+ v0\.0\.0$' "$modfile" | awk '{print $1}' | while read -r m; do
      go mod edit -replace "$m=$m@${staging_version}"
    done
    go mod edit -require "k8s.io/kubernetes@${KUBERNETES_VERSION}"
    for c in "${k8s_cmds[@]}"; do
      go get "k8s.io/kubernetes/cmd/$c@${KUBERNETES_VERSION}" >>"$work/k8s-get.log" 2>&1 || { tail -n 3 "$work/k8s-get.log" >&2; exit 1; }
    done
    for c in "${k8s_cmds[@]}"; do
      timed "  go build $c" nice -n 19 go build -trimpath -ldflags "$k8s_ldflags" -o "$k8s_node_dir.tmp/$c" "k8s.io/kubernetes/cmd/$c" || exit 1
    done
  ) || fail "building ${k8s_cmds[*]} failed"
  mkdir -p "$k8s_node_dir"; mv "$k8s_node_dir.tmp"/* "$k8s_node_dir"/; rmdir "$k8s_node_dir.tmp"
  step_done
else
  cached "${k8s_cmds[*]} ${KUBERNETES_VERSION} ($k8s_node_dir)"
fi

# --- component images ---------------------------------------------------------------------------
# The names kubeadm will look for, e.g. registry.k8s.io/kube-apiserver:v1.37.2, plus the sandbox
# image kind's containerd config names.
mapfile -t wanted < <("$k8s_node_dir/kubeadm" config images list --kubernetes-version "$KUBERNETES_VERSION" 2>/dev/null)
[ ${#wanted[@]} -ge 6 ] || fail "kubeadm config images list printed no image list"
sandbox_image="$(sed -n 's/^ *sandbox_image *= *"\(.*\)"/\1/p' "$kind_dir/images/base/files/etc/containerd/config.toml")"
image_for() { local n; for n in "${wanted[@]}"; do case "$n" in */"$1":*) echo "$n"; return;; esac; done; fail "kubeadm lists no $1 image"; }

# component_image NAME DOCKERFILE-BODY FILES...   builds one image on the local base image.
component_tags=()
component_image() {
  local name=$1 body=$2; shift 2
  local ctx="$work/img-$name" t
  mkdir -p "$ctx"
  cp "$@" "$ctx"/
  printf 'ARG BASE_IMAGE\nFROM $BASE_IMAGE\n%s\n' "$body" >"$ctx/Dockerfile"
  t="coder-conformance/kind-node-component-${name}:${key}"
  nice -n 19 docker build -q --build-arg BASE_IMAGE="$base_image" -t "$t" "$ctx" >"$ctx.log" 2>&1 \
    || fail "building the $name component image failed: $(tail -n 3 "$ctx.log")"
  component_tags+=("$t")
}
step "building the component images (${wanted[*]##*/}, $sandbox_image)"
path_env='ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
for c in kube-apiserver kube-controller-manager; do
  component_image "$c" "COPY $c /usr/local/bin/$c
$path_env
ENTRYPOINT [\"/usr/local/bin/$c\"]" "$k8s_shared/$c"
  docker tag "${component_tags[-1]}" "$(image_for "$c")"
done
component_image kube-scheduler "COPY kube-scheduler /usr/local/bin/kube-scheduler
$path_env
ENTRYPOINT [\"/usr/local/bin/kube-scheduler\"]" "$k8s_node_dir/kube-scheduler"
docker tag "${component_tags[-1]}" "$(image_for kube-scheduler)"
# kube-proxy needs iptables; the wrapper picks the legacy or nft backend on first use, like
# upstream's iptables-wrapper (the node picks the same way in kind's entrypoint).
cat >"$work/iptables-wrapper" <<'EOF'
#!/bin/sh
# Chooses the iptables backend that already holds rules (legacy or nft), then runs the real command.
set -e
legacy=$( (iptables-legacy-save || true; ip6tables-legacy-save || true) 2>/dev/null | grep -c '^-' || true)
nft=$( (timeout 5 sh -c "iptables-nft-save; ip6tables-nft-save" || true) 2>/dev/null | grep -c '^-' || true)
if [ "${legacy:-0}" -gt "${nft:-0}" ]; then mode=legacy; else mode=nft; fi
update-alternatives --set iptables "/usr/sbin/iptables-$mode" >/dev/null
update-alternatives --set ip6tables "/usr/sbin/ip6tables-$mode" >/dev/null
exec "$0" "$@"
EOF
component_image kube-proxy "RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iptables conntrack ipset kmod >/dev/null && rm -rf /var/lib/apt/lists/*
COPY iptables-wrapper /usr/sbin/iptables-wrapper
RUN chmod 0755 /usr/sbin/iptables-wrapper \\
 && for t in iptables ip6tables; do update-alternatives --install /usr/sbin/\$t \$t /usr/sbin/iptables-wrapper 100 --slave /usr/sbin/\$t-restore \$t-restore /usr/sbin/iptables-wrapper --slave /usr/sbin/\$t-save \$t-save /usr/sbin/iptables-wrapper; done
COPY kube-proxy /usr/local/bin/kube-proxy
$path_env
ENTRYPOINT [\"/usr/local/bin/kube-proxy\"]" "$k8s_node_dir/kube-proxy" "$work/iptables-wrapper"
docker tag "${component_tags[-1]}" "$(image_for kube-proxy)"
component_image etcd "COPY etcd /usr/local/bin/etcd
$path_env
ENTRYPOINT [\"/usr/local/bin/etcd\"]" "$etcd_dir/etcd"
docker tag "${component_tags[-1]}" "$(image_for etcd)"
component_image coredns "COPY coredns /coredns
EXPOSE 53 53/udp
ENTRYPOINT [\"/coredns\"]" "$coredns_dir/coredns"
docker tag "${component_tags[-1]}" "$(image_for coredns)"
component_image pause "COPY pause /pause
USER 65535:65535
ENTRYPOINT [\"/pause\"]" "$pause_dir/pause"
docker tag "${component_tags[-1]}" "$(image_for pause)"
docker tag "${component_tags[-1]}" "$sandbox_image"
all_images=("${wanted[@]}" "$sandbox_image")
docker save -o "$work/images.tar" "${all_images[@]}" || fail "docker save of the component images failed"
docker rmi "${all_images[@]}" "${component_tags[@]}" >/dev/null 2>&1 || true
step_done

# --- the node image ------------------------------------------------------------------------------
step "building the node image from kind ${KIND_VERSION}'s base recipe on $base_image (apt-get from the Debian mirror)"
ctx="$work/node"
mkdir -p "$ctx/files" "$ctx/bin" "$ctx/cni" "$ctx/kube" "$ctx/extra/kind/manifests" "$ctx/extra/etc/cni/net.d"
cp -r "$kind_dir/images/base/files/." "$ctx/files/"
chmod -R u+w "$ctx/files"
cp "$containerd_dir"/containerd "$containerd_dir"/containerd-shim-runc-v2 "$containerd_dir"/ctr "$crictl_dir/crictl" "$ctx/bin/"
cp "$cni_dir"/* "$ctx/cni/"
cp "$k8s_node_dir/kubelet" "$k8s_node_dir/kubeadm" "$k8s_shared/kubectl" "$ctx/kube/"
printf '%s' "$KUBERNETES_VERSION" >"$ctx/extra/kind/version"
cat >"$ctx/extra/etc/cni/net.d/10-bridge.conflist" <<'EOF'
{
  "cniVersion": "1.0.0",
  "name": "kind-offline-bridge",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{ "subnet": "10.244.0.0/24" }]],
        "routes": [{ "dst": "0.0.0.0/0" }]
      }
    },
    { "type": "portmap", "capabilities": { "portMappings": true } }
  ]
}
EOF
# kind applies /kind/manifests/default-cni.yaml after kubeadm init; the bridge plugin needs no
# workload, so it only records what this image uses.
cat >"$ctx/extra/kind/manifests/default-cni.yaml" <<'EOF'
# would you kindly template this file
apiVersion: v1
kind: ConfigMap
metadata:
  name: kind-offline-cni
  namespace: kube-system
data:
  cni: "bridge plugin, /etc/cni/net.d/10-bridge.conflist in the node image (one node, pods in 10.244.0.0/24)"
  podSubnet: "{{ .PodSubnet }}"
EOF
cat >"$ctx/extra/kind/manifests/default-storage.yaml" <<'EOF'
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: standard
  annotations:
    storageclass.kubernetes.io/is-default-class: "true"
provisioner: kubernetes.io/host-path
EOF
# Kind's base Dockerfile, for the classic builder too (no COPY --chmod); the packages are kind's list
# plus runc.
cat >"$ctx/Dockerfile" <<'EOF'
ARG BASE_IMAGE
FROM $BASE_IMAGE
COPY files/ /
# restrict_oom_score_adj: on hosts whose capability bounding set lacks CAP_SYS_RESOURCE (these
# machines), runc cannot lower a container's oom_score_adj below the node's ("can't get final
# child's PID from pipe: EOF" for every pod sandbox); containerd then keeps it at the node's level.
RUN sed -i 's/^\( *restrict_oom_score_adj *= *\)false/\1true/' /etc/containerd/config.toml \
 && grep -q 'restrict_oom_score_adj = true' /etc/containerd/config.toml \
 && chmod 0755 /usr/local/bin/* /kind /kind/bin /kind/bin/* \
 && DEBIAN_FRONTEND=noninteractive clean-install \
      systemd \
      conntrack iptables nftables iproute2 ethtool util-linux mount kmod \
      libseccomp2 pigz fuse-overlayfs \
      nfs-common e2fsprogs \
      bash ca-certificates curl jq procps \
      runc >/dev/null \
 && find /lib/systemd/system/sysinit.target.wants/ -name "systemd-tmpfiles-setup.service" -delete \
 && rm -f /lib/systemd/system/multi-user.target.wants/* \
 && rm -f /etc/systemd/system/*.wants/* \
 && rm -f /lib/systemd/system/local-fs.target.wants/* \
 && rm -f /lib/systemd/system/sockets.target.wants/*udev* \
 && rm -f /lib/systemd/system/sockets.target.wants/*initctl* \
 && rm -f /lib/systemd/system/basic.target.wants/* \
 && echo "ReadKMsg=no" >> /etc/systemd/journald.conf \
 && ln -sf /usr/lib/systemd/systemd /sbin/init
RUN systemctl enable kubelet.service containerd.service undo-mount-hacks.service \
 && systemctl mask systemd-binfmt.service \
 && mkdir -p /etc/kubernetes/manifests
COPY bin/ /usr/local/bin/
COPY cni/ /opt/cni/bin/
COPY kube/ /usr/bin/
COPY extra/ /
RUN ctr oci spec \
      | jq '.hooks.createContainer[.hooks.createContainer| length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' \
      | jq 'del(.process.rlimits)' > /etc/containerd/cri-base.json \
 && containerd --version && runc --version | head -n 1 && kubelet --version
ENV container=docker
STOPSIGNAL SIGRTMIN+3
ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]
EOF
heartbeat "building the node image" quietly "$work/node-build.log" nice -n 19 docker build --build-arg BASE_IMAGE="$base_image" -t "$tag-stage" "$ctx" \
  || { cp "$work/node-build.log" /tmp/kind-node-image-build.log; fail "docker build of the node image failed (log: /tmp/kind-node-image-build.log): $(tail -n 3 "$work/node-build.log")"; }
step_done

step "importing ${#all_images[@]} component images into the node's containerd (as kind build node-image does)"
build_container="kind-node-build-$$"
docker run -d --name "$build_container" --entrypoint sleep --security-opt seccomp=unconfined "$tag-stage" infinity >/dev/null \
  || fail "could not start the node build container"
docker exec "$build_container" bash -c 'nohup containerd >/var/log/containerd-build.log 2>&1 &'
docker exec "$build_container" bash -c 'for i in $(seq 1 30); do [ -S /run/containerd/containerd.sock ] && ctr version >/dev/null 2>&1 && exit 0; sleep 1; done; cat /var/log/containerd-build.log; exit 1' >&2 \
  || fail "containerd did not start in the node build container"
docker exec -i "$build_container" ctr --namespace=k8s.io images import --label=io.cri-containerd.pinned=pinned \
  --all-platforms --no-unpack --digests - <"$work/images.tar" >"$work/import.log" 2>&1 \
  || fail "ctr images import failed: $(tail -n 3 "$work/import.log")"
imported="$(docker exec "$build_container" ctr --namespace=k8s.io images list -q | grep -vc '@sha256:' || true)"
docker exec "$build_container" bash -c 'pkill containerd; for i in $(seq 1 20); do pgrep containerd >/dev/null || exit 0; sleep 0.5; done'
docker exec "$build_container" rm -f /var/log/containerd-build.log
docker commit \
  --change 'ENTRYPOINT [ "/usr/local/bin/entrypoint", "/sbin/init" ]' \
  "$build_container" "$tag" >/dev/null || fail "docker commit of the node image failed"
docker rm -f "$build_container" >/dev/null; build_container=""
docker rmi "$tag-stage" >/dev/null 2>&1 || true
log "  $imported image names in the node's containerd"
step_done

step "saving $tag to $saved (for engines that lack it)"
mkdir -p "$(dirname "$saved")"
# Older node images (other content keys) in the cache are replaced, not accumulated.
find "$cache_root/kind-node" -maxdepth 1 -name '*.tar*' ! -name "$(basename "$saved")" -delete
docker save -o "$saved.tmp" "$tag" && mv "$saved.tmp" "$saved" || log "warning: could not save the node image to $saved"
step_done
log "node image $tag ready ($((SECONDS - total_start)) s in all)"
echo "$tag"
