#!/usr/bin/env bash
# `helm test` of the reference operator's chart on the kind tier's cluster, which
# `conformance run --cluster kind` installed the operator in with the chart (release
# coder-provisioner-operator in coder-system) beside the fake coderd, and kept (--keep-cluster):
#   1. the suite's image (scripts/suite-image.sh) loaded into the cluster;
#   2. the tutorial's control plane coder/codercontrolplane-sample, Ready, pointing at the
#      in-cluster fake coderd with its operator token (scripts/control-plane-fixture.sh; the token
#      read from the fake's admin API through a port-forward, never printed), provisioner pods
#      running the stub daemon;
#   3. `helm upgrade --reuse-values` turning the chart's test on (test.*), then `helm test`: it must
#      pass, and leave no CoderProvisioner behind;
#   4. the operator's Deployment scaled to 0: `helm test` must FAIL (a pass fails this script; its
#      waits scaled by 0.25, as only the failure is checked); then scaled back and available again.
# Usage: scripts/helm-test-kind.sh [--cluster NAME] [--timeout DURATION]
#   --cluster  the kind cluster (default coder-conformance, the suite's)
#   --timeout  helm test's timeout (default 15m)
# Needs kind, kubectl, docker, curl, python3, and the suite's release binary the kind tier built
# (scripts/suite-image.sh's default).
set -euo pipefail
cd "$(dirname "$0")/.."
cluster=coder-conformance timeout=15m
while [ $# -gt 0 ]; do
  case "$1" in
    --cluster) cluster=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    *) echo "usage: scripts/helm-test-kind.sh [--cluster NAME] [--timeout DURATION]" >&2; exit 2 ;;
  esac
done
fail() { echo "helm-test-kind: $*" >&2; exit 1; }
release=coder-provisioner-operator namespace=coder-system
chart=config/helm/coder-provisioner-operator
coderd_url=http://fake-coderd.coder-fake.svc:3000
started=$SECONDS

