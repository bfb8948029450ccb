#!/usr/bin/env bash
# Makes a local Debian bookworm base image without any image registry and prints its tag on stdout;
# progress goes to stderr.
#
# The root is made with `debootstrap --variant=minbase` from apt's configured Debian mirror and
# imported with `docker import`. The image tag is the cache key; the root's tarball is also kept in
# the per-user cache, so an engine without the image (a fresh CI machine with a restored cache)
# imports it again instead of running debootstrap.
#
# Usage: scripts/base-image.sh            # prints e.g. coder-conformance/debian:bookworm-minbase-1a2b3c4d
# Env:   DEBIAN_MIRROR   mirror URI (default: the first Debian URI in apt's sources)
#        BASE_IMAGE_TAG  tag to produce (default coder-conformance/debian:bookworm-minbase-<key>)
set -euo pipefail

suite=bookworm
# ca-certificates: what distroless/cc also has; rustls' platform verifier (reqwest) needs a CA store.
include=ca-certificates
key="$(printf '%s minbase %s\n' "$suite" "$include" | sha256sum | cut -c1-8)"
tag="${BASE_IMAGE_TAG:-coder-conformance/debian:${suite}-minbase-${key}}"
cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/coder-provisioner-conformance"
tarball="$cache_root/base/debian-${suite}-minbase-${key}.tar"

. "$(dirname "$0")/progress.sh"
fail() { printf 'base-image: %s\n' "$*" >&2; exit 1; }

docker info >/dev/null 2>&1 || fail "no Docker engine answers (run scripts/docker-engine.sh)"

if docker image inspect "$tag" >/dev/null 2>&1; then
  cached "$tag (in the engine)"
  echo "$tag"
  exit 0
fi

if [ -s "$tarball" ]; then
  cached "the Debian root ($tarball)"
else
  [ "$(id -u)" = 0 ] || fail "debootstrap needs root: run this script as root, or import any Debian bookworm root as $tag"
  if ! command -v debootstrap >/dev/null 2>&1; then
    log "installing debootstrap with apt-get"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null 2>&1 \
      || { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; } \
      || fail "apt-get install debootstrap failed"
  fi
  mirror="${DEBIAN_MIRROR:-}"
  if [ -z "$mirror" ]; then
    # deb822 sources (URIs: …) first, then one-line sources (deb URI suite …); skip security mirrors.
    mirror="$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '/^URIs:/ {print $2}' | grep -v security | grep -m1 debian || true)"
    [ -n "$mirror" ] || mirror="$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
      | awk '$1 == "deb" {print ($2 ~ /^\[/ ? $3 : $2)}' | grep -v security | grep -m1 debian || true)"
    [ -n "$mirror" ] || mirror=http://deb.debian.org/debian
  fi
  root="$(mktemp -d /tmp/base-image-root.XXXXXX)"
  trap 'rm -rf "$root"' EXIT
  step "debootstrap --variant=minbase --include=$include $suite from $mirror (about a minute)"
  heartbeat debootstrap quietly "$root.log" nice -n 19 debootstrap --variant=minbase --include="$include" "$suite" "$root" "$mirror" \
    || fail "debootstrap failed (log: $root.log): $(tail -n 1 "$root.log")"
  rm -f "$root.log"
  step_done
  # Smaller image: no apt lists or caches (apt-get update works again inside builds).
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
  mkdir -p "$(dirname "$tarball")"
  tar -C "$root" --numeric-owner -cf "$tarball.tmp" .
  mv "$tarball.tmp" "$tarball"
  log "root cached in $tarball ($(du -h "$tarball" | cut -f1))"
fi

step "docker import $tag"
docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["bash"]' \
  "$tarball" "$tag" >/dev/null || fail "docker import of $tarball failed"
step_done
echo "$tag"
