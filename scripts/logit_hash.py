#!/usr/bin/env python3
"""A hash of the logits a session gives over a long chunked prefill and a few decode steps.

    scripts/logit_hash.py LIB MODEL N_TOKENS CHUNK [KV_TYPE]

Prefills N_TOKENS fixed token ids (i * 7919 mod 200000 + 100) in chunks of CHUNK through
LIB (a libgeist.so), hashing the logits after every chunk, then decodes 4 tokens greedily
and hashes theirs. KV_TYPE is a geist_kv_type (0 f32, 1 f16, 2 bf16, 3 q8_0) for both K and
V; GEIST_ISA picks the tier as usual. Prints the first 16 hex digits of the SHA-256.

For kernel changes that must not change a bit: run it with the library built before and the
one built after (several chunk sizes, KV types and tiers), and compare the lines. The C ABI
comes from examples/python/pinned_prefix.py's declarations.
"""
import ctypes as C
import hashlib
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "python"))
import pinned_prefix as pp  # noqa: E402 -- the C ABI declared by ctypes


def main():
    if len(sys.argv) not in (5, 6):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    lib = pp.load_lib(sys.argv[1])
    model_path, n, chunk = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    kv = int(sys.argv[5]) if len(sys.argv) == 6 else -1
    model, s = C.c_void_p(), C.c_void_p()
    pp.check(lib, lib.geist_model_load(model_path.encode(), None, C.byref(model)), "geist_model_load")
    prm = lib.geist_session_params_default()
    prm.sampling.temperature = 0.0
    prm.n_ctx = n + 64
    prm.n_threads = 2
    if kv >= 0:
        prm.type_k = prm.type_v = kv
    pp.check(lib, lib.geist_session_create(model, C.byref(prm), C.byref(s)), "geist_session_create")
    ids = [(i * 7919) % 200000 + 100 for i in range(n)]
    h = hashlib.sha256()
    for i in range(0, n, chunk):
        part = ids[i:i + chunk]
        pp.check(lib, lib.geist_session_prefill_tokens(s, (pp.token * len(part))(*part), len(part)),
                 "geist_session_prefill_tokens", s)
        h.update(pp.logits_bytes(lib, s))
    t = pp.token()
    for _ in range(4):
        pp.check(lib, lib.geist_session_decode_step(s, C.byref(t)), "geist_session_decode_step", s)
        h.update(pp.logits_bytes(lib, s))
    lib.geist_session_free(s)
    lib.geist_model_free(model)
    print(h.hexdigest()[:16])
    return 0


if __name__ == "__main__":
    sys.exit(main())
