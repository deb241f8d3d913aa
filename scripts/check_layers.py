#!/usr/bin/env python3
"""Checks the include direction between geist's layers (docs/ARCHITECTURE.md):
a file may include its own layer and the layers below it, never above. Exit 1 on a violation."""
import re
import sys
from pathlib import Path

# Lower index = lower layer. "geist" is the public include/geist/ header set.
ORDER = ["geist", "base", "quant", "gguf", "backends", "models", "engine", "api"]
ALLOWED_BELOW = {
    "geist": set(),
    "base": {"geist"},
    "quant": {"geist", "base"},
    "gguf": {"geist", "base", "quant"},
    "backends": {"geist", "base", "quant"},
    "models": {"geist", "base", "quant", "gguf", "backends"},
    "engine": {"geist", "base", "quant", "gguf", "backends", "models"},
    "api": {"geist", "base", "quant", "gguf", "backends", "models", "engine"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def main() -> int:
    root = Path(__file__).resolve().parent.parent
    bad = []
    for f in sorted((root / "src").rglob("*")):
        if f.suffix not in (".h", ".hpp", ".cpp", ".cc"):
            continue
        layer = f.relative_to(root / "src").parts[0]
        if layer not in ALLOWED_BELOW:
            bad.append(f"{f.relative_to(root)}: directory '{layer}' is not a known layer")
            continue
        for inc in INCLUDE.findall(f.read_text(errors="replace")):
            top = inc.split("/")[0]
            if top == layer or top not in ALLOWED_BELOW:
                continue  # same layer, or a system/third-party header in quotes
            if top not in ALLOWED_BELOW[layer]:
                bad.append(f"{f.relative_to(root)}: includes \"{inc}\" ({top} is above {layer})")
    for b in bad:
        print(b)
    print(f"check_layers: {'FAIL' if bad else 'OK'} ({len(bad)} violations)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
