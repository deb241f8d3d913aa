#!/usr/bin/env python3
"""Reference tokenizations of the Gemma 3 vocabulary by llama.cpp (via llama-cpp-python).

Writes tests/data/tokenizer/gemma3_ref.jsonl: one JSON object per line. The first line is a
header {"header": {...}} with the llama_cpp version and the model file; every other line is
one case:
  {"name", "text" (valid UTF-8) or "text_hex" (raw bytes), "add_bos", "special", "ids",
   "decoded" / "decoded_hex" and "decoded_special" / "decoded_special_hex" (llama.cpp's
   llama_detokenize with unparse_special off / on, remove_special off), "invalid_utf8"}
Every string is tokenized with all four (add_bos, special) combinations. Decoding calls
llama_detokenize directly: the wrapper's Llama.detokenize drops a leading space after BOS,
which llama.cpp itself does not do for Gemma (add_space_prefix is false).

Usage: scripts/gen_tokenizer_ref.py [--model PATH] [--out PATH]
"""
import argparse
import json
import os
import sys

DEFAULT_MODEL = os.path.expanduser("~/.cache/geist/models/gemma-3-270m-q4_k_m.gguf")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO, "tests", "data", "tokenizer", "gemma3_ref.jsonl")

LONG_PARAGRAPH = (
    "The tokenizer is the first and last stage of every language model pipeline. "
    "It turns raw text into a sequence of integer ids, and later turns ids back into text. "
    "SentencePiece-style tokenizers, such as the one used by Gemma, start from individual "
    "characters and repeatedly merge the adjacent pair with the highest score, until no "
    "pair can be merged any more. Characters that are not in the vocabulary fall back to "
    "byte tokens, so that every input can be represented. In practice, the vocabulary of "
    "262,144 entries covers most scripts of the world: Latin, Cyrillic (Привет, мир!), "
    "Greek (Γειά σου Κόσμε), Arabic (مرحبا بالعالم), Devanagari (नमस्ते दुनिया), Chinese "
    "(你好，世界), Japanese (こんにちは世界), Korean (안녕하세요 세계) and many more. "
    "Numbers like 3.14159, 2,718 and 1e-9 are split digit by digit, which helps arithmetic. "
    "Whitespace matters too:  double spaces,\ttabs, and\n\nblank lines all become tokens.\n"
)

