// Tokenizer::from_gguf: copies the tokenizer.ggml.* keys out of a GGUF into a Vocab.
// Kept apart from tokenizer.cpp so that code using only Tokenizer::create does not pull
// in the GGUF reader.
#include <cstring>

#include "engine/tokenizer.h"
#include "gguf/gguf_reader.h"

namespace geist {

namespace {

using gguf::GgufFile;
using gguf::Value;
using gguf::ValueType;

Result<const Value *> find_array(const GgufFile &f, const char *key, uint64_t n_expected) {
  const Value *v = f.find(key);
  if (v == nullptr) return Status(GEIST_E_BAD_FORMAT, std::string("missing key ") + key);
  if (!v->is_array()) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT, "key %s: expected an array, got %s", key,
                       gguf::value_type_name(v->type));
  }
  if (n_expected != UINT64_MAX && v->count != n_expected) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT, "key %s: %llu elements for %llu tokens", key,
                       static_cast<unsigned long long>(v->count),
                       static_cast<unsigned long long>(n_expected));
  }
  return v;
}

// An optional token id key: absent -> fallback; present but not an id -> error.
Status read_id(const GgufFile &f, const char *key, int32_t *id) {
  const Value *v = f.find(key);
  if (v == nullptr) return Status::ok();
  const std::optional<int64_t> x = v->as_int();
  if (!x || *x < -1 || *x > INT32_MAX) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT, "key %s: not a token id (%s)", key,
                       v->to_string().c_str());
  }
  *id = static_cast<int32_t>(*x);
  return Status::ok();
}

Status read_flag(const GgufFile &f, const char *key, bool *flag) {
  const Value *v = f.find(key);
  if (v == nullptr) return Status::ok();
  const std::optional<bool> x = v->as_bool();
  if (!x) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT, "key %s: expected a bool, got %s", key,
                       gguf::value_type_name(v->type));
  }
  *flag = *x;
  return Status::ok();
}

}  // namespace

