#!/usr/bin/env bash
# The k3s tier end to end (k3s in a container through testcontainers); see scripts/cluster-e2e.sh.
exec "$(dirname "$0")/cluster-e2e.sh" k3s "$@"