# Hand-written inputs: (name, str or bytes).
CASES = [
    # --- empty and whitespace ---
    ("empty", ""),
    ("space", " "),
    ("two_spaces", "  "),
    ("three_spaces", "   "),
    ("many_spaces_31", " " * 31),
    ("many_spaces_32", " " * 32),
    ("many_spaces_70", " " * 70),
    ("tab", "\t"),
    ("tabs_3", "\t\t\t"),
    ("tabs_40", "\t" * 40),
    ("newline", "\n"),
    ("newlines_2", "\n\n"),
    ("newlines_5", "\n\n\n\n\n"),
    ("newlines_40", "\n" * 40),
    ("crlf", "line1\r\nline2\r\n"),
    ("cr_only", "a\rb\rc"),
    ("mixed_ws", " \t \n \t\n  \n\t\t  x"),
    ("leading_space", " hello"),
    ("leading_spaces", "   hello"),
    ("trailing_space", "hello "),
    ("trailing_spaces", "hello   "),
    ("inner_spaces", "hello  world   again    end"),
    ("space_newline", "hello \n world"),
    ("vertical_tab_ff", "a\x0bb\x0cc"),
    ("nbsp", "a\u00a0b\u00a0\u00a0c"),
    ("ideographic_space", "a\u3000b"),
    ("en_em_space", "a\u2002b\u2003c\u2009d"),
    # --- ASCII prose ---
    ("hello", "Hello"),
    ("hello_world", "Hello world"),
    ("hello_world_bang", "Hello, world!"),
    ("sentence", "The quick brown fox jumps over the lazy dog."),
    ("sentence_caps", "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG"),
    ("question", "What is the capital of France?"),
    ("contractions", "I'm sure you'll see it's what they've done, isn't it? Y'all'd've."),
    ("quotes", "He said \"yes\" and 'no' and `maybe`."),
    ("punct_run", "!!!???...,,,;;;:::---___"),
    ("ascii_printable", "".join(chr(c) for c in range(32, 127))),
    ("single_letters", "a b c d e f g h i j k l m n o p q r s t u v w x y z"),
    ("long_word", "Pneumonoultramicroscopicsilicovolcanoconiosis"),
    ("antidis", "antidisestablishmentarianism supercalifragilisticexpialidocious"),
    ("repeated_a", "a" * 100),
    ("repeated_ab", "ab" * 60),
    ("repeated_word", "the " * 40),
    ("camel_case", "getElementById parseHTTPResponse XMLHttpRequest iPhone"),
    ("snake_case", "snake_case_identifier __init__ _private CONSTANT_VALUE"),
    ("hyphens", "state-of-the-art well-known e-mail re-enter"),
    ("abbrev", "e.g. i.e. etc. U.S.A. Dr. Mr. Mrs. a.m. p.m."),
    ("paragraph", LONG_PARAGRAPH),
    ("paragraph_x3", LONG_PARAGRAPH * 3),
    # --- numbers ---
    ("digits", "0123456789"),
    ("integer", "1234567890123456789"),
    ("decimal", "3.14159265358979"),
    ("negative", "-42 and -0.5 and +7"),
    ("thousands", "1,000,000 and 1.000.000 and 1 000 000"),
    ("scientific", "6.022e23 1E-9 2.5e+10"),
    ("hex_num", "0xDEADBEEF 0x1f 0b1010 0o777"),
    ("dates", "2024-01-15 15/01/2024 Jan 15, 2024 12:30:45"),
    ("money", "$19.99 €5,00 £100 ¥1000 ₹250 ₿0.001"),
    ("percent", "50% 99.9% 100 %"),
    ("phone", "+1 (555) 123-4567"),
    ("math", "x^2 + y^2 = z^2; ∑_{i=1}^{n} i = n(n+1)/2; ∫ f(x) dx ≈ 3.0 ± 0.1"),
    ("fractions", "½ ⅓ ¼ ¾ 1/2"),
    ("roman", "Ⅰ Ⅱ Ⅲ Ⅳ XIV MMXXIV"),
    ("fullwidth_digits", "１２３ＡＢＣ"),
    ("arabic_digits", "٠١٢٣٤٥٦٧٨٩"),
    # --- URLs, paths, emails ---
    ("url", "https://www.example.com/path/to/page?query=value&other=123#section"),
    ("url_short", "http://a.b/c"),
    ("email", "john.doe+filter@example-mail.co.uk"),
    ("path_unix", "/usr/local/bin/python3 ~/.config/app/settings.json"),
    ("path_windows", "C:\\Users\\Admin\\Documents\\file (1).txt"),
    ("ip", "192.168.0.1:8080 [::1]:443"),
    ("hashtag", "#MachineLearning @user_name $TICKER"),
    # --- code ---
    ("python", "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n"),
    ("python_class", "class Foo(Bar):\n    \"\"\"Docstring.\"\"\"\n\n    def __init__(self, x: int = 0) -> None:\n        self.x = x  # comment\n"),
    ("python_fstring", "print(f\"{name!r:>10} = {value:.3f}\")"),
    ("cpp", "#include <vector>\nint main() {\n  std::vector<int> v{1, 2, 3};\n  for (auto &x : v) x *= 2;\n  return 0;\n}\n"),
    ("cpp_template", "template <typename T> constexpr T max(const T &a, const T &b) { return a < b ? b : a; }"),
    ("c_ptr", "int **pp = &p; *pp = NULL; a->b = c >> 2 << 1;"),
    ("rust", "fn main() { let mut v: Vec<u32> = Vec::new(); v.push(1); println!(\"{:?}\", v); }"),
    ("js", "const f = async (x) => { await fetch(`/api/${x}`); return x ?? null; };"),
    ("json", "{\"name\": \"geist\", \"version\": 1, \"tags\": [\"a\", \"b\"], \"ok\": true, \"n\": null}"),
    ("json_pretty", "{\n  \"a\": {\n    \"b\": [\n      1,\n      2\n    ]\n  }\n}"),
    ("html", "<!DOCTYPE html>\n<html>\n<head><title>Test</title></head>\n<body><h1>Hi</h1><p class=\"x\">Para</p></body>\n</html>"),
    ("html_tags", "<table><tr><td>1</td></tr></table><div><span>x</span></div><br/><img>"),
    ("html_tags2", "<h1><h2><h3><h4><h5><h6></h1></h2><b></b><i></i><em></em><sub></sub><sup></sup>"),
    ("html_entities", "&lt;tag&gt; &amp; &quot; &#39; &nbsp; &copy;"),
    ("markdown", "# Title\n\n## Section\n\n- item 1\n- item 2\n\n**bold** _italic_ `code`\n\n```python\nx = 1\n```\n"),
    ("markdown_table", "| a | b |\n|---|---|\n| 1 | 2 |\n"),
    ("sql", "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC LIMIT 10;"),
    ("shell", "for f in *.txt; do echo \"$f\" | grep -E '^[a-z]+$' >> out.log 2>&1; done"),
    ("regex", "^(?:[a-z0-9!#$%&'*+/=?^_`{|}~-]+)@(?:[a-z0-9-]+\\.)+[a-z]{2,}$"),
    ("latex", "\\begin{equation} E = mc^2 \\quad \\frac{a}{b} \\end{equation}"),
    ("indented_code", "    line1\n        line2\n\t\tline3\n"),
    ("yaml", "key: value\nlist:\n  - a\n  - b\nnested:\n  k: 1\n"),
    ("brackets", "((([[[{{{<<<>>>}}}]]])))"),
    ("operators", "a+=1; b-=2; c*=3; d/=4; e%=5; f&&g || !h; i != j == k <= l >= m"),
    # --- Latin-script languages / diacritics ---
    ("french", "Où est la bibliothèque ? Ça coûte très cher, n'est-ce pas ?"),
    ("german", "Größenwahnsinnige Straßenbahnfahrer über Äpfel, Öl und Übermut."),
    ("spanish", "¿Dónde está el niño? ¡Mañana será otro día!"),
    ("portuguese", "Não há ação sem reação. São Paulo é incrível."),
    ("polish", "Zażółć gęślą jaźń."),
    ("czech", "Příliš žluťoučký kůň úpěl ďábelské ódy."),
    ("turkish", "İstanbul'da ılık bir gün; ağaçlar, çiçekler, şehir."),
    ("vietnamese", "Tiếng Việt có nhiều dấu: ă â đ ê ô ơ ư, ả ã ạ ấ ầ ẩ ẫ ậ."),
    ("icelandic", "Þetta er íslenska: ð, þ, æ, ö."),
    ("romanian", "Știință și țară"),
    ("combining_acute", "e\u0301 a\u0300 n\u0303 o\u0308"),
    ("combining_stack", "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319a\u0324\u031e\u0349l\u0316g\u0353o"),
    ("nfc_vs_nfd", "\u00e9 vs e\u0301 vs \u1e9b\u0323"),
    ("ligatures", "ﬁ ﬂ ﬀ ﬃ æ œ Ĳ"),
    # --- other scripts ---
    ("russian", "Привет, мир! Как дела? Съешь же ещё этих мягких французских булок."),
    ("ukrainian", "Їжак ґедзь є і їсть."),
    ("greek", "Γειά σου Κόσμε! Ξεσκεπάζω την ψυχοφθόρα βδελυγμία."),
    ("armenian", "Բարև աշխարհ"),
    ("georgian", "გამარჯობა მსოფლიო"),
    ("hebrew", "שלום עולם! מה שלומך?"),
    ("arabic", "مرحبا بالعالم! كيف حالك اليوم؟"),
    ("arabic_diacritics", "العَرَبِيَّة"),
    ("persian", "سلام دنیا، حال شما چطور است؟"),
    ("urdu", "ہیلو دنیا"),
    ("hindi", "नमस्ते दुनिया! आप कैसे हैं?"),
    ("bengali", "হ্যালো বিশ্ব"),
    ("tamil", "வணக்கம் உலகம்"),
    ("telugu", "హలో ప్రపంచం"),
    ("gujarati", "નમસ્તે વિશ્વ"),
    ("punjabi", "ਸਤਿ ਸ੍ਰੀ ਅਕਾਲ ਦੁਨਿਆ"),
    ("sinhala", "ආයුබෝවන් ලෝකය"),
    ("thai", "สวัสดีชาวโลก ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ"),
    ("lao", "ສະບາຍດີໂລກ"),
    ("khmer", "សួស្តីពិភពលោក"),
    ("burmese", "မင်္ဂလာပါကမ္ဘာလောက"),
    ("tibetan", "བཀྲ་ཤིས་བདེ་ལེགས།"),
    ("amharic", "ሰላም ልዑል"),
    ("chinese_simplified", "你好，世界！今天天气很好，我们去公园散步吧。"),
    ("chinese_traditional", "繁體中文測試：臺灣、香港、澳門。"),
    ("japanese", "こんにちは世界。カタカナとひらがなと漢字を混ぜた文章です。"),
    ("japanese_halfwidth", "ｶﾀｶﾅ ﾃｽﾄ"),
    ("korean", "안녕하세요 세계! 한국어 문장입니다."),
    ("korean_jamo", "\u1100\u1161\u11a8 \u3131\u314f"),
    ("mongolian", "Сайн байна уу ᠮᠣᠩᠭᠣᠯ"),
    ("cherokee", "ᏣᎳᎩ ᎦᏬᏂᎯᏍᏗ"),
    ("inuktitut", "ᐃᓄᒃᑎᑐᑦ"),
    ("mixed_scripts", "English русский 中文 العربية हिन्दी 日本語 한국어 ไทย"),
    ("cjk_ext_b", "𠀀𠀁𠀂 𪚥 𩸽"),
    ("rtl_marks", "abc\u200fdef\u200eghi\u202bjkl\u202c"),
    # --- emoji and symbols ---
    ("emoji", "😀😃😄😁😆"),
    ("emoji_text", "I love pizza 🍕 and coffee ☕!"),
    ("emoji_zwj_family", "👨‍👩‍👧‍👦"),
    ("emoji_zwj_misc", "👩‍💻 🧑‍🚀 🏳️‍🌈 🐻‍❄️"),
    ("emoji_skin_tone", "👍🏻 👍🏼 👍🏽 👍🏾 👍🏿"),
    ("emoji_flags", "🇺🇸🇩🇪🇯🇵🇫🇷🇧🇷"),
    ("emoji_keycap", "1️⃣ #️⃣ *️⃣"),
    ("emoji_variation", "☺ ☺️ ♥ ♥️ ✔ ✔️"),
    ("emoji_tag_flag", "🏴󠁧󠁢󠁳󠁣󠁴󠁿"),
    ("symbols", "© ® ™ § ¶ † ‡ • … ‰ ′ ″ ‹ › « » ¿ ¡"),
    ("arrows", "← → ↑ ↓ ↔ ⇒ ⇔ ➜"),
    ("box_drawing", "┌─┬─┐\n│ │ │\n└─┴─┘"),
    ("math_symbols", "∀x∈ℝ: ∃y∉∅ ⊂ ⊆ ∪ ∩ ∞ ∂ ∇ √ ∛ ≠ ≤ ≥ ≡"),
    ("math_alnum", "𝐀𝐁𝐂 𝑎𝑏𝑐 𝔸𝔹ℂ 𝟘𝟙𝟚"),
    ("currency", "¢ £ ¤ ¥ ₩ ₪ ₫ € ₭ ₮ ₱ ₲ ₴ ₸ ₺ ₼ ₽"),
    ("braille", "⠓⠑⠇⠇⠕"),
    ("music", "♩ ♪ ♫ ♬ 𝄞"),
    ("dingbats", "✂ ✈ ✉ ✌ ✍ ✏ ❤ ❄"),
    # --- rare characters that force byte fallback ---
    ("private_use", "\ue000\ue001\uf8ff"),
    ("private_use_plane15", "\U000f0000\U0010fffd"),
    ("unassigned", "\u0378\u0379 \U000e0080"),
    ("noncharacters", "\ufdd0\ufffe\uffff"),
    ("control_chars", "a\x00b\x01c\x02d\x07e\x1bf\x7fg"),
    ("c1_controls", "\x80\x85\x9f"),
    ("bom", "\ufeffhello"),
    ("zero_width", "a\u200bb\u200cc\u200dd\u2060e"),
    ("replacement_char", "\ufffd\ufffd"),
    ("linear_b", "𐀀𐀁𐀂"),
    ("cuneiform", "𒀀𒀁𒀂"),
    ("egyptian", "𓀀𓀁𓂀"),
    ("high_astral_mix", "x\U0001f9ffy\U0001fab8z"),
    # --- special token texts (tokenized with special on and off) ---
    ("chat_turn", "<start_of_turn>user\nHello, how are you?<end_of_turn>\n<start_of_turn>model\n"),
    ("chat_full", "<bos><start_of_turn>user\nYou are helpful.\n\nWrite a haiku.<end_of_turn>\n<start_of_turn>model\nLeaves fall.<end_of_turn>\n"),
    ("bos_text", "<bos>"),
    ("eos_text", "<eos>"),
    ("pad_text", "<pad>"),
    ("unk_text", "<unk>"),
    ("mask_text", "<mask>"),
    ("start_of_turn_text", "<start_of_turn>"),
    ("end_of_turn_text", "<end_of_turn>"),
    ("unused_text", "<unused0><unused17><unused6241>"),
    ("image_tokens", "<start_of_image>[multimodal]<end_of_image>"),
    ("specials_adjacent", "<bos><bos><eos><eos>"),
    ("specials_in_text", "Say <eos> then <bos> and <pad>!"),
    ("specials_spaced", " <start_of_turn> user <end_of_turn> "),
    ("special_partial", "<start_of_tur <end_of_turn <bos <eos> >"),
    ("special_nested", "<<bos>> <<eos>eos>"),
    ("special_case", "<BOS> <Eos> <END_OF_TURN>"),
    ("byte_token_text", "<0x41><0xFF><0x00>"),
    ("multimodal_text", "[multimodal] text [multimodal]"),
    ("user_defined_html_in_text", "Use <h1> for titles and </h1> to close, <table> for data."),
    ("tag_near_special", "<bos><h1>x</h1><eos>"),
    ("newline_specials", "\n<start_of_turn>\n\n<end_of_turn>\n\n\n"),
    ("spaces_around_tabs", "  \t  \t\t   "),
    ("spaces_then_special", "   <eos>   "),
    # --- assorted edge cases ---
    ("literal_escape_char", "\u2581hello \u2581\u2581world\u2581"),
    ("space_then_newline", " \n"),
    ("newline_then_space", "\n "),
    ("blank_lines_text", "a\n\nb\n\n\nc"),
    ("tab_code", "if (x) {\n\treturn y;\n\t}\n"),
    ("single_char_a", "a"),
    ("single_char_cjk", "中"),
    ("single_emoji", "🙂"),
    ("single_digit", "7"),
    ("single_punct", "."),
    ("word_variants", "run running runner ran runs Run RUN rUn"),
    ("mixed_case_words", "HeLLo WoRLD tHiS iS mIxEd"),
    ("spaces_before_punct", "word , word . word ! word ?"),
    ("multilingual_sentence", "Das ist ein Test. C'est un test. Это тест. これはテストです。"),
    ("url_in_sentence", "Visit https://github.com/ggerganov/llama.cpp/blob/master/README.md for details."),
]

