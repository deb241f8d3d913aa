#include "models/model_loader.h"

#include <cinttypes>
#include <cmath>

#include "backends/cpu/ops.h"

namespace geist::models {

Result<int64_t> HparamReader::get_int(std::string_view key) const {
  const std::string k = full(key);
  const gguf::Value *v = f_.find(k);
  if (!v) return GEIST_ERROR(GEIST_E_BAD_FORMAT, "missing required key '%s'", k.c_str());
  auto i = v->as_int();
  if (!i) return GEIST_ERROR(GEIST_E_BAD_FORMAT, "key '%s' must be an integer", k.c_str());
  return *i;
}

Result<int64_t> HparamReader::get_int_or(std::string_view key, int64_t dflt) const {
  if (!f_.find(full(key))) return dflt;
  return get_int(key);
}

Result<double> HparamReader::get_float(std::string_view key) const {
  const std::string k = full(key);
  const gguf::Value *v = f_.find(k);
  if (!v) return GEIST_ERROR(GEIST_E_BAD_FORMAT, "missing required key '%s'", k.c_str());
  auto x = v->as_float();
  if (!x) return GEIST_ERROR(GEIST_E_BAD_FORMAT, "key '%s' must be a number", k.c_str());
  if (!std::isfinite(*x)) return GEIST_ERROR(GEIST_E_BAD_FORMAT, "key '%s' is %g; it must be a finite number", k.c_str(), *x);
  return *x;
}

Result<double> HparamReader::get_float_or(std::string_view key, double dflt) const {
  if (!f_.find(full(key))) return dflt;
  return get_float(key);
}

Result<double> HparamReader::get_positive_float(std::string_view key) const {
  double x = 0;
  GEIST_ASSIGN_OR_RETURN(x, get_float(key));
  if (!(x > 0) || !(float(x) > 0)) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT, "key '%s' is %g; it must be > 0", full(key).c_str(), x);
  }
  return x;
}

Result<double> HparamReader::get_positive_float_or(std::string_view key, double dflt) const {
  if (!f_.find(full(key))) return dflt;
  return get_positive_float(key);
}

Result<double> HparamReader::get_nonneg_float_or(std::string_view key, double dflt) const {
  double x = 0;
  GEIST_ASSIGN_OR_RETURN(x, get_float_or(key, dflt));
  if (!(x >= 0)) return GEIST_ERROR(GEIST_E_BAD_FORMAT, "key '%s' is %g; it must be >= 0", full(key).c_str(), x);
  return x;
}

Result<std::string> HparamReader::get_string_or(std::string_view key, std::string dflt) const {
  const std::string k = full(key);
  const gguf::Value *v = f_.find(k);
  if (!v) return dflt;
  auto s = v->as_string();
  if (!s) return GEIST_ERROR(GEIST_E_BAD_FORMAT, "key '%s' must be a string", k.c_str());
  return std::string(*s);
}

Result<int64_t> HparamReader::get_layer_int(std::string_view key, int64_t n_layer) const {
  const std::string k = full(key);
  const gguf::Value *v = f_.find(k);
  if (!v) return GEIST_ERROR(GEIST_E_BAD_FORMAT, "missing required key '%s'", k.c_str());
  if (!v->is_array()) return get_int(key);
  if (static_cast<int64_t>(v->count) != n_layer) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT, "key '%s' has %" PRIu64 " entries for %lld layers", k.c_str(), v->count,
                       (long long)n_layer);
  }
  int64_t first = 0;
  for (uint64_t i = 0; i < v->count; ++i) {
    auto x = v->array_int(i);
    if (!x) return GEIST_ERROR(GEIST_E_BAD_FORMAT, "key '%s' entry %" PRIu64 " is not an integer", k.c_str(), i);
    if (i == 0) first = *x;
    if (*x != first) {
      return GEIST_ERROR(GEIST_E_UNSUPPORTED, "key '%s': per-layer values differ; this architecture needs them equal",
                         k.c_str());
    }
  }
  return first;
}

