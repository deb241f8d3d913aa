// Tokenizer construction, special-token partition, SPM encoding and detokenization.
// The reading of GGUF keys lives in tokenizer_gguf.cpp.
#include "engine/tokenizer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <unordered_map>

namespace geist {

namespace {

constexpr std::string_view kSpaceEscape = "\xE2\x96\x81";  // U+2581 '▁'
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Token texts that end generation wherever they occur (model-spec §7.6; llama.cpp's
// text-based EOG detection).
constexpr std::string_view kEogTexts[] = {
    "<eos>",      "<end_of_turn>", "<turn|>",     "<|tool_response>", "<|eot_id|>",
    "<|eom_id|>", "<|end_of_text|>", "<|im_end|>", "<|endoftext|>",    "<|end|>",
    "<EOT>",      "<|return|>",    "<|call|>"};

uint64_t hash_bytes(std::string_view s) {  // FNV-1a, 64-bit
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h ^ (h >> 29);
}

bool is_special_type(TokenType t) {
  return t == TokenType::Control || t == TokenType::Unknown || t == TokenType::UserDefined;
}

}  // namespace

Utf8Step utf8_step(const uint8_t *p, size_t n, size_t *len) {
  const uint8_t b = p[0];
  if (b < 0x80) {
    *len = 1;
    return Utf8Step::Valid;
  }
  size_t need = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Unicode table 3-7)
  if (b >= 0xC2 && b <= 0xDF) {
    need = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 3;
    if (b == 0xE0) lo = 0xA0;  // no overlongs
    if (b == 0xED) hi = 0x9F;  // no surrogates
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 4;
    if (b == 0xF0) lo = 0x90;  // no overlongs
    if (b == 0xF4) hi = 0x8F;  // <= U+10FFFF
  } else {
    *len = 1;
    return Utf8Step::Invalid;
  }
  for (size_t k = 1; k < need; ++k) {
    if (k >= n) {
      *len = n;
      return Utf8Step::Incomplete;
    }
    if (p[k] < lo || p[k] > hi) {
      *len = k;
      return Utf8Step::Invalid;
    }
    lo = 0x80;
    hi = 0xBF;
  }
  *len = need;
  return Utf8Step::Valid;
}

// ---------------------------------------------------------------------------------------
// Construction

Result<Tokenizer> Tokenizer::create(Vocab v) {
  if (v.model != "llama" && v.model != "gemma4") {
    return GEIST_ERROR(GEIST_E_UNSUPPORTED,
                       "tokenizer model '%s' is not supported (supported: 'llama' = "
                       "SentencePiece-style, 'gemma4' = Gemma 4 BPE)",
                       v.model.c_str());
  }
  if (v.model == "gemma4" && v.merges.empty()) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT, "tokenizer: a 'gemma4' vocabulary needs tokenizer.ggml.merges");
  }
  const size_t n = v.tokens.size();
  if (n == 0) return GEIST_ERROR(GEIST_E_BAD_FORMAT, "tokenizer: the vocabulary is empty");
  if (n > static_cast<size_t>(INT32_MAX / 2)) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT, "tokenizer: %zu tokens is too many", n);
  }
  if (v.scores.empty()) v.scores.assign(n, 0.0f);
  if (v.types.empty()) v.types.assign(n, TokenType::Normal);
  if (v.scores.size() != n) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT, "tokenizer: %zu scores for %zu tokens",
                       v.scores.size(), n);
  }
  if (v.types.size() != n) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT, "tokenizer: %zu token types for %zu tokens",
                       v.types.size(), n);
  }
  for (size_t i = 0; i < n; ++i) {
    if (!token_type_is_valid(static_cast<int32_t>(v.types[i]))) {
      return GEIST_ERROR(GEIST_E_BAD_FORMAT, "tokenizer: token %zu has invalid type %d", i,
                         static_cast<int32_t>(v.types[i]));
    }
    if (std::isnan(v.scores[i])) {
      return GEIST_ERROR(GEIST_E_BAD_FORMAT, "tokenizer: token %zu has a NaN score", i);
    }
  }
  const std::pair<const char *, int32_t> ids[] = {
      {"bos", v.bos}, {"eos", v.eos}, {"eot", v.eot}, {"unk", v.unk}, {"pad", v.pad}};
  for (const auto &[name, id] : ids) {
    if (id < -1 || id >= static_cast<int64_t>(n)) {
      return GEIST_ERROR(GEIST_E_BAD_FORMAT, "tokenizer: %s token id %d out of range [0, %zu)",
                         name, id, n);
    }
  }
  Tokenizer t;
  t.vocab_ = std::move(v);
  GEIST_RETURN_IF_ERROR(t.build());
  return t;
}

