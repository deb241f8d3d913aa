#!/usr/bin/env bash
# Installs what geist needs to build and test, from the distribution's packages, only
# when missing. The names are the same on Debian 12 and Ubuntu 24.04. The optional
# packages (clang and libc++ for test.sh's libc++ compile check; clang's runtime for the
# fuzz preset; cpp-httplib for `geist serve`, which a build without it refuses to run;
# Chromium and its WebDriver for the chat page's browser test) are skipped with a note
# where the distribution has no candidate (Ubuntu's chromium is a snap stub: the test then
# says SKIP).
set -euo pipefail
pkgs=(cmake g++ make git pkg-config python3 python3-pip libgtest-dev libgmock-dev libcli11-dev nlohmann-json3-dev
      libxxhash-dev libssl-dev libbenchmark-dev)
optional=(clang libc++-dev libc++abi-dev libcpp-httplib-dev chromium chromium-driver)
[ "${GEIST_WITH_CLANG:-0}" = 1 ] && optional+=(libclang-rt-dev)
# Each query's output is taken whole before it is searched: with pipefail, `cmd | grep -q`
# fails whenever grep exits at its match before cmd has written everything (SIGPIPE), and
# apt-cache policy's version table made every optional package look missing that way.
installed() { [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" == *"install ok installed"* ]]; }
has_candidate() { [[ "$(apt-cache policy "$1" 2>/dev/null || true)" =~ Candidate:\ [0-9] ]]; }
missing=()
for p in "${pkgs[@]}"; do installed "$p" || missing+=("$p"); done
missing_opt=()
for p in "${optional[@]}"; do installed "$p" || missing_opt+=("$p"); done
if [ ${#missing[@]} -gt 0 ] || [ ${#missing_opt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  for p in "${missing_opt[@]}"; do
    if has_candidate "$p"; then
      missing+=("$p")
    else
      echo "install_deps: note: no package '$p' here; the checks that need it are skipped" >&2
    fi
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "install_deps: installing ${missing[*]}" >&2
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
  fi
fi
