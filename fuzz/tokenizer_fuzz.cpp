// libFuzzer entry for the tokenizers (src/engine/tokenizer.cpp) over arbitrary bytes,
// built twice (fuzz/CMakeLists.txt): tokenizer_spm_fuzz (the Gemma 3 SPM vocabulary,
// "llama") and tokenizer_gemma4_fuzz (the Gemma 4 BPE vocabulary, "gemma4").
//
// Every input is the text, encoded four times (add_bos x parse_special) and decoded.
// Checked on every input, under ASan+UBSan (the fuzz preset):
// - encode succeeds ("any byte string is accepted"); it only appends to *out;
// - every id is in [0, n_vocab);
// - add_bos only adds the vocabulary's BOS in front (and EOS at the end if add_eos);
// - nothing is lost or invented: the ids' source bytes (a byte token's byte, else the
//   token's text with ' ' as U+2581) concatenate to the text with ' ' as U+2581, in both
//   parse_special modes (the special partition and the merges only group bytes);
// - round trip: decode(encode(text)) == text for parse_special off, when the text holds
//   no literal U+2581 (SPM cannot tell it from an escaped space; llama.cpp's references
//   in tests/data/tokenizer show the same) and no produced token renders differently from
//   its source (a merge that lands on a CONTROL/UNKNOWN/UNUSED text renders "", as in
//   llama.cpp; counted, not a failure);
// - StreamDecoder (ids pushed one by one, then flush) gives exactly decode()'s bytes with
//   each maximal ill-formed UTF-8 subpart replaced by U+FFFD, which is valid UTF-8
//   (checked against an independent table-driven decoder here).
// The last three need a vocabulary with a <0xXX> token for every byte and no
// add_space_prefix (both tiny vocabularies and the real Gemma 3 / 4 ones); other
// vocabularies get the first three checks only (said at start).
//
// Model: $GEIST_FUZZ_MODEL (any GGUF whose tokenizer.ggml.model is this target's), else
// the tiny one of the source tree (GEIST_FUZZ_MODEL_DEFAULT). The real Gemma 3 vocabulary
// (262k tokens, ~/.cache/geist/models/gemma-3-270m-q4_k_m.gguf) reaches many more merges.
// GEIST_FUZZ_STATS=1 prints at exit how often the round trip was checked or skipped.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/tokenizer.h"
#include "gguf/gguf_reader.h"

#ifndef GEIST_FUZZ_MODEL_DEFAULT
#error "GEIST_FUZZ_MODEL_DEFAULT: the GGUF whose vocabulary is fuzzed"
#endif
#ifndef GEIST_FUZZ_TOKENIZER_KIND
#error "GEIST_FUZZ_TOKENIZER_KIND: \"llama\" or \"gemma4\""
#endif

namespace {

using geist::StreamDecoder;
using geist::Tokenizer;
using geist::TokenType;

constexpr std::string_view kSp = "\xE2\x96\x81";      // U+2581
constexpr std::string_view kFffd = "\xEF\xBF\xBD";    // U+FFFD

const Tokenizer *g_tok = nullptr;
bool g_full = false;  // every byte has a byte token and no space prefix: exact checks on
std::vector<std::string> *g_source;  // [n_vocab] source bytes of each token (g_full)
std::vector<uint8_t> *g_renders_source;  // [n_vocab] 1 if decode gives the source back

struct Stats {
  uint64_t inputs = 0, roundtrip_checked = 0, skip_u2581 = 0, skip_render = 0;
  uint64_t ids = 0, specials_parsed = 0;
} g_stats;

[[noreturn]] void die(const char *what, std::string_view text = {}) {
  std::fprintf(stderr, "tokenizer_fuzz: %s (input of %zu bytes)\n", what, text.size());
  std::abort();
}

std::string escape(std::string_view s) {
  std::string r;
  r.reserve(s.size());
  for (char c : s) {
    if (c == ' ') {
      r.append(kSp);
    } else {
      r.push_back(c);
    }
  }
  return r;
}

std::string unescape(std::string_view s) {
  std::string r;
  for (size_t i = 0; i < s.size();) {
    if (s.substr(i, kSp.size()) == kSp) {
      r.push_back(' ');
      i += kSp.size();
    } else {
      r.push_back(s[i++]);
    }
  }
  return r;
}

// Independent UTF-8 repair (Unicode 15 table 3-7, "maximal subpart" substitution): the
// reference the StreamDecoder is compared with. Written without geist::utf8_step.
std::string repair_utf8(std::string_view s) {
  std::string r;
  const auto *p = reinterpret_cast<const uint8_t *>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const uint8_t b = p[i];
    int need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b <= 0x7F) {
      r.push_back(static_cast<char>(b));
      ++i;
      continue;
    } else if (b >= 0xC2 && b <= 0xDF) {
      need = 1;
    } else if (b == 0xE0) {
      need = 2, lo = 0xA0;
    } else if (b == 0xED) {
      need = 2, hi = 0x9F;
    } else if (b >= 0xE1 && b <= 0xEF) {
      need = 2;
    } else if (b == 0xF0) {
      need = 3, lo = 0x90;
    } else if (b == 0xF4) {
      need = 3, hi = 0x8F;
    } else if (b >= 0xF1 && b <= 0xF3) {
      need = 3;
    } else {
      r.append(kFffd);
      ++i;
      continue;
    }
    size_t k = 1;
    bool ok = true;
    for (int j = 0; j < need; ++j, ++k) {
      if (i + k >= n || p[i + k] < lo || p[i + k] > hi) {
        ok = false;
        break;
      }
      lo = 0x80, hi = 0xBF;
    }
    if (ok) {
      r.append(s.substr(i, k));
    } else {
      r.append(kFffd);  // the lead byte and the continuation bytes that fitted
    }
    i += k;
  }
  return r;
}