Status Tokenizer::build() {
  const int32_t n = n_vocab();
  bpe_ = vocab_.model == "gemma4";
  if (bpe_) {
    merge_rank_.reserve(vocab_.merges.size());
    for (size_t r = 0; r < vocab_.merges.size(); ++r) {
      const std::string &m = vocab_.merges[r];
      // "left right", split at the first space after the first character (§7.4)
      if (m.size() < 3 || m.find(' ', 1) == std::string::npos) {
        return GEIST_ERROR(GEIST_E_BAD_FORMAT, "tokenizer: merge %zu ('%s') is not 'left right'", r, m.c_str());
      }
      merge_rank_.emplace(m, static_cast<int32_t>(r));  // a duplicate keeps its first rank
    }
  }
  // Hash table, load factor <= 0.5. Later duplicates overwrite earlier ones (llama.cpp).
  uint64_t cap = 16;
  while (cap < 2 * static_cast<uint64_t>(n)) cap *= 2;
  slot_mask_ = cap - 1;
  slot_id_.assign(cap, -1);
  slot_hash_.assign(cap, 0);
  for (int32_t id = 0; id < n; ++id) {
    const std::string &s = vocab_.tokens[id];
    if (s.empty()) continue;
    const uint64_t h = hash_bytes(s);
    const uint32_t h32 = static_cast<uint32_t>(h >> 32);
    for (uint64_t i = h & slot_mask_;; i = (i + 1) & slot_mask_) {
      if (slot_id_[i] < 0) {
        slot_id_[i] = id;
        slot_hash_[i] = h32;
        break;
      }
      if (slot_hash_[i] == h32 && vocab_.tokens[slot_id_[i]] == s) {
        slot_id_[i] = id;
        break;
      }
    }
  }

  // Byte fallback: <0xXX>, else the 1-byte token, else unk.
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    int32_t id = lookup(buf);
    const char c = static_cast<char>(b);
    if (id < 0) id = lookup(std::string_view(&c, 1));
    byte_token_[b] = id >= 0 ? id : vocab_.unk;
  }

  // End-of-generation set.
  eog_ids_.clear();
  if (vocab_.eos >= 0) eog_ids_.push_back(vocab_.eos);
  if (vocab_.eot >= 0) eog_ids_.push_back(vocab_.eot);
  for (std::string_view s : kEogTexts) {
    if (int32_t id = lookup(s); id >= 0) eog_ids_.push_back(id);
  }
  std::sort(eog_ids_.begin(), eog_ids_.end());
  eog_ids_.erase(std::unique(eog_ids_.begin(), eog_ids_.end()), eog_ids_.end());

  // Special-token trie, ranked longest text first, then lower id.
  special_by_rank_.clear();
  for (int32_t id = 0; id < n; ++id) {
    if (is_special_type(vocab_.types[id]) && !vocab_.tokens[id].empty()) {
      special_by_rank_.push_back(id);
    }
  }
  std::sort(special_by_rank_.begin(), special_by_rank_.end(), [&](int32_t a, int32_t b) {
    const size_t la = vocab_.tokens[a].size(), lb = vocab_.tokens[b].size();
    return la != lb ? la > lb : a < b;
  });
  trie_.assign(1, TrieNode{});
  std::fill(std::begin(trie_root_), std::end(trie_root_), -1);
  std::unordered_map<uint64_t, int32_t> edges;
  for (size_t rank = 0; rank < special_by_rank_.size(); ++rank) {
    const int32_t id = special_by_rank_[rank];
    int32_t node = 0;
    for (unsigned char c : vocab_.tokens[id]) {
      int32_t next;
      if (node == 0) {
        next = trie_root_[c];
      } else {
        auto it = edges.find((static_cast<uint64_t>(node) << 8) | c);
        next = it == edges.end() ? -1 : it->second;
      }
      if (next < 0) {
        next = static_cast<int32_t>(trie_.size());
        trie_.push_back(TrieNode{});
        if (node == 0) {
          trie_root_[c] = next;
        } else {
          edges.emplace((static_cast<uint64_t>(node) << 8) | c, next);
        }
      }
      node = next;
    }
    if (trie_[node].token < 0) {  // a duplicate text keeps its best rank
      trie_[node].token = id;
      trie_[node].rank = static_cast<int32_t>(rank);
    }
  }
  trie_edges_.assign(edges.begin(), edges.end());
  std::sort(trie_edges_.begin(), trie_edges_.end());
  return Status::ok();
}

