#!/usr/bin/env bash
# The k3s tier end to end: like scripts/kind-e2e.sh, with k3s (rancher/k3s in a privileged
# Docker container, started by testcontainers) instead of kind.
#
# Usage: scripts/k3s-e2e.sh [--keep] [-- <extra `conformance run` arguments>]
#   --keep  leave the k3s containers running; remove them with docker rm -f <id> (printed)
# Needs: a Docker engine that may run privileged containers, cargo.
set -euo pipefail
cd "$(dirname "$0")/.."

keep=0
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --keep) keep=1; shift ;;
    --) shift; extra=("$@"); break ;;
    *) echo "k3s-e2e: unknown argument $1 (usage: scripts/k3s-e2e.sh [--keep] [-- <conformance run arguments>])" >&2; exit 2 ;;
  esac
done

for tool in docker cargo; do
  command -v "$tool" >/dev/null || { echo "k3s-e2e: $tool is not installed" >&2; exit 2; }
done
docker info --format '{{.ServerVersion}}' >/dev/null || { echo "k3s-e2e: no Docker engine is reachable" >&2; exit 2; }

keep_args=()
if [[ $keep == 1 ]]; then
  export CONFORMANCE_KEEP_CLUSTER=1
  keep_args=(--keep-cluster)
fi

echo "== k3s tier: images, k3s container, operator, fake coderd, stub daemon (cargo test --test tiers k3s -- --ignored)"
cargo test -p conformance --locked --test tiers k3s -- --ignored

echo "== conformance suite on k3s (reports in reports/)"
cargo run -p conformance --locked -- run --cluster k3s "${keep_args[@]}" --report-dir reports "${extra[@]}"
