// The attention family, with the semantics of the texts it comes from:
// d2l.ai 10.3 (masked softmax, DotProductAttention, AdditiveAttention), d2l.ai 10.5
// (MultiHeadAttention) and "Build a LLM from Scratch" ch. 3 (CausalAttention, the per-head
// MultiHeadAttentionWrapper and the fused CausalMultiHeadAttention), plus head gates, the surgery
// every multi-head module does on itself (pruning heads, splitting into and merging from per-head
// form), the one factory that maps an attention form to its module, and the causal forms' forward
// with hook points (nn/hooks.h) that decoders run (nn/decoder.h).
// attention.cpp holds d2l's modules and the head control; causal_attention.cpp the causal forms (the fused
// one in causal_attention_fused.cpp).
// B = batch, Q = queries, K = keys, T = tokens, H = heads, D = head size, C = d_in.
#pragma once
#include <string>
#include <tuple>
#include <vector>

#include "base/enum_names.h"
#include "nn/hooks.h"
#include "nn/layers.h"
#include "ops/ops.h"

namespace headlab::nn {

// d2l's masked_softmax is headlab::masked_softmax (ops/ops.h): valid_lens undefined, (B,) or (B, Q);
// a row with valid length 0 gives zero weights (d2l's -1e6 fill would give uniform ones).

// scores = Q K^T / sqrt(d), weights = masked_softmax(scores), out = dropout(weights) V.
// d2l plots attention_weights, so they are kept by default (the composite path); with
// keep_attention_weights off the fused scaled_dot_product_attention runs instead (no (B, Q, K)
// tensor is kept for backward) and attention_weights is left undefined. In training its dropout
// draws the same Philox mask the Dropout module would.
class DotProductAttention : public Module {
 public:
  explicit DotProductAttention(double dropout);
  std::string type_name() const override { return "DotProductAttention"; }
  // queries: (B, Q, d), keys: (B, K, d), values: (B, K, v) -> (B, Q, v)
  Tensor forward(const Tensor& queries, const Tensor& keys, const Tensor& values, const Tensor& valid_lens = Tensor());
  Tensor operator()(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& vl = Tensor()) {
    return forward(q, k, v, vl);
  }
  bool keep_attention_weights = true;
  Tensor attention_weights;  // (B, Q, K), detached, from the last forward (undefined when not kept)
  std::shared_ptr<Dropout> dropout;
};

// scores = w_v(tanh(W_q q + W_k k)), then as DotProductAttention.
class AdditiveAttention : public Module {
 public:
  AdditiveAttention(int64_t key_size, int64_t query_size, int64_t num_hiddens, double dropout);
  std::string type_name() const override { return "AdditiveAttention"; }
  // queries: (B, Q, query_size), keys: (B, K, key_size), values: (B, K, v) -> (B, Q, v)
  Tensor forward(const Tensor& queries, const Tensor& keys, const Tensor& values, const Tensor& valid_lens = Tensor());
  Tensor operator()(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& vl = Tensor()) {
    return forward(q, k, v, vl);
  }
  Tensor attention_weights;  // (B, Q, K)
  std::shared_ptr<Linear> W_k, W_q, w_v;
  std::shared_ptr<Dropout> dropout;
};

// Per-head control shared by the multi-head modules: each head's context c_h becomes
// gates[h] * c_h + offsets[h]. Gates default to ones (no-op); they may require grad, which makes
// dL/dgates the head-importance scores of Michel et al. (2019). offsets implement mean ablation
// (gate 0, offset = the head's mean context) and activation patching (gate 0, offset = the head's
// context from another run). Gates and offsets may differ per batch row (and position), so that
// one batched forward runs a different intervention in each copy of the data.
struct HeadControl {
  Tensor gates;               // (H), (B, H) or (B, H, T); undefined: all ones
  Tensor offsets;             // (H, D), (B, H, D) or (B, H, T, D); undefined: none
  bool keep_context = false;  // store each head's context (before gating) in `context`
  Tensor context;             // (B, H, T, D), detached
  // When defined, used as the heads' contexts instead of computing them from the input (whose shape
  // must still match): analysis replays a layer's output projection from stored contexts.
  Tensor given_context;  // (B, H, T, D)