int32_t Tokenizer::lookup(std::string_view text) const {
  if (text.empty() || slot_id_.empty()) return -1;
  const uint64_t h = hash_bytes(text);
  const uint32_t h32 = static_cast<uint32_t>(h >> 32);
  for (uint64_t i = h & slot_mask_;; i = (i + 1) & slot_mask_) {
    const int32_t id = slot_id_[i];
    if (id < 0) return -1;
    if (slot_hash_[i] == h32 && vocab_.tokens[id] == text) return id;
  }
}

std::optional<int32_t> Tokenizer::find_token(std::string_view text) const {
  const int32_t id = lookup(text);
  if (id < 0) return std::nullopt;
  return id;
}

bool Tokenizer::is_eog(int32_t id) const {
  return std::binary_search(eog_ids_.begin(), eog_ids_.end(), id);
}

int32_t Tokenizer::trie_child(int32_t node, uint8_t byte) const {
  if (node == 0) return trie_root_[byte];
  const uint64_t key = (static_cast<uint64_t>(node) << 8) | byte;
  auto it = std::lower_bound(trie_edges_.begin(), trie_edges_.end(), key,
                             [](const std::pair<uint64_t, int32_t> &e, uint64_t k) {
                               return e.first < k;
                             });
  return it != trie_edges_.end() && it->first == key ? it->second : -1;
}

// ---------------------------------------------------------------------------------------
// Special-token partition (model-spec §7.2). llama.cpp takes the special tokens longest
// first and, for each, splits every remaining raw fragment at its non-overlapping
// occurrences, left to right. Equivalent here in O(n * depth + m log m): find every
// occurrence with the trie, visit them by (rank, position) and accept one if it overlaps
// nothing accepted before. Every earlier acceptance is at least as long, so an overlap
// always covers the candidate's first or last byte: two probes suffice.

void Tokenizer::partition(std::string_view text, bool parse_special,
                          std::vector<Fragment> *out) const {
  const size_t n = text.size();
  const auto *p = reinterpret_cast<const uint8_t *>(text.data());
  std::vector<uint64_t> occ;  // rank << 32 | position
  for (size_t pos = 0; pos < n; ++pos) {
    int32_t node = trie_root_[p[pos]];
    size_t k = pos + 1;
    while (node >= 0) {
      const TrieNode &tn = trie_[node];
      if (tn.token >= 0) {
        const TokenType t = vocab_.types[tn.token];
        if (parse_special || t == TokenType::UserDefined) {
          occ.push_back((static_cast<uint64_t>(tn.rank) << 32) | pos);
        }
      }
      if (k == n) break;
      node = trie_child(node, p[k++]);
    }
  }
  if (occ.empty()) {
    if (n > 0) out->push_back({-1, 0, static_cast<uint32_t>(n)});
    return;
  }
  std::sort(occ.begin(), occ.end());
  std::vector<uint8_t> claimed(n, 0);
  std::vector<std::pair<uint32_t, int32_t>> accepted;  // (position, token)
  for (uint64_t o : occ) {
    const int32_t id = special_by_rank_[o >> 32];
    const uint32_t pos = static_cast<uint32_t>(o);
    const size_t len = vocab_.tokens[id].size();
    if (claimed[pos] || claimed[pos + len - 1]) continue;
    std::memset(&claimed[pos], 1, len);
    accepted.emplace_back(pos, id);
  }
  std::sort(accepted.begin(), accepted.end());
  uint32_t at = 0;
  for (const auto &[pos, id] : accepted) {
    if (pos > at) out->push_back({-1, at, pos});
    out->push_back({id, pos, static_cast<uint32_t>(pos + vocab_.tokens[id].size())});
    at = out->back().end;
  }
  if (at < n) out->push_back({-1, at, static_cast<uint32_t>(n)});
}

// ---------------------------------------------------------------------------------------
// SPM merge (model-spec §7.3), as SentencePiece's and llama.cpp's BPE-by-score: symbols in
// a doubly linked list over the escaped text, candidate pairs in a max-heap keyed by
// (score, leftmost); a popped pair whose symbols changed since it was pushed is stale.

