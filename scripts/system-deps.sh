#!/usr/bin/env bash
# Debian packages some tests drive: curl as a raw client; ip, iptables, nft and unshare for the
# namespaced hosts (tests/test_transparent.py) and the private trust store
# (tests/test_certs_howto.py); update-ca-certificates for the OS-store recipe; chromium to
# render the report page and mitmweb's flow view in a real browser (test_report, test_mitmweb);
# strace to see which syncs `streamtap index` makes (test_index); gcc, zlib's and OpenSSL's headers
# to build the compiled loops of the decoders and of the recording writer (make runs this with
# --build, for those alone, before it installs the package).
# Node and a JDK are used when present (certs_howto.md's Node and Java recipes) but not
# installed here: they are large, and those tests skip, saying so, without them.
# Best effort: without root or a package mirror the tests that need them skip, saying why.
set -u
missing=()
# the decoders' compiled loops (setup.py): without these the package builds without them
command -v cc >/dev/null 2>&1 || missing+=(gcc)
[ -f /usr/include/zlib.h ] || missing+=(zlib1g-dev)
# the recording writer's compiled frame lines hash with OpenSSL's SHA-256
[ -f /usr/include/openssl/evp.h ] || missing+=(libssl-dev)
if [ "${1:-}" != --build ]; then  # --build: only what installing the package needs
command -v curl >/dev/null 2>&1 || missing+=(curl)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v iptables >/dev/null 2>&1 || missing+=(iptables)
command -v nft >/dev/null 2>&1 || missing+=(nftables)
command -v unshare >/dev/null 2>&1 || missing+=(util-linux)
command -v update-ca-certificates >/dev/null 2>&1 || missing+=(ca-certificates)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v strace >/dev/null 2>&1 || missing+=(strace)
fi
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "system-deps: not installing ${missing[*]} (needs root and apt-get); tests that need them will skip" >&2
  exit 0
fi
echo "system-deps: installing ${missing[*]}" >&2
{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >/dev/null 2>&1 \
  || echo "system-deps: could not install ${missing[*]}; tests that need them will skip" >&2
exit 0
