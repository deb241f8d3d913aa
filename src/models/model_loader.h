// Helpers that every architecture's loader uses: typed hyperparameter lookups with the
// architecture prefix, and tensor binding with shape and type checks. Errors name the
// key or tensor and what was expected.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "backends/weight.h"
#include "base/status.h"
#include "gguf/gguf_reader.h"
#include "models/arch.h"

namespace geist::models {

class HparamReader {
 public:
  HparamReader(const gguf::GgufFile &f, std::string prefix) : f_(f), prefix_(std::move(prefix)) {}
  Result<int64_t> get_int(std::string_view key) const;
  Result<int64_t> get_int_or(std::string_view key, int64_t dflt) const;
  // Floats must be finite (NaN and infinities are refused, naming the key).
  Result<double> get_float(std::string_view key) const;
  Result<double> get_float_or(std::string_view key, double dflt) const;
  // As get_float(_or), and the value must be > 0 (and stay > 0 as a float: eps, RoPE
  // bases, scale factors) or >= 0 (softcaps, where 0 means off).
  Result<double> get_positive_float(std::string_view key) const;
  Result<double> get_positive_float_or(std::string_view key, double dflt) const;
  Result<double> get_nonneg_float_or(std::string_view key, double dflt) const;
  Result<std::string> get_string_or(std::string_view key, std::string dflt) const;
  // A key that may be a scalar or a per-layer array of n_layer entries; architectures with
  // uniform layers require every entry to be equal.
  Result<int64_t> get_layer_int(std::string_view key, int64_t n_layer) const;

 private:
  std::string full(std::string_view key) const { return prefix_ + "." + std::string(key); }
  const gguf::GgufFile &f_;
  std::string prefix_;
};

class TensorBinder {
 public:
  explicit TensorBinder(const gguf::GgufFile &f) : f_(f) {}
  // A 2-D weight with ne = [n_in, n_out] (n_out < 0: any) of a type geist computes with.
  Result<WeightView> matrix(const std::string &name, int64_t n_in, int64_t n_out);
  // A 1-D F32 tensor of n elements, read on the host (RoPE factors, scalars).
  Result<const float *> vector(const std::string &name, int64_t n);
  // The same as a view the backend prepares (norm weights: Exec::rmsnorm's g).
  Result<WeightView> norm(const std::string &name, int64_t n);
  int64_t total_elements() const { return total_; }

 private:
  Result<const gguf::TensorInfo *> find(const std::string &name);
  const gguf::GgufFile &f_;
  int64_t total_ = 0;
};

// The argument checks of ArchModel::forward (arch.h) every architecture makes: for each
// sequence its chunk size, a cache of n_cache_layers layers, room in the context, a store no
// other sequence of the step uses; rows <= ex.max_rows(), token ids < n_vocab, the logit
// rows. *n_rows: the step's rows.
Status check_forward_args(const int32_t *tokens, const StepSeq *seqs, int n_seqs, const Exec &ex,
                          int n_cache_layers, int64_t n_vocab, const ArchModel::LogitRows &out, int *n_rows);
// After a step's end_step succeeded: each sequence's store advances by its rows.
void advance_seqs(const StepSeq *seqs, int n_seqs);

// The Gemma FFN: o = W_down (gelu(W_gate x) * W_up x) for n rows x [n][d] (the block's
// normalized input). Scratch: gate, up [n][n_ff]; o [n][d].
void gelu_ffn(Exec &ex, Act x, int n, const WeightView &w_gate, const WeightView &w_up, const WeightView &w_down,
              Act gate, Act up, Act o);
// The end of a block and the start of the next: h += post_norm(o), then h *= h_scale
// unless it is 1, then x = next_norm(h) when next_norm is set (the next block's input; o
// is scratch afterwards). One Exec op when there is a next norm.
void residual_norm(Exec &ex, Act o, const WeightView &post_norm, Act h, float h_scale, const WeightView *next_norm,
                   Act x, int n, float eps);

// logits [n][n_vocab] = softcap(W_out rmsnorm(h, norm)) for n rows h [n][d], to the host;
// x: scratch of n rows of d; softcap 0 = none.
// The logits `out` asks for from the residual stream h of the step (rows n_rows, sequences
// seqs): the last rows of several multi-row sequences are gathered into g first. x and g:
// scratch of h's width.
void step_logits(Exec &ex, const WeightView &w_out, const WeightView &norm, Act h, int n_rows, const StepSeq *seqs,
                 int n_seqs, float eps, float softcap, const ArchModel::LogitRows &out, Act x, Act g);
// Row r goes to logits + r n_vocab, or to row_out[r] when row_out is not null; its drawn
// token to draws[r]->token where draws and draws[r] are not null (Exec::draw).
void output_logits(Exec &ex, const WeightView &w_out, const WeightView &norm, Act h, int n, float eps, float softcap,
                   Act x, float *logits, float *const *row_out = nullptr, StepDraw *const *draws = nullptr);

}  // namespace geist::models
