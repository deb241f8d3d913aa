#include "openai_api.h"

#include <cmath>
#include <utility>

namespace geist::serve {

using nlohmann::json;

json ApiError::to_json() const {
  json e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  return json{{"error", std::move(e)}};
}

ApiError ApiError::invalid(std::string message, std::string param, std::string code) {
  ApiError e;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

namespace {

// JSON type names as a reader of the error expects them.
const char *type_name(const json &v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "an integer";
    case json::value_t::number_float:
      return "a number";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    default:
      return "an unknown type";
  }
}

ApiError wrong_type(const std::string &name, const char *want, const json &v) {
  return ApiError::invalid("'" + name + "' must be " + want + ", not " + type_name(v), name,
                           "invalid_type");
}

// Reads the optional field `name` of o. Absent or null: nothing changes, true.
// Each getter returns false and fills *err on a wrong type or value.
bool get_bool(const json &o, const char *name, bool *out, ApiError *err) {
  auto it = o.find(name);
  if (it == o.end() || it->is_null()) return true;
  if (!it->is_boolean()) return *err = wrong_type(name, "a boolean", *it), false;
  *out = it->get<bool>();
  return true;
}

bool get_number(const json &o, const char *name, double lo, double hi, std::optional<double> *out,
                ApiError *err) {
  auto it = o.find(name);
  if (it == o.end() || it->is_null()) return true;
  if (!it->is_number()) return *err = wrong_type(name, "a number", *it), false;
  const double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi) {
    char b[160];
    std::snprintf(b, sizeof b, "'%s' is %g; it must be in [%g, %g]", name, v, lo, hi);
    return *err = ApiError::invalid(b, name), false;
  }
  *out = v;
  return true;
}

bool get_int(const json &o, const char *name, int64_t lo, int64_t hi, std::optional<int64_t> *out,
             ApiError *err) {
  auto it = o.find(name);
  if (it == o.end() || it->is_null()) return true;
  if (!it->is_number_integer()) return *err = wrong_type(name, "an integer", *it), false;
  const bool too_big = it->is_number_unsigned() && it->get<uint64_t>() > uint64_t(INT64_MAX);
  const int64_t v = too_big ? INT64_MAX : it->get<int64_t>();
  if (too_big || v < lo || v > hi) {
    return *err = ApiError::invalid("'" + std::string(name) + "' is " + it->dump() +
                                        "; it must be in [" + std::to_string(lo) + ", " +
                                        std::to_string(hi) + "]",
                                    name),
           false;
  }
  *out = v;
  return true;
}

// The text of a message's content: a string, or an array of {"type":"text","text":...}
// parts (joined); other part types (images, audio) are not supported.
bool message_text(const json &c, size_t i, std::string *out, ApiError *err) {
  const std::string name = "messages[" + std::to_string(i) + "].content";
  if (c.is_null()) return true;  // an assistant message with only tool calls has none
  if (c.is_string()) return *out = c.get<std::string>(), true;
  if (!c.is_array()) return *err = wrong_type(name, "a string or an array of text parts", c), false;
  for (size_t k = 0; k < c.size(); ++k) {
    const json &part = c[k];
    const std::string pname = name + "[" + std::to_string(k) + "]";
    if (!part.is_object()) return *err = wrong_type(pname, "an object", part), false;
    auto ty = part.find("type");
    if (ty == part.end() || !ty->is_string() || ty->get<std::string>() != "text") {
      return *err = ApiError::invalid(
                 "'" + pname + ".type' must be \"text\" (this server reads text only)",
                 pname + ".type", "unsupported_value"),
             false;
    }
    auto tx = part.find("text");
    if (tx == part.end() || !tx->is_string()) {
      return *err = ApiError::invalid("'" + pname + ".text' must be a string", pname + ".text",
                                      "invalid_type"),
             false;
    }
    *out += tx->get<std::string>();
  }
  return true;
}

bool parse_messages(const json &o, GenRequest *out, ApiError *err) {
  auto it = o.find("messages");
  if (it == o.end() || it->is_null()) {
    return *err = ApiError::invalid("'messages' is required", "messages",
                                    "missing_required_parameter"),
           false;
  }
  if (!it->is_array()) return *err = wrong_type("messages", "an array", *it), false;
  if (it->empty())
    return *err = ApiError::invalid("'messages' must not be empty", "messages"), false;
  for (size_t i = 0; i < it->size(); ++i) {
    const json &m = (*it)[i];
    const std::string name = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return *err = wrong_type(name, "an object", m), false;
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return *err = ApiError::invalid(
                 "'" + name + ".role' is required and must be a string", name + ".role",
                 role == m.end() ? "missing_required_parameter" : "invalid_type"),
             false;
    }
    ChatMessage msg;
    msg.role = role->get<std::string>();
    if (msg.role == "developer") msg.role = "system";
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant") {
      return *err = ApiError::invalid(
                 "'" + name + ".role' is '" + msg.role +
                     "'; this server takes system, developer, user and assistant messages",
                 name + ".role", "unsupported_value"),
             false;
    }
    auto content = m.find("content");
    if (content == m.end()) {
      return *err = ApiError::invalid("'" + name + ".content' is required", name + ".content",
                                      "missing_required_parameter"),
             false;
    }
    if (!message_text(*content, i, &msg.content, err)) return false;
    out->messages.push_back(std::move(msg));
  }
  return true;
}

