// A GGUF file in headlab's terms (see gguf.h): the metadata of each architecture headlab reads as its family's
// config (every key it cannot honour refused by name), llama.cpp's tensor names as headlab's parameters,
// tokenizer.ggml.* as a tokenizer, and the source registered in io/sources.cpp.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <sstream>

#include "base/error.h"
#include "io/gguf.h"
#include "io/gguf_quants.h"
#include "nn/decoder_family.h"
#include "ops/ops.h"
#include "tasks/bpe_tokenizer.h"
#include "tasks/llama2c_tokenizer.h"

namespace headlab::io {

namespace {

using nlohmann::json;
using T = GgufValueType;

std::string in_quotes(const std::string& s) { return "'" + s + "'"; }

// The metadata a config reads, with errors naming the file and the key; every key asked for is remembered, so that
// refuse_unknown_keys can refuse the rest.
class Meta {
 public:
  Meta(const GgufFile& f, std::string arch) : f_(f), arch_(std::move(arch)) {}
  const std::string& arch() const { return arch_; }
  bool has(const std::string& key) const { return f_.find(key) != nullptr; }
  bool asked(const std::string& key) const { return asked_.count(key) > 0; }
  // An integer key (any integer type) in [lo, hi]; `fallback` where absent, or required where it is -1.
  int64_t integer(const std::string& key, int64_t lo, int64_t hi, int64_t fallback = -1) const {
    const GgufValue* v = find(key);
    HL_CHECK(v || fallback >= 0, f_.path(), ": metadata ", in_quotes(key), " is missing (a ", arch_,
             " model needs it)");
    if (!v) return fallback;
    HL_CHECK(v->value.is_number_integer(), f_.path(), ": metadata ", in_quotes(key), " is a ", type_of(*v),
             " (expected an integer)");
    const bool fits = v->value.is_number_unsigned() ? v->value.get<uint64_t>() <= static_cast<uint64_t>(hi)
                                                    : v->value.get<int64_t>() <= hi;
    const int64_t n = fits ? v->value.get<int64_t>() : hi + 1;
    HL_CHECK(fits && n >= lo, f_.path(), ": metadata ", in_quotes(key), " = ", v->value.dump(), " (expected ", lo,
             " to ", hi, ")");
    return n;
  }
  // A number; a FLOAT32 as the shortest decimal that gives the same float (9.999999747e-06 -> 1e-05).
  double real(const std::string& key, double fallback) const {
    const GgufValue* v = find(key);
    if (!v) return fallback;
    HL_CHECK(v->value.is_number(), f_.path(), ": metadata ", in_quotes(key), " is a ", type_of(*v),
             " (expected a number)");
    const double d = v->value.get<double>();
    if (v->type != static_cast<uint32_t>(T::float32)) return d;
    char text[32];
    const auto end = std::to_chars(text, text + sizeof(text), static_cast<float>(d)).ptr;
    return std::strtod(std::string(text, end).c_str(), nullptr);
  }
  bool flag(const std::string& key, bool fallback) const {
    const GgufValue* v = find(key);
    if (!v) return fallback;
    HL_CHECK(v->value.is_boolean(), f_.path(), ": metadata ", in_quotes(key), " is a ", type_of(*v),
             " (expected a BOOL)");
    return v->value.get<bool>();
  }
  std::string text(const std::string& key, const std::string& fallback) const {
    const GgufValue* v = find(key);
    if (!v) return fallback;
    HL_CHECK(v->value.is_string(), f_.path(), ": metadata ", in_quotes(key), " is a ", type_of(*v),
             " (expected a STRING)");
    return v->value.get<std::string>();
  }
  // An ARRAY of `element` values, or null where absent.
  const json* array(const std::string& key, T element) const {
    const GgufValue* v = find(key);
    if (!v) return nullptr;
    HL_CHECK(v->type == static_cast<uint32_t>(T::array) && v->element_type == static_cast<uint32_t>(element),
             f_.path(), ": metadata ", in_quotes(key), " is a ", type_of(*v), " (expected an ARRAY of ",
             gguf_type_name(static_cast<uint32_t>(element)), ")");
    return &v->value;
  }
  std::string key(const std::string& name) const { return arch_ + "." + name; }

