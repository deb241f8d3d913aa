// Gemma 4 E2B / E4B text decoder (model-spec.md section 4), read top to bottom.
//
// What differs from Gemma 3: per-layer embeddings (PLE) computed once per token before
// layer 0 and mixed into the residual after every layer's FFN; KV-shared layers (the last
// attention.shared_kv_layers layers own no cache and attend over the cache of the last
// owner layer of their type); sliding and full layers with their own head dims (256 / 512
// in the real models); proportional partial RoPE on full layers (rope_freqs.weight: factor
// 1 for the rotated pairs, >= 1e29 for the identity ones); a V norm without weight;
// attention scale 1; a scalar per layer that multiplies the whole residual; per-layer FFN
// widths; final logit softcap. Norms are plain (x * w) in GGUF.
#include "models/gemma4.h"

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
  bool owns_kv = false;
  int kv_src = 0;  // the layer whose cache this one reads (itself for owners) = its cache slot
  int64_t head_dim = 0, n_ff = 0;
  float out_scale = 1.0f;
  WeightView attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up, ffn_down, inp_gate, proj;
  WeightView attn_norm, attn_q_norm, attn_k_norm, post_attention_norm, ffn_norm, post_ffw_norm;
  WeightView post_norm;  // after the PLE projection
};

class Gemma4 final : public ArchModel {
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
  Status load_hparams(const gguf::GgufFile &f, std::vector<bool> *sliding, std::vector<int64_t> *n_ff,
                      int64_t *n_shared);
  void per_layer_inputs(Act e, int n, Exec &ex) const;
  void attention_block(const Layer &L, Act h, int n, Exec &ex, Act cs) const;
  void ffn_block(int il, Act h, int n, Exec &ex) const;
  void ple_block(int il, Act h, int n, Exec &ex) const;
  // The end of layer il: h += post(o), h *= the layer's output scale, x = the next layer's
  // attn_norm(h).
  void end_layer(int il, Act o, const WeightView &post, Act h, int n, Exec &ex) const;

  std::unique_ptr<Backend> backend_;
  ModelInfo info_;
  int64_t n_embd_ = 0, n_head_ = 0, n_head_kv_ = 0, hd_swa_ = 0, hd_full_ = 0, max_ff_ = 0;
  int64_t d_ple_ = 0;  // per-layer embedding width (0: no PLE)
  int n_owners_ = 0;
  int window_ = 0;
  float eps_ = 1e-6f;
  float softcap_ = 0.0f;
  cpu::RopeTable rope_full_, rope_swa_;
  double rope_base_full_ = 1e6;
  std::vector<float> rope_ff_;  // [hd_full / 2] frequency factors of the full layers
  WeightView token_embd_, output_, ple_embd_, ple_model_proj_, output_norm_, ple_proj_norm_;
  std::vector<Layer> layers_;
};

enum Slot { kH, kX, kQ, kK, kV, kAttn, kO, kGate, kUp, kRopeF, kRopeS, kPle, kPleTmp, kPleG };

// Per-layer values of an integer key that may be a scalar (broadcast) or an array.
Result<std::vector<int64_t>> layer_ints(const gguf::GgufFile &f, const std::string &key, int64_t n_layer) {
  const gguf::Value *v = f.find(key);
  if (!v) return GEIST_ERROR(GEIST_E_BAD_FORMAT, "missing required key '%s'", key.c_str());
  std::vector<int64_t> out(n_layer);
  if (!v->is_array()) {
    auto x = v->as_int();
    if (!x) return GEIST_ERROR(GEIST_E_BAD_FORMAT, "key '%s' must be an integer", key.c_str());
    std::fill(out.begin(), out.end(), *x);
    return out;
  }
  if (int64_t(v->count) != n_layer) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT, "key '%s' has %llu entries for %lld layers", key.c_str(),
                       (unsigned long long)v->count, (long long)n_layer);
  }
  for (int64_t i = 0; i < n_layer; ++i) {
    auto x = v->array_int(uint64_t(i));
    if (!x) return GEIST_ERROR(GEIST_E_BAD_FORMAT, "key '%s' entry %lld is not an integer", key.c_str(), (long long)i);
    out[i] = *x;
  }
  return out;
}

