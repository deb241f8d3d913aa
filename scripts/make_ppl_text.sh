#!/usr/bin/env bash
# Writes tests/data/text/kjv_genesis.txt: Genesis 1-7 of the King James Version (public
# domain), from Debian's bible-kjv package, verse labels removed, one verse per line.
set -euo pipefail
command -v bible >/dev/null || { apt-get update -qq && apt-get install -y -qq bible-kjv; }
out="$(dirname "$0")/../tests/data/text/kjv_genesis.txt"
bible -f gen1:1-7:24 | sed -E 's/^[A-Za-z0-9]+:[0-9]+ //' > "$out"
wc -w "$out"
