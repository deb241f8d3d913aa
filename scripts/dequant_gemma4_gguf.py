#!/usr/bin/env python3
"""Turn a Gemma 4 GGUF back into an HF checkpoint with the GGUF's weights, dequantized by
the gguf package: HF transformers then runs exactly the weights geist runs, so its logits
are the reference for a quantized GGUF (tests/gemma4_logits_int.cpp, Q8_0 copies).

Usage: python3 scripts/dequant_gemma4_gguf.py MODEL.gguf HF_DIR OUT_DIR
  HF_DIR: the checkpoint the GGUF was converted from (for config.json and tensor names).
"""
import shutil
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
from safetensors.numpy import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import convert_gemma4 as conv  # noqa: E402


def main():
    gguf_path, hf_dir, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    T = conv.load_tensors(hf_dir)
    import json
    cfg = json.loads((hf_dir / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    L = cfg["num_hidden_layers"]
    first_shared = L - cfg.get("num_kv_shared_layers", 0)
    d_ple = cfg.get("hidden_size_per_layer_input", 0)
    r = GGUFReader(str(gguf_path))
    by_name = {t.name: t for t in r.tensors}
    out_t = {}
    for hf, name, _ in conv.tensor_map(T, L, first_shared, d_ple):
        t = by_name[name]
        x = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(T[hf].shape)
        out_t[hf] = np.ascontiguousarray(x)
    out.mkdir(parents=True, exist_ok=True)
    save_file(out_t, str(out / "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(hf_dir / "config.json", out / "config.json")
    print(f"wrote {out}: {len(out_t)} tensors from {gguf_path.name}")


if __name__ == "__main__":
    main()
