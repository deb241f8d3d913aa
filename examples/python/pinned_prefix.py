#!/usr/bin/env python3
"""Pin a system turn once, answer several questions from it, through libgeist.so by ctypes.

The same flow as examples/pinned_prefix.c, with no binding package: the C ABI of
include/geist/geist.h declared here by hand. It also checks the pin's promise: after
reset + prefill of a question, the logits are bit-identical to those of a second session
that prefilled system turn + question from scratch.

Usage: pinned_prefix.py [--lib PATH/libgeist.so] [MODEL.gguf]
  --lib      default: $GEIST_LIB, else build/release/libgeist.so of this checkout
  MODEL      default: $GEIST_MODEL
Exit status: 0 on success, 1 on a geist error or a logits mismatch, 2 on bad usage.
"""
import argparse
import ctypes as C
import os
import sys

# ---- The C ABI (geist.h). Struct layouts must match the header field for field. ----
GEIST_OK = 0
GEIST_E_BUFFER_TOO_SMALL = 7
token = C.c_int32


class SamplingParams(C.Structure):  # geist_sampling_params
    _fields_ = [("struct_size", C.c_uint32), ("temperature", C.c_float), ("top_k", C.c_int32),
                ("top_p", C.c_float), ("min_p", C.c_float), ("repeat_penalty", C.c_float),
                ("repeat_last_n", C.c_int32), ("seed", C.c_uint64)]


class SessionParams(C.Structure):  # geist_session_params
    _fields_ = [("struct_size", C.c_uint32), ("n_threads", C.c_int32), ("n_ctx", C.c_int64),
                ("chunk", C.c_int32), ("type_k", C.c_int32), ("type_v", C.c_int32),
                ("reserved", C.c_int32), ("sampling", SamplingParams)]


class SessionStats(C.Structure):  # struct geist_session_stats
    _fields_ = [(name, C.c_double if name.endswith("seconds") else C.c_uint64) for name in (
        "n_prefill_tokens", "prefill_seconds", "n_decode_tokens", "decode_seconds", "n_pins",
        "n_pinned_tokens", "pin_seconds", "n_resets", "reset_seconds", "n_reset_rows", "n_snapshots",
        "snapshot_seconds", "n_restores", "restore_seconds", "kv_bytes_reserved", "checkpoint_bytes",
        "last_prefill_seconds", "last_decode_seconds", "scratch_bytes")]


def load_lib(path):
    lib = C.CDLL(path)
    sz, st, vp, model, sess = C.c_size_t, C.c_int, C.c_void_p, C.c_void_p, C.c_void_p
    psz, ptok = C.POINTER(C.c_size_t), C.POINTER(token)
    protos = {  # name: (restype, argtypes)
        "geist_status_name": (C.c_char_p, [st]),
        "geist_last_error": (C.c_char_p, []),
        "geist_model_load": (st, [C.c_char_p, vp, C.POINTER(model)]),
        "geist_model_free": (None, [model]),
        "geist_tokenize": (st, [model, C.c_char_p, sz, C.c_int, C.c_int, ptok, sz, psz]),
        "geist_detokenize": (st, [model, ptok, sz, C.c_int, C.c_char_p, sz, psz]),
        "geist_token_is_eog": (C.c_int, [model, token]),
        "geist_session_params_default": (SessionParams, []),
        "geist_session_create": (st, [model, C.POINTER(SessionParams), C.POINTER(sess)]),
        "geist_session_free": (None, [sess]),
        "geist_session_error": (C.c_char_p, [sess]),
        "geist_session_pin_prefix": (st, [sess, ptok, sz]),
        "geist_session_reset": (st, [sess]),
        "geist_session_clear": (st, [sess]),
        "geist_session_prefill_tokens": (st, [sess, ptok, sz]),
        "geist_session_decode_step": (st, [sess, ptok]),
        "geist_session_logits": (C.POINTER(C.c_float), [sess, psz]),
        "geist_session_n_pinned": (sz, [sess]),
        "geist_session_stats": (st, [sess, C.POINTER(SessionStats)]),
    }
    for name, (res, args) in protos.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


class GeistError(Exception):
    pass


def check(lib, status, call, session=None):
    if status != GEIST_OK:
        msg = lib.geist_session_error(session) if session else lib.geist_last_error()
        raise GeistError(f"{call} failed: {lib.geist_status_name(status).decode()}: {msg.decode()}")


def tokenize(lib, model, text, add_bos, parse_special):
    """Size query (cap 0), then the call with a buffer of the size it reported."""
    raw, n = text.encode(), C.c_size_t(0)
    st = lib.geist_tokenize(model, raw, len(raw), add_bos, parse_special, None, 0, C.byref(n))
    if st == GEIST_OK:
        return []
    if st != GEIST_E_BUFFER_TOO_SMALL:
        check(lib, st, "geist_tokenize")
    out = (token * n.value)()
    check(lib, lib.geist_tokenize(model, raw, len(raw), add_bos, parse_special, out, n.value, C.byref(n)),
          "geist_tokenize")
    return list(out[:n.value])


