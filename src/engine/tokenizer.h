// Tokenizer: text <-> token ids for the vocabularies stored in GGUF files.
// Supported: SentencePiece-style score merging (`tokenizer.ggml.model = "llama"`, Gemma 3 /
// 3n), behaving like llama.cpp's SPM tokenizer (see docs/model-spec.md §7.2-7.3, 7.6, 7.9),
// and Gemma 4's rank-merge BPE over raw UTF-8 (`"gemma4"`, §7.4): spaces as '▁', the text
// pre-split into runs of newlines and runs of anything else, the pair with the lowest
// merge rank merged first (ties: leftmost), byte fallback, BOS always added.
//
// A Tokenizer is immutable after creation and safe to use from many threads at once.
// It owns a copy of the vocabulary (it does not borrow from the GGUF mapping).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"

namespace geist {

namespace gguf {
class GgufFile;
}

// Token types as stored in `tokenizer.ggml.token_type`.
enum class TokenType : int32_t {
  Undefined = 0,
  Normal = 1,
  Unknown = 2,
  Control = 3,
  UserDefined = 4,
  Unused = 5,
  Byte = 6,
  COUNT  // sentinel
};
inline bool token_type_is_valid(int32_t t) {
  return t >= 0 && t < static_cast<int32_t>(TokenType::COUNT);
}

// What a tokenizer is built from (copied out of the GGUF). Ids are -1 when absent.
struct Vocab {
  std::string model, pre;          // tokenizer.ggml.model / .pre
  std::vector<std::string> tokens;  // [n_vocab] token texts (raw bytes, '▁' for space in SPM)
  std::vector<float> scores;        // [n_vocab] merge priority (higher merges first)
  std::vector<TokenType> types;     // [n_vocab]
  std::vector<std::string> merges;  // "a b" BPE merges; empty for SPM
  int32_t bos = -1, eos = -1, eot = -1, unk = -1, pad = -1;
  bool add_bos = true, add_eos = false, add_space_prefix = false;
};

class Tokenizer {
 public:
  // Reads the tokenizer.ggml.* keys of an open GGUF and calls create(). Missing optional
  // keys take llama.cpp's defaults for the model type (SPM: add_bos, add_space_prefix on).
  // GEIST_E_BAD_FORMAT naming the key for missing/mistyped arrays or size mismatches.
  static Result<Tokenizer> from_gguf(const gguf::GgufFile &f);
  // Validates (sizes match, ids in range, types valid, model supported: "llama") and
  // builds the lookup tables: O(n_vocab) time and memory (~20 MB for 262k tokens).
  // Unsupported models give GEIST_E_UNSUPPORTED naming the model.
  static Result<Tokenizer> create(Vocab v);

  Tokenizer(Tokenizer &&) = default;
  Tokenizer &operator=(Tokenizer &&) = default;
  Tokenizer(const Tokenizer &) = delete;  // megabytes of tables; share by reference
  Tokenizer &operator=(const Tokenizer &) = delete;

  // text -> ids, appended to *out. add_bos: llama.cpp's "add_special": prepend BOS if the
  // vocab's add_bos is set (and append EOS if its add_eos is set). parse_special: match the
  // texts of CONTROL/UNKNOWN tokens in `text` (USER_DEFINED texts always match); never set
  // it for untrusted user content. Any byte string is accepted (invalid UTF-8 falls back
  // to byte tokens). O(n log n) in the text length. On error *out is left as it was.
  Status encode(std::string_view text, bool add_bos, bool parse_special,
                std::vector<int32_t> *out) const;

  // Raw bytes one token contributes to the output: NORMAL with '▁' -> ' ', BYTE <0xXX> ->
  // that byte, USER_DEFINED verbatim, CONTROL/UNKNOWN -> "" unless render_special (then
  // verbatim), UNUSED/UNDEFINED -> "". Out-of-range id -> "" (see is_valid).
  std::string token_to_piece(int32_t id, bool render_special = false) const;
  // Concatenated pieces of a whole sequence, raw bytes (no UTF-8 repair; see StreamDecoder).
  std::string decode(const std::vector<int32_t> &ids, bool render_special = false) const;

