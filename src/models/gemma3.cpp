// Gemma 3 forward pass (model-spec.md section 2), written to be read top to bottom.
#include "models/gemma3.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cpu/ops.h"
#include "gguf/gguf_reader.h"
#include "models/model_loader.h"

namespace geist::models {
namespace {

struct Layer {
  bool sliding = false;
  WeightView attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up, ffn_down;
  WeightView attn_norm;            // [n_embd]
  WeightView attn_q_norm;          // [head_dim]
  WeightView attn_k_norm;          // [head_dim]
  WeightView post_attention_norm;  // [n_embd]
  WeightView ffn_norm;             // [n_embd]
  WeightView post_ffw_norm;        // [n_embd]
};

class Gemma3 final : public ArchModel {
 public:
  const ModelInfo &info() const override { return info_; }
  std::vector<KvLayerSpec> kv_layout() const override;
  Backend &backend() const override { return *backend_; }
  void reserve(Exec &ex) const override;
  using ArchModel::forward;
  Status forward(const int32_t *tokens, const StepSeq *seqs, int n_seqs, Exec &ex,
                 const LogitRows &out) const override;

  Status load(const gguf::GgufFile &f, std::unique_ptr<Backend> backend);

 private:
  void attention_block(int il, Act h, int n, Exec &ex, Act cs) const;
  void ffn_block(int il, Act h, int n, Exec &ex) const;

