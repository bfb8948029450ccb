#!/usr/bin/env bash
# Mutation testing of the reference operator's decision code with cargo-mutants, judged by the
# operator's unit tests, then the conformance suite (configuration: .cargo/mutants.toml).
#
#   scripts/mutants.sh [--in-place] [--shard k/n] [file ...]
#       e.g. scripts/mutants.sh operator/src/provisioner/credentials.rs
#   --in-place  mutate this tree itself (restored after each mutant) and build in its target/:
#               no copy, incremental builds; for a worktree made for the run, never one you edit.
#   --resume    keep an interrupted run's results and skip its caught and unviable mutants
#               (cargo-mutants --iterate); only valid while the file is unchanged.
#
# Each file is run on its own, in two stages: first with the suite narrowed to the rules that
# file decides (CUCUMBER_FILTER_TAGS), so a mutant costs one build and a part of the suite; then
# the survivors of that stage meet the whole suite, and only its survivors count. Results go to
# mutants/<file>/ and mutants/<file>/whole-suite/ (cargo-mutants' own outcomes.json, caught.txt,
# missed.txt, unviable.txt, timeout.txt); a summary line per stage is printed. Survivors that no
# scenario should catch are listed, with a reason, in mutants/accepted.txt; any other survivor
# makes this script exit 1.
set -euo pipefail
cd "$(dirname "$0")/.."

# The scratch copy starts from this tree's target/ so only the workspace crates build cold.
where=(--jobs 1 --copy-target true)
shard=()
resume=()
while [ $# -gt 0 ]; do
  case "$1" in
    --in-place) where=(--in-place); shift ;;
    --resume) resume=(--iterate); shift ;;
    --shard) shard=(--shard "$2"); shift 2 ;;
    *) break ;;
  esac
done
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(operator/src/provisioner/{gates,keys,credentials,status,children,names,mod,cleanup}.rs)

command -v cargo-mutants >/dev/null 2>&1 || {
  echo "[mutants] installing cargo-mutants (cargo install --locked cargo-mutants)" >&2
  cargo install --locked cargo-mutants
}
export KUBEBUILDER_ASSETS="${KUBEBUILDER_ASSETS:-$(bash scripts/k8s-binaries.sh)}"

# The rules each file decides: the scenarios that judge its mutants.
tags_for() {
  case "$1" in
    */credentials.rs) echo '@R-CRED-1 or @R-CRED-3 or @R-CRED-6 or @R-CRED-7 or @R-CRED-10 or @R-CRED-14 or @D-2' ;;
    */gates.rs) echo '@R-PRE-2 or @R-PRE-3 or @R-PRE-5 or @R-PRE-6 or @R-PRE-7 or @R-PRE-9 or @R-ENT-1 or @R-ENT-2 or @R-ENT-3 or @R-ENT-5 or @R-ENT-6 or @R-ENT-7 or @R-ENT-8 or @R-SEC-8 or @R-SEC-12 or @D-1' ;;
    */keys.rs) echo '@R-KEY-3 or @R-KEY-4 or @R-KEY-9 or @R-KEY-10 or @R-KEY-11 or @R-KEY-12 or @R-KEY-13 or @R-KEY-14 or @R-KEY-15 or @R-KEY-16 or @R-KEY-21 or @R-KEY-22 or @R-KEY-24' ;;
    */status.rs) echo '@R-ST-2 or @R-ST-3 or @R-ST-4 or @R-ST-5 or @R-ST-6 or @R-ST-7 or @R-RL-1 or @D-1' ;;
    */children.rs) echo '@R-POD-1 or @R-POD-2 or @R-POD-5 or @R-POD-6 or @R-POD-8 or @R-POD-9 or @R-POD-10 or @R-POD-11 or @R-POD-13 or @R-POD-16 or @R-RBAC-1 or @R-RBAC-2 or @R-SEC-1 or @R-SEC-3' ;;
    */names.rs) echo '@R-RES-1 or @R-RES-2 or @R-RES-4 or @R-ST-8 or @R-KEY-13 or @R-SEC-6 or @R-CRD-13' ;;
    */mod.rs) echo '@R-DEL-2 or @R-DEL-3 or @R-DEL-5 or @R-DEL-6 or @R-DEL-7 or @R-DEL-8 or @R-DEL-11 or @R-RL-2 or @R-RL-3 or @R-KEY-7 or @R-KEY-8 or @R-SEC-11' ;;
    */cleanup.rs) echo '@R-DEL-2 or @R-DEL-3 or @R-DEL-4 or @R-DEL-5 or @R-DEL-6 or @R-DEL-7 or @R-DEL-8 or @R-DEL-9 or @R-DEL-10' ;;
    *) echo "" ;;
  esac
}

