// libFuzzer target: checkpoints that are valid HDF5 but say anything. HDF5 checksums its metadata,
// so byte flips (fuzz_checkpoint_file) rarely get past the superblock; here the input is a list of
// edits to a real checkpoint (tests/fuzz/corpus/checkpoint_file/reverse.h5): a config value or the
// whole config text, an attribute, a dataset's dtype, shape, values or name, a dataset removed or
// added. The edited checkpoint is written with io's own Writer and goes through the commands' path.
#include <fuzzer/FuzzedDataProvider.h>

#include <nlohmann/json.hpp>
#include <variant>

#include "fuzz_util.h"
#include "io/h5file.h"

using namespace headlab;
using nlohmann::json;

namespace {

struct Dataset {
  std::string name;
  io::h5::Array array;
};

struct Attribute {
  std::string object, key;
  std::variant<std::string, int64_t, double> value;
};

struct Contents {
  std::vector<Dataset> datasets;
  std::vector<Attribute> attributes;
};

const Contents& base() {
  static const Contents c = [] {
    const io::h5::Reader r(HEADLAB_SOURCE_DIR "/tests/fuzz/corpus/checkpoint_file/reverse.h5");
    Contents c;
    for (const std::string& name : r.list_datasets_recursive("/")) c.datasets.push_back({name, r.read(name)});
    for (const char* key : {"format", "config"}) c.attributes.push_back({"/", key, r.attr_str("/", key)});
    c.attributes.push_back({"/", "format_version", r.attr_i64("/", "format_version")});
    for (const char* key : {"kind", "hyperparameters"})
      c.attributes.push_back({"/optimizer", key, r.attr_str("/optimizer", key)});
    return c;
  }();
  return c;
}

// Every value's location in a JSON document, objects and arrays included.
void pointers(const json& j, const json::json_pointer& at, std::vector<json::json_pointer>& out) {
  out.push_back(at);
  if (j.is_object())
    for (const auto& [key, value] : j.items()) pointers(value, at / key, out);
  else if (j.is_array())
    for (size_t i = 0; i < j.size(); ++i) pointers(j[i], at / i, out);
}

json any_value(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange(0, 7)) {
    case 0:
      return in.ConsumeIntegralInRange<int64_t>(-4, 70);
    case 1:
      return in.ConsumeIntegral<int64_t>();
    case 2:
      return in.ConsumeFloatingPoint<double>();
    case 3:
      return in.ConsumeRandomLengthString(24);
    case 4:
      return in.ConsumeBool();
    case 5:
      return json::array({in.ConsumeIntegralInRange<int64_t>(-1, 4), in.ConsumeIntegralInRange<int64_t>(-1, 4)});
    case 6:
      return json::object();
    default:
      return nullptr;
  }
}

void edit_config(FuzzedDataProvider& in, Attribute& config) {
  const auto* text = std::get_if<std::string>(&config.value);
  if (!text || !json::accept(*text)) return;  // an earlier edit made it something else
  json j = json::parse(*text);
  std::vector<json::json_pointer> at;
  pointers(j, json::json_pointer(), at);
  const json::json_pointer p = at[in.ConsumeIntegralInRange<size_t>(0, at.size() - 1)];
  if (in.ConsumeBool() && !p.empty() && j.at(p.parent_pointer()).is_object())
    j.at(p.parent_pointer()).erase(p.back());
  else
    j[p] = any_value(in);
  config.value = j.dump(-1, ' ', false, json::error_handler_t::replace);  // fuzzed strings may not be UTF-8
}

void edit_dataset(FuzzedDataProvider& in, Contents& c) {
  if (c.datasets.empty()) return;
  const size_t i = in.ConsumeIntegralInRange<size_t>(0, c.datasets.size() - 1);
  Dataset& d = c.datasets[i];
  switch (in.ConsumeIntegralInRange(0, 4)) {
    case 0:
      c.datasets.erase(c.datasets.begin() + static_cast<std::ptrdiff_t>(i));
      return;
    case 1:
      d.name = in.ConsumeRandomLengthString(40);
      return;
    case 2: {  // another shape: rank 0..3, small dims
      d.array.shape.assign(in.ConsumeIntegralInRange<size_t>(0, 3), 0);
      for (int64_t& n : d.array.shape) n = in.ConsumeIntegralInRange<int64_t>(0, 70);
      break;
    }
    case 3:
      d.array.dtype = static_cast<io::h5::DType>(in.ConsumeIntegralInRange(0, 3));
      break;
    default: {  // new values from the input (NaN, infinities, huge steps and indices)
      const std::vector<uint8_t> bytes = in.ConsumeBytes<uint8_t>(in.ConsumeIntegralInRange<size_t>(1, 64));
      const size_t at = in.ConsumeIntegralInRange<size_t>(0, d.array.bytes.size());
      for (size_t k = 0; k < bytes.size() && at + k < d.array.bytes.size(); ++k) d.array.bytes[at + k] = bytes[k];
      return;
    }
  }
  d.array.bytes.resize(static_cast<size_t>(d.array.numel()) * io::h5::dtype_size(d.array.dtype));
}

void edit(FuzzedDataProvider& in, Contents& c) {
  switch (in.ConsumeIntegralInRange(0, 5)) {
    case 0:
    case 1:
      edit_config(in, c.attributes[1]);
      return;
    case 2:
      c.attributes[1].value = in.ConsumeRandomLengthString(200);
      return;  // any text as config
    case 3: {
      Attribute& a = c.attributes[in.ConsumeIntegralInRange<size_t>(0, c.attributes.size() - 1)];
      if (in.ConsumeBool())
        a.value = in.ConsumeRandomLengthString(60);
      else
        a.value = in.ConsumeIntegralInRange<int64_t>(-1, 3);
      return;
    }
    case 4: {  // a new dataset, often beside the real ones ("model/<name>", "optimizer/steps/<name>")
      Dataset d{in.ConsumeRandomLengthString(40), {}};
      d.array.dtype = static_cast<io::h5::DType>(in.ConsumeIntegralInRange(0, 3));
      d.array.shape = {in.ConsumeIntegralInRange<int64_t>(0, 8)};
      d.array.bytes.resize(static_cast<size_t>(d.array.numel()) * io::h5::dtype_size(d.array.dtype));
      c.datasets.push_back(std::move(d));
      return;
    }
    default:
      edit_dataset(in, c);
      return;
  }
}

// False when the Writer refuses the contents (a name HDF5 cannot hold, two datasets of one name):
// not a checkpoint the loader can ever see.
bool write(const Contents& c, const std::string& path) {
  try {
    io::h5::Writer w(path);
    for (const Dataset& d : c.datasets) w.write(d.name, d.array);
    for (const Attribute& a : c.attributes) {
      if (a.object != "/") w.create_group(a.object.substr(1));
      std::visit([&](const auto& v) { w.set_attr(a.object, a.key, v); }, a.value);
    }
    w.commit();
    return true;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  Contents c = base();
  for (int edits = 0; edits < 8 && in.remaining_bytes() > 0; ++edits) edit(in, c);
  const std::string path = fuzz::scratch_path("edited.h5");
  if (!write(c, path)) return 0;
  try {
    fuzz::exercise_checkpoint(path);
  } catch (const Error&) {}
  return 0;
}