// attention.sliding_window_pattern: a bool (or integer) array, true = sliding.
Result<std::vector<bool>> layer_bools(const gguf::GgufFile &f, const std::string &key, int64_t n_layer) {
  const gguf::Value *v = f.find(key);
  if (!v) return GEIST_ERROR(GEIST_E_BAD_FORMAT, "missing required key '%s'", key.c_str());
  if (!v->is_array() || int64_t(v->count) != n_layer) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT, "key '%s' must be an array of %lld bools", key.c_str(), (long long)n_layer);
  }
  std::vector<bool> out(n_layer);
  for (int64_t i = 0; i < n_layer; ++i) {
    if (v->elem_type == gguf::ValueType::BOOL) {
      out[i] = v->data[i] != 0;
    } else {
      auto x = v->array_int(uint64_t(i));
      if (!x) return GEIST_ERROR(GEIST_E_BAD_FORMAT, "key '%s' entry %lld is not a bool", key.c_str(), (long long)i);
      out[i] = *x != 0;
    }
  }
  return out;
}

Status Gemma4::load_hparams(const gguf::GgufFile &f, std::vector<bool> *sliding, std::vector<int64_t> *n_ff,
                            int64_t *n_shared) {
  HparamReader hp(f, "gemma4");
  int64_t n_layer = 0;
  GEIST_ASSIGN_OR_RETURN(n_layer, hp.get_int("block_count"));
  if (n_layer < 1 || n_layer > 1024) return GEIST_ERROR(GEIST_E_BAD_FORMAT, "gemma4: block_count %lld", (long long)n_layer);
  if (f.find("gemma4.expert_count")) {
    return GEIST_ERROR(GEIST_E_UNSUPPORTED, "gemma4: mixture-of-experts models (26B-A4B) are not supported");
  }
  GEIST_ASSIGN_OR_RETURN(n_embd_, hp.get_int("embedding_length"));
  GEIST_ASSIGN_OR_RETURN(info_.n_ctx_train, hp.get_int("context_length"));
  GEIST_ASSIGN_OR_RETURN(n_head_, hp.get_layer_int("attention.head_count", n_layer));
  GEIST_ASSIGN_OR_RETURN(n_head_kv_, hp.get_layer_int("attention.head_count_kv", n_layer));
  GEIST_ASSIGN_OR_RETURN(*n_ff, layer_ints(f, "gemma4.feed_forward_length", n_layer));
  GEIST_ASSIGN_OR_RETURN(hd_full_, hp.get_int("attention.key_length"));
  GEIST_ASSIGN_OR_RETURN(hd_swa_, hp.get_int("attention.key_length_swa"));
  int64_t vl = 0, vl_swa = 0, window = 0, rope_dim = 0, rope_dim_swa = 0;
  GEIST_ASSIGN_OR_RETURN(vl, hp.get_int_or("attention.value_length", hd_full_));
  GEIST_ASSIGN_OR_RETURN(vl_swa, hp.get_int_or("attention.value_length_swa", hd_swa_));
  GEIST_ASSIGN_OR_RETURN(window, hp.get_int("attention.sliding_window"));
  GEIST_ASSIGN_OR_RETURN(*n_shared, hp.get_int_or("attention.shared_kv_layers", 0));
  GEIST_ASSIGN_OR_RETURN(d_ple_, hp.get_int_or("embedding_length_per_layer_input", 0));
  GEIST_ASSIGN_OR_RETURN(rope_dim, hp.get_int_or("rope.dimension_count", hd_full_));
  GEIST_ASSIGN_OR_RETURN(rope_dim_swa, hp.get_int_or("rope.dimension_count_swa", hd_swa_));
  double eps = 0, base_full = 0, base_swa = 0, softcap = 0;
  GEIST_ASSIGN_OR_RETURN(eps, hp.get_positive_float("attention.layer_norm_rms_epsilon"));
  GEIST_ASSIGN_OR_RETURN(base_full, hp.get_positive_float_or("rope.freq_base", 1e6));
  GEIST_ASSIGN_OR_RETURN(base_swa, hp.get_positive_float_or("rope.freq_base_swa", 1e4));
  GEIST_ASSIGN_OR_RETURN(softcap, hp.get_nonneg_float_or("final_logit_softcapping", 0.0));
  GEIST_ASSIGN_OR_RETURN(*sliding, layer_bools(f, "gemma4.attention.sliding_window_pattern", n_layer));

  bool ok = n_embd_ >= 1 && n_head_ >= 1 && n_head_kv_ >= 1 && n_head_ % n_head_kv_ == 0 && hd_full_ >= 2 &&
            hd_full_ % 2 == 0 && hd_swa_ >= 2 && hd_swa_ % 2 == 0 && hd_full_ <= cpu::RopeTable::kMaxRotDim &&
            hd_swa_ <= cpu::RopeTable::kMaxRotDim && window >= 1 && window <= (1 << 30) && *n_shared >= 0 &&
            *n_shared < n_layer && d_ple_ >= 0 && eps > 0 && base_full > 0 && base_swa > 0 && softcap >= 0 &&
            info_.n_ctx_train >= 1;
  for (int64_t x : *n_ff) ok = ok && x >= 1;
  if (!ok) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT,
                       "gemma4: inconsistent hyperparameters (n_embd %lld, heads %lld/%lld, head dims %lld/%lld, "
                       "window %lld, shared_kv_layers %lld of %lld, per-layer input %lld)",
                       (long long)n_embd_, (long long)n_head_, (long long)n_head_kv_, (long long)hd_full_,
                       (long long)hd_swa_, (long long)window, (long long)*n_shared, (long long)n_layer,
                       (long long)d_ple_);
  }
  if (vl != hd_full_ || vl_swa != hd_swa_) {
    return GEIST_ERROR(GEIST_E_UNSUPPORTED, "gemma4: value_length %lld/%lld differs from key_length %lld/%lld",
                       (long long)vl, (long long)vl_swa, (long long)hd_full_, (long long)hd_swa_);
  }
  if (rope_dim != hd_full_ || rope_dim_swa != hd_swa_) {
    return GEIST_ERROR(GEIST_E_UNSUPPORTED,
                       "gemma4: rope.dimension_count %lld/%lld must equal the head dims %lld/%lld (partial "
                       "rotation is encoded in rope_freqs.weight)",
                       (long long)rope_dim, (long long)rope_dim_swa, (long long)hd_full_, (long long)hd_swa_);
  }
  window_ = int(window);
  eps_ = float(eps);
  softcap_ = float(softcap);
  rope_swa_.init(base_swa, int(hd_swa_), 1.0, nullptr);
  rope_base_full_ = base_full;  // the full table needs rope_freqs, bound in load()
  info_.n_layer = n_layer;
  return Status::ok();
}

