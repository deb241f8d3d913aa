/* pinned_prefix: pin a system turn once, then answer several questions from it. Each
 * request resets the session to the pin, so the system turn is computed only once.
 * Usage: pinned_prefix [MODEL.gguf]  (default: $GEIST_MODEL). Greedy decoding. C99. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "geist/geist.h"

/* On failure: print the call, its status and message, then clean up and exit 1. */
#define CHECK(call)                                                         \
  do {                                                                      \
    geist_status st_ = (call);                                              \
    if (st_ != GEIST_OK) {                                                  \
      fprintf(stderr, "%s failed: %s: %s\n", #call, geist_status_name(st_), \
              s ? geist_session_error(s) : geist_last_error());             \
      goto done;                                                            \
    }                                                                       \
  } while (0)

enum { kMaxTokens = 256, kMaxNew = 32 };

int main(int argc, char **argv) {
  const char *path = argc > 1 ? argv[1] : getenv("GEIST_MODEL");
  const char *system = "<start_of_turn>user\nYou are a terse assistant.\n\n";
  const char *turn_end = "<end_of_turn>\n<start_of_turn>model\n";
  const char *questions[] = {"What is the capital of France?", "Name a prime number.",
                             "Why is the sky blue?"};
  geist_model *m = NULL;
  geist_session *s = NULL;
  geist_session_params p = geist_session_params_default();
  struct geist_session_stats before, after;
  geist_token toks[kMaxTokens], out[kMaxNew];
  char text[4096];
  size_t n = 0, n_text = 0, n_q = 0, n_tail = 0, i;
  int rc = 1, k;
  if (!path) {
    fprintf(stderr, "usage: %s MODEL.gguf (or set GEIST_MODEL)\n", argv[0]);
    return 2;
  }

  CHECK(geist_model_load(path, NULL, &m));
  p.sampling.temperature = 0.0f; /* greedy */
  CHECK(geist_session_create(m, &p, &s));
  /* The system turn: BOS first, "<start_of_turn>" parsed as its control token. */
  CHECK(geist_tokenize(m, system, strlen(system), 1, 1, toks, kMaxTokens, &n));
  CHECK(geist_session_pin_prefix(s, toks, n));
  printf("pinned %zu tokens\n", geist_session_n_pinned(s));

  for (i = 0; i < sizeof questions / sizeof questions[0]; ++i) {
    CHECK(geist_session_stats(s, &before));
    CHECK(geist_session_reset(s)); /* back to the pinned system turn */
    /* The user's text with parse_special=0, so it cannot inject "<end_of_turn>"; then the
     * template's markers with parse_special=1. */
    CHECK(geist_tokenize(m, questions[i], strlen(questions[i]), 0, 0, toks, kMaxTokens, &n_q));
    CHECK(
        geist_tokenize(m, turn_end, strlen(turn_end), 0, 1, toks + n_q, kMaxTokens - n_q, &n_tail));
    CHECK(geist_session_prefill_tokens(s, toks, n_q + n_tail));
    for (k = 0; k < kMaxNew; ++k) {
      CHECK(geist_session_decode_step(s, &out[k]));
      if (geist_token_is_eog(m, out[k])) break; /* the end-of-turn token is not printed */
    }
    CHECK(geist_detokenize(m, out, (size_t)k, 0, text, sizeof text, &n_text));
    CHECK(geist_session_stats(s, &after));
    printf("Q: %s\nA: %.*s\n", questions[i], (int)n_text, text);
    printf("   reset %.3f ms, prefill %zu tokens %.1f ms, decode %d tokens %.1f ms\n",
           (after.reset_seconds - before.reset_seconds) * 1e3, n_q + n_tail,
           after.last_prefill_seconds * 1e3, k,
           (after.decode_seconds - before.decode_seconds) * 1e3);
  }
  printf("done: %zu requests from 1 pin (%llu resets)\n", i, (unsigned long long)after.n_resets);
  rc = 0;
done:
  geist_session_free(s);
  geist_model_free(m);
  return rc;
}