def detokenize(lib, model, ids):
    arr, n = (token * len(ids))(*ids), C.c_size_t(0)
    st = lib.geist_detokenize(model, arr, len(ids), 0, None, 0, C.byref(n))
    if st == GEIST_OK:
        return ""
    if st != GEIST_E_BUFFER_TOO_SMALL:
        check(lib, st, "geist_detokenize")
    buf = C.create_string_buffer(n.value)
    check(lib, lib.geist_detokenize(model, arr, len(ids), 0, buf, n.value, C.byref(n)), "geist_detokenize")
    return buf.raw[:n.value].decode("utf-8")  # geist writes ill-formed bytes as U+FFFD


def logits_bytes(lib, session):
    nv = C.c_size_t(0)
    p = lib.geist_session_logits(session, C.byref(nv))
    if not p:
        raise GeistError("geist_session_logits returned NULL")
    return C.string_at(p, nv.value * C.sizeof(C.c_float))


def default_lib():
    here = os.path.dirname(os.path.abspath(__file__))
    return os.environ.get("GEIST_LIB") or os.path.join(here, "..", "..", "build", "release", "libgeist.so")


def run(lib, model_path, max_new=32):
    system = "<start_of_turn>user\nYou are a terse assistant.\n\n"
    turn_end = "<end_of_turn>\n<start_of_turn>model\n"
    questions = ["What is the capital of France?", "Name a prime number.", "Why is the sky blue?"]
    model, s, ref = C.c_void_p(), C.c_void_p(), C.c_void_p()
    try:
        check(lib, lib.geist_model_load(model_path.encode(), None, C.byref(model)), "geist_model_load")
        params = lib.geist_session_params_default()
        params.sampling.temperature = 0.0  # greedy
        check(lib, lib.geist_session_create(model, C.byref(params), C.byref(s)), "geist_session_create")
        check(lib, lib.geist_session_create(model, C.byref(params), C.byref(ref)), "geist_session_create")
        sys_ids = tokenize(lib, model, system, 1, 1)
        check(lib, lib.geist_session_pin_prefix(s, (token * len(sys_ids))(*sys_ids), len(sys_ids)),
              "geist_session_pin_prefix", s)
        print(f"pinned {lib.geist_session_n_pinned(s)} tokens")
        mismatches = 0
        for q in questions:
            before, after = SessionStats(), SessionStats()
            check(lib, lib.geist_session_stats(s, C.byref(before)), "geist_session_stats", s)
            check(lib, lib.geist_session_reset(s), "geist_session_reset", s)
            # User text with parse_special=0 (no injected control tokens), markers with 1.
            q_ids = tokenize(lib, model, q, 0, 0) + tokenize(lib, model, turn_end, 0, 1)
            check(lib, lib.geist_session_prefill_tokens(s, (token * len(q_ids))(*q_ids), len(q_ids)),
                  "geist_session_prefill_tokens", s)
            # The promise: the same bytes as system + question prefilled from scratch.
            full = sys_ids + q_ids
            check(lib, lib.geist_session_clear(ref), "geist_session_clear", ref)
            check(lib, lib.geist_session_prefill_tokens(ref, (token * len(full))(*full), len(full)),
                  "geist_session_prefill_tokens", ref)
            if logits_bytes(lib, s) != logits_bytes(lib, ref):
                print(f"MISMATCH: logits after reset + prefill differ from a fresh prefill ({q!r})")
                mismatches += 1
            out, t = [], token(0)
            for _ in range(max_new):
                check(lib, lib.geist_session_decode_step(s, C.byref(t)), "geist_session_decode_step", s)
                if lib.geist_token_is_eog(model, t.value):
                    break
                out.append(t.value)
            check(lib, lib.geist_session_stats(s, C.byref(after)), "geist_session_stats", s)
            print(f"Q: {q}\nA: {detokenize(lib, model, out)}")
            print(f"   reset {(after.reset_seconds - before.reset_seconds) * 1e3:.3f} ms, "
                  f"prefill {len(q_ids)} tokens {after.last_prefill_seconds * 1e3:.1f} ms, "
                  f"decode {len(out)} tokens {(after.decode_seconds - before.decode_seconds) * 1e3:.1f} ms")
        if mismatches:
            return 1
        print("pinned == unpinned: OK")
        return 0
    except GeistError as e:
        print(e, file=sys.stderr)
        return 1
    finally:
        lib.geist_session_free(ref)
        lib.geist_session_free(s)
        lib.geist_model_free(model)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", default=default_lib(), help="path of libgeist.so")
    ap.add_argument("model", nargs="?", default=os.environ.get("GEIST_MODEL"), help="GGUF file")
    ap.add_argument("-n", type=int, default=32, help="most tokens per answer")
    a = ap.parse_args()
    if not a.model:
        ap.error("no model: pass MODEL.gguf or set GEIST_MODEL")
    if not os.path.exists(a.lib):
        ap.error(f"{a.lib} not found: build geist (cmake --build build/release) or pass --lib / set GEIST_LIB")
    return run(load_lib(a.lib), a.model, a.n)


if __name__ == "__main__":
    sys.exit(main())