 private:
  static std::string type_of(const GgufValue& v) {
    return v.type == static_cast<uint32_t>(T::array) ? "ARRAY of " + gguf_type_name(v.element_type)
                                                     : gguf_type_name(v.type);
  }
  const GgufValue* find(const std::string& key) const {
    asked_.insert(key);
    return f_.find(key);
  }
  const GgufFile& f_;
  std::string arch_;
  mutable std::set<std::string> asked_;
};

// The keys under "<arch>." that the config did not read are refused by name (rope scalings other than linear,
// experts, parts headlab's decoder does not have), except those that change nothing: tensor_data_layout, a
// rope.scaling.type of "none", expert counts of 0, and Phi-3's original context length without its longrope factors.
void refuse_unknown_keys(const GgufFile& f, const Meta& m) {
  const std::string prefix = m.arch() + ".";
  for (const auto& [key, v] : f.metadata()) {
    if (!key.starts_with(prefix) || m.asked(key)) continue;
    const std::string name = key.substr(prefix.size());
    const bool harmless = name == "tensor_data_layout" || (name == "rope.scaling.type" && v.value == "none") ||
                          ((name == "expert_count" || name == "expert_used_count") && v.value == 0) ||
                          (m.arch() == "phi3" && name == "rope.scaling.original_context_length");
    HL_CHECK(harmless, f.path(), ": metadata ", in_quotes(key), " = ",
             v.type == static_cast<uint32_t>(T::array) ? std::string("[...]")
                                                       : v.value.dump(-1, ' ', false, json::error_handler_t::replace),
             " is not supported (headlab's ", m.arch(), " model has no such part)");
  }
}

int64_t rows_of(const GgufFile& f, const std::string& name) {
  const GgufTensorInfo* t = f.tensor(name);
  return t ? static_cast<int64_t>(t->ne.back()) : 0;
}

// The vocabulary: tokenizer.ggml.tokens' count, or <arch>.vocab_size, or token_embd's rows.
int64_t vocab_of(const GgufFile& f, const Meta& m) {
  if (m.has(m.key("vocab_size"))) return m.integer(m.key("vocab_size"), 1, 1 << 28);
  if (const GgufValue* t = f.find("tokenizer.ggml.tokens"); t && t->value.is_array() && !t->value.empty())
    return static_cast<int64_t>(t->value.size());
  const int64_t rows = rows_of(f, "token_embd.weight");
  HL_CHECK(rows > 0, f.path(), ": no vocabulary size (no tokenizer.ggml.tokens, ", m.key("vocab_size"),
           " or token_embd.weight)");
  return rows;
}

// The sizes every architecture has.
void read_sizes(const GgufFile& f, const Meta& m, nn::DecoderConfig& c) {
  c.n_layers = m.integer(m.key("block_count"), 1, 10000);
  c.emb_dim = m.integer(m.key("embedding_length"), 1, 1 << 20);
  c.n_heads = m.integer(m.key("attention.head_count"), 1, 100000);
  c.context_length = m.integer(m.key("context_length"), 1, 1 << 24);
  c.hidden_dim = m.integer(m.key("feed_forward_length"), 1, 1 << 22);
  c.vocab_size = vocab_of(f, m);
}

// The head size: attention.key_length where given (== value_length), else emb / heads; 0 in the config where it is
// the natural one.
void read_head_dim(const GgufFile& f, const Meta& m, nn::DecoderConfig& c) {
  const int64_t natural = c.emb_dim % c.n_heads == 0 ? c.emb_dim / c.n_heads : 0;
  const int64_t key = m.integer(m.key("attention.key_length"), 2, 1 << 16, natural);
  const int64_t value = m.integer(m.key("attention.value_length"), 2, 1 << 16, key);
  HL_CHECK(key > 0, f.path(), ": ", m.key("embedding_length"), " ", c.emb_dim, " is not divisible by ",
           m.key("attention.head_count"), " ", c.n_heads, " and ", m.key("attention.key_length"), " is not given");
  HL_CHECK(key == value, f.path(), ": ", m.key("attention.key_length"), " ", key, " differs from ",
           m.key("attention.value_length"), " ", value, " (headlab's heads have one size)");
  c.head_dim = key == natural ? 0 : key;
}

// The llama-layout architectures and the family each is read as.
const nn::DecoderFamily* llama_layout_family(const std::string& arch) {
  static const std::map<std::string, const nn::DecoderFamily& (*)()> families = {
      {"llama", nn::llama_family},   {"qwen2", nn::llama_family},  {"phi3", nn::llama_family},
      {"qwen3", nn::qwen3_family},   {"olmo2", nn::olmo2_family},  {"gemma", nn::gemma_family},
      {"gemma2", nn::gemma2_family}, {"gemma3", nn::gemma3_family}};
  const auto it = families.find(arch);
  return it == families.end() ? nullptr : &it->second();
}

// The sliding windows of Gemma 2 (every layer il with il % 2 == 0) and Gemma 3 (il % 6 < 5), as llama.cpp's loader
// fixes them (a newer file may say attention.sliding_window_pattern), and Phi-3's on every layer (llama.cpp disables
// it; transformers, and so headlab's reading of the same model's folder, keep it). A window no shorter than the context
// changes nothing and is dropped.
void read_windows(const Meta& m, nn::DecoderConfig& c) {
  const std::string& arch = m.arch();
  if (arch != "gemma2" && arch != "gemma3" && arch != "phi3") return;
  const int64_t window = m.integer(m.key("attention.sliding_window"), 0, int64_t{1} << 40, arch == "gemma2" ? 4096 : 0);
  if (window == 0 || window >= c.context_length) return;
  c.sliding_window = window;
  if (arch == "phi3") return;
  const int64_t pattern = m.integer(m.key("attention.sliding_window_pattern"), 1, 10000, arch == "gemma2" ? 2 : 6);
  for (int64_t l = 0; l < c.n_layers; ++l)
    if (l % pattern < pattern - 1) c.window_layers.push_back(l);
  if (c.window_layers.empty()) c.sliding_window = 0;  // a pattern of 1: every layer global
}

nn::DecoderConfig llama_config(const GgufFile& f, const Meta& m) {
  const std::string& arch = m.arch();
  nn::DecoderConfig c = llama_layout_family(arch)->config();
  read_sizes(f, m, c);
  c.n_kv_heads = m.integer(m.key("attention.head_count_kv"), 1, 100000, c.n_heads);
  HL_CHECK(c.n_heads % c.n_kv_heads == 0, f.path(), ": ", m.key("attention.head_count_kv"), " ", c.n_kv_heads,
           " does not divide ", m.key("attention.head_count"), " ", c.n_heads);
  read_head_dim(f, m, c);
  const int64_t rotary = m.integer(m.key("rope.dimension_count"), 0, 1 << 16, c.head_size());
  HL_CHECK(rotary == c.head_size(), f.path(), ": ", m.key("rope.dimension_count"), " ", rotary, " of head size ",
           c.head_size(), ": the llama family rotates every dim of each head");
  c.norm_eps = m.real(m.key("attention.layer_norm_rms_epsilon"), 1e-5);
  c.rope_theta = m.real(m.key("rope.freq_base"), 10000.0);
  const std::string scaling = m.text(m.key("rope.scaling.type"), "none");
  HL_CHECK(scaling == "none" || scaling == "linear", f.path(), ": metadata ", in_quotes(m.key("rope.scaling.type")),
           " = \"", scaling, "\" is not supported (none or linear; Llama 3's factors come as rope_freqs.weight)");
  if (scaling == "linear") {
    c.rope_scaling = RopeScalingKind::linear;
    c.rope_factor = m.real(m.key("rope.scaling.factor"), 0.0);
    HL_CHECK(c.rope_factor > 0 && std::isfinite(c.rope_factor), f.path(), ": metadata ",
             in_quotes(m.key("rope.scaling.factor")), " must be positive with rope.scaling.type linear, got ",
             c.rope_factor);
  }
  // llama.cpp rotates a llama's adjacent pairs (its converter permutes Hugging Face's halves back to Meta's
  // layout); every other architecture's halves (NEOX mode), unpermuted.
  c.rope_interleaved = arch == "llama";
  c.qkv_bias = arch == "qwen2";
  if (arch == "gemma2" || arch == "gemma3") {
    // llama.cpp's loader: 1 / sqrt(width / heads) for the 27B models (46 and 62 layers: query_pre_attn_scalar 144,
    // 168), 1 / sqrt(head size) for the others, as their config.json's query_pre_attn_scalar says
    const bool large = c.n_layers == (arch == "gemma2" ? 46 : 62) && c.emb_dim % c.n_heads == 0;
    c.attn_scale = 1.0 / std::sqrt(static_cast<double>(large ? c.emb_dim / c.n_heads : c.head_size()));
    c.attn_softcap = arch == "gemma2" ? m.real(m.key("attn_logit_softcapping"), 50.0) : 0.0;
    c.logit_softcap = m.real(m.key("final_logit_softcapping"), arch == "gemma2" ? 30.0 : 0.0);
    const auto finite = [](double v) { return v >= 0 && std::isfinite(v); };
    HL_CHECK(finite(c.attn_softcap) && finite(c.logit_softcap), f.path(), ": ", arch,
             "'s soft-caps must be finite and >= 0, got ", c.attn_softcap, " and ", c.logit_softcap);
  }
  if (arch == "gemma3") {
    c.rope_local_theta = m.real(m.key("rope.freq_base_swa"), 10000.0);  // llama.cpp's fixed base where absent
    HL_CHECK(c.rope_local_theta > 1 && std::isfinite(c.rope_local_theta), f.path(), ": metadata ",
             in_quotes(m.key("rope.freq_base_swa")), " must be finite and above 1, got ", c.rope_local_theta);
  }
  read_windows(m, c);
  return c;
}

nn::DecoderConfig gpt2_config(const GgufFile& f, const Meta& m) {
  nn::DecoderConfig c = nn::gpt_family().config();
  read_sizes(f, m, c);
  HL_CHECK(c.hidden_dim == 4 * c.emb_dim, f.path(), ": ", m.key("feed_forward_length"), " ", c.hidden_dim,
           " is not 4 x ", m.key("embedding_length"), " (", 4 * c.emb_dim, "), which GPTModel's FeedForward has");
  c.hidden_dim = 0;  // GPT's section has no hidden_dim: 4 x the width
  HL_CHECK(c.emb_dim % c.n_heads == 0, f.path(), ": ", m.key("embedding_length"), " ", c.emb_dim,
           " is not divisible by ", m.key("attention.head_count"), " ", c.n_heads);
  const double eps = m.real(m.key("attention.layer_norm_epsilon"), 1e-5);
  HL_CHECK(std::abs(eps - 1e-5) <= 1e-12, f.path(), ": ", m.key("attention.layer_norm_epsilon"), " ", eps,
           " is not supported (GPTModel's LayerNorm uses 1e-5)");
  c.qkv_bias = true;
  c.drop_rate = 0.0;
  return c;
}

nn::DecoderConfig neox_config(const GgufFile& f, const Meta& m) {
  nn::DecoderConfig c = nn::neox_family().config();
  read_sizes(f, m, c);
  HL_CHECK(c.emb_dim % c.n_heads == 0, f.path(), ": ", m.key("embedding_length"), " ", c.emb_dim,
           " is not divisible by ", m.key("attention.head_count"), " ", c.n_heads);
  c.rotary_dims = m.integer(m.key("rope.dimension_count"), 0, c.head_size());
  HL_CHECK(c.rotary_dims % 2 == 0, f.path(), ": ", m.key("rope.dimension_count"), " ", c.rotary_dims,
           " is odd (rotary turns pairs)");
  c.rope_theta = m.real(m.key("rope.freq_base"), 10000.0);
  c.norm_eps = m.real(m.key("attention.layer_norm_epsilon"), 1e-5);
  c.parallel_residual = m.flag(m.key("use_parallel_residual"), true);
  c.qkv_bias = f.tensor("blk.0.attn_qkv.bias") != nullptr;
  return c;
}

// ---------------------------------------------------------------------------------------------
// llama.cpp's tensor names -> headlab's parameters

struct Entry {
  std::string gguf;               // "blk.0.attn_qkv.weight"
  std::vector<std::string> ours;  // headlab's parameters it holds, in order
  Shape shape;                    // PyTorch's (ne reversed)
  std::vector<int64_t> rows;      // fused: each parameter's rows along dim 0 (q | k | v blocks)
};

// The table of a config's parameters: llama.cpp's names for every family (llama.cpp's converter maps GPT-2's and
// GPT-NeoX's names onto the llama's: attn_norm, ffn_up, output_norm, ...).
std::vector<Entry> weight_table(const nn::DecoderConfig& c, const std::string& arch) {
  const int64_t C = c.emb_dim, F = c.mlp_width(), V = c.vocab_size, Dq = c.n_heads * c.head_size(),
                Dkv = c.kv_heads() * c.head_size();
  const bool separate_qkv = llama_layout_family(arch) != nullptr && arch != "phi3";  // else attn_qkv, q | k | v
  const bool book_norm = c.book_norm_names && c.norm == nn::NormKind::layer_norm;  // RMSNorm's is .weight
  std::vector<Entry> t;
  const auto add = [&](std::string gguf, std::vector<std::string> ours, Shape shape, std::vector<int64_t> rows = {}) {
    t.push_back({std::move(gguf), std::move(ours), std::move(shape), std::move(rows)});
  };
  const auto norm = [&](const std::string& gguf, const std::string& ours) {
    add(gguf + ".weight", {ours + (book_norm ? ".scale" : ".weight")}, {C});
    if (c.norm == nn::NormKind::layer_norm) add(gguf + ".bias", {ours + (book_norm ? ".shift" : ".bias")}, {C});
  };
  const auto linear = [&](const std::string& gguf, const std::string& ours, Shape shape, bool bias) {
    add(gguf + ".weight", {ours + ".weight"}, shape);
    if (bias) add(gguf + ".bias", {ours + ".bias"}, {shape[0]});
  };
  add("token_embd.weight", {"tok_emb.weight"}, {V, C});
  if (c.learned_positions) add("position_embd.weight", {"pos_emb.weight"}, {c.context_length, C});
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string g = "blk." + std::to_string(l) + ".", o = "trf_blocks." + std::to_string(l) + ".";
    if (c.pre_norms) norm(g + "attn_norm", o + "norm1");
    if (separate_qkv) {
      linear(g + "attn_q", o + "att.W_query", {Dq, C}, c.qkv_bias);
      linear(g + "attn_k", o + "att.W_key", {Dkv, C}, c.qkv_bias);
      linear(g + "attn_v", o + "att.W_value", {Dkv, C}, c.qkv_bias);
      if (c.qk_norm != nn::QkNorm::none) {  // per head (Qwen3, Gemma 3), or over the whole projections (OLMo-2)
        const bool whole = c.qk_norm == nn::QkNorm::whole;
        add(g + "attn_q_norm.weight", {o + "att.q_norm.weight"}, {whole ? Dq : c.head_size()});
        add(g + "attn_k_norm.weight", {o + "att.k_norm.weight"}, {whole ? Dkv : c.head_size()});
      }
    } else {  // phi3's, gpt2's and gptneox's fused attn_qkv: q | k | v (llama.cpp's converter regroups NeoX's heads)
      const auto qkv = [&](const char* kind) {
        return std::vector<std::string>{o + "att.W_query." + kind, o + "att.W_key." + kind, o + "att.W_value." + kind};
      };
      add(g + "attn_qkv.weight", qkv("weight"), {Dq + 2 * Dkv, C}, {Dq, Dkv, Dkv});
      if (c.qkv_bias) add(g + "attn_qkv.bias", qkv("bias"), {Dq + 2 * Dkv}, {Dq, Dkv, Dkv});
    }
    linear(g + "attn_output", o + "att.out_proj", {C, Dq}, c.has_out_bias());
    if (c.post_norms) norm(g + "post_attention_norm", o + "norm1_post");
    if (c.pre_norms) norm(g + "ffn_norm", o + "norm2");  // Gemma 2's and 3's pre_feedforward_layernorm too
    if (c.gated_mlp() && arch == "phi3") {               // gate | up in one ffn_up, as gate_up_proj
      add(g + "ffn_up.weight", {o + "ff.fc1.weight", o + "ff.fc2.weight"}, {2 * F, C}, {F, F});
      linear(g + "ffn_down", o + "ff.fc3", {C, F}, false);
    } else if (c.gated_mlp()) {  // gate, up, down
      linear(g + "ffn_gate", o + "ff.fc1", {F, C}, false);
      linear(g + "ffn_up", o + "ff.fc2", {F, C}, false);
      linear(g + "ffn_down", o + "ff.fc3", {C, F}, false);
    } else {
      linear(g + "ffn_up", o + "ff.layers.0", {F, C}, true);
      linear(g + "ffn_down", o + "ff.layers.2", {C, F}, true);
    }
    if (c.post_norms) norm(g + "post_ffw_norm", o + "norm2_post");
  }
  norm("output_norm", "final_norm");
  return t;
}

std::string ne_str(const GgufTensorInfo& t) { return json(t.ne).dump(); }

// Whether two tensors hold the same bytes (output.weight saved as a copy of token_embd.weight), a MiB at a time.
bool same_bytes(const GgufFile& f, const GgufTensorInfo& a, const GgufTensorInfo& b) {
  if (a.type != b.type || a.ne != b.ne) return false;
  constexpr uint64_t kChunk = uint64_t{1} << 20;
  std::vector<char> x(static_cast<size_t>(std::min(kChunk, a.bytes))), y(x.size());
  for (uint64_t at = 0; at < a.bytes; at += kChunk) {
    const size_t n = static_cast<size_t>(std::min(kChunk, a.bytes - at));
    f.read_bytes(a, at, x.data(), n);
    f.read_bytes(b, at, y.data(), n);
    if (std::memcmp(x.data(), y.data(), n) != 0) return false;
  }
  return true;
}

// The config of the file's architecture, the head's tying settled (output.weight absent, or a copy of token_embd).
struct Model {
  nn::DecoderConfig config;
  std::string arch;
  bool head_copy = false;  // output.weight is there, equal to token_embd.weight
};

Model model_of(const GgufFile& f) {
  const GgufValue* a = f.find("general.architecture");
  HL_CHECK(a && a->value.is_string(), f.path(), ": metadata 'general.architecture' is ",
           a ? "not a STRING" : "missing", " (a GGUF model names its architecture)");
  const Meta m(f, a->value.get<std::string>());
  Model out;
  out.arch = m.arch();
  if (llama_layout_family(out.arch))
    out.config = llama_config(f, m);
  else if (out.arch == "gpt2")
    out.config = gpt2_config(f, m);
  else if (out.arch == "gptneox")
    out.config = neox_config(f, m);
  else
    HL_FAIL(f.path(), ": general.architecture '", out.arch,
            "' is not one headlab reads (llama, qwen2, phi3: the llama family; qwen3; olmo2; gemma, gemma2, gemma3; "
            "gpt2: gpt; gptneox: neox)");
  refuse_unknown_keys(f, m);
  const GgufTensorInfo* head = f.tensor("output.weight");
  const GgufTensorInfo* emb = f.tensor("token_embd.weight");
  out.head_copy = head && emb && same_bytes(f, *head, *emb);
  out.config.tie_embeddings = !head || out.head_copy;
  out.config.validate();
  return out;
}

NamedTensors read_parameters(const GgufFile& f, const Model& m) {
  const nn::DecoderConfig& c = m.config;
  std::vector<Entry> table = weight_table(c, m.arch);
  if (!c.tie_embeddings) table.push_back({"output.weight", {"out_head.weight"}, {c.vocab_size, c.emb_dim}, {}});
  std::set<std::string> named;
  NamedTensors out;
  const std::string what = "a " + m.arch + " model";
  for (const Entry& e : table) {
    named.insert(e.gguf);
    const GgufTensorInfo* t = f.tensor(e.gguf);
    HL_CHECK(t, f.path(), ": no tensor ", in_quotes(e.gguf), " (", what, " has it)");
    HL_CHECK(t->shape() == e.shape, f.path(), ": tensor ", in_quotes(e.gguf), " has ne ", ne_str(*t), " (PyTorch's ",
             shape_str(t->shape()), "), expected ", shape_str(e.shape));
    Tensor v = f.to_blocks(e.gguf);  // Q8_0 and Q4_K matrices stay in their blocks, as the file holds them
    if (!v.defined()) v = f.to_float(e.gguf);
    // llama.cpp's converter adds Gemma's 1 to every norm's weight; headlab's norms add it themselves
    if (c.norm_weight_offset != 0 && e.gguf.ends_with("norm.weight")) v = add(v, -c.norm_weight_offset);
    if (e.rows.empty()) {
      out.emplace_back(e.ours[0], std::move(v));
      continue;
    }
    int64_t at = 0;
    for (size_t i = 0; i < e.ours.size(); at += e.rows[i], ++i)
      out.emplace_back(e.ours[i], v.narrow(0, at, e.rows[i]).contiguous());
  }
  if (c.tie_embeddings) named.insert("output.weight");
  for (const GgufTensorInfo& t : f.tensors()) {
    HL_CHECK(t.name != "rope_freqs.weight", f.path(),
             ": tensor 'rope_freqs.weight' (per-dim rotary frequency "
             "factors: Llama 3.1's rope scaling) is not supported (plain rotary or linear scaling; a Hugging Face "
             "folder's llama3 rope_scaling is)");
    HL_CHECK(!t.name.starts_with("rope_factors_"), f.path(), ": tensor ", in_quotes(t.name),
             " (Phi-3's longrope factors) is not supported (plain rotary or linear scaling)");
    HL_CHECK(named.count(t.name), f.path(), ": tensor ", in_quotes(t.name), " is not one ", what, " has");
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// tokenizer.ggml.* -> a tokenizer

std::vector<std::string> strings_of(const json& a) {
  std::vector<std::string> out;
  out.reserve(a.size());
  for (const json& s : a) out.push_back(s.get<std::string>());
  return out;
}

std::shared_ptr<const tasks::TextTokenizer> read_tokenizer(const GgufFile& f, int64_t vocab, std::string& why_none) {
  const Meta m(f, "tokenizer");
  const std::string model = m.text("tokenizer.ggml.model", "");
  const std::string who = f.path() + " tokenizer.ggml";
  if (model.empty()) {
    why_none = "none in the file (no tokenizer.ggml.model)";
    return nullptr;
  }
  const json* tokens = m.array("tokenizer.ggml.tokens", T::string);
  HL_CHECK(tokens, f.path(), ": metadata 'tokenizer.ggml.tokens' is missing (tokenizer.ggml.model is '", model, "')");
  if (model == "llama") {
    const int64_t bos = m.integer("tokenizer.ggml.bos_token_id", 0, 1 << 30, 1),
                  eos = m.integer("tokenizer.ggml.eos_token_id", 0, 1 << 30, 2);
    if (bos != 1 || eos != 2) {
      why_none = "tokenizer.ggml.model 'llama' with BOS " + std::to_string(bos) + " and EOS " + std::to_string(eos) +
                 " (headlab's SentencePiece BPE tokenizer has <s> 1 and </s> 2)";
      return nullptr;
    }
    std::vector<float> scores(tokens->size(), 0.0f);
    if (const json* s = m.array("tokenizer.ggml.scores", T::float32)) {
      HL_CHECK(s->size() == tokens->size(), f.path(), ": metadata 'tokenizer.ggml.scores' has ", s->size(),
               " scores for ", tokens->size(), " tokens");
      for (size_t i = 0; i < scores.size(); ++i) scores[i] = static_cast<float>((*s)[i].get<double>());
    }
    return tasks::Llama2cTokenizer::from_pieces(strings_of(*tokens), scores, who, vocab);
  }
  if (model == "gpt2") {
    const std::string pre = m.text("tokenizer.ggml.pre", "gpt-2");
    if (pre != "gpt-2" && pre != "default") {
      why_none = "byte-level BPE with tokenizer.ggml.pre '" + pre +
                 "', a pre-tokenizer headlab does not know by that name (it reads gpt-2's)";
      return nullptr;
    }
    const json* merges = m.array("tokenizer.ggml.merges", T::string);
    HL_CHECK(merges, f.path(), ": metadata 'tokenizer.ggml.merges' is missing (tokenizer.ggml.model is 'gpt2')");
    nlohmann::ordered_json vocab_json = nlohmann::ordered_json::object();
    for (size_t i = 0; i < tokens->size(); ++i) vocab_json[(*tokens)[i].get<std::string>()] = i;
    std::string merges_txt = "#version: 0.2\n";
    for (const json& s : *merges) merges_txt.append(s.get<std::string>()).append("\n");
    std::string vocab_text;
    try {
      vocab_text = vocab_json.dump();
    } catch (const nlohmann::json::exception&) {
      HL_FAIL(f.path(), ": metadata 'tokenizer.ggml.tokens' holds a token that is not valid UTF-8");
    }
    return std::make_shared<const tasks::BpeTokenizer>(vocab_text, merges_txt, who + ".tokens",
                                                       who + ".merges", vocab);
  }
  why_none = "tokenizer.ggml.model '" + model + "', a kind headlab does not read (it reads llama and gpt2)";
  return nullptr;
}

// "F32 x 48" or "Q4_K x 120, Q6_K x 24, F32 x 49": what inspect says of the tensors' types.
std::string type_counts(const GgufFile& f) {
  std::map<std::string, int> n;
  for (const GgufTensorInfo& t : f.tensors()) ++n[ggml_type_name(t.type)];
  std::string out;
  for (const auto& [name, k] : n) out.append(out.empty() ? "" : ", ").append(name).append(" x ").append(std::to_string(k));
  return out;
}

class GgufSource final : public ModelSource {
 public:
  std::string name() const override { return "GGUF file"; }
  bool claims(const std::string& path) const override { return is_gguf_file(path); }
  SourceModel read(const std::string& path) const override { return read_gguf(path); }
  nlohmann::json read_config(const std::string& path) const override {
    const GgufFile f(path);
    return model_of(f).config.to_json();
  }
  TokenizerOption tokenizer_option() const override { return TokenizerOption::overrides; }
};

}  // namespace

SourceModel read_gguf(const std::string& path) {
  const GgufFile f(path);
  const Model m = model_of(f);
  SourceModel out;
  out.pretrained.config = m.config.to_json();
  out.pretrained.parameters = read_parameters(f, m);
  std::string why_none;
  out.embedded_tokenizer = read_tokenizer(f, m.config.vocab_size, why_none);
  std::ostringstream notes;
  notes << "GGUF version " << f.version() << ", general.architecture " << m.arch << "; tensors: " << type_counts(f)
        << " (read as float32)\nhead: "
        << (m.head_copy ? "output.weight, equal to token_embd.weight: tied"
                        : m.config.tie_embeddings ? "tied to token_embd (no output.weight)" : "output.weight")
        << "\ntokenizer.ggml: "
        << (out.embedded_tokenizer ? out.embedded_tokenizer->describe()
                                   : why_none + "; give one with --tokenizer FILE");
  out.notes = notes.str();
  return out;
}

const ModelSource& gguf_source() {
  static const GgufSource source;
  return source;
}

}  // namespace headlab::io