bool valid_utf8(std::string_view s) { return repair_utf8(s) == s; }

std::vector<int32_t> encode_or_die(std::string_view text, bool add_bos, bool special) {
  // Two sentinels first: encode must append and leave them alone.
  std::vector<int32_t> out = {-7, 123456789};
  geist::Status st = g_tok->encode(text, add_bos, special, &out);
  if (out.size() < 2 || out[0] != -7 || out[1] != 123456789) die("encode changed what *out held", text);
  if (!st) {
    if (st.message().empty()) die("an error without a message", text);
    // Only a vocabulary that cannot encode some byte may refuse, and then *out is as it was.
    if (g_full || st.code() != GEIST_E_UNSUPPORTED || out.size() != 2) {
      std::fprintf(stderr, "%s\n", st.to_string().c_str());
      die("encode refused a text", text);
    }
    return {};
  }
  out.erase(out.begin(), out.begin() + 2);
  for (int32_t id : out) {
    if (!g_tok->is_valid(id)) die("an id out of range", text);
  }
  return out;
}

std::string stream_decode(const std::vector<int32_t> &ids, bool render_special) {
  StreamDecoder d(*g_tok, render_special);
  std::string s;
  for (int32_t id : ids) s += d.push(id);
  s += d.flush();
  if (!d.flush().empty()) die("a second flush gave bytes");
  return s;
}

