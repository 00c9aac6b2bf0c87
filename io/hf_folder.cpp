// config.json of a Hugging Face folder, read and checked.
#include "io/hf_folder.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "autograd/engine.h"
#include "base/input_path.h"
#include "base/json_text.h"
#include "base/sizes.h"
#include "io/atomic_file.h"
#include "ops/ops.h"

namespace headlab::io {

namespace {

namespace fs = std::filesystem;

}  // namespace

bool is_hf_model_folder(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && path_present((fs::path(path) / "config.json").string());
}

std::string hf_config_path(const std::string& folder) { return (fs::path(folder) / "config.json").string(); }

nlohmann::json read_hf_config(const std::string& folder) {
  check_input_folder(folder, "model folder");
  const std::string path = hf_config_path(folder);
  const nlohmann::json j = parse_json_text(read_whole_file(path, WholeFile::config, "model config"), path);
  HL_CHECK(j.is_object(), path, ": expected a JSON object");
  return j;
}

int64_t hf_config_int(const nlohmann::json& j, std::initializer_list<const char*> keys, int64_t lo, int64_t hi,
                      const std::string& file) {
  for (const char* key : keys) {
    if (!j.contains(key)) continue;
    int64_t v = 0;
    HL_CHECK(json_to_integer(j.at(key), v) && v >= lo && v <= hi, file, ": ", key, " must be a whole number in [", lo,
             ", ", hi, "], got ", json_text(j.at(key)));
    return v;
  }
  HL_FAIL(file, ": missing ", *keys.begin());
}

void read_hf_sizes(const nlohmann::json& j, const std::string& file, nn::DecoderConfig& c, bool heads_divide) {
  c.n_layers = hf_config_int(j, {"num_hidden_layers"}, 1, 10000, file);
  c.n_heads = hf_config_int(j, {"num_attention_heads"}, 1, 100000, file);
  c.emb_dim = hf_config_int(j, {"hidden_size"}, 1, 1 << 20, file);
  c.hidden_dim = hf_config_int(j, {"intermediate_size"}, 1, 1 << 22, file);
  c.vocab_size = hf_config_int(j, {"vocab_size"}, 1, 1 << 28, file);
  c.context_length = hf_config_int(j, {"max_position_embeddings"}, 1, 1 << 24, file);
  HL_CHECK(!heads_divide || c.emb_dim % c.n_heads == 0, file, ": hidden_size ", c.emb_dim,
           " is not divisible by num_attention_heads ", c.n_heads);
}

void write_tokenizer_files(const std::string& folder, const TokenizerFiles& tokenizer) {
  for (const auto& [name, bytes] : tokenizer.files)
    write_file_atomic((fs::path(folder) / name).string(), bytes, "export");
}

const nn::CausalMultiHeadAttention& fused_attention(const nn::DecoderModel& model, int64_t layer,
                                                    std::shared_ptr<nn::CausalMultiHead>& holder) {
  if (const auto* att = dynamic_cast<const nn::CausalMultiHeadAttention*>(&model.attention(layer))) return *att;
  holder = nn::convert_attention(model.attention(layer), nn::AttentionForm::fused);
  return dynamic_cast<const nn::CausalMultiHeadAttention&>(*holder);
}

Tensor full_width(const Tensor& w, const std::vector<int64_t>& kept, int64_t units, int64_t D) {
  Shape zero_rows = w.shape();
  zero_rows[0] = D;
  std::vector<Tensor> rows;
  size_t i = 0;
  for (int64_t u = 0; u < units; ++u)
    rows.push_back(i < kept.size() && kept[i] == u ? w.narrow(0, static_cast<int64_t>(i++) * D, D)
                                                   : zeros(zero_rows, w.dtype(), w.device()));
  return cat(rows, 0);
}

}  // namespace headlab::io