  std::unique_ptr<Backend> backend_;
  ModelInfo info_;
  int64_t n_embd_ = 0, n_head_ = 0, n_head_kv_ = 0, head_dim_ = 0, n_ff_ = 0;
  int window_ = 0;
  float eps_ = 1e-6f;
  float attn_scale_ = 0.0f;
  float softcap_ = 0.0f;  // 0: none
  cpu::RopeTable rope_global_, rope_local_;
  WeightView token_embd_, output_, output_norm_;
  std::vector<Layer> layers_;
};

// Scratch slots of the forward pass.
enum Slot { kH, kX, kQ, kK, kV, kAttn, kO, kGate, kUp, kRopeG, kRopeL };

Status Gemma3::load(const gguf::GgufFile &f, std::unique_ptr<Backend> backend) {
  backend_ = std::move(backend);
  HparamReader hp(f, "gemma3");
  int64_t n_layer = 0;
  GEIST_ASSIGN_OR_RETURN(n_layer, hp.get_int("block_count"));
  GEIST_ASSIGN_OR_RETURN(n_embd_, hp.get_int("embedding_length"));
  GEIST_ASSIGN_OR_RETURN(info_.n_ctx_train, hp.get_int("context_length"));
  GEIST_ASSIGN_OR_RETURN(n_head_, hp.get_layer_int("attention.head_count", n_layer));
  GEIST_ASSIGN_OR_RETURN(n_head_kv_, hp.get_layer_int("attention.head_count_kv", n_layer));
  GEIST_ASSIGN_OR_RETURN(n_ff_, hp.get_layer_int("feed_forward_length", n_layer));
  GEIST_ASSIGN_OR_RETURN(head_dim_, hp.get_int_or("attention.key_length", 256));
  int64_t v_len = 0;
  GEIST_ASSIGN_OR_RETURN(v_len, hp.get_int_or("attention.value_length", head_dim_));
  double eps = 0, base_g = 0, base_l = 0, softcap = 0, scale_factor = 1;
  GEIST_ASSIGN_OR_RETURN(eps, hp.get_positive_float("attention.layer_norm_rms_epsilon"));
  GEIST_ASSIGN_OR_RETURN(base_g, hp.get_positive_float_or("rope.freq_base", 1e6));
  GEIST_ASSIGN_OR_RETURN(base_l, hp.get_positive_float_or("rope.freq_base_swa", 1e4));
  GEIST_ASSIGN_OR_RETURN(softcap, hp.get_nonneg_float_or("final_logit_softcapping", 0.0));
  int64_t window = 0, pattern = 6, rope_dim = 0;
  GEIST_ASSIGN_OR_RETURN(window, hp.get_int_or("attention.sliding_window", 0));
  GEIST_ASSIGN_OR_RETURN(pattern, hp.get_int_or("attention.sliding_window_pattern", 6));
  GEIST_ASSIGN_OR_RETURN(rope_dim, hp.get_int_or("rope.dimension_count", head_dim_));
  std::string scaling_type;
  GEIST_ASSIGN_OR_RETURN(scaling_type, hp.get_string_or("rope.scaling.type", "none"));
  if (scaling_type == "linear") {
    GEIST_ASSIGN_OR_RETURN(scale_factor, hp.get_positive_float_or("rope.scaling.factor", 1.0));
  } else if (scaling_type != "none") {
    return GEIST_ERROR(GEIST_E_UNSUPPORTED, "gemma3: rope.scaling.type '%s' is not supported", scaling_type.c_str());
  }

  if (n_layer < 1 || n_layer > 1024 || n_embd_ < 1 || n_head_ < 1 || n_head_kv_ < 1 || n_head_ % n_head_kv_ != 0 ||
      head_dim_ < 2 || head_dim_ % 2 != 0 || head_dim_ > cpu::RopeTable::kMaxRotDim || v_len != head_dim_ ||
      rope_dim != head_dim_ || n_ff_ < 1 || window < 0 || window > (1 << 30) || pattern < 1 || !(eps > 0) ||
      !(base_g > 0) || !(base_l > 0) || !(scale_factor > 0)) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT,
                       "gemma3: inconsistent hyperparameters (layers %lld, n_embd %lld, heads %lld/%lld, head_dim "
                       "%lld, value_length %lld, rope dims %lld, n_ff %lld, window %lld, pattern %lld)",
                       (long long)n_layer, (long long)n_embd_, (long long)n_head_, (long long)n_head_kv_,
                       (long long)head_dim_, (long long)v_len, (long long)rope_dim, (long long)n_ff_,
                       (long long)window, (long long)pattern);
  }
  if (info_.n_ctx_train < 1) return GEIST_ERROR(GEIST_E_BAD_FORMAT, "gemma3: context_length must be >= 1");
  window_ = static_cast<int>(window);
  eps_ = static_cast<float>(eps);
  softcap_ = static_cast<float>(softcap);
  // llama.cpp's rule (query_pre_attn_scalar is not in GGUF): 1/sqrt(head_dim), except 27B.
  attn_scale_ = n_layer == 62 ? 1.0f / std::sqrt(float(n_embd_ / n_head_)) : 1.0f / std::sqrt(float(head_dim_));
  rope_global_.init(base_g, static_cast<int>(head_dim_), 1.0 / scale_factor, nullptr);
  rope_local_.init(base_l, static_cast<int>(head_dim_), 1.0, nullptr);