void print_stats() {
  if (g_stats.inputs == 0) return;  // the -jobs parent, which runs no inputs
  std::fprintf(stderr,
               "tokenizer_fuzz stats: %llu inputs, %llu ids, %llu specials parsed; round trip "
               "checked %llu, skipped %llu (literal U+2581), %llu (a token that renders "
               "differently from its source)\n",
               (unsigned long long)g_stats.inputs, (unsigned long long)g_stats.ids,
               (unsigned long long)g_stats.specials_parsed,
               (unsigned long long)g_stats.roundtrip_checked, (unsigned long long)g_stats.skip_u2581,
               (unsigned long long)g_stats.skip_render);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
  const char *path = std::getenv("GEIST_FUZZ_MODEL");
  if (!path || !*path) path = GEIST_FUZZ_MODEL_DEFAULT;
  auto f = geist::gguf::GgufFile::open(path);
  if (!f) die(f.status().to_string().c_str());
  auto t = Tokenizer::from_gguf(**f);
  if (!t) die(t.status().to_string().c_str());
  if (t->vocab().model != GEIST_FUZZ_TOKENIZER_KIND) {
    std::fprintf(stderr, "tokenizer_fuzz: %s has tokenizer '%s', this target fuzzes '%s'\n", path,
                 t->vocab().model.c_str(), GEIST_FUZZ_TOKENIZER_KIND);
    std::exit(1);
  }
  g_tok = new Tokenizer(std::move(t).value());
  const int32_t n = g_tok->n_vocab();

  bool bytes = true;
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    const auto id = g_tok->find_token(name);
    if (!id || g_tok->token_type(*id) != TokenType::Byte ||
        g_tok->token_to_piece(*id) != std::string(1, static_cast<char>(b))) {
      bytes = false;
    }
  }
  g_full = bytes && !g_tok->vocab().add_space_prefix;
  g_source = new std::vector<std::string>(n);
  g_renders_source = new std::vector<uint8_t>(n, 0);
  int32_t n_special = 0;
  for (int32_t id = 0; id < n; ++id) {
    const TokenType ty = g_tok->token_type(id);
    const std::string &text = g_tok->vocab().tokens[id];
    (*g_source)[id] = ty == TokenType::Byte ? g_tok->token_to_piece(id) : escape(text);
    // What decode gives back for the token equals its source with U+2581 as ' '.
    (*g_renders_source)[id] = g_tok->token_to_piece(id) == unescape((*g_source)[id]);
    n_special += ty == TokenType::Control || ty == TokenType::Unknown || ty == TokenType::UserDefined;
  }
  std::fprintf(stderr,
               "tokenizer_fuzz: %s: '%s' vocabulary, %d tokens (%d special), bos %d eos %d, "
               "add_bos %d add_eos %d add_space_prefix %d, byte tokens %s: %s checks\n",
               path, g_tok->vocab().model.c_str(), n, n_special, g_tok->bos(), g_tok->eos(),
               g_tok->vocab().add_bos, g_tok->vocab().add_eos, g_tok->vocab().add_space_prefix,
               bytes ? "all 256" : "incomplete", g_full ? "all" : "basic");
  if (const char *e = std::getenv("GEIST_FUZZ_STATS"); e && *e && *e != '0') {
    std::atexit(print_stats);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  // An exactly sized heap copy, so ASan sees any read past the end of the text.
  std::unique_ptr<char[]> buf(new char[size == 0 ? 1 : size]);
  if (size) std::memcpy(buf.get(), data, size);
  const std::string_view text(buf.get(), size);
  ++g_stats.inputs;
  const geist::Vocab &v = g_tok->vocab();

  for (bool special : {false, true}) {
    const std::vector<int32_t> ids = encode_or_die(text, false, special);
    const std::vector<int32_t> with_bos = encode_or_die(text, true, special);
    g_stats.ids += ids.size();

    // add_bos adds exactly BOS in front and, if the vocabulary says so, EOS at the end.
    std::vector<int32_t> expect;
    if (v.add_bos && v.bos >= 0) expect.push_back(v.bos);
    expect.insert(expect.end(), ids.begin(), ids.end());
    if (v.add_eos && v.eos >= 0) expect.push_back(v.eos);
    if (with_bos != expect) die("add_bos did more than add BOS/EOS", text);

    // Detokenization of anything encode gave, every way there is.
    const std::string plain = g_tok->decode(ids);
    const std::string rendered = g_tok->decode(with_bos, true);
    for (int32_t id : with_bos) {
      (void)g_tok->is_eog(id);
      (void)g_tok->token_to_piece(id, true);
    }
    for (bool render : {false, true}) {
      const std::vector<int32_t> &seq = render ? with_bos : ids;
      const std::string whole = render ? rendered : plain;
      const std::string streamed = stream_decode(seq, render);
      if (streamed != repair_utf8(whole)) die("StreamDecoder differs from decode() with U+FFFD repair", text);
      if (!valid_utf8(streamed)) die("the stream is not valid UTF-8", text);
    }

    if (!g_full) continue;
    // Nothing lost, nothing invented: the tokens' source bytes are the escaped text.
    std::string joined;
    joined.reserve(text.size() * 3);
    for (int32_t id : ids) joined += (*g_source)[id];
    if (joined != escape(text)) die("the tokens' bytes are not the text's", text);
    if (special) {
      for (int32_t id : ids) {
        const TokenType ty = g_tok->token_type(id);
        g_stats.specials_parsed += ty == TokenType::Control || ty == TokenType::Unknown;
      }
      continue;
    }
    // The user's round trip.
    if (text.find(kSp) != std::string_view::npos) {
      ++g_stats.skip_u2581;
      continue;
    }
    bool renders = true;
    for (int32_t id : ids) renders = renders && (*g_renders_source)[id];
    if (!renders) {
      ++g_stats.skip_render;
      continue;
    }
    ++g_stats.roundtrip_checked;
    if (plain != text) die("decode(encode(text)) != text", text);
  }
  return 0;
}