Result<const gguf::TensorInfo *> TensorBinder::find(const std::string &name) {
  const gguf::TensorInfo *t = f_.tensor(name);
  if (!t) return GEIST_ERROR(GEIST_E_BAD_FORMAT, "missing tensor '%s'", name.c_str());
  total_ += t->n_elements();
  return t;
}

Result<WeightView> TensorBinder::matrix(const std::string &name, int64_t n_in, int64_t n_out) {
  const gguf::TensorInfo *t = nullptr;
  GEIST_ASSIGN_OR_RETURN(t, find(name));
  if (t->n_dims != 2 || t->ne[0] != n_in || (n_out >= 0 && t->ne[1] != n_out) || t->ne[1] < 1) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT, "tensor '%s' has shape [%lld, %lld, %lld, %lld]; expected [%lld, %lld]",
                       name.c_str(), (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                       (long long)t->ne[3], (long long)n_in, (long long)n_out);
  }
  const quant::TypeTraits &tt = quant::traits(t->type);
  if (!tt.has_dequant) {
    return GEIST_ERROR(GEIST_E_UNSUPPORTED, "tensor '%s' has type %s, which geist cannot compute with", name.c_str(),
                       tt.name);
  }
  if (t->type == quant::GgmlType::F32 && reinterpret_cast<uintptr_t>(t->data) % alignof(float) != 0) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT, "tensor '%s' data is not 4-byte aligned in memory", name.c_str());
  }
  WeightView w;
  w.data = t->data;
  w.type = t->type;
  w.n_in = t->ne[0];
  w.n_out = t->ne[1];
  w.row_bytes = quant::row_bytes(t->type, t->ne[0]);
  return w;
}

Result<WeightView> TensorBinder::norm(const std::string &name, int64_t n) {
  const float *p = nullptr;
  GEIST_ASSIGN_OR_RETURN(p, vector(name, n));
  WeightView w;
  w.data = reinterpret_cast<const uint8_t *>(p);
  w.type = quant::GgmlType::F32;
  w.n_in = n;
  w.n_out = 1;
  w.row_bytes = size_t(n) * sizeof(float);
  return w;
}

Result<const float *> TensorBinder::vector(const std::string &name, int64_t n) {
  const gguf::TensorInfo *t = nullptr;
  GEIST_ASSIGN_OR_RETURN(t, find(name));
  if (t->n_dims != 1 || t->ne[0] != n) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT, "tensor '%s' has %u dims, ne[0] = %lld; expected a vector of %lld",
                       name.c_str(), t->n_dims, (long long)t->ne[0], (long long)n);
  }
  if (t->type != quant::GgmlType::F32) {
    return GEIST_ERROR(GEIST_E_UNSUPPORTED, "tensor '%s' has type %s; geist expects F32 for norm weights",
                       name.c_str(), quant::type_name(t->type));
  }
  if (reinterpret_cast<uintptr_t>(t->data) % alignof(float) != 0) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT, "tensor '%s' data is not 4-byte aligned in memory", name.c_str());
  }
  return reinterpret_cast<const float *>(t->data);
}

