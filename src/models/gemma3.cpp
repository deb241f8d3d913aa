// Gemma 3 forward pass (model-spec.md section 2), written to be read top to bottom.
#include "models/gemma3.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cpu/ops.h"
#include "backends/cpu/packed.h"
#include "base/timer.h"
#include "gguf/gguf_reader.h"
#include "models/model_loader.h"

namespace geist::models {
namespace {

struct Layer {
  bool sliding = false;
  WeightView attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up, ffn_down;
  const float *attn_norm = nullptr;            // [n_embd]
  const float *attn_q_norm = nullptr;          // [head_dim]
  const float *attn_k_norm = nullptr;          // [head_dim]
  const float *post_attention_norm = nullptr;  // [n_embd]
  const float *ffn_norm = nullptr;             // [n_embd]
  const float *post_ffw_norm = nullptr;        // [n_embd]
};

class Gemma3 final : public ArchModel {
 public:
  const ModelInfo &info() const override { return info_; }
  std::vector<KvLayerSpec> kv_layout() const override;
  void reserve(Workspace &ws, int max_chunk) const override;
  Status forward(const int32_t *tokens, int n_rows, KvCache &cache, Workspace &ws, ThreadPool &pool,
                 int first_logit_row, float *logits) const override;

  Status load(const gguf::GgufFile &f);

 private:
  void attention_block(const Layer &L, int il, float *h, int n, int64_t pos0, KvCache &cache, Workspace &ws,
                       ThreadPool &pool) const;
  void ffn_block(const Layer &L, float *h, int n, Workspace &ws, ThreadPool &pool) const;

