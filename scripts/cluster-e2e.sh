#!/usr/bin/env bash
# A Docker-backed tier end to end (kind or k3s), as CI runs it (.github/workflows/e2e-kind.yaml):
#   1. the Docker-only tier test: builds the three images (operator, fake-coderd, coder-stub),
#      creates the cluster (kind, or k3s in a container through testcontainers), installs CRDs,
#      RBAC, the operator and the fake coderd, and checks that a provisioner pod running the stub
#      daemon authenticates with the operator's key; then the fake coderd's image alone, started
#      through testcontainers;
#   2. the conformance suite against that stack: `conformance run --cluster <tier>`, reports in
#      reports/ (junit.xml, cucumber.json, conformance-report.yaml).
#
#   3. with --helm-test (kind): `helm test` of the chart on the suite's cluster (scripts/helm-test-kind.sh):
#      it must pass with the operator running and fail with it scaled to 0.
#
# Usage: scripts/cluster-e2e.sh kind|k3s [--keep] [--helm-test] [-- <extra `conformance run` arguments>]
#   --helm-test  (kind) then run scripts/helm-test-kind.sh on the suite's cluster, deleted after it
#   --keep  leave the cluster running (a later kind run reuses it); delete kind clusters with
#           kind delete cluster --name coder-conformance-tiers
#           kind delete cluster --name coder-conformance
# Needs: cargo, and a Docker engine (as root, scripts/docker-engine.sh installs and starts one when
# none answers); kind v0.33.0 or newer for the kind tier (built from the Go module proxy into
# ~/.cache when missing and Go is installed). Images are built from host binaries
# (CONFORMANCE_IMAGE_BUILD=prebuilt, the default; `dockerfile` builds the multi-stage Dockerfiles,
# which needs internet). Each failing step is one line naming it; kind logs go to reports/.
# Env: KIND_NODE_IMAGE=offline  build the node image here (scripts/kind-node-image.sh), for hosts
#      without a registry or with cgroup v1; the tag is passed on in KIND_NODE_IMAGE.
set -euo pipefail
cd "$(dirname "$0")/.."

tier="${1:-}"
case "$tier" in
  kind) tools=(docker kind cargo) ;;
  k3s) tools=(docker cargo) ;;
  *) echo "usage: scripts/cluster-e2e.sh kind|k3s [--keep] [-- <conformance run arguments>]" >&2; exit 2 ;;
esac
shift

keep=0
helm_test=0
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --keep) keep=1; shift ;;
    --helm-test) helm_test=1; shift ;;
    --) shift; extra=("$@"); break ;;
    *) echo "$tier-e2e: unknown argument $1 (usage: scripts/$tier-e2e.sh [--keep] [--helm-test] [-- <conformance run arguments>])" >&2; exit 2 ;;
  esac
done

started=$SECONDS
# The engine: one that answers is used as it is; as root (CI), scripts/docker-engine.sh installs
# Debian's docker.io and starts dockerd when none answers.
if ! docker info --format '{{.ServerVersion}}' >/dev/null 2>&1; then
  if [[ $(id -u) == 0 ]]; then
    echo "== Docker engine (scripts/docker-engine.sh)"
    bash scripts/docker-engine.sh || { echo "$tier-e2e: step 'docker engine' failed (scripts/docker-engine.sh)" >&2; exit 2; }
  else
    echo "$tier-e2e: step 'docker engine' failed: no Docker engine is reachable (start one; as root, scripts/docker-engine.sh installs and starts Debian's)" >&2
    exit 2
  fi
fi
# kind: the one on the PATH (v0.33.0 or newer), else the per-user cache, else built once from the
# Go module proxy (scripts/kind-binary.sh).
if [[ $tier == kind ]]; then
  kind_bin="$(bash scripts/kind-binary.sh)" || { echo "$tier-e2e: step 'kind' failed (scripts/kind-binary.sh)" >&2; exit 2; }
  export PATH="$(dirname "$kind_bin"):$PATH"
fi
# kubectl (diagnostics and a few steps use it): the pinned one of the local tier when none is installed.
if ! command -v kubectl >/dev/null; then
  assets="$(bash scripts/k8s-binaries.sh)" || { echo "$tier-e2e: step 'kubectl' failed (scripts/k8s-binaries.sh)" >&2; exit 2; }
  export PATH="$assets:$PATH"
fi
for tool in "${tools[@]}"; do
  command -v "$tool" >/dev/null || { echo "$tier-e2e: $tool is not installed" >&2; exit 2; }
done
# KIND_NODE_IMAGE=offline: build (or reuse) the node image made here without a registry
# (scripts/kind-node-image.sh) once, and pass its tag on in KIND_NODE_IMAGE.
if [[ $tier == kind && ${KIND_NODE_IMAGE:-} == offline ]]; then
  step=$SECONDS
  KIND_NODE_IMAGE="$(bash scripts/kind-node-image.sh)" || { echo "$tier-e2e: step 'node image' failed (scripts/kind-node-image.sh)" >&2; exit 2; }
  export KIND_NODE_IMAGE
  echo "== kind node image: $KIND_NODE_IMAGE ($((SECONDS - step)) s)"
fi

keep_args=()
if [[ $keep == 1 ]]; then
  export CONFORMANCE_KEEP_CLUSTER=1
  keep_args=(--keep-cluster)
fi

echo "== $tier tier: images, cluster, operator, fake coderd, stub daemon (cargo test --test tiers $tier -- --ignored)"
step=$SECONDS
cargo test -p conformance --locked --test tiers "$tier" -- --ignored
echo "== $tier tier test passed in $((SECONDS - step)) s"
# The images' sizes (docs/tiers.md lists them): scripts/images.sh again, every image cached now.
image_bins="${CONFORMANCE_IMAGE_BIN_DIR:-${CONFORMANCE_IMAGE_TARGET_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/coder-provisioner-conformance/target-image}/image}"
bash scripts/images.sh --bin-dir "$image_bins" >/dev/null || echo "$tier-e2e: scripts/images.sh could not print the images' sizes" >&2

# The fake coderd's image on its own, through testcontainers (the path the k3s tier takes, which
# has no image on hosts without a registry).
echo "== fake coderd image in a container through testcontainers (cargo test --test tiers fake_coderd_image -- --ignored)"
cargo test -p conformance --locked --test tiers fake_coderd_image -- --ignored

if [[ $helm_test == 1 ]]; then
  [[ $tier == kind ]] || { echo "$tier-e2e: --helm-test is for the kind tier" >&2; exit 2; }
  if [[ $keep == 0 ]]; then
    # The suite's cluster stays for helm test, and is deleted after it (and on any failure).
    keep_args=(--keep-cluster)
    trap 'kind delete cluster --name coder-conformance >/dev/null 2>&1 || true' EXIT
  fi
fi

echo "== conformance suite on $tier (reports in reports/)"
step=$SECONDS
cargo run -p conformance --locked -- run --cluster "$tier" "${keep_args[@]}" --report-dir reports "${extra[@]}"
echo "== conformance suite on $tier passed in $((SECONDS - step)) s (total $((SECONDS - started)) s)"

if [[ $helm_test == 1 ]]; then
  echo "== helm test of the chart on the suite's kind cluster (scripts/helm-test-kind.sh)"
  step=$SECONDS
  bash scripts/helm-test-kind.sh --cluster coder-conformance
  echo "== helm test on kind done in $((SECONDS - step)) s (total $((SECONDS - started)) s)"
fi