namespace {

struct SpmSymbol {
  int32_t prev, next;  // -1 at the ends
  uint32_t off, n;     // byte range in the escaped text; n == 0 once merged away
};

struct SpmPair {
  float score;
  int32_t left, right;
  uint32_t size;  // bytes of left + right when pushed
};

struct SpmPairLess {
  bool operator()(const SpmPair &a, const SpmPair &b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

}  // namespace

Status Tokenizer::encode_spm(std::string_view raw, std::vector<int32_t> *out) const {
  // Escape spaces; no other normalization.
  std::string text;
  text.reserve(raw.size() + raw.size() / 2);
  for (char c : raw) {
    if (c == ' ') {
      text.append(kSpaceEscape);
    } else {
      text.push_back(c);
    }
  }
  const size_t n = text.size();
  if (n == 0) return Status::ok();
  if (n > UINT32_MAX / 2) {
    return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "tokenizer: text of %zu bytes is too long", n);
  }
  const auto *p = reinterpret_cast<const uint8_t *>(text.data());

  // Initial symbols: UTF-8 characters; each byte of an ill-formed sequence on its own.
  std::vector<SpmSymbol> sym;
  sym.reserve(n);
  for (size_t off = 0; off < n;) {
    size_t len = 1;
    if (utf8_step(p + off, n - off, &len) != Utf8Step::Valid) len = 1;
    const int32_t idx = static_cast<int32_t>(sym.size());
    sym.push_back({idx - 1, off + len < n ? idx + 1 : -1, static_cast<uint32_t>(off),
                   static_cast<uint32_t>(len)});
    off += len;
  }

  // A max-heap of candidate pairs (std::push_heap/pop_heap over a reserved vector; GCC 13
  // misreads priority_queue's make_heap over a moved-in empty vector as unbounded).
  std::vector<SpmPair> heap;
  heap.reserve(sym.size());
  auto heap_push = [&](const SpmPair &x) {
    heap.push_back(x);
    std::push_heap(heap.begin(), heap.end(), SpmPairLess{});
  };
  auto try_pair = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const SpmSymbol &l = sym[left], &r = sym[right];
    const uint32_t size = l.n + r.n;  // neighbours are adjacent in the text
    const int32_t id = lookup(std::string_view(text.data() + l.off, size));
    if (id < 0) return;
    if (bpe_) {  // only listed merges, lowest rank first
      const int32_t rank = merge_rank(std::string_view(text.data() + l.off, l.n),
                                      std::string_view(text.data() + r.off, r.n));
      if (rank < 0) return;
      heap_push({-static_cast<float>(rank), left, right, size});
      return;
    }
    heap_push({vocab_.scores[id], left, right, size});
  };
  for (size_t i = 1; i < sym.size(); ++i) {
    try_pair(static_cast<int32_t>(i - 1), static_cast<int32_t>(i));
  }
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), SpmPairLess{});
    const SpmPair top = heap.back();
    heap.pop_back();
    SpmSymbol &l = sym[top.left];
    SpmSymbol &r = sym[top.right];
    if (l.n == 0 || r.n == 0 || l.n + r.n != top.size) continue;  // stale
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = top.left;
    try_pair(l.prev, top.left);
    try_pair(top.left, l.next);
  }

  // Emit: each final symbol is a token, or (a character missing from the vocab) bytes.
  std::vector<int32_t> ids;
  ids.reserve(sym.size());
  for (int32_t i = 0; i >= 0; i = sym[i].next) {
    const SpmSymbol &s = sym[i];
    const int32_t id = lookup(std::string_view(text.data() + s.off, s.n));
    if (id >= 0) {
      ids.push_back(id);
      continue;
    }
    for (uint32_t k = 0; k < s.n; ++k) {
      const int32_t b = byte_token_[p[s.off + k]];
      if (b < 0) {
        return GEIST_ERROR(GEIST_E_UNSUPPORTED,
                           "tokenizer: byte 0x%02X cannot be encoded: the vocabulary has no "
                           "<0x%02X> token and no unknown token",
                           p[s.off + k], p[s.off + k]);
      }
      ids.push_back(b);
    }
  }
  out->insert(out->end(), ids.begin(), ids.end());
  return Status::ok();
}

int32_t Tokenizer::merge_rank(std::string_view left, std::string_view right) const {
  thread_local std::string key;
  key.assign(left);
  key.push_back(' ');
  key.append(right);
  auto it = merge_rank_.find(key);
  return it == merge_rank_.end() ? -1 : it->second;
}