# Raw byte strings (invalid UTF-8): tokenized from bytes directly.
BYTE_CASES = [
    ("invalid_lone_continuation", b"a\x80b"),
    ("invalid_ff", b"\xff\xfe"),
    ("invalid_truncated_end", b"hello\xe2\x96"),
    ("invalid_truncated_4", b"x\xf0\x9f\x98"),
    ("invalid_lead_then_ascii", b"\xe2AB"),
    ("invalid_overlong", b"\xc0\xaf\xe0\x80\xaf"),
    ("invalid_surrogate", b"\xed\xa0\x80\xed\xbf\xbf"),
    ("invalid_mixed", b"ok \xc3( \xa9 ok"),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args()

    import llama_cpp

    import ctypes

    llm = llama_cpp.Llama(model_path=args.model, vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)

    def detokenize(ids, special):
        arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
        cap = 64 + 64 * len(ids)
        buf = ctypes.create_string_buffer(cap)
        n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, cap, False, special)
        assert 0 <= n <= cap, n
        return buf.raw[:n]

    def put_bytes(rec, key, b):
        try:
            rec[key] = b.decode("utf-8")
        except UnicodeDecodeError:
            rec[key + "_hex"] = b.hex()

    names = set()
    lines = [json.dumps({"header": {
        "generator": "scripts/gen_tokenizer_ref.py",
        "llama_cpp_version": llama_cpp.__version__,
        "model": os.path.basename(args.model),
        "n_vocab": llm.n_vocab(),
    }})]
    all_cases = [(n, s.encode("utf-8"), False) for n, s in CASES]
    all_cases += [(n, b, True) for n, b in BYTE_CASES]
    n_strings = 0
    for name, data, invalid in all_cases:
        assert name not in names, name
        names.add(name)
        n_strings += 1
        for add_bos in (True, False):
            for special in (False, True):
                ids = llm.tokenize(data, add_bos=add_bos, special=special)
                rec = {"name": name}
                put_bytes(rec, "text", data)
                rec.update({"add_bos": add_bos, "special": special, "ids": ids})
                put_bytes(rec, "decoded", detokenize(ids, False))
                put_bytes(rec, "decoded_special", detokenize(ids, True))
                rec["invalid_utf8"] = invalid
                lines.append(json.dumps(rec, ensure_ascii=False))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{n_strings} strings, {len(lines) - 1} cases -> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
