#!/usr/bin/env bash
# Runs the whole suite through `--cluster kubeconfig` against a local control plane started
# separately, with the reference operator run as config/manager runs it (leader election on,
# JSON logs) under config/rbac only. Usage: scripts/kubeconfig-tier.sh [REPORT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
report_dir="${1:-reports/kubeconfig-tier}"
bin=target/debug
[ -x "$bin/conformance" ] && [ -x "$bin/coder-provisioner-operator" ] || cargo build --bins --locked

scratch="$(mktemp -d)"
kubeconfig="$scratch/kubeconfig"
"$bin/conformance" local-cluster --kubeconfig-out "$kubeconfig" &
cluster_pid=$!
trap 'kill "$cluster_pid" 2>/dev/null || true; wait "$cluster_pid" 2>/dev/null || true; rm -rf "$scratch"' EXIT

deadline=$((SECONDS + 180))
until [ -s "$kubeconfig" ]; do
  kill -0 "$cluster_pid" 2>/dev/null || { echo "the local control plane exited before it was ready" >&2; exit 1; }
  [ "$SECONDS" -lt "$deadline" ] || { echo "the local control plane was not ready within 180 s" >&2; exit 1; }
  sleep 1
done

"$bin/conformance" run --cluster kubeconfig --kubeconfig "$kubeconfig" --report-dir "$report_dir" \
  --operator-cmd "$PWD/$bin/coder-provisioner-operator run --leader-election=true --log-format=json --metrics-addr 127.0.0.1:0"
"$bin/conformance" verify-report "$report_dir/conformance-report.yaml"