  bool is_valid(int32_t id) const { return id >= 0 && id < n_vocab(); }
  // End of generation: eos, eot, and tokens whose text is in the model-spec §7.6 set
  // (<eos>, <end_of_turn>, <turn|>, <|eot_id|>, <|im_end|>, ...). O(log n_eog).
  bool is_eog(int32_t id) const;
  const std::vector<int32_t> &eog_ids() const { return eog_ids_; }  // sorted

  int32_t n_vocab() const { return static_cast<int32_t>(vocab_.tokens.size()); }
  int32_t bos() const { return vocab_.bos; }
  int32_t eos() const { return vocab_.eos; }
  TokenType token_type(int32_t id) const {
    return is_valid(id) ? vocab_.types[id] : TokenType::Undefined;
  }
  // Exact token text -> id (any type); nullopt if no token has that text. O(|text|).
  std::optional<int32_t> find_token(std::string_view text) const;
  const Vocab &vocab() const { return vocab_; }

 private:
  Tokenizer() = default;
  Status build();
  int32_t lookup(std::string_view text) const;  // -1 if absent

  // One fragment of the input after the special-token partition.
  struct Fragment {
    int32_t token;       // >= 0: a special token; -1: raw text [begin, end)
    uint32_t begin, end;
  };
  void partition(std::string_view text, bool parse_special, std::vector<Fragment> *out) const;
  // Merge one raw fragment: by score (SPM) or, when bpe_, by merge rank.
  Status encode_spm(std::string_view raw, std::vector<int32_t> *out) const;
  // Gemma 4: newline runs split off; a newline run that is a token is emitted whole.
  Status encode_gemma4(std::string_view raw, std::vector<int32_t> *out) const;
  int32_t merge_rank(std::string_view left, std::string_view right) const;  // -1: no merge

  Vocab vocab_;
  // Open-addressing hash table over vocab_.tokens: [capacity] token id or -1, plus the
  // 32-bit hash of that slot's text to skip most string compares. No pointers, so moves
  // are safe.
  std::vector<int32_t> slot_id_;
  std::vector<uint32_t> slot_hash_;
  uint64_t slot_mask_ = 0;
  int32_t byte_token_[256] = {};  // byte -> <0xXX> token (or 1-char token, or unk, or -1)
  std::vector<int32_t> eog_ids_;
  bool bpe_ = false;                                     // "gemma4": merges by rank
  std::unordered_map<std::string, int32_t> merge_rank_;  // "left right" -> rank

  // Trie over the texts of CONTROL / UNKNOWN / USER_DEFINED tokens for the partition.
  // Edges keyed by (node << 8 | byte). A node's token is the special token whose text ends
  // there; its rank orders matching as llama.cpp does: longer texts first, then lower id.
  struct TrieNode {
    int32_t token = -1;
    int32_t rank = -1;
  };
  std::vector<TrieNode> trie_;                             // [n_nodes], node 0 is the root
  int32_t trie_root_[256] = {};                            // root's children, -1 if none
  std::vector<std::pair<uint64_t, int32_t>> trie_edges_;  // deeper edges, sorted by key
  std::vector<int32_t> special_by_rank_;                   // [n_special] rank -> token id
  int32_t trie_child(int32_t node, uint8_t byte) const;
};

// Streaming detokenizer: feed ids one at a time and get back only complete UTF-8. A partial
// multi-byte sequence (from byte tokens) is held until it completes; bytes that can no
// longer form a valid sequence become U+FFFD (one per maximal ill-formed subpart).
// Borrows the tokenizer (which must outlive it); one decoder per stream, not thread-safe.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer &t, bool render_special = false)
      : tok_(&t), render_special_(render_special) {}
  std::string push(int32_t id);
  // The held bytes (each ill-formed / incomplete part as U+FFFD); resets the decoder.
  std::string flush();

 private:
  const Tokenizer *tok_;
  bool render_special_;
  std::string pending_;  // bytes of an incomplete UTF-8 sequence (at most 3)
};

// UTF-8 helpers shared by the tokenizers.
enum class Utf8Step { Valid, Incomplete, Invalid };
// Classifies the sequence starting at p[0] (n >= 1 bytes available): Valid with *len its
// length; Incomplete if the n bytes are a proper prefix of a valid sequence (*len = n);
// Invalid with *len the length of the maximal ill-formed subpart (>= 1).
Utf8Step utf8_step(const uint8_t *p, size_t n, size_t *len);

}  // namespace geist
