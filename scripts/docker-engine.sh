#!/usr/bin/env bash
# Makes sure a Docker engine answers, for the Docker-backed tiers (kind, k3s) and the image builds.
#
#   - an engine already answers (`docker info`): left alone, nothing changes;
#   - no engine is installed: installs Debian's `docker.io` with apt-get (root only);
#   - the engine is installed but not running (machines without an init system): starts `dockerd`
#     in the background, logging to $DOCKERD_LOG (default /var/log/dockerd.log), and waits for it.
#
# Before starting dockerd it registers scripts/runc-bounded as Docker's default OCI runtime: on hosts
# whose capability bounding set lacks a capability (CAP_SYS_RESOURCE here) privileged containers,
# and so kind's nodes, cannot start with plain runc; on other hosts the wrapper changes nothing.
# Set DOCKER_ENGINE_NO_RUNC_WRAPPER=1 to leave /etc/docker/daemon.json alone.
#
# Prints progress on stderr; a failure is one line naming the step, exit status 1.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
log() { printf '[docker-engine] %s\n' "$*" >&2; }
fail() { printf 'docker-engine: %s\n' "$*" >&2; exit 1; }

engine_answers() { docker info --format '{{.ServerVersion}}' >/dev/null 2>&1; }

bounding_set_complete() {
  # Every capability the kernel knows (cap_last_cap) is in this process's bounding set.
  local last bnd
  last="$(cat /proc/sys/kernel/cap_last_cap 2>/dev/null)" || return 0
  bnd="$(awk '/^CapBnd/ {print $2}' /proc/self/status)"
  [ $(( 0x$bnd )) -eq $(( (1 << (last + 1)) - 1 )) ]
}

if command -v docker >/dev/null 2>&1 && engine_answers; then
  version="$(docker info --format '{{.ServerVersion}} (runtime {{.DefaultRuntime}})' 2>/dev/null)"
  log "a Docker engine already answers: $version; leaving it alone"
  if ! bounding_set_complete && [[ "$version" != *runc-bounded* ]]; then
    log "warning: this host's capability bounding set is incomplete and the engine's default runtime is not runc-bounded; privileged containers (kind nodes) may fail with 'unable to apply caps' (see scripts/runc-bounded)"
  fi
  exit 0
fi

# Root, or a password-less sudo (some CI runners): installing and starting an engine needs it.
as_root=()
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
    log "not root: using password-less sudo to install and start the engine"
  elif command -v docker >/dev/null 2>&1; then
    fail "no Docker engine answers (docker info failed) and starting one needs root: start your Docker engine, or run this script as root"
  else
    fail "Docker is not installed and installing it needs root: install a Docker engine (https://docs.docker.com/engine/install/), or run this script as root"
  fi
fi

# The Debian package's daemon; its CLI may be shadowed on the PATH by a newer one, which is fine.
if ! command -v dockerd >/dev/null 2>&1; then
  command -v apt-get >/dev/null 2>&1 || fail "no Docker engine is installed and apt-get is missing: install a Docker engine (https://docs.docker.com/engine/install/)"
  log "installing docker.io with apt-get (Debian's engine; about a minute)"
  export DEBIAN_FRONTEND=noninteractive
  { "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq \
      && "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io; } >/tmp/docker-engine-apt.log 2>&1 \
    || fail "apt-get install docker.io failed (log: /tmp/docker-engine-apt.log): $(tail -n 1 /tmp/docker-engine-apt.log)"
  command -v dockerd >/dev/null 2>&1 || fail "docker.io is installed but dockerd is not on the PATH"
  log "installed: $(dockerd --version)"
fi
command -v docker >/dev/null 2>&1 || fail "dockerd is installed but the docker CLI is not on the PATH"

if [ "${DOCKER_ENGINE_NO_RUNC_WRAPPER:-0}" != 1 ]; then
  command -v python3 >/dev/null 2>&1 || fail "python3 is needed by the runc-bounded runtime wrapper: apt-get install python3 (or set DOCKER_ENGINE_NO_RUNC_WRAPPER=1)"
  "${as_root[@]}" install -D -m 0755 "$here/runc-bounded" /usr/local/sbin/runc-bounded
  "${as_root[@]}" mkdir -p /etc/docker
  # Merge into an existing daemon.json rather than overwrite it.
  "${as_root[@]}" python3 - /etc/docker/daemon.json <<'EOF'
import json, os, sys
path = sys.argv[1]
doc = {}
if os.path.exists(path) and os.path.getsize(path) > 0:
    with open(path) as f:
        doc = json.load(f)
doc.setdefault("runtimes", {})["runc-bounded"] = {"path": "/usr/local/sbin/runc-bounded"}
doc["default-runtime"] = "runc-bounded"
with open(path, "w") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")
EOF
  log "registered /usr/local/sbin/runc-bounded as the default runtime in /etc/docker/daemon.json"
fi

if pgrep -x dockerd >/dev/null 2>&1; then
  log "a dockerd process exists but does not answer yet; waiting for it"
else
  dockerd_log="${DOCKERD_LOG:-/var/log/dockerd.log}"
  log "starting dockerd in the background (log: $dockerd_log)"
  "${as_root[@]}" mkdir -p "$(dirname "$dockerd_log")"
  # A session of its own, so that it outlives this script and its caller's process group.
  "${as_root[@]}" setsid nohup sh -c 'exec dockerd >>"$1" 2>&1' dockerd "$dockerd_log" </dev/null &
fi

for _ in $(seq 1 60); do
  if engine_answers; then
    log "Docker engine ready: $(docker info --format '{{.ServerVersion}}, storage {{.Driver}}, cgroup v{{.CgroupVersion}} ({{.CgroupDriver}}), runtime {{.DefaultRuntime}}' 2>/dev/null)"
    exit 0
  fi
  pgrep -x dockerd >/dev/null 2>&1 || break
  sleep 1
done
# The daemon's own last words say why (iptables, storage driver, cgroups…): shown, not just named.
dockerd_log="${DOCKERD_LOG:-/var/log/dockerd.log}"
if pgrep -x dockerd >/dev/null 2>&1; then why="dockerd did not answer within 60 s"; else why="dockerd exited"; fi
tail -n 15 "$dockerd_log" 2>/dev/null | sed 's/^/[docker-engine] dockerd: /' >&2 || true
fail "$why (log: $dockerd_log): $(tail -n 1 "$dockerd_log" 2>/dev/null)"