Status Tokenizer::encode_gemma4(std::string_view raw, std::vector<int32_t> *out) const {
  for (size_t at = 0; at < raw.size();) {
    const bool nl = raw[at] == '\n';
    size_t end = at;
    while (end < raw.size() && (raw[end] == '\n') == nl) ++end;
    const std::string_view chunk = raw.substr(at, end - at);
    const int32_t whole = nl ? lookup(chunk) : -1;
    if (whole >= 0) {
      out->push_back(whole);
    } else {
      GEIST_RETURN_IF_ERROR(encode_spm(chunk, out));
    }
    at = end;
  }
  return Status::ok();
}

Status Tokenizer::encode(std::string_view text, bool add_bos, bool parse_special,
                         std::vector<int32_t> *out) const {
  if (out == nullptr) return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "tokenizer: out is null");
  if (text.size() > UINT32_MAX / 4) {
    return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "tokenizer: text of %zu bytes is too long",
                       text.size());
  }
  std::vector<Fragment> frags;
  partition(text, parse_special, &frags);

  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_bos && vocab_.add_bos && vocab_.bos >= 0) ids.push_back(vocab_.bos);
  bool prev_special = true;  // a space prefix goes before the first raw fragment too
  std::string prefixed;
  for (const Fragment &f : frags) {
    if (f.token >= 0) {
      ids.push_back(f.token);
      prev_special = true;
      continue;
    }
    std::string_view raw = text.substr(f.begin, f.end - f.begin);
    if (vocab_.add_space_prefix && prev_special) {
      prefixed.assign(1, ' ');
      prefixed.append(raw);
      raw = prefixed;
    }
    GEIST_RETURN_IF_ERROR(bpe_ ? encode_gemma4(raw, &ids) : encode_spm(raw, &ids));
    prev_special = false;
  }
  if (add_bos && vocab_.add_eos && vocab_.eos >= 0) ids.push_back(vocab_.eos);
  out->insert(out->end(), ids.begin(), ids.end());
  return Status::ok();
}

// ---------------------------------------------------------------------------------------
// Detokenization (model-spec §7.9; llama.cpp's token_to_piece for SPM).

std::string Tokenizer::token_to_piece(int32_t id, bool render_special) const {
  if (!is_valid(id)) return {};
  const std::string &s = vocab_.tokens[id];
  switch (vocab_.types[id]) {
    case TokenType::Control:
    case TokenType::Unknown:
      return render_special ? s : std::string();
    case TokenType::UserDefined:
      return s;
    case TokenType::Normal: {
      std::string r;
      r.reserve(s.size());
      for (size_t i = 0; i < s.size();) {
        if (s.compare(i, kSpaceEscape.size(), kSpaceEscape) == 0) {
          r.push_back(' ');
          i += kSpaceEscape.size();
        } else {
          r.push_back(s[i++]);
        }
      }
      return r;
    }
    case TokenType::Byte: {
      // "<0xXX>"; anything else renders as nothing.
      auto hex = [](char c) {
        return c >= '0' && c <= '9' ? c - '0'
               : c >= 'A' && c <= 'F' ? c - 'A' + 10
               : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                      : -1;
      };
      if (s.size() == 6 && s.compare(0, 3, "<0x") == 0 && s[5] == '>' && hex(s[3]) >= 0 &&
          hex(s[4]) >= 0) {
        return std::string(1, static_cast<char>(hex(s[3]) * 16 + hex(s[4])));
      }
      return {};
    }
    default:
      return {};
  }
}

std::string Tokenizer::decode(const std::vector<int32_t> &ids, bool render_special) const {
  std::string out;
  for (int32_t id : ids) out += token_to_piece(id, render_special);
  return out;
}

std::string StreamDecoder::push(int32_t id) {
  pending_ += tok_->token_to_piece(id, render_special_);
  std::string out;
  const auto *p = reinterpret_cast<const uint8_t *>(pending_.data());
  size_t i = 0;
  while (i < pending_.size()) {
    size_t len = 1;
    const Utf8Step st = utf8_step(p + i, pending_.size() - i, &len);
    if (st == Utf8Step::Incomplete) break;
    if (st == Utf8Step::Valid) {
      out.append(pending_, i, len);
    } else {
      out.append(kReplacement);
    }
    i += len;
  }
  pending_.erase(0, i);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = pending_.empty() ? std::string() : std::string(kReplacement);
  pending_.clear();
  return out;
}

}  // namespace geist