bool parse_prompt(const json &o, GenRequest *out, ApiError *err) {
  auto it = o.find("prompt");
  if (it == o.end() || it->is_null()) {
    return *err = ApiError::invalid("'prompt' is required", "prompt", "missing_required_parameter"),
           false;
  }
  const json *p = &*it;
  // One prompt only (n = 1): a string, an array of token ids, or an array holding one of those.
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) p = &(*p)[0];
  if (p->is_string()) {
    out->prompt = p->get<std::string>();
    return true;
  }
  if (p->is_array()) {
    for (const json &t : *p) {
      if (t.is_array() || t.is_string()) {
        return *err = ApiError::invalid(
                   "'prompt' holds several prompts; this server takes one per request", "prompt",
                   "unsupported_value"),
               false;
      }
      if (!t.is_number_integer() ||
          (t.is_number_unsigned() && t.get<uint64_t>() > uint64_t(INT32_MAX)) ||
          (!t.is_number_unsigned() && (t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX))) {
        return *err = ApiError::invalid(
                   "'prompt' as an array must hold token ids (non-negative integers)", "prompt",
                   "invalid_type"),
               false;
      }
      out->prompt_tokens.push_back(int32_t(t.get<int64_t>()));
    }
    out->prompt_is_tokens = true;
    return true;
  }
  return *err = wrong_type("prompt", "a string or an array of token ids", *p), false;
}

bool parse_stop(const json &o, GenRequest *out, ApiError *err) {
  auto it = o.find("stop");
  if (it == o.end() || it->is_null()) return true;
  std::vector<std::string> stop;
  if (it->is_string()) {
    stop.push_back(it->get<std::string>());
  } else if (it->is_array()) {
    for (const json &s : *it) {
      if (!s.is_string())
        return *err = wrong_type("stop", "a string or an array of strings", s), false;
      stop.push_back(s.get<std::string>());
    }
  } else {
    return *err = wrong_type("stop", "a string or an array of strings", *it), false;
  }
  if (stop.size() > kMaxStopStrings) {
    return *err = ApiError::invalid("'stop' has " + std::to_string(stop.size()) +
                                        " strings; at most " + std::to_string(kMaxStopStrings),
                                    "stop"),
           false;
  }
  for (std::string &s : stop) {
    if (s.size() > kMaxStopBytes) {
      return *err = ApiError::invalid(
                 "a 'stop' string is longer than " + std::to_string(kMaxStopBytes) + " bytes",
                 "stop"),
             false;
    }
    if (!s.empty()) out->stop.push_back(std::move(s));  // an empty stop string matches nothing
  }
  return true;
}

