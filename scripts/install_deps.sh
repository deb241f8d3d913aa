#!/usr/bin/env bash
# Installs what geist needs to build and test, from Debian's packages only when missing.
set -euo pipefail
pkgs=(cmake g++ make git pkg-config python3 python3-pip libgtest-dev libgmock-dev libcli11-dev nlohmann-json3-dev
      libxxhash-dev libssl-dev libbenchmark-dev clang libc++-dev libc++abi-dev)
[ "${GEIST_WITH_CLANG:-0}" = 1 ] && pkgs+=(clang libclang-rt-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install_deps: installing ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
