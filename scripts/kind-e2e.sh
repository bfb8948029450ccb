#!/usr/bin/env bash
# The kind tier end to end; see scripts/cluster-e2e.sh.
exec "$(dirname "$0")/cluster-e2e.sh" kind "$@"
