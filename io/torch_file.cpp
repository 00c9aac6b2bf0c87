// torch.save's zip archives (see torch_file.h): the archive through libzip, its pickle through the restricted
// machine of io/torch_pickle.h, and the tensors' bytes on request.
#include "io/torch_file.h"

#include <zip.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <fstream>
#include <utility>

#include "base/error.h"
#include "base/bfloat16.h"
#include "base/float16.h"
#include "base/input_path.h"
#include "io/safetensors.h"
#include "io/torch_pickle.h"

namespace headlab::io {

namespace {

constexpr uint64_t kMaxPickleBytes = 1ull << 30;  // a state_dict's pickle is KBs to MBs; more is a lie

std::string zip_message(zip_error_t* e) { return zip_error_strerror(e); }

bool starts_with_bytes(const std::string& path, const std::string& magic) {
  if (!not_a_file_reason(path).empty()) return false;
  std::ifstream in(path, std::ios::binary);
  std::string head(magic.size(), '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  return in.gcount() == static_cast<std::streamsize>(magic.size()) && head == magic;
}

}  // namespace

// ---- the archive ----

struct TorchFile::Archive {
  zip_t* zip = nullptr;
  std::string prefix;  // "archive/": what torch.save put before data.pkl
  bool big_endian = false;
  ~Archive() {
    if (zip) zip_discard(zip);
  }
  zip_int64_t index_of(const std::string& name) const { return zip_name_locate(zip, name.c_str(), 0); }
  uint64_t size_of(zip_int64_t index) const {
    zip_stat_t st;
    zip_stat_init(&st);
    return zip_stat_index(zip, static_cast<zip_uint64_t>(index), 0, &st) == 0 && (st.valid & ZIP_STAT_SIZE) ? st.size : 0;
  }
  // n bytes of an entry from byte `at` into dst; errors name the file and the entry.
  void read(zip_int64_t index, uint64_t at, void* dst, uint64_t n, const std::string& path) const {
    const char* name = zip_get_name(zip, static_cast<zip_uint64_t>(index), 0);
    zip_file_t* f = zip_fopen_index(zip, static_cast<zip_uint64_t>(index), 0);
    HL_CHECK(f, path, ": cannot open '", name ? name : "?", "' in the archive: ", zip_strerror(zip));
    auto* out = static_cast<char*>(dst);
    bool ok = true;
    if (at > 0 && zip_fseek(f, static_cast<zip_int64_t>(at), SEEK_SET) != 0) {  // a compressed entry: read past
      std::vector<char> skip(1 << 16);
      for (uint64_t left = at; ok && left > 0;) {
        const zip_int64_t got = zip_fread(f, skip.data(), std::min<uint64_t>(left, skip.size()));
        ok = got > 0;
        left -= ok ? static_cast<uint64_t>(got) : 0;
      }
    }
    for (uint64_t done = 0; ok && done < n;) {
      const zip_int64_t got = zip_fread(f, out + done, n - done);
      ok = got > 0;
      done += ok ? static_cast<uint64_t>(got) : 0;
    }
    const std::string why = zip_file_strerror(f);
    zip_fclose(f);
    HL_CHECK(ok, path, ": '", name ? name : "?", "' in the archive cannot be read (", n, " bytes from byte ", at,
             "): ", why);
  }
};

bool TorchFile::claims(const std::string& path) {
  if (starts_with_bytes(path, std::string("\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19", 14)))
    return true;  // the legacy format's magic number, refused by name on reading
  return starts_with_bytes(path, std::string("PK\x03\x04", 4));  // a zip: the reader says what else it lacks
}

TorchFile::TorchFile(const std::string& path) : path_(path), archive_(std::make_unique<Archive>()) {
  check_input_file(path, "PyTorch file");
  HL_CHECK(!starts_with_bytes(path, std::string("\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19", 14)), path,
           ": PyTorch's legacy format (torch.save before PyTorch 1.6, or with _use_new_zipfile_serialization=False), "
           "which headlab does not read; save it again with a newer torch: torch.save(torch.load(f), f2)");
  int err = 0;
  archive_->zip = zip_open(path.c_str(), ZIP_RDONLY, &err);
  if (!archive_->zip) {
    zip_error_t e;
    zip_error_init_with_code(&e, err);
    const std::string why = zip_message(&e);
    zip_error_fini(&e);
    HL_FAIL(path, ": a PyTorch file is a zip archive as torch.save writes it, and this one cannot be read as one (",
            why, ")");
  }
  // data.pkl's folder is the archive's prefix; TorchScript's archives hold code/ and constants.pkl beside it.
  const zip_int64_t n = zip_get_num_entries(archive_->zip, 0);
  zip_int64_t pkl = -1;
  bool script = false;
  for (zip_int64_t i = 0; i < n; ++i) {
    const std::string name = zip_get_name(archive_->zip, static_cast<zip_uint64_t>(i), 0);
    const size_t slash = name.find('/');
    const std::string rest = slash == std::string::npos ? name : name.substr(slash + 1);
    if (rest == "data.pkl" && pkl < 0) pkl = i, archive_->prefix = name.substr(0, name.size() - 8);
    script = script || rest == "constants.pkl" || rest.starts_with("code/");
  }
  HL_CHECK(!script, path, ": a TorchScript archive (torch.jit.save), which headlab does not read: save the model's "
                          "state_dict with torch.save(model.state_dict(), f)");
  HL_CHECK(pkl >= 0, path, ": a zip archive without data.pkl, so not a PyTorch file (torch.save writes one)");
  const zip_int64_t order = archive_->index_of(archive_->prefix + "byteorder");
  if (order >= 0) {
    const uint64_t len = archive_->size_of(order);
    HL_CHECK(len <= 16, path, ": byteorder holds ", len, " bytes, expected \"little\" or \"big\"");
    std::string text(len, '\0');
    archive_->read(order, 0, text.data(), len, path);
    HL_CHECK(text == "little" || text == "big", path, ": byteorder says '", text, "', expected little or big");
    archive_->big_endian = text == "big";
  }
  const uint64_t pkl_size = archive_->size_of(pkl);
  HL_CHECK(pkl_size <= kMaxPickleBytes, path, ": data.pkl claims ", pkl_size, " bytes, more than a state_dict's ",
           kMaxPickleBytes, "");
  std::string bytes(pkl_size, '\0');
  archive_->read(pkl, 0, bytes.data(), pkl_size, path);
  Unpickled u = unpickle(bytes, path + ": data.pkl");
  // Every storage the tensors name is there, with the bytes the pickle says it has.
  for (const TorchStorage& s : u.storages) {
    const std::string name = archive_->prefix + "data/" + s.key;
    const zip_int64_t i = archive_->index_of(name);
    HL_CHECK(i >= 0, path, ": the pickle names storage '", s.key, "', but the archive has no ", name);
    const uint64_t want = static_cast<uint64_t>(s.numel) * static_cast<uint64_t>(s.element_size);
    HL_CHECK(archive_->size_of(i) >= want, path, ": ", name, " holds ", archive_->size_of(i), " bytes, but its ",
             s.numel, " ", s.dtype, " elements need ", want);
  }
  tensors_ = std::move(u.tensors);
  value_ = std::move(u.value);
  unbuilt_ = std::move(u.unbuilt);
}

TorchFile::~TorchFile() = default;
TorchFile::TorchFile(TorchFile&&) noexcept = default;
TorchFile& TorchFile::operator=(TorchFile&&) noexcept = default;

Tensor TorchFile::to_float(int64_t i, const std::string& name) const {
  HL_CHECK(i >= 0 && i < static_cast<int64_t>(tensors_.size()), path_, ": no tensor ", i);
  const TorchTensor& t = tensors_[static_cast<size_t>(i)];
  const zip_int64_t entry = archive_->index_of(archive_->prefix + "data/" + t.storage);
  Tensor out = Tensor::empty(t.shape);
  const int64_t numel = out.numel();
  if (numel == 0) return out;
  float* dst = out.data<float>();
  // Contiguous float32 in the machine's order: its bytes go straight into the tensor.
  bool contiguous = true;
  for (int64_t j = static_cast<int64_t>(t.shape.size()) - 1, expect = 1; j >= 0; --j) {
    const size_t u = static_cast<size_t>(j);
    contiguous = contiguous && (t.shape[u] == 1 || t.stride[u] == expect);
    expect *= t.shape[u];
  }
  const uint64_t es = static_cast<uint64_t>(t.element_size);
  if (contiguous && t.dtype == "float32" && !archive_->big_endian) {
    archive_->read(entry, static_cast<uint64_t>(t.offset) * es, dst, static_cast<uint64_t>(numel) * es,
                   path_ + ": tensor '" + name + "'");
    return out;
  }
  // Else the span it covers, then each element by its strides.
  int64_t span = 1;
  for (size_t j = 0; j < t.shape.size(); ++j) span += (t.shape[j] - 1) * t.stride[j];
  std::vector<unsigned char> raw(static_cast<size_t>(span) * es);
  archive_->read(entry, static_cast<uint64_t>(t.offset) * es, raw.data(), raw.size(), path_ + ": tensor '" + name + "'");
  if (archive_->big_endian)
    for (size_t at = 0; at < raw.size(); at += es) std::reverse(raw.begin() + static_cast<std::ptrdiff_t>(at),
                                                                raw.begin() + static_cast<std::ptrdiff_t>(at + es));
  const auto element = [&](int64_t k) -> float {
    const unsigned char* p = raw.data() + static_cast<size_t>(k) * es;
    const std::string& d = t.dtype;
    if (d == "float32") return std::bit_cast<float>(*reinterpret_cast<const uint32_t*>(p));
    if (d == "float64") return static_cast<float>(std::bit_cast<double>(*reinterpret_cast<const uint64_t*>(p)));
    if (d == "float16") return float_from_f16(*reinterpret_cast<const uint16_t*>(p));
    if (d == "bfloat16") return float_from_bf16(*reinterpret_cast<const uint16_t*>(p));
    if (d == "int64") return static_cast<float>(*reinterpret_cast<const int64_t*>(p));
    if (d == "int32") return static_cast<float>(*reinterpret_cast<const int32_t*>(p));
    if (d == "int16") return static_cast<float>(*reinterpret_cast<const int16_t*>(p));
    if (d == "int8") return static_cast<float>(*reinterpret_cast<const int8_t*>(p));
    return static_cast<float>(*p);  // uint8, bool
  };
  std::vector<int64_t> index(t.shape.size(), 0);
  for (int64_t k = 0; k < numel; ++k) {
    int64_t at = 0;
    for (size_t j = 0; j < index.size(); ++j) at += index[j] * t.stride[j];
    dst[k] = element(at);
    for (size_t j = index.size(); j-- > 0;) {  // the next index, last dimension fastest
      if (++index[j] < t.shape[j]) break;
      index[j] = 0;
    }
  }
  return out;
}

int64_t torch_tensor_index(const nlohmann::ordered_json& v) {
  if (!v.is_object() || v.size() != 1 || !v.contains("__tensor__")) return -1;
  return v.at("__tensor__").get<int64_t>();
}

std::string torch_unbuilt_object(const nlohmann::ordered_json& v) {
  if (v.is_object() && v.size() == 1 && v.contains("__object__")) return v.at("__object__").get<std::string>();
  if (v.is_structured())
    for (const auto& x : v) {
      const std::string name = torch_unbuilt_object(x);
      if (!name.empty()) return name;
    }
  return "";
}

}  // namespace headlab::io
