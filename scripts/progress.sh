# Progress lines for the long build steps, sourced by the build scripts (k8s-binaries.sh,
# base-image.sh, images.sh, kind-node-image.sh) so a first run is never silent, on a terminal or in
# a CI log: a step prints one line when it starts and one with its elapsed time when it ends, a
# step whose result is already there says it was cached, and a command that runs for minutes
# prints a line every 30 s. Lines go to stderr (the scripts print their results on stdout),
# prefixed with the script's name.
progress_prefix="$(basename "$0" .sh)"

log() { printf '[%s] %s\n' "$progress_prefix" "$*" >&2; }

# step WHAT: a step starts.
step() {
  step_what=$*
  step_start=$SECONDS
  log "$step_what …"
}

# step_done [NOTE]: the step started last ends; NOTE (e.g. a size) goes in parentheses.
step_done() {
  log "$step_what: done in $((SECONDS - step_start)) s${1:+ ($1)}"
}

# cached WHAT: a step that was skipped because its result is already there.
cached() { log "$*: cached"; }

# heartbeat LABEL CMD...: runs CMD, printing a line every 30 s while it runs; returns its status.
heartbeat() {
  local label=$1
  shift
  "$@" &
  local pid=$! started=$SECONDS status=0
  while kill -0 "$pid" 2>/dev/null; do
    for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    if kill -0 "$pid" 2>/dev/null; then log "  still $label ($((SECONDS - started)) s so far)"; fi
  done
  wait "$pid" || status=$?
  return $status
}

# timed WHAT CMD...: CMD as a step of its own, with heartbeats.
timed() {
  local what=$1
  shift
  step "$what"
  heartbeat "$what" "$@" || { log "$what: failed after $((SECONDS - step_start)) s"; return 1; }
  step_done
}

# quietly LOGFILE CMD...: runs CMD with its output in LOGFILE (for heartbeat, whose own lines
# must still reach the terminal).
quietly() {
  local logfile=$1
  shift
  "$@" >"$logfile" 2>&1
}
