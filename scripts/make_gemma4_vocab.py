#!/usr/bin/env python3
"""A small synthetic Gemma 4 style tokenizer, built with the HF `tokenizers` package, and
the reference tokenizations that tests/tokenizer_gemma4_unit.cpp checks geist against.

Writes
  tests/data/tokenizer/gemma4_tiny_tokenizer.json   the HF tokenizer (vocab + merges)
  tests/data/tokenizer/gemma4_ref.jsonl             {"text": ..., "ids": [...]} per line,
                                                    the ids from that HF tokenizer (no BOS)

The tokenizer has the shape of Gemma 4's (model-spec.md s7.4): a BPE with merge ranks over
raw UTF-8 characters, spaces replaced by U+2581 ("\u2581"), the text pre-split into runs of
newlines and runs of other characters, byte fallback to <0xXX> tokens. Its vocabulary:
special tokens at Gemma's ids (<pad> 0, <eos> 1, <bos> 2, <unk> 3, <mask> 4) and the turn
markers <|turn> / <turn|>, the 256 byte tokens, then characters and merges learned by the
tokenizers BPE trainer on tests/data/text/kjv_genesis.txt, VOCAB entries in all. The tiny
Gemma 4 GGUFs (tools/convert_gemma4.py --tokenizer) carry this vocabulary.

Usage: pip install tokenizers; python3 scripts/make_gemma4_vocab.py
"""
import json
import random
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer

ROOT = Path(__file__).resolve().parent.parent
VOCAB = 384
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<|turn>", "<turn|>", "<|think|>"]
SPLIT = Regex(r"[^\n]+|[\n]+")


def configure(tok):
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split(SPLIT, behavior="isolated")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])


def build():
    corpus = (ROOT / "tests/data/text/kjv_genesis.txt").read_text(encoding="utf-8")
    n_fixed = len(SPECIALS) + 256
    trainer_tok = Tokenizer(BPE())
    configure(trainer_tok)
    trainer = BpeTrainer(vocab_size=VOCAB - n_fixed, show_progress=False, special_tokens=[])
    trainer_tok.train_from_iterator(corpus.splitlines(keepends=True), trainer)
    learned = json.loads(trainer_tok.to_str())["model"]
    vocab = {t: i for i, t in enumerate(SPECIALS)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for text, _ in sorted(learned["vocab"].items(), key=lambda kv: kv[1]):
        if text not in vocab:
            vocab[text] = len(vocab)
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in learned["merges"]]
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, byte_fallback=True, fuse_unk=False))
    configure(tok)
    tok.add_special_tokens(SPECIALS)
    return tok


def cases():
    corpus = (ROOT / "tests/data/text/kjv_genesis.txt").read_text(encoding="utf-8")
    lines = [l for l in corpus.splitlines() if l.strip()]
    rnd = random.Random(4)
    out = ["", " ", "  ", "\n", "\n\n", "\n\n\n\n", " \n ", "a", "In the beginning", " In the beginning",
           "in  the   beginning", "God said, Let there be light: and there was light.",
           "line one\nline two\n\nline four\n", "\n\nleading newlines", "trailing spaces   ",
           "tabs\tand\tcarriage\r\nreturns", "UPPER lower MiXeD", "numbers 0123456789 3.14159",
           "punctuation !?.,;:'\"()[]{}<>", "caf\u00e9 na\u00efve \u00fcber", "\u4e2d\u6587 \u65e5\u672c\u8a9e",
           "emoji \U0001F600\U0001F680", "\u2581already\u2581escaped", "<bos> is plain text here",
           "<|turn>user\nhi<turn|>", "x" * 50, "ab" * 30, "\u00a0non-breaking\u00a0space"]
    out += lines[:120]
    for _ in range(60):  # random slices and joins, some across line boundaries
        i = rnd.randrange(len(corpus) - 200)
        out.append(corpus[i:i + rnd.randrange(1, 200)])
    for _ in range(20):
        out.append("".join(rnd.choice("ab \n\u00e9\u4e2dxyz.,") for _ in range(rnd.randrange(1, 40))))
    return out


def main():
    tok = build()
    data = ROOT / "tests/data/tokenizer"
    (data / "gemma4_tiny_tokenizer.json").write_text(tok.to_str(pretty=True), encoding="utf-8")
    with open(data / "gemma4_ref.jsonl", "w", encoding="utf-8") as f:
        for text in cases():
            ids = tok.encode(text, add_special_tokens=False).ids
            f.write(json.dumps({"text": text, "ids": ids}, ensure_ascii=False) + "\n")
    print(f"vocab {tok.get_vocab_size()}, {len(cases())} cases")


if __name__ == "__main__":
    main()
