#!/usr/bin/env bash
# Debian packages some tests use (curl as a raw client; ip/iptables for the namespaced hosts).
# Best effort: without root or a package mirror the tests that need them skip, saying why.
set -u
missing=()
command -v curl >/dev/null 2>&1 || missing+=(curl)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v iptables >/dev/null 2>&1 || missing+=(iptables)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "system-deps: not installing ${missing[*]} (needs root and apt-get); tests that need them will skip" >&2
  exit 0
fi
echo "system-deps: installing ${missing[*]}" >&2
{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; } >/dev/null 2>&1 \
  || echo "system-deps: could not install ${missing[*]}; tests that need them will skip" >&2
exit 0
