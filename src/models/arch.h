// The interface every architecture implements. An ArchModel is immutable after load and
// shared by all sessions; it runs on a Backend (backends/backend.h), chosen at load, whose
// Exec and KvStore belong to one session.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "backends/backend.h"

namespace geist::gguf {
class GgufFile;
}

namespace geist::models {

struct ModelInfo {
  std::string arch;     // general.architecture
  std::string name;     // general.name (may be empty)
  int64_t n_vocab = 0;  // rows of the output head
  int64_t n_embd = 0;
  int64_t n_layer = 0;
  int64_t n_ctx_train = 0;
  int64_t n_params = 0;  // elements of all tensors
  // What the backend holds for the weights (repacked copies, device memory; 0 for the
  // CPU's generic tier) and the seconds it took to prepare them.
  uint64_t packed_bytes = 0;
  double repack_seconds = 0;
};

class ArchModel {
 public:
  virtual ~ArchModel() = default;
  virtual const ModelInfo &info() const = 0;
  virtual std::vector<KvLayerSpec> kv_layout() const = 0;
  // The backend the weights were prepared for; sessions make their Exec and KvStore here.
  virtual Backend &backend() const = 0;
  // Reserve every scratch buffer forward() uses (Exec::buffer at its widest), so forward
  // never allocates.
  virtual void reserve(Exec &ex) const = 0;

  // One forward pass over the sequences seqs[0..n_seqs) (backend.h's StepSeq: sessions
  // decoding together, or one session's chunk): tokens holds their rows one sequence after
  // another; each sequence's rows run at its store's positions n_past.., their K/V is
  // appended to it and its n_past advances. Logits as `out` says.
  // Requires each sequence 1 <= n_rows <= kv->max_chunk(), kv->n_past + n_rows <= n_ctx,
  // distinct stores made for this model, all rows <= ex.max_rows(), token ids < n_vocab
  // (checked: GEIST_E_INVALID_ARGUMENT / GEIST_E_CONTEXT_FULL). On any error (a device error
  // too) no store's n_past changes.
  struct LogitRows {
    float *out = nullptr;             // rows [first_row, n_rows) of the step: [n][n_vocab] ...
    int first_row = 0;
    float *const *seq_out = nullptr;  // ... or the last row of sequence i to seq_out[i] [n_vocab]
                                      // (each sequence's own buffer; no copy on the host)
    // The token the i-th logits row written draws (Exec::draw, by draws[i]->spec) to
    // draws[i]->token; null: none wanted, a null draws[i]: not that row's.
    StepDraw *const *draws = nullptr;
  };
  virtual Status forward(const int32_t *tokens, const StepSeq *seqs, int n_seqs, Exec &ex,
                         const LogitRows &out) const = 0;

  // One sequence: tokens[0..n_rows) at positions kv.n_past..; the logits of rows
  // [first_logit_row, n_rows) to logits ([n_rows - first_logit_row][n_vocab]) if it is not
  // null (first_logit_row outside [0, n_rows]: none).
  // draws: as LogitRows::draws.
  Status forward(const int32_t *tokens, int n_rows, KvStore &kv, Exec &ex, int first_logit_row, float *logits,
                 StepDraw *const *draws = nullptr) const {
    const StepSeq seq{&kv, n_rows};
    LogitRows out;
    if (logits != nullptr && first_logit_row >= 0 && first_logit_row < n_rows) {
      out.out = logits;
      out.first_row = first_logit_row;
      out.draws = draws;
    }
    return forward(tokens, &seq, 1, ex, out);
  }
};

// Pick the architecture from general.architecture, bind its weights (views into the
// mapping) and have `backend` prepare them; the model owns the backend from then on.
// GEIST_E_UNSUPPORTED for an architecture geist does not run, GEIST_E_BAD_FORMAT for missing
// or inconsistent keys and tensors.
Result<std::unique_ptr<ArchModel>> load_arch(const gguf::GgufFile &file, std::unique_ptr<Backend> backend);

}  // namespace geist::models