Status Gemma4::load(const gguf::GgufFile &f, std::unique_ptr<Backend> backend) {
  backend_ = std::move(backend);
  std::vector<bool> sliding;
  std::vector<int64_t> n_ff;
  int64_t n_shared = 0;
  GEIST_RETURN_IF_ERROR(load_hparams(f, &sliding, &n_ff, &n_shared));
  const int64_t n_layer = info_.n_layer, d = n_embd_;
  n_owners_ = int(n_layer - n_shared);

  TensorBinder tb(f);
  GEIST_ASSIGN_OR_RETURN(token_embd_, tb.matrix("token_embd.weight", d, -1));
  info_.n_vocab = token_embd_.n_out;
  if (f.tensor("output.weight")) {
    GEIST_ASSIGN_OR_RETURN(output_, tb.matrix("output.weight", d, info_.n_vocab));
  } else {
    output_ = token_embd_;
  }
  GEIST_ASSIGN_OR_RETURN(output_norm_, tb.norm("output_norm.weight", d));
  if (d_ple_ > 0) {
    GEIST_ASSIGN_OR_RETURN(ple_embd_, tb.matrix("per_layer_token_embd.weight", n_layer * d_ple_, -1));
    GEIST_ASSIGN_OR_RETURN(ple_model_proj_, tb.matrix("per_layer_model_proj.weight", d, n_layer * d_ple_));
    GEIST_ASSIGN_OR_RETURN(ple_proj_norm_, tb.norm("per_layer_proj_norm.weight", d_ple_));
  }
  // Proportional RoPE of the full layers: global rope_freqs.weight (or llama.cpp's
  // per-layer copy on the first full layer); absent means full rotation.
  const float *ff = nullptr;
  for (int64_t il = -1; il < n_layer && !ff; ++il) {
    const std::string name = il < 0 ? "rope_freqs.weight" : "blk." + std::to_string(il) + ".rope_freqs.weight";
    if (f.tensor(name)) {
      GEIST_ASSIGN_OR_RETURN(ff, tb.vector(name, hd_full_ / 2));
    }
  }
  if (ff) {
    rope_ff_.assign(ff, ff + hd_full_ / 2);
    for (float x : rope_ff_) {
      if (!(x > 0)) return GEIST_ERROR(GEIST_E_BAD_FORMAT, "gemma4: rope_freqs.weight has a value <= 0 or NaN");
    }
  }
  rope_full_.init(rope_base_full_, int(hd_full_), 1.0, ff ? rope_ff_.data() : nullptr);

  // The per-layer record first (model-spec §4.2), then the tensors against it.
  layers_.resize(n_layer);
  for (int64_t il = 0; il < n_layer; ++il) {
    Layer &L = layers_[il];
    L.sliding = sliding[il];
    L.head_dim = L.sliding ? hd_swa_ : hd_full_;
    L.n_ff = n_ff[il];
    max_ff_ = std::max(max_ff_, L.n_ff);
    L.owns_kv = il < n_owners_;
    L.kv_src = int(il);
    if (!L.owns_kv) {  // the last owner of the same type
      L.kv_src = -1;
      for (int j = n_owners_ - 1; j >= 0 && L.kv_src < 0; --j) {
        if (sliding[j] == L.sliding) L.kv_src = j;
      }
      if (L.kv_src < 0) {
        return GEIST_ERROR(GEIST_E_BAD_FORMAT, "gemma4: KV-shared layer %lld (%s) has no owner layer of its type",
                           (long long)il, L.sliding ? "sliding" : "full");
      }
    }
  }
  for (int64_t il = 0; il < n_layer; ++il) {
    Layer &L = layers_[il];
    const std::string p = "blk." + std::to_string(il) + ".";
    const int64_t hd = L.head_dim, qd = n_head_ * hd, kvd = n_head_kv_ * hd;
    GEIST_ASSIGN_OR_RETURN(L.attn_norm, tb.norm(p + "attn_norm.weight", d));
    GEIST_ASSIGN_OR_RETURN(L.attn_q, tb.matrix(p + "attn_q.weight", d, qd));
    GEIST_ASSIGN_OR_RETURN(L.attn_q_norm, tb.norm(p + "attn_q_norm.weight", hd));
    if (L.owns_kv) {
      GEIST_ASSIGN_OR_RETURN(L.attn_k, tb.matrix(p + "attn_k.weight", d, kvd));
      if (!f.tensor(p + "attn_v.weight")) {
        return GEIST_ERROR(GEIST_E_UNSUPPORTED, "gemma4: layer %lld has no attn_v (K=V attention is not supported)",
                           (long long)il);
      }
      GEIST_ASSIGN_OR_RETURN(L.attn_v, tb.matrix(p + "attn_v.weight", d, kvd));
      GEIST_ASSIGN_OR_RETURN(L.attn_k_norm, tb.norm(p + "attn_k_norm.weight", hd));
    }
    GEIST_ASSIGN_OR_RETURN(L.attn_output, tb.matrix(p + "attn_output.weight", qd, d));
    GEIST_ASSIGN_OR_RETURN(L.post_attention_norm, tb.norm(p + "post_attention_norm.weight", d));
    GEIST_ASSIGN_OR_RETURN(L.ffn_norm, tb.norm(p + "ffn_norm.weight", d));
    GEIST_ASSIGN_OR_RETURN(L.ffn_gate, tb.matrix(p + "ffn_gate.weight", d, L.n_ff));
    GEIST_ASSIGN_OR_RETURN(L.ffn_up, tb.matrix(p + "ffn_up.weight", d, L.n_ff));
    GEIST_ASSIGN_OR_RETURN(L.ffn_down, tb.matrix(p + "ffn_down.weight", L.n_ff, d));
    GEIST_ASSIGN_OR_RETURN(L.post_ffw_norm, tb.norm(p + "post_ffw_norm.weight", d));
    if (d_ple_ > 0) {
      GEIST_ASSIGN_OR_RETURN(L.inp_gate, tb.matrix(p + "inp_gate.weight", d, d_ple_));
      GEIST_ASSIGN_OR_RETURN(L.proj, tb.matrix(p + "proj.weight", d_ple_, d));
      GEIST_ASSIGN_OR_RETURN(L.post_norm, tb.norm(p + "post_norm.weight", d));
    }
    if (f.tensor(p + "layer_output_scale.weight")) {
      const float *s = nullptr;
      GEIST_ASSIGN_OR_RETURN(s, tb.vector(p + "layer_output_scale.weight", 1));
      L.out_scale = s[0];
      if (!std::isfinite(L.out_scale)) {
        return GEIST_ERROR(GEIST_E_BAD_FORMAT, "gemma4: layer %lld output scale is not finite", (long long)il);
      }
    }
  }

  ModelWeights mw;
  mw.matrices.push_back(&output_);
  mw.tables.push_back(&token_embd_);
  mw.vectors.push_back(&output_norm_);
  if (d_ple_ > 0) {
    mw.matrices.push_back(&ple_model_proj_);
    mw.tables.push_back(&ple_embd_);
    mw.vectors.push_back(&ple_proj_norm_);
  }
  for (Layer &L : layers_) {
    for (WeightView *w : {&L.attn_q, &L.attn_k, &L.attn_v, &L.attn_output, &L.ffn_gate, &L.ffn_up, &L.ffn_down,
                          &L.inp_gate, &L.proj}) {
      if (w->data) mw.matrices.push_back(w);
    }
    for (WeightView *w : {&L.attn_norm, &L.attn_q_norm, &L.attn_k_norm, &L.post_attention_norm, &L.ffn_norm,
                          &L.post_ffw_norm, &L.post_norm}) {
      if (w->data) mw.vectors.push_back(w);
    }
  }
  GEIST_RETURN_IF_ERROR(backend_->prepare(mw, [&f](const void *p, size_t n) { f.release_pages(p, n); }));
  info_.packed_bytes = backend_->weight_bytes();
  info_.repack_seconds = backend_->prepare_seconds();
  info_.arch = "gemma4";
  info_.n_embd = d;
  info_.n_params = tb.total_elements();
  if (const gguf::Value *nm = f.find("general.name"); nm && nm->as_string()) info_.name = std::string(*nm->as_string());
  return Status::ok();
}