  TensorBinder tb(f);
  const int64_t d = n_embd_, qd = n_head_ * head_dim_, kvd = n_head_kv_ * head_dim_;
  GEIST_ASSIGN_OR_RETURN(token_embd_, tb.matrix("token_embd.weight", d, -1));
  info_.n_vocab = token_embd_.n_out;
  if (f.tensor("output.weight")) {
    GEIST_ASSIGN_OR_RETURN(output_, tb.matrix("output.weight", d, info_.n_vocab));
  } else {
    output_ = token_embd_;  // tied head
  }
  GEIST_ASSIGN_OR_RETURN(output_norm_, tb.norm("output_norm.weight", d));
  layers_.resize(n_layer);
  for (int64_t il = 0; il < n_layer; ++il) {
    Layer &L = layers_[il];
    const std::string p = "blk." + std::to_string(il) + ".";
    L.sliding = window_ > 0 && (il + 1) % pattern != 0;
    GEIST_ASSIGN_OR_RETURN(L.attn_norm, tb.norm(p + "attn_norm.weight", d));
    GEIST_ASSIGN_OR_RETURN(L.attn_q, tb.matrix(p + "attn_q.weight", d, qd));
    GEIST_ASSIGN_OR_RETURN(L.attn_k, tb.matrix(p + "attn_k.weight", d, kvd));
    GEIST_ASSIGN_OR_RETURN(L.attn_v, tb.matrix(p + "attn_v.weight", d, kvd));
    GEIST_ASSIGN_OR_RETURN(L.attn_q_norm, tb.norm(p + "attn_q_norm.weight", head_dim_));
    GEIST_ASSIGN_OR_RETURN(L.attn_k_norm, tb.norm(p + "attn_k_norm.weight", head_dim_));
    GEIST_ASSIGN_OR_RETURN(L.attn_output, tb.matrix(p + "attn_output.weight", qd, d));
    GEIST_ASSIGN_OR_RETURN(L.post_attention_norm, tb.norm(p + "post_attention_norm.weight", d));
    GEIST_ASSIGN_OR_RETURN(L.ffn_norm, tb.norm(p + "ffn_norm.weight", d));
    GEIST_ASSIGN_OR_RETURN(L.ffn_gate, tb.matrix(p + "ffn_gate.weight", d, n_ff_));
    GEIST_ASSIGN_OR_RETURN(L.ffn_up, tb.matrix(p + "ffn_up.weight", d, n_ff_));
    GEIST_ASSIGN_OR_RETURN(L.ffn_down, tb.matrix(p + "ffn_down.weight", n_ff_, d));
    GEIST_ASSIGN_OR_RETURN(L.post_ffw_norm, tb.norm(p + "post_ffw_norm.weight", d));
  }
  ModelWeights mw;
  mw.matrices.push_back(&output_);
  mw.tables.push_back(&token_embd_);
  mw.vectors.push_back(&output_norm_);
  for (Layer &L : layers_) {
    for (WeightView *w : {&L.attn_q, &L.attn_k, &L.attn_v, &L.attn_output, &L.ffn_gate, &L.ffn_up, &L.ffn_down}) {
      mw.matrices.push_back(w);
    }
    for (WeightView *w : {&L.attn_norm, &L.attn_q_norm, &L.attn_k_norm, &L.post_attention_norm, &L.ffn_norm,
                          &L.post_ffw_norm}) {
      mw.vectors.push_back(w);
    }
  }
  GEIST_RETURN_IF_ERROR(backend_->prepare(mw, [&f](const void *p, size_t n) { f.release_pages(p, n); }));
  info_.packed_bytes = backend_->weight_bytes();
  info_.repack_seconds = backend_->prepare_seconds();
  info_.arch = "gemma3";
  info_.n_embd = n_embd_;
  info_.n_layer = n_layer;
  info_.n_params = tb.total_elements();
  if (const gguf::Value *nm = f.find("general.name"); nm && nm->as_string()) info_.name = std::string(*nm->as_string());
  return Status::ok();
}

std::vector<KvLayerSpec> Gemma3::kv_layout() const {
  std::vector<KvLayerSpec> out;
  for (const Layer &L : layers_) out.push_back({n_head_kv_ * head_dim_, L.sliding ? window_ : 0, int(head_dim_)});
  return out;
}

void Gemma3::reserve(Exec &ex) const {
  const int64_t qd = n_head_ * head_dim_, kvd = n_head_kv_ * head_dim_;
  for (auto [slot, width] : {std::pair{kH, n_embd_}, {kX, n_embd_}, {kQ, qd}, {kK, kvd}, {kV, kvd}, {kAttn, qd},
                             {kO, n_embd_}, {kGate, n_ff_}, {kUp, n_ff_}, {kRopeG, head_dim_}, {kRopeL, head_dim_}}) {
    ex.buffer(slot, width);
  }
}

