// libFuzzer target for geist serve's model-free input handling (scripts/fuzz_serve.sh):
// the request parsers on arbitrary bodies (they return true or an error, never crash),
// and the stop-string matcher, whose output is checked against a direct computation: the
// text before the earliest occurrence of any stop string (all of it if none occurs),
// however the text is split into pieces.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "openai_api.h"
#include "stop_matcher.h"

using namespace geist::serve;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string in(reinterpret_cast<const char *>(data), size);
  GenRequest r;
  ApiError e;
  for (Endpoint ep : {Endpoint::kChat, Endpoint::kCompletions}) {
    if (!parse_gen_request(ep, in, &r, &e)) {
      if (e.http_status != 400 || e.message.empty()) std::abort();
      (void)e.to_json().dump();
    } else {
      if (r.top_logprobs < 0 || r.top_logprobs > kMaxTopLogprobs || r.stop.size() > kMaxStopStrings)
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
