// The weight table's two directions: a folder's tensors into headlab's parameters, and a decoder's parameters
// back into the folder's tensors; and the folder format every decoder family shares.
#include "io/hf_weights.h"

#include <filesystem>
#include <set>

#include "autograd/engine.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "io/weight_files.h"
#include "nn/decoder_family.h"
#include "ops/ops.h"

namespace headlab::io {

namespace {

namespace fs = std::filesystem;

// (rows, cols) -> (cols, rows) of a float32 CPU matrix whose rows may be strided (a column slice), in
// square tiles so that reads and writes both stay in cache, tile rows over the threads: Conv1D's 85M
// weights in GPT-2 small took a second through the generic strided copy, a tenth of that so.
Tensor transposed(const Tensor& t) {
  const int64_t rows = t.size(0), cols = t.size(1), ld = t.stride(0);
  HL_CHECK(t.stride(1) == 1 && t.dtype() == DType::f32 && !t.device().is_cuda(), "transposed: a CPU float32 matrix");
  Tensor out = Tensor::empty({cols, rows});
  const float* src = t.data<float>();
  float* dst = out.data<float>();
  constexpr int64_t kTile = 64;
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < cols; c0 += kTile)
    for (int64_t r0 = 0; r0 < rows; r0 += kTile)
      for (int64_t c = c0; c < std::min(c0 + kTile, cols); ++c)
        for (int64_t r = r0; r < std::min(r0 + kTile, rows); ++r) dst[c * rows + r] = src[r * ld + c];
  return out;
}

// The rows of part `which` of `parts` fused per head: head h's rows [h*parts*D + which*D, ... + D).
std::vector<int64_t> per_head_rows(int64_t rows, int64_t parts, int64_t D, int64_t which) {
  std::vector<int64_t> out;
  for (int64_t h = 0; h < rows / (parts * D); ++h)
    for (int64_t i = 0; i < D; ++i) out.push_back(h * parts * D + which * D + i);
  return out;
}

// Rows of a (heads * D, ...) projection from interleaved pairs (2i, 2i+1) to halves (i, i + D/2) per head.
Tensor pairs_to_halves(const Tensor& w, int64_t D) {
  std::vector<int64_t> rows;
  for (int64_t h = 0; h < w.size(0) / D; ++h) {
    for (int64_t i = 0; i < D / 2; ++i) rows.push_back(h * D + 2 * i);
    for (int64_t i = 0; i < D / 2; ++i) rows.push_back(h * D + 2 * i + 1);
  }
  return index_select(w, 0, tensor(rows));
}

// "trf_blocks.3.att.W_key.bias" -> {3, "W_key", "bias"}; false for any other name.
bool attention_parameter(const std::string& name, int64_t& layer, std::string& which, std::string& kind) {
  const std::string head = "trf_blocks.";
  if (!name.starts_with(head)) return false;
  const size_t dot = name.find('.', head.size());
  if (dot == std::string::npos || name.compare(dot, 5, ".att.") != 0) return false;
  const size_t last = name.rfind('.');
  which = name.substr(dot + 5, last - dot - 5);
  kind = name.substr(last + 1);
  if (which != "W_query" && which != "W_key" && which != "W_value" && which != "out_proj") return false;
  layer = std::stoll(name.substr(head.size(), dot - head.size()));
  return true;
}

// One of the model's parameters as the folder holds it: attention weights from the fused form at full width.
class ExportParameters {
 public:
  explicit ExportParameters(const nn::DecoderModel& model) : model_(model), c_(model.config()) {}

  // The parameter `name`, or an undefined tensor where the model has no such bias.
  Tensor get(const std::string& name, bool rotary) {
    int64_t l = 0;
    std::string which, kind;
    if (!attention_parameter(name, l, which, kind)) return cpu(model_.parameter(name));
    const nn::CausalMultiHeadAttention& att = fused_attention(model_, l, held_);
    const nn::Linear& lin = which == "W_query"   ? *att.W_query
                            : which == "W_key"   ? *att.W_key
                            : which == "W_value" ? *att.W_value
                                                 : *att.out_proj;
    const Tensor& p = kind == "weight" ? lin.weight : lin.bias;
    if (!p.defined()) return Tensor();
    // A pruned layer is written at full width: its removed heads (and their groups' keys and values) as zeros.
    const int64_t D = c_.head_size(), G = c_.group_size();
    std::vector<int64_t> heads, groups;  // the kept ones, by original index
    for (int64_t j = 0; j < att.head_count(); ++j) heads.push_back(model_.original_head(l, j));
    for (size_t j = 0; j < heads.size(); j += static_cast<size_t>(G)) groups.push_back(heads[j] / G);
    if (which == "out_proj") {
      return kind == "bias" ? cpu(p) : full_width(cpu(p).mT(), heads, c_.n_heads, D).mT().contiguous();
    }
    Tensor rows = kind == "bias" ? cpu(p).view({-1, 1}) : cpu(p);
    if (rotary && c_.rope_interleaved) rows = pairs_to_halves(rows, D);
    rows = which == "W_query" ? full_width(rows, heads, c_.n_heads, D) : full_width(rows, groups, c_.kv_heads(), D);
    return kind == "bias" ? rows.view({-1}) : rows;
  }