// Only owner layers have a cache; layer il reads slot kv_src (owners are layers 0..n_owners-1).
std::vector<KvLayerSpec> Gemma4::kv_layout() const {
  std::vector<KvLayerSpec> out;
  for (int il = 0; il < n_owners_; ++il) {
    const Layer &L = layers_[il];
    out.push_back({n_head_kv_ * L.head_dim, L.sliding ? window_ : 0, int(L.head_dim)});
  }
  return out;
}

void Gemma4::reserve(Exec &ex) const {
  const int64_t hd = std::max(hd_full_, hd_swa_), qd = n_head_ * hd, kvd = n_head_kv_ * hd;
  for (auto [slot, width] : {std::pair{kH, n_embd_}, {kX, n_embd_}, {kQ, qd}, {kK, kvd}, {kV, kvd}, {kAttn, qd},
                             {kO, n_embd_}, {kGate, max_ff_}, {kUp, max_ff_}, {kRopeF, hd_full_}, {kRopeS, hd_swa_}}) {
    ex.buffer(slot, width);
  }
  if (d_ple_ > 0) {
    const int64_t width = int64_t(layers_.size()) * d_ple_;
    ex.buffer(kPle, width);
    ex.buffer(kPleTmp, width);
    ex.buffer(kPleG, d_ple_);
  }
}

