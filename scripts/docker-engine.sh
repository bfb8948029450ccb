#!/usr/bin/env bash
# Makes sure a Docker engine answers, for the Docker-backed tiers (kind, k3s) and the image builds.
#
#   - an engine already answers (`docker info`): left alone, nothing changes;
#   - no engine is installed: installs Debian's `docker.io` with apt-get (root, or password-less sudo),
#     with python3 when the runtime wrapper below needs it and the machine lacks it;
#   - the engine is installed but not running (machines without an init system): starts `dockerd`
#     in the background, logging to $DOCKERD_LOG (default /var/log/dockerd.log), and waits for it
#     (up to $DOCKER_ENGINE_WAIT seconds, default 120). Pid files left by a killed dockerd are removed
#     first: dockerd refuses to start while its pid file names any live process. Through sudo, the
#     API socket's group is the caller's (unless the caller is in the docker group).
#
# Before starting dockerd it registers scripts/runc-bounded as Docker's default OCI runtime: on hosts
# whose capability bounding set lacks a capability (CAP_SYS_RESOURCE here) privileged containers,
# and so kind's nodes, cannot start with plain runc; on other hosts the wrapper changes nothing.
# Set DOCKER_ENGINE_NO_RUNC_WRAPPER=1 to leave /etc/docker/daemon.json alone.
# When iptables' default (nf_tables) backend does not work on this kernel and the legacy one does,
# it switches iptables to legacy (dockerd needs iptables for its bridge network).
#
# Prints progress on stderr; a failure is one line naming the step (after the last lines of the log
# that says why, when there is one), exit status 1.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
log() { printf '[docker-engine] %s\n' "$*" >&2; }
fail() { printf 'docker-engine: %s\n' "$*" >&2; exit 1; }
# Lines of a log that say why, shown before the failure line that names the log.
quote() { sed "s/^/[docker-engine] $1: /" >&2; }

# dockerd, iptables and update-alternatives live in sbin, which some PATHs (non-root, CI) leave out.
for dir in /usr/local/sbin /usr/sbin /sbin; do
  case ":$PATH:" in *":$dir:"*) ;; *) PATH="$PATH:$dir" ;; esac
done
export PATH

engine_answers() { docker info --format '{{.ServerVersion}}' >/dev/null 2>&1; }

# Process $1 is alive (not a zombie), and named $2 when given (no procps: minimal systems lack pgrep).
is_live() {
  local stat
  stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
  [[ "$stat" != *") Z "* ]] && { [ -z "${2:-}" ] || [[ "$stat" == "$1 ($2) "* ]]; }
}
# The pid in pid file $1 when it is a live process named $2 (the files of dockerd's run dir are root's).
pid_of() {
  local pid
  pid="$("${as_root[@]}" cat "$1" 2>/dev/null)" || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] && is_live "$pid" "$2" && echo "$pid"
}

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

wrapper=1
[ "${DOCKER_ENGINE_NO_RUNC_WRAPPER:-0}" = 1 ] && wrapper=0

