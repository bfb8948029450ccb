#!/usr/bin/env bash
# Creates (or updates) a Ready CoderControlPlane with operator access, the existing control plane
# that `conformance run --coderd URL --control-plane NAMESPACE/NAME` and the chart's `helm test`
# (test.controlPlane) use: the namespace, a Secret holding the operator token, the control plane
# (spec.image set when --image is given) and its status, written through /status as its own
# operator would (phase Ready, the coderd URL, operatorAccessReady, the token's Secret, entitled,
# checked now). The token is read from stdin and never printed.
#
# Usage: printf %s "$TOKEN" | scripts/control-plane-fixture.sh --url URL [--namespace NS] [--name NAME] [--image IMAGE]
#   --namespace  default coder (the tutorial's)          --name  default codercontrolplane-sample
#   --url        the coderd URL the operator reaches     --image the daemon image of its provisioners
# Needs kubectl with the cluster in $KUBECONFIG (or its default).
set -euo pipefail
namespace=coder name=codercontrolplane-sample url="" image=""
while [ $# -gt 0 ]; do
  case "$1" in
    --namespace) namespace=$2; shift 2 ;;
    --name) name=$2; shift 2 ;;
    --url) url=$2; shift 2 ;;
    --image) image=$2; shift 2 ;;
    *) echo "usage: scripts/control-plane-fixture.sh --url URL [--namespace NS] [--name NAME] [--image IMAGE] (token on stdin)" >&2; exit 2 ;;
  esac
done
[ -n "$url" ] || { echo "control-plane-fixture: --url is required" >&2; exit 2; }
token="$(cat)"
[ -n "$token" ] || { echo "control-plane-fixture: no operator token on stdin" >&2; exit 2; }
secret="$name-operator-token"

kubectl create namespace "$namespace" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
# The token goes through a pipe, never through an argument (ps) or the terminal.
printf %s "$token" | kubectl create secret generic "$secret" -n "$namespace" --from-file=token=/dev/stdin \
  --dry-run=client -o yaml | kubectl apply -f - >/dev/null
spec='{}'
[ -z "$image" ] || spec="{\"image\": \"$image\"}"
kubectl apply -f - >/dev/null <<YAML
apiVersion: coder.com/v1alpha1
kind: CoderControlPlane
metadata:
  name: $name
  namespace: $namespace
spec: $spec
YAML
now="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
kubectl patch codercontrolplane "$name" -n "$namespace" --subresource=status --type=merge -p "{\"status\": {
  \"phase\": \"Ready\", \"url\": \"$url\", \"operatorAccessReady\": true,
  \"operatorTokenSecretRef\": {\"name\": \"$secret\", \"key\": \"token\"},
  \"externalProvisionerDaemonsEntitlement\": \"entitled\", \"entitlementsLastChecked\": \"$now\"}}" >/dev/null
echo "control-plane-fixture: $namespace/$name Ready at $url (operator token in Secret $namespace/$secret)" >&2
