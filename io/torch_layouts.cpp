// The layouts of PyTorch files headlab reads (see torch_layouts.h), each a state_dict's names and the config that
// sizes them, into the weight tables the families' folders use.
#include "io/torch_layouts.h"

#include <filesystem>
#include <map>
#include <set>

#include "base/error.h"
#include "base/input_path.h"
#include "io/hf_gpt2.h"
#include "io/hf_weights.h"
#include "io/torch_file.h"
#include "io/weight_files.h"
#include "nn/decoder_family.h"
#include "ops/ops.h"
#include "tasks/id_tokenizer.h"

namespace headlab::io {

namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

// A whole number of a stored config (model_args, cfg), in [lo, hi]; errors name the file and key.
int64_t stored_int(const ojson& args, const char* key, int64_t lo, int64_t hi, const std::string& where) {
  HL_CHECK(args.contains(key), where, ": missing ", key);
  const ojson& v = args.at(key);
  HL_CHECK(v.is_number_integer() && v.get<int64_t>() >= lo && v.get<int64_t>() <= hi, where, ": ", key,
           " must be a whole number in [", lo, ", ", hi, "], got ", v.dump());
  return v.get<int64_t>();
}

// A weight table's entries the files lack that may be zeros (nanoGPT's bias=False): taken out of the table and
// given back as zero parameters, so the model computes what the file's model does.
NamedTensors zeros_for_missing(WeightMap& map, const WeightFiles& files, const std::string& suffix) {
  NamedTensors zeros;
  std::vector<WeightEntry> kept;
  for (WeightEntry& e : map.entries) {
    if (files.contains(e.hf) || !e.hf.ends_with(suffix)) {
      kept.push_back(std::move(e));
      continue;
    }
    const int64_t parts = static_cast<int64_t>(e.ours.size());
    for (const std::string& name : e.ours) zeros.emplace_back(name, headlab::zeros({e.shape[0] / parts}));
  }
  map.entries = std::move(kept);
  return zeros;
}

// nanoGPT's ckpt.pt: GPT-2's table with nn.Linear's (out, in) where GPT-2 has Conv1D's (in, out).
FolderModel read_nanogpt(const std::shared_ptr<const TorchFile>& file, const TorchStateDict& sd,
                         const std::string& path) {
  const ojson& a = file->value().at("model_args");
  const std::string where = path + ": model_args";
  HL_CHECK(a.is_object(), where, " must be a dict, got ", a.dump());
  nn::DecoderConfig c;  // the gpt family: GPT-2's parts
  c.n_layers = stored_int(a, "n_layer", 1, 1 << 12, where);
  c.n_heads = stored_int(a, "n_head", 1, 1 << 12, where);
  c.emb_dim = stored_int(a, "n_embd", 1, 1 << 20, where);
  c.context_length = stored_int(a, "block_size", 1, 1 << 24, where);
  c.vocab_size = stored_int(a, "vocab_size", 1, 1 << 24, where);
  HL_CHECK(c.emb_dim % c.n_heads == 0, where, ": n_embd ", c.emb_dim, " is not a multiple of n_head ", c.n_heads);
  c.qkv_bias = true;  // bias=False: zeros, below
  c.tie_embeddings = true;
  c.validate();
  WeightMap map = gpt2_weights(c, "transformer.", true);
  for (WeightEntry& e : map.entries)
    if (e.transposed) e.transposed = false, e.shape = {e.shape[1], e.shape[0]};
  const std::unique_ptr<WeightFiles> files = torch_weights(file, sd);
  const bool bias = !a.contains("bias") || a.at("bias") != false;
  NamedTensors zeros = bias ? NamedTensors{} : zeros_for_missing(map, *files, ".bias");
  NamedTensors params = read_weights(*files, path, map);
  for (auto& z : zeros) params.push_back(std::move(z));
  return {c.to_json(), std::move(params), "", ""};
}

// Names that say which layout a state_dict is in, for the refusal of one headlab does not read.
std::string first_names(const TorchStateDict& sd) {
  std::string out;
  for (size_t i = 0; i < sd.tensors.size() && i < 4; ++i) out += (i ? ", " : "") + sd.tensors[i].first;
  return out + (sd.tensors.size() > 4 ? ", ..." : "");
}

class TorchSource final : public ModelSource {
 public:
  std::string name() const override { return "PyTorch file"; }
  bool claims(const std::string& path) const override {
    return not_a_file_reason(path).empty() && TorchFile::claims(path);
  }
  SourceModel read(const std::string& path) const override {
    const auto file = std::make_shared<const TorchFile>(path);
    const TorchStateDict sd = find_state_dict(*file);
    SourceModel m;
    const ojson& v = file->value();
    if (v.is_object() && v.contains("model_args")) {
      m.pretrained = read_nanogpt(file, sd, path);
      m.notes = "layout: nanoGPT's ckpt.pt (model_args)";
    } else {
      const bool hf = !sd.tensors.empty() && (sd.tensors[0].first.starts_with("transformer.") ||
                                              sd.tensors[0].first.starts_with("model.") ||
                                              sd.tensors[0].first.starts_with("gpt_neox."));
      HL_CHECK(!hf, path, ": a Hugging Face state_dict (", first_names(sd),
               "): give its folder, with config.json beside pytorch_model.bin");
      HL_FAIL(path, ": a state_dict in a layout headlab does not read (", first_names(sd),
              "); it reads nanoGPT's ckpt.pt and Hugging Face folders");
    }
    const nlohmann::json& c = m.pretrained.config;
    const int64_t vocab = c.at("vocab_size").get<int64_t>(), out = c.value("out_vocab_size", vocab);
    m.embedded_tokenizer = std::make_shared<const tasks::IdTokenizer>(vocab);
    (void)out;
    if (!sd.key.empty()) m.notes += "; state_dict under \"" + sd.key + "\"";
    return m;
  }
  nlohmann::json read_config(const std::string& path) const override { return read(path).pretrained.config; }
  TokenizerOption tokenizer_option() const override { return TokenizerOption::overrides; }
};

}  // namespace

const ModelSource& torch_source() {
  static const TorchSource source;
  return source;
}

}  // namespace headlab::io