// x = attn_norm(h) on entry (the step or the layer before normalized it);
// h += post_norm(W_o * attention(rope(norm(W_q x)), rope(norm(W_k x)), W_v x)), x = ffn_norm(h)
void Gemma3::attention_block(int il, Act h, int n, Exec &ex, Act cs) const {
  const Layer &L = layers_[size_t(il)];
  const int64_t d = n_embd_, qd = n_head_ * head_dim_, kvd = n_head_kv_ * head_dim_;
  const Act x = ex.buffer(kX, d);       // [n][d]
  const Act q = ex.buffer(kQ, qd);      // [n][n_head][head_dim]
  const Act k = ex.buffer(kK, kvd);     // [n][n_head_kv][head_dim]
  const Act v = ex.buffer(kV, kvd);     // [n][n_head_kv][head_dim]
  const Act att = ex.buffer(kAttn, qd); // [n][n_head][head_dim]
  const Act o = ex.buffer(kO, d);       // [n][d]

  {
    const WeightView *ws[] = {&L.attn_q, &L.attn_k, &L.attn_v};
    const Act ys[] = {q, k, v};
    ex.matmul(ws, 3, x, ys, n);
  }
  const Exec::HeadNorm heads[] = {{q, &L.attn_q_norm, int(n_head_), true}, {k, &L.attn_k_norm, int(n_head_kv_), true}};
  ex.head_norm_rope(heads, 2, n, int(head_dim_), eps_, cs);

  ex.kv_append(il, k, v);
  ex.attention(il, q, att, int(n_head_), int(head_dim_), L.sliding ? window_ : 0, attn_scale_);
  ex.matmul(L.attn_output, att, o, n);
  residual_norm(ex, o, L.post_attention_norm, h, 1.0f, &L.ffn_norm, x, n, eps_);
}

// x = ffn_norm(h) on entry; h += post_norm(W_down (gelu(W_gate x) * W_up x)), then x = the
// next layer's attn_norm(h).
void Gemma3::ffn_block(int il, Act h, int n, Exec &ex) const {
  const Layer &L = layers_[size_t(il)];
  const Act x = ex.buffer(kX, n_embd_), o = ex.buffer(kO, n_embd_);
  gelu_ffn(ex, x, n, L.ffn_gate, L.ffn_up, L.ffn_down, ex.buffer(kGate, n_ff_), ex.buffer(kUp, n_ff_), o);
  const WeightView *next = size_t(il) + 1 < layers_.size() ? &layers_[size_t(il) + 1].attn_norm : nullptr;
  residual_norm(ex, o, L.post_ffw_norm, h, 1.0f, next, x, n, eps_);
}

Status Gemma3::forward(const int32_t *tokens, const StepSeq *seqs, int n_seqs, Exec &ex,
                       const LogitRows &out) const {
  int n = 0;
  GEIST_RETURN_IF_ERROR(
      check_forward_args(tokens, seqs, n_seqs, ex, int(layers_.size()), info_.n_vocab, out, &n));
  const int64_t d = n_embd_;

  ex.begin_step(tokens, n, seqs, n_seqs);
  const Act cs_global = ex.rope_rows(kRopeG, rope_global_), cs_local = ex.rope_rows(kRopeL, rope_local_);
  const Act h = ex.buffer(kH, d);  // [n][d] residual stream
  ex.embed(token_embd_, std::sqrt(float(d)), h);
  ex.rmsnorm(h, &layers_[0].attn_norm, n, d, eps_, ex.buffer(kX, d));

  for (size_t il = 0; il < layers_.size(); ++il) {
    attention_block(int(il), h, n, ex, layers_[il].sliding ? cs_local : cs_global);
    ffn_block(int(il), h, n, ex);
  }

  step_logits(ex, output_, output_norm_, h, n, seqs, n_seqs, eps_, softcap_, out, ex.buffer(kX, d), ex.buffer(kO, d));
  GEIST_RETURN_IF_ERROR(ex.end_step());
  advance_seqs(seqs, n_seqs);
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<ArchModel>> load_gemma3(const gguf::GgufFile &file, std::unique_ptr<Backend> backend) {
  auto m = std::make_unique<Gemma3>();
  GEIST_RETURN_IF_ERROR(m->load(file, std::move(backend)));
  return std::unique_ptr<ArchModel>(std::move(m));
}

}  // namespace geist::models