  ModelInfo info_;
  int64_t n_embd_ = 0, n_head_ = 0, n_head_kv_ = 0, head_dim_ = 0, n_ff_ = 0;
  int window_ = 0;
  float eps_ = 1e-6f;
  float attn_scale_ = 0.0f;
  float softcap_ = 0.0f;  // 0: none
  cpu::RopeTable rope_global_, rope_local_;
  WeightView token_embd_, output_;
  const float *output_norm_ = nullptr;
  std::vector<Layer> layers_;
  cpu::PackedStore packed_;  // repacked weights (the mapped originals are released)
};

// Scratch slots of the forward pass.
enum Slot { kH, kX, kQ, kK, kV, kAttn, kO, kGate, kUp, kRopeG, kRopeL };

Status Gemma3::load(const gguf::GgufFile &f) {
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
  GEIST_ASSIGN_OR_RETURN(output_norm_, tb.vector("output_norm.weight", d));
  layers_.resize(n_layer);
  for (int64_t il = 0; il < n_layer; ++il) {
    Layer &L = layers_[il];
    const std::string p = "blk." + std::to_string(il) + ".";
    L.sliding = window_ > 0 && (il + 1) % pattern != 0;
    GEIST_ASSIGN_OR_RETURN(L.attn_norm, tb.vector(p + "attn_norm.weight", d));
    GEIST_ASSIGN_OR_RETURN(L.attn_q, tb.matrix(p + "attn_q.weight", d, qd));
    GEIST_ASSIGN_OR_RETURN(L.attn_k, tb.matrix(p + "attn_k.weight", d, kvd));
    GEIST_ASSIGN_OR_RETURN(L.attn_v, tb.matrix(p + "attn_v.weight", d, kvd));
    GEIST_ASSIGN_OR_RETURN(L.attn_q_norm, tb.vector(p + "attn_q_norm.weight", head_dim_));
    GEIST_ASSIGN_OR_RETURN(L.attn_k_norm, tb.vector(p + "attn_k_norm.weight", head_dim_));
    GEIST_ASSIGN_OR_RETURN(L.attn_output, tb.matrix(p + "attn_output.weight", qd, d));
    GEIST_ASSIGN_OR_RETURN(L.post_attention_norm, tb.vector(p + "post_attention_norm.weight", d));
    GEIST_ASSIGN_OR_RETURN(L.ffn_norm, tb.vector(p + "ffn_norm.weight", d));
    GEIST_ASSIGN_OR_RETURN(L.ffn_gate, tb.matrix(p + "ffn_gate.weight", d, n_ff_));
    GEIST_ASSIGN_OR_RETURN(L.ffn_up, tb.matrix(p + "ffn_up.weight", d, n_ff_));
    GEIST_ASSIGN_OR_RETURN(L.ffn_down, tb.matrix(p + "ffn_down.weight", n_ff_, d));
    GEIST_ASSIGN_OR_RETURN(L.post_ffw_norm, tb.vector(p + "post_ffw_norm.weight", d));
  }
  // Repack the matrices for the CPU tier in use, one at a time, releasing each one's mapped
  // pages after it is packed: the process then holds one copy of the weights. The token
  // embedding stays in the mapping (a lookup touches one row); when it is also the output
  // head (tied), the head's packed copy is separate and the embedding rows fault back in
  // as tokens are seen.
  const double t_pack = now_seconds();
  ThreadPool pack_pool(ThreadPool::hardware_threads());
  auto pack = [&](WeightView &w) {
    if (cpu::pack_weight(&w, &packed_, &pack_pool)) f.release_pages(w.data, w.row_bytes * size_t(w.n_out));
  };
  pack(output_);
  for (Layer &L : layers_) {
    for (WeightView *w : {&L.attn_q, &L.attn_k, &L.attn_v, &L.attn_output, &L.ffn_gate, &L.ffn_up, &L.ffn_down}) {
      pack(*w);
    }
  }
  info_.packed_bytes = packed_.bytes();
  info_.repack_seconds = now_seconds() - t_pack;
  info_.arch = "gemma3";
  info_.n_embd = n_embd_;
  info_.n_layer = n_layer;
  info_.n_params = tb.total_elements();
  if (const gguf::Value *nm = f.find("general.name"); nm && nm->as_string()) info_.name = std::string(*nm->as_string());
  return Status::ok();
}

std::vector<KvLayerSpec> Gemma3::kv_layout() const {
  std::vector<KvLayerSpec> out;
  for (const Layer &L : layers_) out.push_back({n_head_kv_ * head_dim_, L.sliding ? window_ : 0});
  return out;
}

void Gemma3::reserve(Workspace &ws, int max_chunk) const {
  const size_t n = size_t(max_chunk), qd = size_t(n_head_ * head_dim_), kvd = size_t(n_head_kv_ * head_dim_);
  ws.get(kH, n * n_embd_);
  ws.get(kX, n * n_embd_);
  ws.get(kQ, n * qd);
  ws.get(kK, n * kvd);
  ws.get(kV, n * kvd);
  ws.get(kAttn, n * qd);
  ws.get(kO, n * n_embd_);
  ws.get(kGate, n * n_ff_);
  ws.get(kUp, n * n_ff_);
  ws.get(kRopeG, n * head_dim_);
  ws.get(kRopeL, n * head_dim_);
}

// h += post_norm(W_o * attention(rope(norm(W_q x)), rope(norm(W_k x)), W_v x)), x = norm(h)
void Gemma3::attention_block(const Layer &L, int il, float *h, int n, int64_t pos0, KvCache &cache, Workspace &ws,
                             ThreadPool &pool) const {
  const int64_t d = n_embd_, qd = n_head_ * head_dim_, kvd = n_head_kv_ * head_dim_;
  float *x = ws.get(kX, size_t(n) * d);        // [n][d]
  float *q = ws.get(kQ, size_t(n) * qd);       // [n][n_head][head_dim]
  float *k = ws.get(kK, size_t(n) * kvd);      // [n][n_head_kv][head_dim]
  float *v = ws.get(kV, size_t(n) * kvd);      // [n][n_head_kv][head_dim]
  float *att = ws.get(kAttn, size_t(n) * qd);  // [n][n_head][head_dim]
  float *o = ws.get(kO, size_t(n) * d);        // [n][d]
  const float *cs = ws.get(L.sliding ? kRopeL : kRopeG, 0);  // [n][head_dim/2][2], filled in forward()

  cpu::rmsnorm_to(h, L.attn_norm, x, n, d, eps_, pool);
  {
    const WeightView *ws[] = {&L.attn_q, &L.attn_k, &L.attn_v};
    float *ys[] = {q, k, v};
    cpu::matmul_shared_input(ws, 3, x, ys, n, pool);
  }
  cpu::rmsnorm(q, L.attn_q_norm, int64_t(n) * n_head_, head_dim_, eps_, pool);
  cpu::rmsnorm(k, L.attn_k_norm, int64_t(n) * n_head_kv_, head_dim_, eps_, pool);
  cpu::rope_neox(q, n, int(n_head_), int(head_dim_), int(head_dim_), cs, pool);
  cpu::rope_neox(k, n, int(n_head_kv_), int(head_dim_), int(head_dim_), cs, pool);

  cache.append(il, pos0, n, k, v);
  const int64_t cap = cache.capacity(il);  // the attention kernel reads the ring itself
  cpu::AttentionArgs a{q,  cache.k(il), cache.v(il),      att,       n, pos0, cap, int(n_head_), int(n_head_kv_),
                       int(head_dim_), L.sliding ? window_ : 0, attn_scale_};
  cpu::attention(a, pool);
  cpu::matmul(L.attn_output, att, o, n, pool);
  cpu::rmsnorm(o, L.post_attention_norm, n, d, eps_, pool);
  cpu::add_inplace(h, o, int64_t(n) * d);
}

// h += post_norm(W_down (gelu(W_gate x) * W_up x)), x = norm(h)
void Gemma3::ffn_block(const Layer &L, float *h, int n, Workspace &ws, ThreadPool &pool) const {
  const int64_t d = n_embd_;
  gelu_ffn_residual(h, n, d, L.ffn_norm, L.ffn_gate, L.ffn_up, L.ffn_down, L.post_ffw_norm, eps_,
                    ws.get(kX, size_t(n) * d), ws.get(kGate, size_t(n) * n_ff_), ws.get(kUp, size_t(n) * n_ff_),
                    ws.get(kO, size_t(n) * d), pool);
}

Status Gemma3::forward(const int32_t *tokens, int n, KvCache &cache, Workspace &ws, ThreadPool &pool,
                       int first_logit_row, float *logits) const {
  GEIST_RETURN_IF_ERROR(check_forward_args(tokens, n, cache, int(layers_.size()), info_.n_vocab));
  if (first_logit_row < 0 || first_logit_row > n) first_logit_row = n;
  const int64_t d = n_embd_;
  const int64_t pos0 = cache.n_past;

  float *h = ws.get(kH, size_t(n) * d);  // [n][d] residual stream
  rope_global_.fill(pos0, n, ws.get(kRopeG, size_t(n) * head_dim_));
  rope_local_.fill(pos0, n, ws.get(kRopeL, size_t(n) * head_dim_));
  cpu::embedding_gather(token_embd_, tokens, n, std::sqrt(float(d)), h);

  for (size_t il = 0; il < layers_.size(); ++il) {
    attention_block(layers_[il], int(il), h, n, pos0, cache, ws, pool);
    ffn_block(layers_[il], h, n, ws, pool);
  }
  cache.n_past += n;

  const int n_out = n - first_logit_row;
  if (logits && n_out > 0) {
    output_logits(output_, output_norm_, h + size_t(first_logit_row) * d, n_out, d, eps_, softcap_,
                  ws.get(kX, size_t(n_out) * d), logits, pool);
  }
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<ArchModel>> load_gemma3(const gguf::GgufFile &file) {
  auto m = std::make_unique<Gemma3>();
  GEIST_RETURN_IF_ERROR(m->load(file));
  return std::unique_ptr<ArchModel>(std::move(m));
}

}  // namespace geist::models