// z[r][l][:] = (rmsnorm(W_ple_proj e_r / sqrt(d))[l] + ple_embd[token_r][l] * sqrt(d_ple)) / sqrt(2)
void Gemma4::per_layer_inputs(Act e, int n, Exec &ex) const {
  const int64_t width = int64_t(layers_.size()) * d_ple_;
  const Act z = ex.buffer(kPle, width);
  const Act tok = ex.buffer(kPleTmp, width);
  ex.matmul(ple_model_proj_, e, z, n);
  ex.scale(z, 1.0f / std::sqrt(float(n_embd_)), int64_t(n) * width);
  ex.rmsnorm(z, &ple_proj_norm_, int64_t(n) * int64_t(layers_.size()), d_ple_, eps_, z);
  // Ids past the PLE vocabulary (soft tokens) have no row: zeros.
  ex.embed(ple_embd_, std::sqrt(float(d_ple_)), tok);
  ex.add_scale(z, tok, 0.70710678118654752f, int64_t(n) * width);  // (z + tok) * 2^-1/2
}

// x = attn_norm(h) on entry (the step or the layer before normalized it);
// h += post_norm(W_o attention(rope(norm(W_q x)), K, V)), x = ffn_norm(h); owners append
// K = rope(norm(W_k x)), V = rmsnorm(W_v x) (no weight) to their cache first.
void Gemma4::attention_block(const Layer &L, Act h, int n, Exec &ex, Act cs) const {
  const int64_t d = n_embd_, hd = L.head_dim, qd = n_head_ * hd, kvd = n_head_kv_ * hd;
  const Act x = ex.buffer(kX, d), q = ex.buffer(kQ, qd), k = ex.buffer(kK, kvd), v = ex.buffer(kV, kvd);
  const Act att = ex.buffer(kAttn, qd), o = ex.buffer(kO, d);

  if (L.owns_kv) {
    const WeightView *wv[] = {&L.attn_q, &L.attn_k, &L.attn_v};
    const Act ys[] = {q, k, v};
    ex.matmul(wv, 3, x, ys, n);
  } else {
    ex.matmul(L.attn_q, x, q, n);
  }
  const Exec::HeadNorm heads[] = {{q, &L.attn_q_norm, int(n_head_), true},
                                   {k, &L.attn_k_norm, int(n_head_kv_), true},
                                   {v, nullptr, int(n_head_kv_), false}};
  ex.head_norm_rope(heads, L.owns_kv ? 3 : 1, n, int(hd), eps_, cs);
  const int slot = L.kv_src;
  if (L.owns_kv) ex.kv_append(slot, k, v);
  ex.attention(slot, q, att, int(n_head_), int(hd), L.sliding ? window_ : 0, 1.0f);
  ex.matmul(L.attn_output, att, o, n);
  residual_norm(ex, o, L.post_attention_norm, h, 1.0f, &L.ffn_norm, x, n, eps_);
}