# The Debian package's daemon (its CLI may be shadowed on the PATH by a newer one, which is fine), and
# python3 for the runtime wrapper.
packages=()
command -v dockerd >/dev/null 2>&1 || packages+=(docker.io)
[ $wrapper = 1 ] && ! command -v python3 >/dev/null 2>&1 && packages+=(python3)
if [ ${#packages[@]} -gt 0 ]; then
  command -v apt-get >/dev/null 2>&1 || fail "no apt-get to install ${packages[*]}: install a Docker engine (https://docs.docker.com/engine/install/), and python3 for scripts/runc-bounded"
  apt_log=/tmp/docker-engine-apt.log
  log "installing ${packages[*]} with apt-get (Debian's engine; about a minute; log: $apt_log)"
  # Waits up to 5 minutes for another apt's lock; a failed download is retried once, lists and all.
  apt=("${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 -qq)
  apt_install() { "${apt[@]}" update && "${apt[@]}" install -y --no-install-recommends "${packages[@]}"; }
  { apt_install || { sleep 10; apt_install; }; } >"$apt_log" 2>&1 \
    || { { grep -E '^(W|E): ' "$apt_log" | awk '!seen[$0]++' | head -n 6 | grep . || tail -n 5 "$apt_log"; } | quote apt || true
         fail "apt-get install ${packages[*]} failed (log: $apt_log)"; }
  command -v dockerd >/dev/null 2>&1 || fail "docker.io is installed but dockerd is not on the PATH"
  log "installed: $(dockerd --version)"
fi
command -v docker >/dev/null 2>&1 || fail "dockerd is installed but the docker CLI is not on the PATH"

if [ $wrapper = 1 ]; then
  "${as_root[@]}" install -D -m 0755 "$here/runc-bounded" /usr/local/sbin/runc-bounded
  "${as_root[@]}" mkdir -p /etc/docker
  # Merge into an existing daemon.json rather than overwrite it.
  "${as_root[@]}" python3 - /etc/docker/daemon.json <<'EOF' || fail "registering runc-bounded in /etc/docker/daemon.json failed (python3's error above)"
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

dockerd_log="${DOCKERD_LOG:-/var/log/dockerd.log}"
pidfile=/var/run/docker.pid
if dockerd_pid="$(pid_of "$pidfile" dockerd)"; then
  log "dockerd (pid $dockerd_pid) runs but does not answer yet; waiting for it"
else
  # A dockerd or its containerd killed without cleanup leaves pid files behind; dockerd refuses to
  # start while its file names a live process of any kind (pids are reused), and takes a live
  # process named in containerd's file for its containerd (and kills it when it does not answer).
  "${as_root[@]}" rm -f "$pidfile"
  containerd_pidfile=/var/run/docker/containerd/containerd.pid
  pid_of "$containerd_pidfile" containerd >/dev/null || "${as_root[@]}" rm -f "$containerd_pidfile"
  # dockerd cannot set up its bridge network without a working iptables; kernels without nf_tables
  # need the legacy backend (Debian's default is nf_tables).
  if command -v iptables-legacy >/dev/null 2>&1 && ! "${as_root[@]}" iptables -w -t nat -L -n >/dev/null 2>&1 \
     && "${as_root[@]}" iptables-legacy -w -t nat -L -n >/dev/null 2>&1; then
    log "iptables' default backend does not work on this kernel; switching to iptables-legacy"
    "${as_root[@]}" update-alternatives --set iptables /usr/sbin/iptables-legacy >/dev/null \
      || fail "switching iptables to the legacy backend failed (update-alternatives --set iptables /usr/sbin/iptables-legacy)"
    "${as_root[@]}" update-alternatives --set ip6tables /usr/sbin/ip6tables-legacy >/dev/null 2>&1 || true
  fi
  # Not root: the API socket's group is the caller's, so that `docker` works without sudo.
  group_args=()
  [ ${#as_root[@]} -gt 0 ] && ! id -nG | grep -qw docker && group_args=(--group "$(id -g)")
  log "starting dockerd in the background (log: $dockerd_log)"
  "${as_root[@]}" mkdir -p "$(dirname "$dockerd_log")"
  # A session of its own, so that it outlives this script and its caller's process group, and
  # none of the caller's open files: a lock the caller holds (`flock … bash .ci/run`) would
  # otherwise stay held for as long as the engine runs.
  "${as_root[@]}" setsid nohup bash -c 'log="$1"; shift
    for fd in /proc/$$/fd/*; do fd=${fd##*/}; [ "$fd" -gt 2 ] && exec {fd}>&-; done
    exec dockerd "$@" >>"$log" 2>&1' dockerd "$dockerd_log" "${group_args[@]}" \
    </dev/null >/dev/null 2>&1 &
  started=$!
fi

wait_s="${DOCKER_ENGINE_WAIT:-120}"
deadline=$((SECONDS + wait_s))
while [ $SECONDS -lt $deadline ]; do
  if engine_answers; then
    log "Docker engine ready: $(docker info --format '{{.ServerVersion}}, storage {{.Driver}}, cgroup v{{.CgroupVersion}} ({{.CgroupDriver}}), runtime {{.DefaultRuntime}}' 2>/dev/null)"
    exit 0
  fi
  # Waits while the dockerd started here (or sudo, which waits for it) lives, or a dockerd owns the
  # pid file (another caller's, started at the same time).
  { [ -n "${started:-}" ] && is_live "$started"; } || pid_of "$pidfile" dockerd >/dev/null || break
  sleep 1
done
# The daemon's own last words say why (iptables, storage driver, cgroups…): shown, not just named,
# without its grpc client's reconnection chatter.
if pid_of "$pidfile" dockerd >/dev/null; then why="dockerd did not answer within $wait_s s"; else why="dockerd exited"; fi
if [ ${#as_root[@]} -gt 0 ] && "${as_root[@]}" docker info >/dev/null 2>&1; then
  fail "dockerd answers root but not $(id -un): add $(id -un) to the docker group, or run this script as root"
fi
grep -v 'module=grpc' "$dockerd_log" 2>/dev/null | tail -n 15 | quote dockerd || true
fail "$why (log: $dockerd_log): $(tail -n 1 "$dockerd_log" 2>/dev/null | sed 's/^time="[^"]*" //')"