Result<Tokenizer> Tokenizer::from_gguf(const GgufFile &f) {
  Vocab v;
  GEIST_ASSIGN_OR_RETURN(std::string_view model, f.get_string("tokenizer.ggml.model"));
  v.model = std::string(model);
  if (const Value *pre = f.find("tokenizer.ggml.pre")) {
    if (auto s = pre->as_string()) v.pre = std::string(*s);
  }
  if (v.model != "llama" && v.model != "gemma4") {
    return GEIST_ERROR(GEIST_E_UNSUPPORTED,
                       "tokenizer model '%s' is not supported (supported: 'llama' = "
                       "SentencePiece-style, 'gemma4' = Gemma 4 BPE)",
                       v.model.c_str());
  }
  const bool gemma4 = v.model == "gemma4";

  GEIST_ASSIGN_OR_RETURN(const Value *tokens, find_array(f, "tokenizer.ggml.tokens", UINT64_MAX));
  if (tokens->elem_type != ValueType::STRING) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT, "key tokenizer.ggml.tokens: expected strings, got %s",
                       gguf::value_type_name(tokens->elem_type));
  }
  const uint64_t n = tokens->count;
  if (tokens->strings.size() != n) {
    return GEIST_ERROR(GEIST_E_INTERNAL, "tokenizer.ggml.tokens: %zu strings for count %llu",
                       tokens->strings.size(), static_cast<unsigned long long>(n));
  }
  v.tokens.reserve(n);
  for (std::string_view s : tokens->strings) v.tokens.emplace_back(s);

  // Scores: optional (llama.cpp uses 0), FLOAT32.
  if (f.find("tokenizer.ggml.scores") != nullptr) {
    GEIST_ASSIGN_OR_RETURN(const Value *scores, find_array(f, "tokenizer.ggml.scores", n));
    if (scores->elem_type != ValueType::FLOAT32) {
      return GEIST_ERROR(GEIST_E_BAD_FORMAT, "key tokenizer.ggml.scores: expected f32, got %s",
                         gguf::value_type_name(scores->elem_type));
    }
    v.scores.resize(n);
    if (n > 0) std::memcpy(v.scores.data(), scores->data, n * sizeof(float));
  }
  // Types: optional (default NORMAL), INT32 or UINT32.
  if (f.find("tokenizer.ggml.token_type") != nullptr) {
    GEIST_ASSIGN_OR_RETURN(const Value *types, find_array(f, "tokenizer.ggml.token_type", n));
    if (types->elem_type != ValueType::INT32 && types->elem_type != ValueType::UINT32) {
      return GEIST_ERROR(GEIST_E_BAD_FORMAT,
                         "key tokenizer.ggml.token_type: expected i32 or u32, got %s",
                         gguf::value_type_name(types->elem_type));
    }
    v.types.resize(n);
    for (uint64_t i = 0; i < n; ++i) {
      int32_t t;
      std::memcpy(&t, types->data + i * 4, 4);
      if (!token_type_is_valid(t)) {
        return GEIST_ERROR(GEIST_E_BAD_FORMAT, "key tokenizer.ggml.token_type: token %llu has "
                           "invalid type %d", static_cast<unsigned long long>(i), t);
      }
      v.types[i] = static_cast<TokenType>(t);
    }
  }
  if (const Value *merges = f.find("tokenizer.ggml.merges")) {
    for (std::string_view s : merges->strings) v.merges.emplace_back(s);
  }

  // llama.cpp's defaults for an SPM vocab, overridden by the keys that are present.
  v.bos = 1;
  v.eos = 2;
  v.unk = 0;
  v.add_bos = true;
  v.add_eos = false;
  v.add_space_prefix = !gemma4;
  if (gemma4) {  // Gemma's ids: <eos> 1, <bos> 2, <unk> 3
    v.bos = 2;
    v.eos = 1;
    v.unk = 3;
  }
  GEIST_RETURN_IF_ERROR(read_id(f, "tokenizer.ggml.bos_token_id", &v.bos));
  GEIST_RETURN_IF_ERROR(read_id(f, "tokenizer.ggml.eos_token_id", &v.eos));
  GEIST_RETURN_IF_ERROR(read_id(f, "tokenizer.ggml.eot_token_id", &v.eot));
  GEIST_RETURN_IF_ERROR(read_id(f, "tokenizer.ggml.unknown_token_id", &v.unk));
  GEIST_RETURN_IF_ERROR(read_id(f, "tokenizer.ggml.padding_token_id", &v.pad));
  GEIST_RETURN_IF_ERROR(read_flag(f, "tokenizer.ggml.add_bos_token", &v.add_bos));
  GEIST_RETURN_IF_ERROR(read_flag(f, "tokenizer.ggml.add_eos_token", &v.add_eos));
  GEIST_RETURN_IF_ERROR(read_flag(f, "tokenizer.ggml.add_space_prefix", &v.add_space_prefix));
  if (gemma4) v.add_bos = true;  // forced, as llama.cpp does for this vocab (§7.4)
  // Defaults (not keys) that do not exist in this vocab are dropped rather than rejected.
  const std::pair<const char *, int32_t *> defaulted[] = {
      {"tokenizer.ggml.bos_token_id", &v.bos},
      {"tokenizer.ggml.eos_token_id", &v.eos},
      {"tokenizer.ggml.unknown_token_id", &v.unk}};
  for (const auto &[key, id] : defaulted) {
    if (f.find(key) == nullptr && *id >= static_cast<int64_t>(n)) *id = -1;
  }
  if (v.eot < 0) {  // as llama.cpp: find the turn-end token by its text
    for (const char *text : {"<end_of_turn>", "<turn|>", "<|eot_id|>", "<|im_end|>"}) {
      for (uint64_t i = 0; i < n && v.eot < 0; ++i) {
        if (v.tokens[i] == text) v.eot = static_cast<int32_t>(i);
      }
      if (v.eot >= 0) break;
    }
  }
  return create(std::move(v));
}

}  // namespace geist