// Known OpenAI features this server does not have: an error rather than a silent
// answer of another kind.
bool refuse_unsupported(const json &o, ApiError *err) {
  auto tools = o.find("tools");
  if (tools != o.end() && !tools->is_null() && !(tools->is_array() && tools->empty())) {
    return *err = ApiError::invalid("'tools' is not supported by this server", "tools",
                                    "unsupported_parameter"),
           false;
  }
  auto echo = o.find("echo");
  if (echo != o.end() && echo->is_boolean() && echo->get<bool>()) {
    return *err = ApiError::invalid("'echo' is not supported by this server", "echo",
                                    "unsupported_value"),
           false;
  }
  std::optional<int64_t> best_of;
  if (!get_int(o, "best_of", 1, 1, &best_of, err)) {
    err->message = "'best_of' must be 1 on this server";
    err->code = "unsupported_value";
    return false;
  }
  auto rf = o.find("response_format");
  if (rf != o.end() && rf->is_object()) {
    auto ty = rf->find("type");
    if (ty != rf->end() && ty->is_string() && ty->get<std::string>() != "text") {
      return *err = ApiError::invalid("'response_format' of type '" + ty->get<std::string>() +
                                          "' is not supported by this server (only \"text\")",
                                      "response_format", "unsupported_value"),
             false;
    }
  }
  return true;
}

bool parse_sampling(const json &o, GenRequest *out, ApiError *err) {
  SamplingFields &s = out->sampling;
  if (!get_number(o, "temperature", 0.0, 2.0, &s.temperature, err)) return false;
  if (!get_number(o, "top_p", 0.0, 1.0, &s.top_p, err)) return false;
  if (!get_number(o, "min_p", 0.0, 1.0, &s.min_p, err)) return false;
  if (!get_number(o, "repeat_penalty", 1e-6, 1e4, &s.repeat_penalty, err)) return false;
  if (!get_int(o, "top_k", INT32_MIN, INT32_MAX, &s.top_k, err)) return false;
  auto seed = o.find("seed");
  if (seed != o.end() && !seed->is_null()) {
    if (!seed->is_number_integer()) return *err = wrong_type("seed", "an integer", *seed), false;
    if (seed->is_number_unsigned()) {
      s.seed = seed->get<uint64_t>();
    } else if (seed->get<int64_t>() >= 0) {
      s.seed = uint64_t(seed->get<int64_t>());
    } else if (seed->get<int64_t>() != -1) {
      return *err = ApiError::invalid(
                 "'seed' is " + seed->dump() + "; it must be in [0, 2^64-1] (or -1: random)",
                 "seed"),
             false;
    }
  }
  return true;
}

}  // namespace

bool parse_json_object(const std::string &body, json *out, ApiError *err) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    *err = ApiError::invalid("the request body is not valid JSON", "", "invalid_json");
    return false;
  }
  if (!j.is_object()) {
    *err = ApiError::invalid(
        std::string("the request body must be a JSON object, not ") + type_name(j), "",
        "invalid_type");
    return false;
  }
  *out = std::move(j);
  return true;
}