  // The control of a module keeping only heads `keep` (its local indices): every defined tensor
  // indexed along its head dimension; gates stay leaves that require grad if they did.
  HeadControl select_heads(const std::vector<int64_t>& keep) const;
};

// A keep list of head indices is valid for a module of H heads: non-empty, sorted, distinct, in
// range. Errors read "<who>: <subject> has no head 4 (it has 4)", so callers name the module.
void check_head_selection(const std::vector<int64_t>& keep, int64_t H, const std::string& who,
                          const std::string& subject);

// What every multi-head module shows analysis and surgery, whatever its layout: its heads, their
// control and the projection that maps the concatenated head contexts back to the model's width.
class MultiHead {
 public:
  virtual ~MultiHead() = default;
  virtual int64_t head_count() const = 0;
  virtual int64_t head_size() const = 0;
  virtual HeadControl& control() = 0;
  // weight (out, H*D): head h owns columns [h*D, (h+1)*D). Null where the heads are only concatenated.
  virtual Linear* output_projection() const = 0;
  // A new module of the same kind with heads `keep` only (local indices, sorted): prune_heads, untyped.
  virtual std::shared_ptr<Module> keep_heads(const std::vector<int64_t>& keep) const = 0;
};

// d2l 10.5: W_q, W_k, W_v project to num_hiddens, split into num_heads heads of DotProductAttention;
// W_o maps num_hiddens to out_size (default num_hiddens; a pruned module keeps its model's width).
class MultiHeadAttention : public Module, public MultiHead {
 public:
  MultiHeadAttention(int64_t key_size, int64_t query_size, int64_t value_size, int64_t num_hiddens, int64_t num_heads,
                     double dropout, bool bias = false, int64_t out_size = -1);
  std::string type_name() const override { return "MultiHeadAttention"; }
  // What MultiHeadAttention(...) with these arguments holds, without building it.
  static double parameter_count(int64_t key_size, int64_t query_size, int64_t value_size, int64_t num_hiddens,
                                bool bias, int64_t out_size);
  int64_t head_count() const override { return num_heads; }
  int64_t head_size() const override { return num_hiddens / num_heads; }
  HeadControl& control() override { return heads; }
  Linear* output_projection() const override { return W_o.get(); }
  // A new module with heads `keep` only (their W_q/W_k/W_v rows, their W_o columns; W_o still maps to
  // the same width), in this one's dtype, device and mode, its head control cut to the kept heads.
  std::shared_ptr<MultiHeadAttention> prune_heads(const std::vector<int64_t>& keep) const;
  std::shared_ptr<Module> keep_heads(const std::vector<int64_t>& keep) const override { return prune_heads(keep); }
  // queries: (B, Q, query_size), keys: (B, K, key_size), values: (B, K, value_size),
  // valid_lens: (B,) or (B, Q) -> (B, Q, num_hiddens). gates: (num_heads), overrides heads.gates.
  Tensor forward(const Tensor& queries, const Tensor& keys, const Tensor& values, const Tensor& valid_lens = Tensor(),
                 const Tensor& gates = Tensor());
  Tensor operator()(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& vl = Tensor()) {
    return forward(q, k, v, vl);
  }
  int64_t num_heads, num_hiddens;
  // (B, num_heads, Q, K), per head, unaveraged; undefined when attention->keep_attention_weights is
  // off (then the heads run the fused scaled_dot_product_attention).
  Tensor attention_weights;
  HeadControl heads;
  std::shared_ptr<DotProductAttention> attention;
  std::shared_ptr<Linear> W_q, W_k, W_v, W_o;
};

// The forms of causal multi-head attention a GPT can be built with (same maths, other layouts):
// "fused", one CausalMultiHeadAttention; "wrapper", a MultiHeadAttentionWrapper of per-head
// CausalAttention modules plus out_proj. A new form is a CausalMultiHead subclass, a value here and
// one entry in attention.cpp's table of forms.
enum class AttentionForm { fused, wrapper };
constexpr auto enum_table(AttentionForm) {  // enum_name, parse_enum, enum_names (base/enum_names.h)
  return std::to_array<EnumName<AttentionForm>>({{AttentionForm::fused, "fused"}, {AttentionForm::wrapper, "wrapper"}});
}
std::string attention_forms_help();  // "fused (...) | wrapper (...)", for command lines

// Rotary position embeddings of a causal attention's queries and keys (ops' rotary_embedding).
struct Rotary {
  int64_t dims = 0;          // the rotated dims of each head (even, <= head_dim); 0: none
  double theta = 10000.0;    // the base of the frequencies (Hugging Face's rope_theta)
  bool interleaved = false;  // pairs (2i, 2i+1) (Meta's, llama2.c's layout); else halves (Hugging Face's)
  RopeScaling scaling;       // the frequencies rescaled for a longer context (Llama 3.1's llama3, linear)
  bool operator==(const Rotary&) const = default;
};

// RMSNorm over the queries and keys after their projections (attn.hook_q, hook_k) and before rotary: over each head's
// D dims with one weight (D) all heads share (Qwen3, Gemma 3), or over the whole projection (OLMo-2: H*D for the
// queries, Hkv*D for the keys), which mixes the heads and so has no per-head form.
enum class QkNorm { none, per_head, whole };
constexpr auto enum_table(QkNorm) {
  return std::to_array<EnumName<QkNorm>>(
      {{QkNorm::none, "none"}, {QkNorm::per_head, "per_head"}, {QkNorm::whole, "whole"}});
}

// The sizes of one causal multi-head attention: x (B, T, d_in) -> (B, T, d_out) through num_heads
// heads of head_dim (num_heads * head_dim need not be d_out: pruned models keep their width).
struct CausalAttentionSizes {
  int64_t d_in = 0, d_out = 0, context_length = 0, num_heads = 0, head_dim = 0;
  // Key/value heads: 0 or num_heads (multi-head), a divisor of num_heads (grouped-query: query head h reads
  // key/value head h / (num_heads / num_kv_heads)), 1 (multi-query).
  int64_t num_kv_heads = 0;
  double dropout = 0.0;
  bool qkv_bias = false;
  bool out_bias = true;  // out_proj's bias (the book's GPT: yes; LLaMA: no)
  Rotary rotary;
  QkNorm qk_norm = QkNorm::none;
  double qk_norm_eps = 1e-6;
  double qk_norm_offset = 0.0;  // the q/k norms' weight_offset (Gemma 3's (1 + weight): 1)
  int64_t window = 0;  // sliding-window attention: each query sees itself and the window - 1 keys before; 0: all
  double scale = 0.0;  // the scores' factor; 0: 1 / sqrt(head_dim) (GPT-Neo: 1, unscaled)
  double softcap = 0.0;  // the scaled scores soft-capped, softcap * tanh(s / softcap) (Gemma 2's); 0: none
  bool causal = true;    // false: every query sees every key (an encoder's), but padding (AttentionInput::valid_lens)
  int64_t kv_heads() const { return num_kv_heads ? num_kv_heads : num_heads; }
};

class MultiHeadAttentionWrapper;

// One layer's keys and values for incremental decoding (nn/generate.h): (B, Hkv, capacity, D), allocated on
// first use and doubled as positions come (capacity at most context_length); positions [start, length) fill
// slots [0, length - start). start is 0 but in a sliding-window layer, whose cache drops the positions no new
// query can see (all but the window's last w - 1) when the new ones would not fit: it holds about 2w, never the
// whole context.
struct KVCache {
  Tensor keys, values;
  int64_t length = 0;
  int64_t start = 0;
  // Positions the caller will need in all (a generation: prompt + new tokens), or 0: unknown. The first
  // allocation then holds that many (up to the context), so a generation neither doubles nor copies it.
  int64_t expected = 0;
};

// What a causal attention reads: the block's normalised stream, or per head (TransformerLens's split
// inputs: each head its own copy of the stream, which circuit analyses patch per receiver) for any of
// the queries, keys and values.
struct AttentionInput {
  Tensor x;        // (B, T, d_in); undefined only when q, k and v are all given
  Tensor q, k, v;  // (B, T, H, d_in) each (k and v: Hkv heads), or undefined: from x
  Tensor valid_lens;  // (B,) int64: the keys each row's queries see, padding after (bidirectional only); undefined: all
  bool split() const { return q.defined() || k.defined() || v.defined(); }
};

// One layer's attention per head, as TransformerLens exposes it (row vectors: x W_Q is a head's query).
struct HeadWeights {
  Tensor W_Q, W_K, W_V;  // (H, d_in, D)
  Tensor W_O;            // (H, D, d_out)
  Tensor b_Q, b_K, b_V;  // (H, D); undefined without a bias
  Tensor b_O;            // (d_out); undefined without a bias
};

// The common face of the causal multi-head forms, so models, analysis and surgery use any of them.
class CausalMultiHead : public UnaryModule, public MultiHead {
 public:
  Tensor forward(const Tensor& x) override { return forward(x, Tensor()); }
  virtual Tensor forward(const Tensor& x,
                         const Tensor& gates) = 0;  // gates as HeadControl's; overrides control().gates
  // The forward a decoder block runs: with the block's hook points (attn.hook_q, _k, _v, _pattern, _z,
  // _result; nothing computed for a point nobody wants), per-head inputs, and for incremental decoding a
  // key/value cache: `in` holds the tokens at positions [cache.length, cache.length + T) (a prompt, whole or
  // in chunks, then one token a step); their keys and values join the cache and each attends to every
  // cached position up to its own (no dropout, no hooks). The fused form's one forward; the
  // wrapper runs its own loop where none of this is asked, else the fused form's (supports_kv_cache
  // says whether it decodes with a cache; generation recomputes the window where not).
  virtual Tensor forward(const AttentionInput& in, const HookSite& site, KVCache* cache = nullptr) = 0;
  virtual bool supports_kv_cache() const { return false; }
  // Key/value heads: head_count(), or fewer under grouped-query attention (per-head key and value inputs
  // have this many heads, as TransformerLens's hook_k_input of such models).
  virtual int64_t kv_head_count() const { return head_count(); }
  virtual void keep_attention_weights(bool on) = 0;
  virtual Tensor last_attention_weights() const = 0;  // (B, H, T, T) when kept
  virtual AttentionForm form() const = 0;
  virtual HeadWeights head_weights() const = 0;  // detached; views of the weights where the layout allows
  // The same function as one module per head (a new module owning copies of the weights, in this
  // one's dtype, device and mode, with its head control). Every form converts through it.
  virtual std::shared_ptr<MultiHeadAttentionWrapper> split_heads() const = 0;
  // A new module of this form with heads `keep` only (local indices, sorted): split, keep the heads
  // (MultiHeadAttentionWrapper::select_heads), merge back. The output width does not change.
  std::shared_ptr<CausalMultiHead> prune_heads(const std::vector<int64_t>& keep) const;
  std::shared_ptr<Module> keep_heads(const std::vector<int64_t>& keep) const override { return prune_heads(keep); }
};

// The book's single causal head: x (B, T, d_in) -> (B, T, d_out). Without keep_attention_weights
// (the default) it runs the fused scaled_dot_product_attention, which keeps no (B, T, T) tensor.
// A LLaMA head also rotates its queries and keys by position (rotary), and under grouped-query attention
// shares its W_key and W_value modules with the other heads of its key/value group (the same Linear
// registered in each: named_parameters lists a shared parameter once, under its first head's name).
class CausalAttention : public UnaryModule {
 public:
  CausalAttention(int64_t d_in, int64_t d_out, int64_t context_length, double dropout, bool qkv_bias = false);
  // shared_key / shared_value: the group's modules (null: this head's own, new ones).
  CausalAttention(int64_t d_in, int64_t d_out, int64_t context_length, double dropout, bool qkv_bias,
                  const Rotary& rotary, std::shared_ptr<Linear> shared_key = nullptr,
                  std::shared_ptr<Linear> shared_value = nullptr);
  // What a wrapper's head takes beyond its sizes: its group's W_key / W_value (null: its own), the per-head q/k
  // norms (RMSNorm(d_out)) all the wrapper's heads share (null: none), and CausalAttentionSizes's window and scale.
  struct Shared {
    std::shared_ptr<Linear> key = nullptr, value = nullptr;
    std::shared_ptr<RMSNorm> q_norm = nullptr, k_norm = nullptr;
    int64_t window = 0;
    double scale = 0.0, softcap = 0.0;
    bool causal = true;
  };
  CausalAttention(int64_t d_in, int64_t d_out, int64_t context_length, double dropout, bool qkv_bias,
                  const Rotary& rotary, const Shared& shared);
  std::string type_name() const override { return "CausalAttention"; }
  static double parameter_count(int64_t d_in, int64_t d_out, bool qkv_bias);
  Tensor forward(const Tensor& x) override;
  int64_t d_in, d_out, context_length;
  Rotary rotary;
  int64_t window = 0;
  double scale;    // the scores' factor
  double softcap;  // as CausalAttentionSizes's
  bool causal;     // as CausalAttentionSizes's
  bool keep_attention_weights = false;
  Tensor attention_weights;  // (B, T, T) when kept
  std::shared_ptr<Linear> W_query, W_key, W_value;
  std::shared_ptr<RMSNorm> q_norm, k_norm;  // null without q/k norms
  std::shared_ptr<Dropout> dropout;
};

// num_heads CausalAttention heads run one after another and concatenated: (B, T, num_heads * d_out),
// then out_proj (num_heads*d_out -> num_heads*d_out) when asked. Under grouped-query attention head h
// shares W_key and W_value with its group's first head, h - h % (num_heads / num_kv_heads).
class MultiHeadAttentionWrapper : public CausalMultiHead {
 public:
  // out_dim: out_proj's output width (default num_heads * d_out; pruned GPT layers keep emb_dim).
  MultiHeadAttentionWrapper(int64_t d_in, int64_t d_out, int64_t context_length, double dropout, int64_t num_heads,
                            bool qkv_bias = false, bool out_proj = false, int64_t out_dim = -1);
  // Every option (key/value heads, rotary, out_proj's bias); heads of s.head_dim, out_proj to s.d_out when asked.
  explicit MultiHeadAttentionWrapper(const CausalAttentionSizes& s, bool out_proj = true);
  std::string type_name() const override { return "MultiHeadAttentionWrapper"; }
  // The table of forms' entry points: built from sizes (with out_proj to sizes.d_out), its
  // parameter count, and built from per-head form (a copy).
  static std::shared_ptr<MultiHeadAttentionWrapper> create(const CausalAttentionSizes& s);
  static double parameter_count(const CausalAttentionSizes& s);
  static std::shared_ptr<MultiHeadAttentionWrapper> merge_heads(const MultiHeadAttentionWrapper& w);
  using CausalMultiHead::forward;
  Tensor forward(const Tensor& x, const Tensor& gates) override;  // the heads one after another
  Tensor forward(const AttentionInput& in, const HookSite& site, KVCache* cache = nullptr) override;
  int64_t head_count() const override { return num_heads; }
  int64_t head_size() const override { return d_out; }
  int64_t kv_head_count() const override { return num_kv_heads; }
  HeadWeights head_weights() const override;  // stacked from the heads (copies; W_K, W_V repeated per group)
  HeadControl& control() override { return head_control; }
  Linear* output_projection() const override { return out_proj.get(); }
  void keep_attention_weights(bool on) override;
  Tensor last_attention_weights() const override;  // stacked from the heads
  AttentionForm form() const override { return AttentionForm::wrapper; }
  std::shared_ptr<MultiHeadAttentionWrapper> split_heads() const override;  // a copy
  // A new wrapper of heads `keep` (renumbered 0..), out_proj reading only their columns: the one
  // implementation of head pruning for the causal forms. Under grouped-query attention only whole
  // key/value groups (a clear error otherwise), whose W_key/W_value go with them.
  std::shared_ptr<MultiHeadAttentionWrapper> select_heads(const std::vector<int64_t>& keep) const;
  // What this module is built from (d_out: out_proj's width, or num_heads * d_out without one).
  CausalAttentionSizes sizes() const;
  int64_t group_size() const { return num_kv_heads ? num_heads / num_kv_heads : 1; }
  int64_t d_in, d_out, context_length, num_heads;
  int64_t num_kv_heads;  // == num_heads unless grouped-query
  double dropout_p;
  bool qkv_bias;
  Rotary rotary;
  QkNorm qk_norm;  // none or per_head (a norm over the whole projection mixes the heads: refused)
  double qk_norm_eps, qk_norm_offset;
  int64_t window;
  double scale;    // as CausalAttentionSizes's (0: 1 / sqrt(head size))
  double softcap;  // as CausalAttentionSizes's
  bool causal;     // as CausalAttentionSizes's
  HeadControl head_control;
  std::shared_ptr<ModuleList> heads;
  std::shared_ptr<Linear> out_proj;  // null unless out_proj

