// llama2.c's checkpoint formats: the header checked field by field, the weights read into tensors in the
// order the format lays them out.
#include "io/llama2c.h"

#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "base/error.h"
#include "nn/decoder_family.h"

namespace headlab::io {

namespace {

constexpr uint32_t kMagic = 0x616b3432;  // "ak42"
constexpr int64_t kV1Header = 256;

struct Header {
  int64_t dim = 0, hidden = 0, layers = 0, heads = 0, kv_heads = 0, vocab = 0, seq_len = 0;
  bool shared_classifier = true;
  int version = 0;  // 0: legacy
  int64_t weights_at = 0;
};

// Bytes of float32 weights the header claims, as a double (absurd sizes must not overflow).
double weight_bytes(const Header& h) {
  const double d = static_cast<double>(h.dim), F = static_cast<double>(h.hidden), L = static_cast<double>(h.layers),
               V = static_cast<double>(h.vocab),
               kv = d * static_cast<double>(h.kv_heads) / static_cast<double>(h.heads),
               hs = d / static_cast<double>(h.heads);
  double floats = V * d + L * (2 * d + 2 * d * d + 2 * kv * d + 3 * F * d) + d;
  if (h.version == 0) floats += static_cast<double>(h.seq_len) * hs;  // freq_cis_real and _imag, (seq_len, hs/2) each
  if (!h.shared_classifier) floats += V * d;
  return 4 * floats;
}

// The header, or why the file is not a llama2.c checkpoint (empty header.dim).
Header read_header(std::ifstream& in, int64_t file_size, std::string& why_not) {
  Header h;
  std::array<int32_t, 9> w{};
  in.read(reinterpret_cast<char*>(w.data()), sizeof(w));
  if (in.gcount() < static_cast<std::streamsize>(7 * sizeof(int32_t))) {
    why_not = "is shorter than a llama2.c header (28 bytes)";
    return {};
  }
  size_t at = 0;
  if (static_cast<uint32_t>(w[0]) == kMagic) {
    if (w[1] != 1) {
      why_not = "has llama2.c's magic but version " + std::to_string(w[1]) + " (headlab reads version 1, float32)";
      return {};
    }
    h.version = 1;
    at = 2;
    h.weights_at = kV1Header;
  } else {
    h.weights_at = 28;
  }
  h.dim = w[at], h.hidden = w[at + 1], h.layers = w[at + 2], h.heads = w[at + 3], h.kv_heads = w[at + 4];
  h.vocab = w[at + 5], h.seq_len = w[at + 6];
  if (h.version == 1) {
    in.seekg(36);
    char shared = 0;
    in.read(&shared, 1);
    h.shared_classifier = shared != 0;
  } else {
    h.shared_classifier = h.vocab > 0;
    h.vocab = h.vocab < 0 ? -h.vocab : h.vocab;
  }
  const std::pair<const char*, int64_t> fields[] = {
      {"dim", h.dim},        {"hidden_dim", h.hidden},   {"n_layers", h.layers},
      {"n_heads", h.heads},  {"n_kv_heads", h.kv_heads}, {"vocab_size", h.vocab},
      {"seq_len", h.seq_len}};
  for (const auto& [name, v] : fields)
    if (v <= 0) {
      why_not = std::string("has header field ") + name + " = " + std::to_string(v) + " (expected positive)";
      return {};
    }
  if (h.dim % h.heads != 0 || h.heads % h.kv_heads != 0 || (h.dim / h.heads) % 2 != 0) {
    why_not = "has dim " + std::to_string(h.dim) + ", n_heads " + std::to_string(h.heads) + ", n_kv_heads " +
              std::to_string(h.kv_heads) +
              ": n_heads must divide dim into even head sizes, and n_kv_heads must divide n_heads";
    return {};
  }
  const double want = static_cast<double>(h.weights_at) + weight_bytes(h);
  if (want != static_cast<double>(file_size)) {
    std::ostringstream os;
    os << std::fixed << std::setprecision(0) << "has a header whose sizes need " << want << " bytes, but the file has "
       << file_size;
    why_not = os.str();
    return {};
  }
  return h;
}

int64_t file_size_of(const std::string& path) {
  std::error_code ec;
  const auto n = std::filesystem::file_size(path, ec);
  return ec ? -1 : static_cast<int64_t>(n);
}

}  // namespace

bool is_llama2c_checkpoint(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  std::ifstream in(path, std::ios::binary);
  std::string why_not;
  return in && read_header(in, file_size_of(path), why_not).dim > 0;
}

FolderModel read_llama2c(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  HL_CHECK(in, "llama2.c checkpoint '", path, "': cannot be opened for reading");
  std::string why_not;
  const Header h = read_header(in, file_size_of(path), why_not);
  HL_CHECK(h.dim > 0, "llama2.c checkpoint '", path, "' ", why_not);

  nn::DecoderConfig c = nn::llama_family().config();
  c.vocab_size = h.vocab, c.context_length = h.seq_len, c.emb_dim = h.dim, c.n_heads = h.heads;
  c.n_kv_heads = h.kv_heads, c.n_layers = h.layers, c.hidden_dim = h.hidden;
  c.norm_eps = 1e-5, c.rope_theta = 10000.0, c.rope_interleaved = true, c.tie_embeddings = h.shared_classifier;
  c.validate();

  FolderModel m;
  m.config = c.to_json();
  in.seekg(h.weights_at);
  const int64_t d = h.dim, F = h.hidden, kv = h.dim / h.heads * h.kv_heads;
  const auto next = [&](const std::string& name, Shape shape) {
    Tensor t = Tensor::empty(shape, DType::f32);
    in.read(static_cast<char*>(t.raw_data()), static_cast<std::streamsize>(t.numel() * 4));
    HL_CHECK(in, "llama2.c checkpoint '", path, "': the file ends inside ", name);
    m.parameters.emplace_back(name, t);
  };
  const auto per_layer = [&](const char* name, Shape shape) {
    for (int64_t l = 0; l < h.layers; ++l) next("trf_blocks." + std::to_string(l) + "." + name, shape);
  };
  const auto attention = [&] {
    per_layer("att.W_query.weight", {d, d});
    per_layer("att.W_key.weight", {kv, d});
    per_layer("att.W_value.weight", {kv, d});
    per_layer("att.out_proj.weight", {d, d});
  };
  const auto feed_forward = [&] {  // w1 the gate (fc1), w2 the down projection (fc3), w3 the up (fc2)
    per_layer("ff.fc1.weight", {F, d});
    per_layer("ff.fc3.weight", {d, F});
    per_layer("ff.fc2.weight", {F, d});
  };
  if (h.version == 0) {
    next("tok_emb.weight", {h.vocab, d});
    per_layer("norm1.weight", {d});
    attention();
    per_layer("norm2.weight", {d});
    feed_forward();
    next("final_norm.weight", {d});
    in.seekg(static_cast<std::streamoff>(h.seq_len * (d / h.heads) * 4), std::ios::cur);  // the unused freq_cis
  } else {
    per_layer("norm1.weight", {d});
    per_layer("norm2.weight", {d});
    next("final_norm.weight", {d});
    next("tok_emb.weight", {h.vocab, d});
    attention();
    feed_forward();
  }
  if (!h.shared_classifier) next("out_head.weight", {h.vocab, d});
  return m;
}

}  // namespace headlab::io