bool parse_gen_request(Endpoint ep, const std::string &body, GenRequest *out, ApiError *err) {
  json o;
  if (!parse_json_object(body, &o, err)) return false;
  GenRequest r;
  r.endpoint = ep;
  auto model = o.find("model");
  if (model != o.end() && !model->is_null()) {
    if (!model->is_string()) return *err = wrong_type("model", "a string", *model), false;
    r.model = model->get<std::string>();
  }
  if (ep == Endpoint::kChat ? !parse_messages(o, &r, err) : !parse_prompt(o, &r, err)) return false;
  if (!refuse_unsupported(o, err)) return false;
  std::optional<int64_t> n;
  if (!get_int(o, "n", 1, 1, &n, err)) {
    err->message = "'n' must be 1 on this server (one choice per request)";
    err->code = "unsupported_value";
    return false;
  }
  std::optional<int64_t> max_tokens;
  // max_completion_tokens is the newer name in chat; it wins when both are given.
  if (!get_int(o, "max_tokens", 0, INT32_MAX, &max_tokens, err)) return false;
  if (!get_int(o, "max_completion_tokens", 0, INT32_MAX, &max_tokens, err)) return false;
  if (max_tokens) r.max_tokens = *max_tokens;
  if (!parse_sampling(o, &r, err)) return false;
  if (!parse_stop(o, &r, err)) return false;
  if (!get_bool(o, "stream", &r.stream, err)) return false;
  auto so = o.find("stream_options");
  if (so != o.end() && !so->is_null()) {
    if (!so->is_object()) return *err = wrong_type("stream_options", "an object", *so), false;
    if (!get_bool(*so, "include_usage", &r.include_usage, err)) {
      err->param = "stream_options.include_usage";
      return false;
    }
  }
  if (!get_bool(o, "cache_prompt", &r.cache_prompt, err)) return false;
  if (ep == Endpoint::kChat) {
    if (!get_bool(o, "logprobs", &r.logprobs, err)) return false;
    std::optional<int64_t> top;
    if (!get_int(o, "top_logprobs", 0, kMaxTopLogprobs, &top, err)) return false;
    if (top && *top > 0 && !r.logprobs) {
      return *err =
                 ApiError::invalid("'top_logprobs' needs 'logprobs' set to true", "top_logprobs"),
             false;
    }
    r.top_logprobs = int(top.value_or(0));
  } else {  // legacy completions: logprobs is the number of alternatives, 0..5
    std::optional<int64_t> lp;
    if (!get_int(o, "logprobs", 0, kMaxLegacyLogprobs, &lp, err)) return false;
    r.logprobs = lp.has_value();
    r.top_logprobs = int(lp.value_or(0));
  }
  *out = std::move(r);
  return true;
}

bool parse_tokenize_request(const std::string &body, TokenizeRequest *out, ApiError *err) {
  json o;
  if (!parse_json_object(body, &o, err)) return false;
  TokenizeRequest r;
  auto c = o.find("content");
  if (c == o.end() || c->is_null()) {
    return *err =
               ApiError::invalid("'content' is required", "content", "missing_required_parameter"),
           false;
  }
  if (!c->is_string()) return *err = wrong_type("content", "a string", *c), false;
  r.content = c->get<std::string>();
  if (!get_bool(o, "add_special", &r.add_special, err)) return false;
  if (!get_bool(o, "parse_special", &r.parse_special, err)) return false;
  if (!get_bool(o, "with_pieces", &r.with_pieces, err)) return false;
  *out = std::move(r);
  return true;
}

bool parse_detokenize_request(const std::string &body, std::vector<int32_t> *out, ApiError *err) {
  json o;
  if (!parse_json_object(body, &o, err)) return false;
  auto t = o.find("tokens");
  if (t == o.end() || t->is_null()) {
    return *err = ApiError::invalid("'tokens' is required", "tokens", "missing_required_parameter"),
           false;
  }
  if (!t->is_array()) return *err = wrong_type("tokens", "an array of token ids", *t), false;
  std::vector<int32_t> ids;
  ids.reserve(t->size());
  for (const json &v : *t) {
    if (!v.is_number_integer() ||
        (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT32_MAX)) ||
        (!v.is_number_unsigned() && (v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX))) {
      return *err = ApiError::invalid("'tokens' must hold token ids (non-negative integers)",
                                      "tokens", "invalid_type"),
             false;
    }
    ids.push_back(int32_t(v.get<int64_t>()));
  }
  *out = std::move(ids);
  return true;
}

}  // namespace geist::serve
