#!/usr/bin/env bash
# The kind tier end to end, as CI runs it (.github/workflows/e2e-kind.yaml):
#   1. the Docker-only tier test: builds the three images (operator, fake-coderd, coder-stub),
#      creates a kind cluster, installs CRDs, RBAC, the operator and the fake coderd, and checks
#      that a provisioner pod running the stub daemon authenticates with the operator's key;
#   2. the conformance suite against that stack: `conformance run --cluster kind`, reports in
#      reports/ (junit.xml, cucumber.json, conformance-report.yaml).
#
# Usage: scripts/kind-e2e.sh [--keep] [-- <extra `conformance run` arguments>]
#   --keep  leave the kind clusters running (a later run reuses them); delete them with
#           kind delete cluster --name coder-conformance-tiers
#           kind delete cluster --name coder-conformance
# Needs: a Docker engine, kind (v0.33.0 or newer), cargo.
set -euo pipefail
cd "$(dirname "$0")/.."

keep=0
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --keep) keep=1; shift ;;
    --) shift; extra=("$@"); break ;;
    *) echo "kind-e2e: unknown argument $1 (usage: scripts/kind-e2e.sh [--keep] [-- <conformance run arguments>])" >&2; exit 2 ;;
  esac
done

for tool in docker kind cargo; do
  command -v "$tool" >/dev/null || { echo "kind-e2e: $tool is not installed" >&2; exit 2; }
done
docker info --format '{{.ServerVersion}}' >/dev/null || { echo "kind-e2e: no Docker engine is reachable" >&2; exit 2; }

keep_args=()
if [[ $keep == 1 ]]; then
  export CONFORMANCE_KEEP_CLUSTER=1
  keep_args=(--keep-cluster)
fi

echo "== kind tier: images, cluster, operator, fake coderd, stub daemon (cargo test --test tiers kind -- --ignored)"
cargo test -p conformance --locked --test tiers kind -- --ignored

echo "== conformance suite on kind (reports in reports/)"
cargo run -p conformance --locked -- run --cluster kind "${keep_args[@]}" --report-dir reports "${extra[@]}"