 private:
  static Tensor cpu(const Tensor& p) { return p.detach().to(kCPU).contiguous(); }
  const nn::DecoderModel& model_;
  const nn::DecoderConfig& c_;
  std::shared_ptr<nn::CausalMultiHead> held_;  // the layer's fused form, where the model's is another
};

// Part i's rows of a Fused::blocks entry: as listed, or an equal share.
int64_t block_rows(const WeightEntry& e, int64_t i) {
  if (!e.rows.empty()) return e.rows.at(static_cast<size_t>(i));
  return e.shape[e.transposed ? 1 : 0] / static_cast<int64_t>(e.ours.size());
}

}  // namespace

NamedTensors read_weights(const WeightFiles& files, const std::string& where, const WeightMap& map) {
  std::set<std::string> used(map.ignored.begin(), map.ignored.end());
  NamedTensors out;
  for (const WeightEntry& e : map.entries) {
    if (!files.contains(e.hf)) HL_FAIL(where, ": ", e.missing.empty() ? "missing tensor '" + e.hf + "'" : e.missing);
    const Shape shape = files.shape(e.hf);
    HL_CHECK(shape == e.shape, files.file_of(e.hf), ": tensor '", e.hf, "' has shape ", shape_str(shape),
             ", expected ", shape_str(e.shape), " for the config");
    used.insert(e.hf);
    const Tensor t = files.to_float(e.hf);
    const int64_t parts = static_cast<int64_t>(e.ours.size());
    if (e.fused == Fused::none) {
      out.emplace_back(e.ours[0], e.transposed ? transposed(t) : t);
    } else if (e.fused == Fused::blocks) {
      int64_t at = 0;
      for (int64_t i = 0; i < parts; ++i) {
        const int64_t n = block_rows(e, i);
        out.emplace_back(e.ours[static_cast<size_t>(i)],
                         e.transposed ? transposed(t.narrow(1, at, n)) : t.narrow(0, at, n).contiguous());
        at += n;
      }
    } else {
      for (int64_t i = 0; i < parts; ++i)
        out.emplace_back(e.ours[static_cast<size_t>(i)],
                         index_select(t, 0, tensor(per_head_rows(t.size(0), parts, map.head_dim, i))));
    }
  }
  for (const std::string& name : files.names()) {
    bool buffer = false;
    for (const std::string& suffix : map.buffer_suffixes) buffer = buffer || name.ends_with(suffix);
    HL_CHECK(used.count(name) || buffer, files.file_of(name), ": tensor '", name, "' is not part of ", map.what,
             " of this config");
  }
  return out;
}

std::vector<std::pair<std::string, Tensor>> weights_to_write(const nn::DecoderModel& model, const WeightMap& map) {
  const NoGradGuard no_grad;
  ExportParameters params(model);
  std::vector<std::pair<std::string, Tensor>> out;
  for (const WeightEntry& e : map.entries) {
    const int64_t parts = static_cast<int64_t>(e.ours.size());
    std::vector<Tensor> ps;  // (rows, ...) each, a missing bias as zeros
    for (int64_t i = 0; i < parts; ++i) {
      const Tensor p = params.get(e.ours[static_cast<size_t>(i)], e.rotary);
      const int64_t rows = e.fused == Fused::blocks ? block_rows(e, i) : e.shape[e.transposed ? 1 : 0] / parts;
      ps.push_back(p.defined() ? p
                               : zeros(e.shape.size() == 1 ? Shape{rows} : Shape{rows, e.shape[e.transposed ? 0 : 1]}));
    }
    Tensor t;
    if (e.fused == Fused::per_head) {
      std::vector<Tensor> rows;
      const int64_t D = map.head_dim;
      for (int64_t h = 0; h < ps[0].size(0) / D; ++h)
        for (const Tensor& p : ps) rows.push_back(p.narrow(0, h * D, D));
      t = cat(rows, 0);
    } else {
      t = parts == 1 ? ps[0] : cat(ps, 0);
    }
    out.emplace_back(e.hf, e.transposed ? transposed(t.contiguous()) : t.contiguous());
  }
  return out;
}

void write_hf_folder(const std::string& folder, const std::vector<std::pair<std::string, Tensor>>& tensors,
                     const nlohmann::json& config, const TokenizerFiles& tokenizer) {
  std::error_code ec;
  fs::create_directories(folder, ec);
  HL_CHECK(!ec && fs::is_directory(folder), "export: cannot create folder '", folder,
           "': ", ec ? ec.message() : "not a folder");
  write_safetensors((fs::path(folder) / "model.safetensors").string(), tensors, {{"format", "pt"}});
  write_file_atomic((fs::path(folder) / "config.json").string(), config.dump(2) + "\n", "export");
  write_tokenizer_files(folder, tokenizer);
}

FolderModel DecoderFolderFormat::read(const std::string& folder) const {
  const nn::DecoderConfig c = config(folder);
  const std::unique_ptr<WeightFiles> files = open_folder_weights(folder);
  return {c.to_json(), read_weights(*files, folder, weight_map(c, folder, files.get())), "", ""};
}

void DecoderFolderFormat::write(const std::string& folder, const nn::Model& model,
                                const TokenizerFiles& tokenizer) const {
  const nn::DecoderModel& m = decoder_of(model);
  write_hf_folder(folder, weights_to_write(m, weight_map(m.config(), "", nullptr)), hf_config(m.config()), tokenizer);
}

const nn::DecoderModel& DecoderFolderFormat::decoder_of(const nn::Model& model) const {
  const auto* d = model.as_decoder();
  HL_CHECK(d && d->config().family == &family(), "export: a ", model.type_name(), " is not a ", family().model_name(),
           " (", family().arch(), " family)");
  return *d;
}

}  // namespace headlab::io