# The suite stops at its first failing scenario (a caught mutant needs no more) and the operator's
# unit tests judge before it. Exit codes 2 (missed) and 3 (timeout) are findings; others are errors.
judge() { # judge OUTPUT TAGS FILE [cargo-mutants arguments…]
  local out="$1" tags="$2" file="$3"
  shift 3
  [ ${#resume[@]} -gt 0 ] || rm -rf "$out"
  mkdir -p "$out"
  local selection=(-u CUCUMBER_FILTER_TAGS)
  [ -z "$tags" ] || selection=(CUCUMBER_FILTER_TAGS="$tags")
  env "${selection[@]}" CONFORMANCE_FAIL_FAST=true CONFORMANCE_UNIT_TESTS_FIRST=1 \
    cargo mutants --file "$file" "${where[@]}" "${resume[@]}" "$@" \
    --baseline skip --timeout 900 --build-timeout 900 --output "$out" || [ $? -le 3 ]
}
count() { if [ -f "$1/mutants.out/$2.txt" ]; then grep -c . "$1/mutants.out/$2.txt" || true; else echo 0; fi; }
summary() { echo "caught $(count "$1" caught), missed $(count "$1" missed), unviable $(count "$1" unviable), timeout $(count "$1" timeout)"; }

status=0
for file in "${files[@]}"; do
  name="$(basename "$file" .rs)"
  out="mutants/$name"
  tags="$(tags_for "$file")"
  [ -n "$tags" ] || { echo "[mutants] no rules known for $file" >&2; exit 2; }
  # Stage 1: the suite narrowed to the rules this file decides (fast).
  echo "[mutants] $file: suite narrowed to $tags" >&2
  judge "$out" "$tags" "$file" "${shard[@]}"
  echo "[mutants] $file, narrowed suite: $(summary "$out")"
  survivors="$out/mutants.out/missed.txt"
  # Stage 2: what survived the narrowed suite meets the whole suite; only its survivors count.
  if [ -s "$survivors" ]; then
    filters=()
    while IFS= read -r mutant; do
      filters+=(--re "^$(printf '%s' "$mutant" | sed 's/[][\.*^$(){}+?|/]/\\&/g')\$")
    done < "$survivors"
    echo "[mutants] $file: $(grep -c . "$survivors") survivor(s) of the narrowed suite meet the whole suite" >&2
    judge "$out/whole-suite" "" "$file" "${filters[@]}"
    echo "[mutants] $file, whole suite on those: $(summary "$out/whole-suite")"
    survivors="$out/whole-suite/mutants.out/missed.txt"
  fi
  if [ -f "$survivors" ]; then
    # Compared with line:column: two mutants of one function can share a description (two
    # `delete !`), so an acceptance names exactly one place and is renewed when the code moves.
    while IFS= read -r mutant; do
      grep -qF -- "$mutant #" mutants/accepted.txt 2>/dev/null || {
        echo "[mutants] unexplained survivor: $mutant"
        status=1
      }
    done < "$survivors"
  fi
done
exit $status