// x = ffn_norm(h) on entry; h += post_norm(W_down (gelu(W_gate x) * W_up x)) (then the
// per-layer input block, or the end of the layer without one).
void Gemma4::ffn_block(int il, Act h, int n, Exec &ex) const {
  const Layer &L = layers_[size_t(il)];
  const int64_t d = n_embd_, F = L.n_ff;
  const Act x = ex.buffer(kX, d), o = ex.buffer(kO, d);
  gelu_ffn(ex, x, n, L.ffn_gate, L.ffn_up, L.ffn_down, ex.buffer(kGate, F), ex.buffer(kUp, F), o);
  if (d_ple_ > 0) {
    ex.rmsnorm_add(o, &L.post_ffw_norm, n, d, eps_, h);
  } else {
    end_layer(il, o, L.post_ffw_norm, h, n, ex);
  }
}

void Gemma4::end_layer(int il, Act o, const WeightView &post, Act h, int n, Exec &ex) const {
  const WeightView *next = size_t(il) + 1 < layers_.size() ? &layers_[size_t(il) + 1].attn_norm : nullptr;
  residual_norm(ex, o, post, h, layers_[size_t(il)].out_scale, next, ex.buffer(kX, n_embd_), n, eps_);
}

// h += post_norm(W_proj (gelu(W_gate h) * z[l])), then the end of the layer.
void Gemma4::ple_block(int il, Act h, int n, Exec &ex) const {
  const Layer &L = layers_[size_t(il)];
  const Act z = ex.buffer(kPle, int64_t(layers_.size()) * d_ple_);
  const Act g = ex.buffer(kPleG, d_ple_);
  const Act zl = ex.buffer(kPleTmp, d_ple_);  // scratch for z[:, l] where the op is not fused
  const Act o = ex.buffer(kO, n_embd_);
  ex.matmul(L.inp_gate, h, g, n);
  ex.gelu_mul_cols(g, z, int64_t(il) * d_ple_, zl, n);
  ex.matmul(L.proj, g, o, n);
  end_layer(il, o, L.post_norm, h, n, ex);
}

