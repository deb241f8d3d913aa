// libFuzzer target for geist serve's model-free input handling (fuzz/run.sh
// serve_request_fuzz; docs/FUZZING.md): the request parsers on arbitrary bodies (a refused
// body gets a 400 with a message; an accepted one holds only values in the documented
// ranges), and the stop-string matcher, whose output is checked against a direct
// computation: the text before the earliest occurrence of any stop string (all of it if
// none occurs), however the text is split into pieces.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "openai_api.h"
#include "stop_matcher.h"

using namespace geist::serve;

namespace {

// What an accepted request may hold (docs/SERVE.md, "Parameters").
bool accepted_is_valid(Endpoint ep, const GenRequest &r) {
  const SamplingFields &s = r.sampling;
  auto in = [](const std::optional<double> &v, double lo, double hi) {
    return !v || (*v >= lo && *v <= hi);
  };
  if (r.endpoint != ep || r.max_tokens < -1 || r.max_tokens > INT32_MAX) return false;
  if (!in(s.temperature, 0, 2) || !in(s.top_p, 0, 1) || !in(s.min_p, 0, 1) ||
      (s.repeat_penalty && !(*s.repeat_penalty > 0))) {
    return false;
  }
  if (r.top_logprobs < 0 || r.stop.size() > kMaxStopStrings) return false;
  if (r.top_logprobs > (ep == Endpoint::kChat ? kMaxTopLogprobs : kMaxLegacyLogprobs)) return false;
  if (ep == Endpoint::kChat && r.top_logprobs > 0 && !r.logprobs) return false;
  for (const std::string &stop : r.stop) {
    if (stop.empty() || stop.size() > kMaxStopBytes) return false;
  }
  if (ep == Endpoint::kChat) {
    if (r.messages.empty()) return false;
    for (const ChatMessage &m : r.messages) {
      if (m.role != "system" && m.role != "user" && m.role != "assistant") return false;
    }
  } else {
    for (int32_t id : r.prompt_tokens) {
      if (id < 0) return false;
    }
    if (!r.prompt_is_tokens && !r.prompt_tokens.empty()) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string in(reinterpret_cast<const char *>(data), size);
  GenRequest r;
  ApiError e;
  for (Endpoint ep : {Endpoint::kChat, Endpoint::kCompletions}) {
    if (!parse_gen_request(ep, in, &r, &e)) {
      if (e.http_status != 400 || e.message.empty()) std::abort();
      (void)e.to_json().dump();
    } else if (!accepted_is_valid(ep, r)) {
      std::abort();
    }
  }
  TokenizeRequest t;
  (void)parse_tokenize_request(in, &t, &e);
  std::vector<int32_t> ids;
  if (parse_detokenize_request(in, &ids, &e)) {
    for (int32_t id : ids) {
      if (id < 0) std::abort();
    }
  }

  // Stop strings: "stop1\x01stop2\x02piece\x02piece..." (bytes 1 and 2 separate).
  const size_t cut = in.find('\x02');
  std::vector<std::string> stops, pieces;
  std::string cur;
  for (size_t i = 0; i < (cut == std::string::npos ? 0 : cut); ++i) {
    if (in[i] == '\x01') {
      stops.push_back(cur);
      cur.clear();
    } else {
      cur += in[i];
    }
  }
  if (cut == std::string::npos) return 0;
  stops.push_back(cur);
  cur.clear();
  for (size_t i = cut + 1; i < in.size(); ++i) {
    if (in[i] == '\x02') {
      pieces.push_back(cur);
      cur.clear();
    } else {
      cur += in[i];
    }
  }
  pieces.push_back(cur);
  std::string full, out;
  StopMatcher m(stops);
  for (const std::string &p : pieces) {
    full += p;
    out += m.push(p);
  }
  out += m.flush();
  size_t first = std::string::npos;
  for (const std::string &s : stops) {
    if (!s.empty()) first = std::min(first, full.find(s));
  }
  const std::string want = first == std::string::npos ? full : full.substr(0, first);
  if (out != want || m.stopped() != (first != std::string::npos)) std::abort();
  return 0;
}
