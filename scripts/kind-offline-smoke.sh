#!/usr/bin/env bash
# Offline smoke test of the kind path, with nothing simulated: engine -> kind -> node image ->
# the three images -> `kind create cluster` -> a Ready node -> the fake coderd and the stub daemon
# as pods (the stub authenticates to the fake through a Service: CoreDNS, kube-proxy, the CNI).
# Prints the time of every step. On failure, `kind export logs` goes to $LOGS_DIR.
#
# Usage: scripts/kind-offline-smoke.sh [--keep]     (--keep leaves the cluster running)
# Env:   KIND_NODE_IMAGE  node image to use (default: scripts/kind-node-image.sh builds/reuses one)
#        CLUSTER_NAME     (default coder-conformance-smoke)   LOGS_DIR (default reports/kind-smoke-logs)
set -euo pipefail
cd "$(dirname "$0")/.."

keep=0
[ "${1:-}" = --keep ] && keep=1
name="${CLUSTER_NAME:-coder-conformance-smoke}"
logs_dir="${LOGS_DIR:-reports/kind-smoke-logs}"
log() { printf '[kind-smoke] %s\n' "$*" >&2; }
t0=$SECONDS; ts=$SECONDS
timed() { log "$1: $((SECONDS - ts)) s"; ts=$SECONDS; }