 private:
  std::vector<int64_t> all_heads() const;
};

// The book's fused MultiHeadAttention: one W_query/W_key/W_value (d_in -> H*D), split into heads by
// view + transpose, causal softmax over scores / sqrt(D), dropout, out_proj (H*D -> d_out).
// head_dim defaults to d_out / num_heads (d_out must divide); pruned models pass it explicitly.
// Unless keep_attention_weights(true) (analysis), scores, softmax, dropout and @ V run as one fused
// scaled_dot_product_attention; its dropout mask is the one Dropout would draw on the weights.
// With sizes' num_kv_heads, W_key and W_value have num_kv_heads * head_dim rows (grouped-query attention: the
// fused kernel reads the shared keys and values in place, the cache holds num_kv_heads heads); with rotary,
// queries and keys rotate by position (attn.hook_rot_q, hook_rot_k) after attn.hook_q and hook_k.
class CausalMultiHeadAttention : public CausalMultiHead {
 public:
  CausalMultiHeadAttention(int64_t d_in, int64_t d_out, int64_t context_length, double dropout, int64_t num_heads,
                           bool qkv_bias = false, int64_t head_dim = -1);
  explicit CausalMultiHeadAttention(const CausalAttentionSizes& s);
  // The book calls this class MultiHeadAttention too; printing the C++ name keeps it apart from d2l's.
  std::string type_name() const override { return "CausalMultiHeadAttention"; }
  // The table of forms' entry points: built from sizes, its parameter count, and built from per-head
  // form (the heads' W_query/W_key/W_value rows stacked; a wrapper without out_proj gets an identity).
  static std::shared_ptr<CausalMultiHeadAttention> create(const CausalAttentionSizes& s);
  static double parameter_count(const CausalAttentionSizes& s);
  static std::shared_ptr<CausalMultiHeadAttention> merge_heads(const MultiHeadAttentionWrapper& w);
  using CausalMultiHead::forward;
  Tensor forward(const Tensor& x, const Tensor& gates) override;
  Tensor forward(const AttentionInput& in, const HookSite& site, KVCache* cache = nullptr) override;
  int64_t head_count() const override { return num_heads; }
  int64_t head_size() const override { return head_dim; }
  int64_t kv_head_count() const override { return num_kv_heads; }
  HeadWeights head_weights() const override;  // views of W_query, W_key, W_value, out_proj
  HeadControl& control() override { return head_control; }
  Linear* output_projection() const override { return out_proj.get(); }
  void keep_attention_weights(bool on) override { keep_weights = on; }
  Tensor last_attention_weights() const override { return attention_weights; }
  AttentionForm form() const override { return AttentionForm::fused; }
  // head h: rows [h*D, (h+1)*D) of W_query; group g's rows [g*D, (g+1)*D) of W_key and W_value, shared by its heads.
  std::shared_ptr<MultiHeadAttentionWrapper> split_heads() const override;
  bool supports_kv_cache() const override { return causal; }
  int64_t d_in, d_out, context_length, num_heads, head_dim;
  int64_t num_kv_heads;  // == num_heads unless grouped-query
  double dropout_p;
  bool qkv_bias;
  Rotary rotary;
  QkNorm qk_norm;
  double qk_norm_eps, qk_norm_offset;
  int64_t window;  // sliding-window attention (CausalAttentionSizes::window); 0: none
  double scale;    // as CausalAttentionSizes's (0: 1 / sqrt(head size))
  double softcap;  // as CausalAttentionSizes's
  bool causal;     // as CausalAttentionSizes's
  bool keep_weights = false;
  Tensor attention_weights;  // (B, H, T, T) when kept
  HeadControl head_control;
  std::shared_ptr<Linear> W_query, W_key, W_value, out_proj;
  std::shared_ptr<RMSNorm> q_norm, k_norm;  // null without q/k norms: RMSNorm(D), or (H*D) and (Hkv*D) when whole
  std::shared_ptr<Dropout> dropout;

 private:
  Tensor run(const AttentionInput& in, const Tensor& gates, const HookSite& site, KVCache* cache);
};

// The module of a form: where GPTModel's blocks (and anything else) turn a form into a module.
std::shared_ptr<CausalMultiHead> make_causal_attention(AttentionForm form, const CausalAttentionSizes& s);
// make_causal_attention(form, s)->num_parameters(), without building it (a double: sizes someone
// mistyped may not fit an int64).
double causal_attention_parameters(AttentionForm form, const CausalAttentionSizes& s);
// The module of a form built from per-head form; and any module in another form (split, then merge).
std::shared_ptr<CausalMultiHead> merge_heads(const MultiHeadAttentionWrapper& w, AttentionForm form);
std::shared_ptr<CausalMultiHead> convert_attention(const CausalMultiHead& m, AttentionForm form);

// The two conversions by their familiar names: CausalMultiHeadAttention::merge_heads(w) and f.split_heads().
std::shared_ptr<CausalMultiHeadAttention> wrapper_to_fused(const MultiHeadAttentionWrapper& w);
std::shared_ptr<MultiHeadAttentionWrapper> fused_to_wrapper(const CausalMultiHeadAttention& f);

}  // namespace headlab::nn