helm="$(bash scripts/helm-binary.sh)" || fail "step 'helm' failed (scripts/helm-binary.sh)"
work="$(mktemp -d /tmp/helm-test-kind.XXXXXX)"
pf_pid=""
cleanup() { [ -z "$pf_pid" ] || kill "$pf_pid" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
kind get kubeconfig --name "$cluster" > "$work/kubeconfig" || fail "no kind cluster $cluster (run the kind tier with --keep-cluster)"
export KUBECONFIG="$work/kubeconfig"
export HELM_CACHE_HOME="$work/helm/cache" HELM_CONFIG_HOME="$work/helm/config" HELM_DATA_HOME="$work/helm/data"
"$helm" status "$release" -n "$namespace" >/dev/null || fail "no Helm release $release in $namespace (the kind tier installs it)"

echo "== suite image (scripts/suite-image.sh), loaded into kind cluster $cluster"
# Its binary: the release build the kind tier made with the other images' (scripts/suite-image.sh's default).
image="$(bash scripts/suite-image.sh)" || fail "step 'suite image' failed"
kind load docker-image --name "$cluster" "$image" >/dev/null || fail "step 'kind load $image' failed"

echo "== control plane coder/codercontrolplane-sample at the in-cluster fake coderd ($coderd_url)"
admin_token="$(kubectl get secret fake-coderd-admin -n coder-fake -o jsonpath='{.data.token}' | base64 -d)"
kubectl port-forward -n coder-fake svc/fake-coderd 0:3001 > "$work/port-forward.log" 2>&1 &
pf_pid=$!
port=""
for _ in $(seq 60); do
  port="$(sed -n 's/^Forwarding from 127.0.0.1:\([0-9]*\) .*/\1/p' "$work/port-forward.log" | head -n1)"
  [ -n "$port" ] && break
  sleep 0.5
done
[ -n "$port" ] || fail "step 'port-forward to the fake's admin API' failed: $(cat "$work/port-forward.log")"
# The admin token goes in a header file, not on curl's command line.
printf 'Authorization: Bearer %s\n' "$admin_token" > "$work/admin-header"
curl -sf -H @"$work/admin-header" "http://127.0.0.1:$port/__fake/info" \
  | python3 -c 'import json, sys; sys.stdout.write(json.load(sys.stdin)["operator_token"])' \
  | bash scripts/control-plane-fixture.sh --url "$coderd_url" --image coder-stub:dev \
  || fail "step 'control plane fixture' failed"
kill "$pf_pid" 2>/dev/null || true; pf_pid=""

echo "== helm upgrade --reuse-values: test.enabled"
repository="${image%:*}" tag="${image##*:}"
"$helm" upgrade "$release" "$chart" -n "$namespace" --reuse-values --skip-crds \
  --set test.enabled=true --set test.image.repository="$repository" --set test.image.tag="$tag" \
  --set test.image.pullPolicy=IfNotPresent --set test.coderdURL="$coderd_url" \
  --set test.controlPlane=coder/codercontrolplane-sample >/dev/null || fail "step 'helm upgrade' failed"
kubectl rollout status deployment/"$release" -n "$namespace" --timeout=300s >/dev/null

left_behind() { kubectl get coderprovisioners -n coder -o name; }

echo "== helm test with the operator running: must pass"
step=$SECONDS
if ! "$helm" test "$release" -n "$namespace" --timeout "$timeout" --logs > "$work/test-1.log" 2>&1; then
  tail -n 60 "$work/test-1.log"
  fail "helm test FAILED with the operator running (its log is above)"
fi
grep -E '^(Core|[0-9]+ scenarios|Phase:)|Phase' "$work/test-1.log" || true
echo "== helm test passed in $((SECONDS - step)) s"
[ -z "$(left_behind)" ] || fail "helm test left CoderProvisioners behind: $(left_behind | tr '\n' ' ')"

echo "== operator scaled to 0: helm test must fail (its waits × 0.25: only that it fails is checked here)"
# The smoke selection's first wait for the operator then gives up after a quarter of the kind
# tier's deadline; set before the scale-down, since an upgrade renders the Deployment again.
"$helm" upgrade "$release" "$chart" -n "$namespace" --reuse-values --skip-crds \
  --set test.timeoutScale=0.25 >/dev/null || fail "step 'helm upgrade' (test.timeoutScale) failed"
replicas="$(kubectl get deployment "$release" -n "$namespace" -o jsonpath='{.spec.replicas}')"
kubectl scale deployment "$release" -n "$namespace" --replicas=0 >/dev/null
kubectl wait pods -n "$namespace" -l app.kubernetes.io/component=manager,app.kubernetes.io/instance="$release" \
  --for=delete --timeout=120s >/dev/null
step=$SECONDS
if "$helm" test "$release" -n "$namespace" --timeout "$timeout" --logs > "$work/test-0.log" 2>&1; then
  tail -n 60 "$work/test-0.log"
  kubectl scale deployment "$release" -n "$namespace" --replicas="$replicas" >/dev/null
  fail "helm test PASSED with the operator scaled to 0: the test does not test the operator"
fi
# What failed (the scenario and its step), from the suite's own lines in the Pod's log.
grep -E -B1 -A4 '✘|Step failed' "$work/test-0.log" | head -n 20 || true
grep -E '^(Core|[0-9]+ scenarios)' "$work/test-0.log" || true
echo "== helm test failed with the operator at 0, as it must ($((SECONDS - step)) s)"
kubectl scale deployment "$release" -n "$namespace" --replicas="$replicas" >/dev/null
"$helm" upgrade "$release" "$chart" -n "$namespace" --reuse-values --skip-crds \
  --set test.timeoutScale= >/dev/null || fail "step 'helm upgrade' (test.timeoutScale back) failed"
kubectl rollout status deployment/"$release" -n "$namespace" --timeout=300s >/dev/null \
  || fail "the operator did not become available again after scaling back to $replicas"
[ -z "$(left_behind)" ] || fail "the failed helm test left CoderProvisioners behind: $(left_behind | tr '\n' ' ')"
echo "== helm test on kind: passed with the operator, failed without it (total $((SECONDS - started)) s)"