Status Gemma4::forward(const int32_t *tokens, const StepSeq *seqs, int n_seqs, Exec &ex,
                       const LogitRows &out) const {
  int n = 0;
  GEIST_RETURN_IF_ERROR(check_forward_args(tokens, seqs, n_seqs, ex, n_owners_, info_.n_vocab, out, &n));
  const int64_t d = n_embd_;

  ex.begin_step(tokens, n, seqs, n_seqs);
  const Act cs_full = ex.rope_rows(kRopeF, rope_full_), cs_swa = ex.rope_rows(kRopeS, rope_swa_);
  const Act h = ex.buffer(kH, d);
  ex.embed(token_embd_, std::sqrt(float(d)), h);
  if (d_ple_ > 0) per_layer_inputs(h, n, ex);

  ex.rmsnorm(h, &layers_[0].attn_norm, n, d, eps_, ex.buffer(kX, d));

  for (size_t il = 0; il < layers_.size(); ++il) {
    const Layer &L = layers_[il];
    attention_block(L, h, n, ex, L.sliding ? cs_swa : cs_full);
    ffn_block(int(il), h, n, ex);
    if (d_ple_ > 0) ple_block(int(il), h, n, ex);
  }

  step_logits(ex, output_, output_norm_, h, n, seqs, n_seqs, eps_, softcap_, out, ex.buffer(kX, d), ex.buffer(kO, d));
  GEIST_RETURN_IF_ERROR(ex.end_step());
  advance_seqs(seqs, n_seqs);
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<ArchModel>> load_gemma4(const gguf::GgufFile &file, std::unique_ptr<Backend> backend) {
  auto m = std::make_unique<Gemma4>();
  GEIST_RETURN_IF_ERROR(m->load(file, std::move(backend)));
  return std::unique_ptr<ArchModel>(std::move(m));
}

}  // namespace geist::models
