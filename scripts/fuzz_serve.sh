#!/usr/bin/env bash
# Fuzzes geist serve's request parsers and stop-string matcher (tests/serve/serve_request_fuzz.cpp)
# with libFuzzer under ASan+UBSan for SECONDS (default 60). Needs clang with its runtime
# (Debian: clang, libclang-rt-dev or the compiler-rt of clang's package). The corpus is
# kept in build/fuzz-serve/corpus.
#   scripts/fuzz_serve.sh [seconds]
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-60}"
out=build/fuzz-serve
mkdir -p "$out/corpus"
clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -Itools/geist/serve tests/serve/serve_request_fuzz.cpp tools/geist/serve/openai_api.cpp \
  tools/geist/serve/stop_matcher.cpp -o "$out/serve_request_fuzz"
# Seeds: valid requests of both endpoints and a stop-string case.
printf '%s' '{"messages":[{"role":"system","content":"S"},{"role":"user","content":[{"type":"text","text":"hi"}]}],"max_tokens":5,"temperature":0.5,"stop":["a","bc"],"logprobs":true,"top_logprobs":2,"stream":true,"stream_options":{"include_usage":true},"seed":42}' > "$out/corpus/chat.json"
printf '%s' '{"prompt":[1,2,3],"logprobs":2,"n":1,"tokens":[1,2],"content":"x","top_k":-1}' > "$out/corpus/completion.json"
printf 'END\x01\n\n\x02abc E\x02ND\x02x\n\x02\nmore' > "$out/corpus/stop.txt"
"$out/serve_request_fuzz" -max_total_time="$secs" -max_len=4096 -print_final_stats=1 "$out/corpus"