Status check_forward_args(const int32_t *tokens, const StepSeq *seqs, int n_seqs, const Exec &ex,
                          int n_cache_layers, int64_t n_vocab, const ArchModel::LogitRows &out, int *n_rows) {
  if (seqs == nullptr || n_seqs < 1) return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "a step needs a sequence");
  int64_t total = 0;
  for (int i = 0; i < n_seqs; ++i) {
    const KvStore *kv = seqs[i].kv;
    const int n = seqs[i].n_rows;
    if (kv == nullptr) return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "sequence %d has no KV store", i);
    if (n < 1 || n > kv->max_chunk()) {
      return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "chunk of %d rows (must be 1..%d)", n, kv->max_chunk());
    }
    if (kv->n_layers() != n_cache_layers) {
      return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "KV cache was made for another model");
    }
    if (kv->n_past + n > kv->n_ctx()) {
      return GEIST_ERROR(GEIST_E_CONTEXT_FULL, "%lld tokens in the cache + %d new exceed the context of %lld",
                         (long long)kv->n_past, n, (long long)kv->n_ctx());
    }
    for (int k = 0; k < i; ++k) {
      if (seqs[k].kv == kv) return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "sequences %d and %d share a KV store", k, i);
    }
    total += n;
  }
  if (total > ex.max_rows()) {
    return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "a step of %lld rows (this exec takes up to %d)", (long long)total,
                       ex.max_rows());
  }
  const int n = int(total);
  for (int r = 0; r < n; ++r) {
    if (tokens[r] < 0 || tokens[r] >= n_vocab) {
      return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "token id %d out of range [0, %lld)", tokens[r],
                         (long long)n_vocab);
    }
  }
  if (out.out != nullptr && out.seq_out == nullptr && (out.first_row < 0 || out.first_row >= n)) {
    return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "logits from row %d of a step of %d", out.first_row, n);
  }
  *n_rows = n;
  return Status::ok();
}

void advance_seqs(const StepSeq *seqs, int n_seqs) {
  for (int i = 0; i < n_seqs; ++i) seqs[i].kv->n_past += seqs[i].n_rows;
}

void gelu_ffn(Exec &ex, Act x, int n, const WeightView &w_gate, const WeightView &w_up, const WeightView &w_down,
              Act gate, Act up, Act o) {
  const WeightView *ws[] = {&w_gate, &w_up};
  const Act ys[] = {gate, up};
  ex.matmul(ws, 2, x, ys, n);
  ex.gelu_mul(gate, up, gate, int64_t(n) * w_gate.n_out);
  ex.matmul(w_down, gate, o, n);
}

void residual_norm(Exec &ex, Act o, const WeightView &post_norm, Act h, float h_scale, const WeightView *next_norm,
                   Act x, int n, float eps) {
  const int64_t d = h.width;
  if (next_norm != nullptr) {
    ex.rmsnorm_add_norm(o, &post_norm, h, h_scale, next_norm, x, n, d, eps);
    return;
  }
  ex.rmsnorm_add(o, &post_norm, n, d, eps, h);
  if (h_scale != 1.0f) ex.scale(h, h_scale, int64_t(n) * d);
}

void step_logits(Exec &ex, const WeightView &w_out, const WeightView &norm, Act h, int n_rows, const StepSeq *seqs,
                 int n_seqs, float eps, float softcap, const ArchModel::LogitRows &out, Act x, Act g) {
  if (out.seq_out == nullptr) {
    if (out.out != nullptr) {
      output_logits(ex, w_out, norm, h.rows_from(out.first_row), n_rows - out.first_row, eps, softcap, x, out.out,
                    nullptr, out.draws);
    }
    return;
  }
  if (n_rows == n_seqs) {  // one row each: the last rows are all rows
    output_logits(ex, w_out, norm, h, n_rows, eps, softcap, x, nullptr, out.seq_out, out.draws);
    return;
  }
  int last = -1;
  for (int i = 0; i < n_seqs; ++i) {
    last += seqs[i].n_rows;
    ex.copy_cols(h.rows_from(last), 0, g.rows_from(i), 1);
  }
  output_logits(ex, w_out, norm, g, n_seqs, eps, softcap, x, nullptr, out.seq_out, out.draws);
}

void output_logits(Exec &ex, const WeightView &w_out, const WeightView &norm, Act h, int n, float eps, float softcap,
                   Act x, float *logits, float *const *row_out, StepDraw *const *draws) {
  ex.rmsnorm(h, &norm, n, h.width, eps, x);
  const Act y = row_out != nullptr ? ex.output_rows(row_out, w_out.n_out, n) : ex.output(logits, w_out.n_out, n);
  ex.matmul(w_out, x, y, n);
  if (softcap > 0) ex.softcap(y, softcap, int64_t(n) * w_out.n_out);
  if (draws != nullptr) ex.draw(y, n, draws);
}

}  // namespace geist::models
