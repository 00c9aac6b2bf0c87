// d2l's encoder-decoder Transformer. Shapes: B batch, S source tokens, T target tokens, N num_hiddens.
#include "nn/transformer.h"

#include <cmath>

#include "base/json_fields.h"

namespace headlab::nn {

// ---- PositionalEncoding ----
PositionalEncoding::PositionalEncoding(int64_t n, double p, int64_t max) : num_hiddens(n), max_len(max) {
  HL_CHECK(n > 0 && max > 0, "PositionalEncoding: num_hiddens and max_len must be positive, got ", n, " and ", max);
  std::vector<double> table(static_cast<size_t>(max * n));
  for (int64_t t = 0; t < max; ++t)
    for (int64_t j = 0; j < n; ++j) {
      // column pair (2i, 2i+1) shares the frequency 1 / 10000^(2i / N)
      const double angle =
          static_cast<double>(t) / std::pow(10000.0, static_cast<double>(j - j % 2) / static_cast<double>(n));
      table[static_cast<size_t>(t * n + j)] = j % 2 == 0 ? std::sin(angle) : std::cos(angle);
    }
  P = tensor(table, {max, n});
  dropout = register_module("dropout", std::make_shared<Dropout>(p));
}

Tensor PositionalEncoding::forward(const Tensor& X, int64_t offset) {
  HL_CHECK(X.defined() && X.dim() == 3 && X.size(2) == num_hiddens, "PositionalEncoding: expected (batch, tokens, ",
           num_hiddens, "), got ", X.defined() ? shape_str(X.shape()) : std::string("(undefined)"));
  const int64_t T = X.size(1);
  HL_CHECK(offset >= 0 && offset + T <= max_len, "PositionalEncoding: positions ", offset, "..", offset + T - 1,
           " exceed max_len ", max_len);
  if (!cast_.defined() || cast_.dtype() != X.dtype() || cast_.device() != X.device())
    cast_ = P.to(X.dtype()).to(X.device());
  return dropout->forward(add(X, narrow(cast_, 0, offset, T)));  // (B, T, N) + (T, N)
}

// ---- PositionWiseFFN, AddNorm ----
PositionWiseFFN::PositionWiseFFN(int64_t in, int64_t hidden, int64_t out) {
  dense1 = register_module("dense1", std::make_shared<Linear>(in, hidden));
  relu = register_module("relu", std::make_shared<ReLU>());
  dense2 = register_module("dense2", std::make_shared<Linear>(hidden, out));
}

Tensor PositionWiseFFN::forward(const Tensor& X) { return dense2->forward(relu->forward(dense1->forward(X))); }

AddNorm::AddNorm(int64_t normalized_shape, double p) {
  dropout = register_module("dropout", std::make_shared<Dropout>(p));
  ln = register_module("ln", std::make_shared<LayerNorm>(normalized_shape));
}

Tensor AddNorm::forward(const Tensor& X, const Tensor& Y) { return ln->forward(add(dropout->forward(Y), X)); }

// ---- blocks ----
namespace {

// d2l's MultiHeadAttention of a block, with `kept` of its num_heads heads (-1: all) after pruning.
std::shared_ptr<MultiHeadAttention> block_attention(const BlockSizes& s, int64_t kept) {
  const int64_t H = kept < 0 ? s.num_heads : kept;
  HL_CHECK(H > 0 && H <= s.num_heads, "Transformer block: ", kept, " heads kept of ", s.num_heads);
  const int64_t inner = H * (s.num_hiddens / s.num_heads);
  return std::make_shared<MultiHeadAttention>(s.key_size, s.query_size, s.value_size, inner, H, s.dropout, s.use_bias,
                                              s.num_hiddens);
}

}  // namespace

TransformerEncoderBlock::TransformerEncoderBlock(const BlockSizes& s, int64_t heads_kept) {
  attention = register_module("attention", block_attention(s, heads_kept));
  addnorm1 = register_module("addnorm1", std::make_shared<AddNorm>(s.norm_shape, s.dropout));
  ffn = register_module("ffn", std::make_shared<PositionWiseFFN>(s.ffn_num_input, s.ffn_num_hiddens, s.num_hiddens));
  addnorm2 = register_module("addnorm2", std::make_shared<AddNorm>(s.norm_shape, s.dropout));
}

Tensor TransformerEncoderBlock::forward(const Tensor& X, const Tensor& valid_lens) {
  const Tensor Y = addnorm1->forward(X, attention->forward(X, X, X, valid_lens));  // (B, S, N)
  return addnorm2->forward(Y, ffn->forward(Y));
}

TransformerDecoderBlock::TransformerDecoderBlock(const BlockSizes& s, int64_t index, int64_t self_kept,
                                                 int64_t cross_kept)
    : i(index) {
  attention1 = register_module("attention1", block_attention(s, self_kept));
  addnorm1 = register_module("addnorm1", std::make_shared<AddNorm>(s.norm_shape, s.dropout));
  attention2 = register_module("attention2", block_attention(s, cross_kept));
  addnorm2 = register_module("addnorm2", std::make_shared<AddNorm>(s.norm_shape, s.dropout));
  ffn = register_module("ffn", std::make_shared<PositionWiseFFN>(s.ffn_num_input, s.ffn_num_hiddens, s.num_hiddens));
  addnorm3 = register_module("addnorm3", std::make_shared<AddNorm>(s.norm_shape, s.dropout));
}

Tensor TransformerDecoderBlock::forward(const Tensor& X, DecoderState& state) {
  HL_CHECK(static_cast<int64_t>(state.key_values.size()) > i, "TransformerDecoderBlock ", i, ": the state holds ",
           state.key_values.size(), " blocks' caches (make it with TransformerDecoder::init_state)");
  Tensor& cache = state.key_values[static_cast<size_t>(i)];
  const int64_t past = cache.defined() ? cache.size(1) : 0, B = X.size(0), T = X.size(1);
  const Tensor key_values = past ? cat({cache, X}, 1) : X;  // (B, past + T, N)
  cache = key_values;
  // Causal: query t sees keys 0..past + t. (d2l sets this only in training.)
  const Tensor causal =
      expand(arange(static_cast<double>(past + 1), static_cast<double>(past + T + 1), 1, DType::i64, X.device())
                 .view({1, T}),
             {B, T})
          .contiguous();  // (B, T)
  const Tensor X2 = attention1->forward(X, key_values, key_values, causal);
  const Tensor Y = addnorm1->forward(X, X2);
  const Tensor Y2 = attention2->forward(Y, state.enc_outputs, state.enc_outputs, state.enc_valid_lens);
  const Tensor Z = addnorm2->forward(Y, Y2);
  return addnorm3->forward(Z, ffn->forward(Z));  // (B, T, N)
}

// ---- config ----
BlockSizes TransformerConfig::block_sizes() const {
  BlockSizes s;
  s.key_size = s.query_size = s.value_size = s.num_hiddens = s.norm_shape = s.ffn_num_input = num_hiddens;
  s.ffn_num_hiddens = ffn_num_hiddens;
  s.num_heads = num_heads;
  s.dropout = dropout;
  s.use_bias = use_bias;
  return s;
}

namespace {

int64_t kept_count(const std::vector<std::vector<int64_t>>& kept, int64_t layer) {
  return kept.empty() ? -1 : static_cast<int64_t>(kept[static_cast<size_t>(layer)].size());
}

}  // namespace

double TransformerConfig::num_parameters() const {
  const double N = static_cast<double>(num_hiddens), F = static_cast<double>(ffn_num_hiddens);
  auto attention = [&](const std::vector<std::vector<int64_t>>& kept, int64_t l) {  // as block_attention builds it
    const int64_t inner = head_size() * (kept.empty() ? num_heads : kept_count(kept, l));
    return MultiHeadAttention::parameter_count(num_hiddens, num_hiddens, num_hiddens, inner, use_bias, num_hiddens);
  };
  const double ffn = N * F + F + F * N + N, addnorm = 2 * N;
  double n = static_cast<double>(src_vocab_size + tgt_vocab_size) * N + N * static_cast<double>(tgt_vocab_size) +
             static_cast<double>(tgt_vocab_size);  // embeddings, dense
  for (int64_t l = 0; l < num_layers; ++l) {
    n += attention(kept_encoder, l) + 2 * addnorm + ffn;
    n += attention(kept_decoder, l) + attention(kept_cross, l) + 3 * addnorm + ffn;
  }
  return n;
}

namespace {

// TransformerConfig's JSON (d2l's names); to_json adds "arch": "encoder-decoder", which tells the
// run's config reader which model a checkpoint holds.
constexpr const char* kTransformerWho = "encoder-decoder config";
const auto kTransformerFields = std::tuple{
    field("src_vocab_size", &TransformerConfig::src_vocab_size, Need::required, kPositive),
    field("tgt_vocab_size", &TransformerConfig::tgt_vocab_size, Need::required, kPositive),
    field("num_hiddens", &TransformerConfig::num_hiddens, Need::required, kPositive),
    field("ffn_num_hiddens", &TransformerConfig::ffn_num_hiddens, Need::required, kPositive),
    field("num_heads", &TransformerConfig::num_heads, Need::required, kPositive),
    field("num_layers", &TransformerConfig::num_layers, Need::required, kPositive),
    field("dropout", &TransformerConfig::dropout, Need::required, kFraction),
    field("use_bias", &TransformerConfig::use_bias),
    field("max_len", &TransformerConfig::max_len, Need::required, kPositive),
    field("kept_encoder", &TransformerConfig::kept_encoder),
    field("kept_decoder", &TransformerConfig::kept_decoder),
    field("kept_cross", &TransformerConfig::kept_cross),
};

}  // namespace

void TransformerConfig::validate() const {
  const char* who = kTransformerWho;
  check_fields(*this, kTransformerFields, who);
  HL_CHECK(num_hiddens % num_heads == 0, who, ": num_hiddens ", num_hiddens,
           " must be a positive multiple of num_heads ", num_heads);
  for (const auto& [key, kept] : {std::pair{"kept_encoder", &kept_encoder}, std::pair{"kept_decoder", &kept_decoder},
                                  std::pair{"kept_cross", &kept_cross}}) {
    check_head_lists(*kept, num_layers, num_heads, who, key);
    for (const std::vector<int64_t>& layer : *kept)
      HL_CHECK(!layer.empty(), who, ": ", key, " leaves a layer without heads (every attention keeps at least one)");
  }
}

nlohmann::json TransformerConfig::to_json() const {
  nlohmann::json j = fields_to_json(*this, kTransformerFields);
  j["arch"] = "encoder-decoder";
  return j;
}

TransformerConfig TransformerConfig::from_json(const nlohmann::json& j) {
  TransformerConfig c;
  fields_from_json(j, c, kTransformerFields, kTransformerWho);
  c.validate();
  return c;
}

namespace {

class EncoderDecoderFamily : public ModelFamily {
 public:
  std::string arch() const override { return "encoder-decoder"; }
  std::string help() const override { return "encoder-decoder (d2l's Transformer: source -> target)"; }
  bool seq2seq() const override { return true; }
  nlohmann::json canonical(const nlohmann::json& s) const override { return TransformerConfig::from_json(s).to_json(); }
  std::shared_ptr<Model> build(const nlohmann::json& s) const override {
    return std::make_shared<EncoderDecoder>(TransformerConfig::from_json(s));
  }
  double parameter_count(const nlohmann::json& s) const override {
    return TransformerConfig::from_json(s).num_parameters();
  }
  // Not estimated: a source -> target batch is padded to its longest row, which the config does not know
  // (max_len is the positional table's size, ~50x the toy tasks' rows), so the parameters and the batches'
  // ids are the estimate.
  double activation_floats(const nlohmann::json&, bool) const override { return 0; }
  double cache_floats(const nlohmann::json&) const override { return 0; }
  int64_t row_tokens(const nlohmann::json& s) const override { return TransformerConfig::from_json(s).max_len; }
  int64_t vocab_size(const nlohmann::json& s) const override { return TransformerConfig::from_json(s).tgt_vocab_size; }
  std::string describe(const nlohmann::json& s) const override {
    const TransformerConfig c = TransformerConfig::from_json(s);
    return "encoder-decoder (d2l), " + std::to_string(c.num_layers) + "+" + std::to_string(c.num_layers) +
           " layers x " + std::to_string(c.num_heads) + " heads, hiddens " + std::to_string(c.num_hiddens) + ", ffn " +
           std::to_string(c.ffn_num_hiddens);
  }
  nlohmann::json from_options(const ModelOptions& o, const TaskSizes& t) const override {
    HL_CHECK(!o.attn_only,
             "train: --attn-only applies to --arch gpt; d2l's encoder-decoder keeps its position-wise FFN");
    HL_CHECK(o.n_kv_heads == 0 || o.n_kv_heads == o.n_heads,
             "train: --n-kv-heads: d2l's encoder-decoder has multi-head attention only (grouped-query: --arch llama)");
    TransformerConfig c;
    c.src_vocab_size = t.source_vocab_size, c.tgt_vocab_size = t.vocab_size;
    c.num_hiddens = o.emb_dim, c.num_heads = o.n_heads, c.num_layers = o.n_layers, c.dropout = o.drop_rate;
    c.use_bias = o.qkv_bias;
    c.ffn_num_hiddens = o.ffn_hiddens > 0 ? o.ffn_hiddens : 2 * o.emb_dim;  // d2l's 32 / 64
    HL_CHECK(t.longest_sequence <= c.max_len, "train: task ", t.task, " has sequences of up to ", t.longest_sequence,
             " tokens, more than the positional encoding's max_len ", c.max_len);
    c.validate();
    return c.to_json();
  }
  ModelOptions options(const nlohmann::json& s) const override {
    const TransformerConfig c = TransformerConfig::from_json(s);
    ModelOptions o;
    o.arch = arch();
    o.emb_dim = c.num_hiddens, o.n_heads = c.num_heads, o.n_layers = c.num_layers, o.drop_rate = c.dropout;
    o.qkv_bias = c.use_bias, o.ffn_hiddens = c.ffn_num_hiddens;
    return o;
  }
  nlohmann::json with_dropout(const nlohmann::json& s, double p) const override {
    TransformerConfig c = TransformerConfig::from_json(s);
    c.dropout = p;
    c.validate();
    return c.to_json();
  }
};

}  // namespace

const ModelFamily& encoder_decoder_family() {
  static const EncoderDecoderFamily family;
  return family;
}

// ---- encoder, decoder ----
namespace {

// ids (B, T) int64 -> embedding(ids) * sqrt(N), as d2l scales it before adding the positional encoding.
Tensor scaled_embedding(const char* who, Embedding& embedding, const Tensor& ids) {
  HL_CHECK(ids.defined() && ids.dim() == 2 && ids.dtype() == DType::i64, who,
           ": expected int64 token ids of shape (batch, tokens), got ",
           ids.defined() ? shape_str(ids.shape()) + " " + dtype_name(ids.dtype()) : std::string("(undefined)"));
  return mul(embedding.forward(ids), std::sqrt(static_cast<double>(embedding.embedding_dim)));
}

}  // namespace

TransformerEncoder::TransformerEncoder(const TransformerConfig& c) : num_hiddens(c.num_hiddens) {
  embedding = register_module("embedding", std::make_shared<Embedding>(c.src_vocab_size, c.num_hiddens));
  pos_encoding =
      register_module("pos_encoding", std::make_shared<PositionalEncoding>(c.num_hiddens, c.dropout, c.max_len));
  blks = register_module("blks", std::make_shared<Blocks>());
  for (int64_t l = 0; l < c.num_layers; ++l)
    blks->add(std::make_shared<TransformerEncoderBlock>(c.block_sizes(), kept_count(c.kept_encoder, l)));
}

Tensor TransformerEncoder::forward(const Tensor& X, const Tensor& valid_lens) {
  Tensor h = pos_encoding->forward(scaled_embedding("TransformerEncoder", *embedding, X));  // (B, S, N)
  for (size_t l = 0; l < blks->size(); ++l) h = blks->at<TransformerEncoderBlock>(l)->forward(h, valid_lens);
  return h;
}

TransformerDecoder::TransformerDecoder(const TransformerConfig& c)
    : num_hiddens(c.num_hiddens), num_layers(c.num_layers) {
  embedding = register_module("embedding", std::make_shared<Embedding>(c.tgt_vocab_size, c.num_hiddens));
  pos_encoding =
      register_module("pos_encoding", std::make_shared<PositionalEncoding>(c.num_hiddens, c.dropout, c.max_len));
  blks = register_module("blks", std::make_shared<Blocks>());
  for (int64_t l = 0; l < c.num_layers; ++l)
    blks->add(std::make_shared<TransformerDecoderBlock>(c.block_sizes(), l, kept_count(c.kept_decoder, l),
                                                        kept_count(c.kept_cross, l)));
  dense = register_module("dense", std::make_shared<Linear>(c.num_hiddens, c.tgt_vocab_size));
}

DecoderState TransformerDecoder::init_state(const Tensor& enc_outputs, const Tensor& enc_valid_lens) const {
  DecoderState s;
  s.enc_outputs = enc_outputs;
  s.enc_valid_lens = enc_valid_lens;
  s.key_values.resize(static_cast<size_t>(num_layers));
  return s;
}

Tensor TransformerDecoder::forward(const Tensor& X, DecoderState& state) {
  Tensor h = pos_encoding->forward(scaled_embedding("TransformerDecoder", *embedding, X), state.steps);  // (B, T, N)
  for (size_t l = 0; l < blks->size(); ++l) h = blks->at<TransformerDecoderBlock>(l)->forward(h, state);
  state.steps += X.size(1);
  return dense->forward(h);  // (B, T, V)
}

// ---- EncoderDecoder ----
EncoderDecoder::EncoderDecoder(const TransformerConfig& c) : cfg_(c) {
  cfg_.validate();
  encoder = register_module("encoder", std::make_shared<TransformerEncoder>(cfg_));
  decoder = register_module("decoder", std::make_shared<TransformerDecoder>(cfg_));
}

Tensor EncoderDecoder::forward(const Tensor& enc_X, const Tensor& dec_X, const Tensor& enc_valid_lens) {
  HL_CHECK(enc_X.defined() && dec_X.defined() && enc_X.dim() == 2 && dec_X.dim() == 2 && enc_X.size(0) == dec_X.size(0),
           "EncoderDecoder: expected source (batch, S) and decoder input (batch, T) ids with the same batch, got ",
           enc_X.defined() ? shape_str(enc_X.shape()) : std::string("(undefined)"), " and ",
           dec_X.defined() ? shape_str(dec_X.shape()) : std::string("(undefined)"));
  DecoderState state = decoder->init_state(encoder->forward(enc_X, enc_valid_lens), enc_valid_lens);
  return decoder->forward(dec_X, state);
}

MultiHeadAttention& EncoderDecoder::attention(int64_t i) const {
  const int64_t L = cfg_.num_layers;
  HL_CHECK(i >= 0 && i < 3 * L, "EncoderDecoder: attention module ", i, " is out of range for ", 3 * L);
  const size_t l = static_cast<size_t>(i % L);
  if (i < L) return *encoder->blks->at<TransformerEncoderBlock>(l)->attention;
  const auto block = decoder->blks->at<TransformerDecoderBlock>(l);
  return i < 2 * L ? *block->attention1 : *block->attention2;
}

const std::vector<std::vector<int64_t>>& EncoderDecoder::kept_lists(int64_t i) const {
  const int64_t kind = i / cfg_.num_layers;
  return kind == 0 ? cfg_.kept_encoder : kind == 1 ? cfg_.kept_decoder : cfg_.kept_cross;
}

std::string EncoderDecoder::attention_kind(int64_t i) const {
  const int64_t kind = i / cfg_.num_layers;
  return kind == 0 ? "encoder" : kind == 1 ? "decoder" : "cross";
}

std::string EncoderDecoder::attention_label(int64_t i) const {
  const int64_t kind = i / cfg_.num_layers;
  return std::string(kind == 0 ? "enc" : kind == 1 ? "dec" : "cross") + ".L" + std::to_string(attention_layer(i));
}

int64_t EncoderDecoder::original_head(int64_t i, int64_t h) const {
  const std::vector<std::vector<int64_t>>& kept = kept_lists(i);
  return kept.empty() ? h : kept.at(static_cast<size_t>(attention_layer(i))).at(static_cast<size_t>(h));
}

void EncoderDecoder::keep_attention_weights(bool on) {
  for (int64_t i = 0; i < attention_count(); ++i) attention(i).attention->keep_attention_weights = on;
}

nlohmann::json EncoderDecoder::pruned_config(const std::vector<std::vector<int64_t>>& kept) const {
  const auto L = static_cast<size_t>(cfg_.num_layers);
  HL_CHECK(kept.size() == 3 * L, "EncoderDecoder: ", kept.size(), " kept-head lists for ", 3 * L, " attention modules");
  TransformerConfig c = cfg_;
  c.kept_encoder.assign(kept.begin(), kept.begin() + static_cast<std::ptrdiff_t>(L));
  c.kept_decoder.assign(kept.begin() + static_cast<std::ptrdiff_t>(L),
                        kept.begin() + static_cast<std::ptrdiff_t>(2 * L));
  c.kept_cross.assign(kept.begin() + static_cast<std::ptrdiff_t>(2 * L), kept.end());
  c.validate();
  return c.to_json();
}

std::vector<std::vector<int64_t>> greedy_decode(EncoderDecoder& model, const Tensor& src, const Tensor& src_valid_lens,
                                                int64_t bos_id, int64_t eos_id, int64_t max_steps) {
  HL_CHECK(src.defined() && src.dim() == 2, "greedy_decode: expected source ids (batch, S), got ",
           src.defined() ? shape_str(src.shape()) : std::string("(undefined)"));
  const bool was_training = model.is_training();
  model.eval();
  NoGradGuard no_grad;
  const int64_t B = src.size(0);
  DecoderState state = model.decoder->init_state(model.encoder->forward(src, src_valid_lens), src_valid_lens);
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(B));
  std::vector<bool> done(static_cast<size_t>(B), false);
  Tensor next = full({B, 1}, static_cast<double>(bos_id), DType::i64, src.device());
  int64_t open = B;
  for (int64_t step = 0; step < max_steps && open > 0; ++step) {
    next = argmax(model.decoder->forward(next, state), -1);  // (B, 1)
    const std::vector<int64_t> ids = next.to_vector<int64_t>();
    for (size_t b = 0; b < ids.size(); ++b) {
      if (done[b]) continue;
      if (ids[b] == eos_id) {
        done[b] = true;
        --open;
      } else {
        out[b].push_back(ids[b]);
      }
    }
  }
  model.train(was_training);
  return out;
}

}  // namespace headlab::nn
