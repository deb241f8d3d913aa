// The OpenAI-compatible request shapes of `geist serve`: JSON bodies to plain structs,
// with OpenAI-shaped errors for what is invalid. Model-free and thread-safe (pure
// functions), so the parsing is unit-tested and fuzzed without a model or a socket.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace geist::serve {

// An error answered as {"error":{"message","type","param","code"}} with an HTTP status.
// param and code are JSON null when empty.
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;
  std::string code;

  nlohmann::json to_json() const;
  static ApiError invalid(std::string message, std::string param = {},
                          std::string code = "invalid_value");
};

enum class Endpoint { kCompletions, kChat };

// One chat message; content is the text (an array of text parts is joined).
struct ChatMessage {
  std::string role;  // "system" (also "developer"), "user" or "assistant"
  std::string content;
};

// Sampling fields as the request gave them (absent or null: nullopt, the server's default).
struct SamplingFields {
  std::optional<double> temperature, top_p, min_p, repeat_penalty;
  std::optional<int64_t> top_k;
  std::optional<uint64_t> seed;  // absent, null or -1: a fresh random seed per request
};

// Limits on what a request may ask for (beyond the context, checked after tokenizing).
inline constexpr size_t kMaxStopStrings = 16;
inline constexpr size_t kMaxStopBytes = 1024;  // per stop string
inline constexpr int kMaxTopLogprobs = 20;     // chat; legacy completions: 5
inline constexpr int kMaxLegacyLogprobs = 5;

// A /v1/completions or /v1/chat/completions request.
struct GenRequest {
  Endpoint endpoint = Endpoint::kChat;
  std::string model;                   // echoed back; any name is accepted
  std::vector<ChatMessage> messages;   // chat
  std::string prompt;                  // completions, text form
  std::vector<int32_t> prompt_tokens;  // completions, token ids form (ids checked later)
  bool prompt_is_tokens = false;
  int64_t max_tokens = -1;  // -1: until end of generation or a full context
  SamplingFields sampling;
  std::vector<std::string> stop;  // non-empty strings
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool logprobs = false;
  int top_logprobs = 0;
  bool cache_prompt = true;  // false: no prefix reuse and no caching (llama.cpp's name)
};

// Parses body into *out, or fills *err (HTTP 400) and returns false. Unknown fields are
// ignored; known ones of the wrong type or range, n != 1, and features geist does not
// have (tools, echo, best_of > 1, json response formats) are errors.
bool parse_gen_request(Endpoint ep, const std::string &body, GenRequest *out, ApiError *err);

// POST /tokenize: {"content": str, "add_special": bool=false, "parse_special": bool=true,
// "with_pieces": bool=false}.
struct TokenizeRequest {
  std::string content;
  bool add_special = false;
  bool parse_special = true;
  bool with_pieces = false;
};
bool parse_tokenize_request(const std::string &body, TokenizeRequest *out, ApiError *err);

// POST /detokenize: {"tokens": [int, ...]} (ids checked against the vocabulary later).
bool parse_detokenize_request(const std::string &body, std::vector<int32_t> *out, ApiError *err);

// The body parsed as a JSON object, or an error (invalid JSON, or not an object).
bool parse_json_object(const std::string &body, nlohmann::json *out, ApiError *err);

}  // namespace geist::serve