kind=""
fail() {
  printf 'kind-smoke: %s\n' "$*" >&2
  if [ -n "$kind" ] && "$kind" get clusters 2>/dev/null | grep -qx "$name"; then
    "$kind" export logs --name "$name" "$logs_dir" >/dev/null 2>&1 && printf 'kind-smoke: cluster logs in %s\n' "$logs_dir" >&2
  fi
  exit 1
}
cleanup() {
  if [ $keep = 0 ] && [ -n "$kind" ] && "$kind" get clusters 2>/dev/null | grep -qx "$name"; then
    log "deleting cluster $name"; "$kind" delete cluster --name "$name" >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

bash scripts/docker-engine.sh || exit 1;                                  timed "engine"
kind="$(bash scripts/kind-binary.sh)" || fail "kind could not be installed"; timed "kind"
node_image="${KIND_NODE_IMAGE:-$(bash scripts/kind-node-image.sh)}" || fail "the node image could not be built"
timed "node image ($node_image)"
mapfile -t images < <(bash scripts/images.sh --verify --wait "${IMAGES_WAIT:-0}") || fail "the images could not be built"
[ ${#images[@]} = 3 ] || fail "scripts/images.sh did not print three images"
timed "images (${images[*]})"

kubeconfig="$(mktemp /tmp/kind-smoke-kubeconfig.XXXXXX)"
k() { kubectl --kubeconfig "$kubeconfig" "$@"; }
command -v kubectl >/dev/null 2>&1 || PATH="$(bash scripts/k8s-binaries.sh):$PATH"
if "$kind" get clusters 2>/dev/null | grep -qx "$name"; then
  log "reusing cluster $name"
else
  log "kind create cluster --name $name --image $node_image --config config/kind/kind-config.yaml"
  mkdir -p "$logs_dir"
  nice -n 19 "$kind" create cluster --name "$name" --image "$node_image" --config config/kind/kind-config.yaml \
    --kubeconfig "$kubeconfig" --wait 5m --retain >"$logs_dir/kind-create.log" 2>&1 \
    || { grep -E '^ERROR|^error' "$logs_dir/kind-create.log" | head -n 3 >&2
         fail "kind create cluster failed or the node never became Ready (output: $logs_dir/kind-create.log)"; }
  grep -E '^ [✓✗•]' "$logs_dir/kind-create.log" | grep -v '•' >&2 || true
fi
"$kind" get kubeconfig --name "$name" >"$kubeconfig"
k wait --for=condition=Ready node --all --timeout=120s >&2 || fail "the node is not Ready"
timed "cluster (node Ready)"
k -n kube-system rollout status deployment/coredns --timeout=180s >&2 || fail "CoreDNS did not become available"
timed "CoreDNS available"

"$kind" load docker-image --name "$name" "${images[@]}" >&2 || fail "kind load docker-image failed"
timed "kind load docker-image (3 images)"

fake_image="${images[1]}" stub_image="${images[2]}"
operator_token="smoke00000-smoketoken000000000000"
k apply -f - >&2 <<EOF || fail "applying the smoke workload failed"
apiVersion: v1
kind: Pod
metadata: {name: fake-coderd, labels: {app: fake-coderd}}
spec:
  containers:
    - name: fake-coderd
      image: $fake_image
      imagePullPolicy: IfNotPresent
      env:
        - {name: FAKE_CODERD_ADMIN_TOKEN, value: smoke-admin-token}
        - {name: FAKE_CODERD_OPERATOR_TOKEN, value: $operator_token}
      ports: [{containerPort: 3000}, {containerPort: 3001}]
      readinessProbe: {tcpSocket: {port: 3000}, periodSeconds: 1}
      securityContext: {allowPrivilegeEscalation: false, runAsNonRoot: true, capabilities: {drop: [ALL]}, seccompProfile: {type: RuntimeDefault}}
---
apiVersion: v1
kind: Service
metadata: {name: fake-coderd}
spec:
  selector: {app: fake-coderd}
  ports: [{name: api, port: 3000}, {name: admin, port: 3001}]
EOF
k wait --for=condition=Ready pod/fake-coderd --timeout=120s >&2 || { k describe pod fake-coderd >&2; fail "the fake coderd pod did not become Ready"; }
timed "fake coderd pod Ready"
# A provisioner key from the fake's coderd API (the node has curl and jq; pod IPs are routed
# there), then the stub daemon with that key: it authenticates and serves its readiness endpoint,
# so a Ready pod proves the image runs and DNS, the Service (kube-proxy) and the CNI work.
fake_ip="$(k get pod fake-coderd -o jsonpath='{.status.podIP}')"
key="$(docker exec "$name-control-plane" sh -c "curl -fsS -X POST -H 'Coder-Session-Token: $operator_token' \
  -H 'Content-Type: application/json' -d '{\"name\":\"smoke\"}' \
  http://$fake_ip:3000/api/v2/organizations/default/provisionerkeys | jq -r .key")" \
  || fail "creating a provisioner key through the fake coderd's API at $fake_ip:3000 failed"
[ -n "$key" ] && [ "$key" != null ] || fail "the fake coderd returned no provisioner key"
k apply -f - >&2 <<EOF || fail "applying the stub pod failed"
apiVersion: v1
kind: Pod
metadata: {name: coder-stub}
spec:
  containers:
    - name: coder
      image: $stub_image
      imagePullPolicy: IfNotPresent
      env:
        - {name: CODER_URL, value: "http://fake-coderd.default.svc.cluster.local:3000"}
        - {name: CODER_PROVISIONER_DAEMON_KEY, value: "$key"}
        - {name: CODER_STUB_READY_ADDR, value: "0.0.0.0:8081"}
      readinessProbe: {httpGet: {path: /, port: 8081}, periodSeconds: 1}
      securityContext: {allowPrivilegeEscalation: false, runAsNonRoot: true, capabilities: {drop: [ALL]}, seccompProfile: {type: RuntimeDefault}}
EOF
k wait --for=condition=Ready pod/coder-stub --timeout=120s >&2 \
  || fail "the stub pod did not become Ready: $(k logs coder-stub 2>&1 | tail -n 1)"
log "stub pod: $(k logs coder-stub 2>&1 | grep -m1 -o 'successfully connected to coderd.*' | cut -c1-120)"
timed "stub pod authenticated and Ready"
log "smoke test passed in $((SECONDS - t0)) s (cluster $name$([ $keep = 1 ] && echo ', kept'))"
