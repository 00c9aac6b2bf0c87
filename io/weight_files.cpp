// Weights by name over safetensors files and PyTorch files, one file or shards (see weight_files.h).
#include "io/weight_files.h"

#include <filesystem>
#include <map>

#include "base/error.h"
#include "base/input_path.h"
#include "base/json_fields.h"
#include "base/json_text.h"
#include "base/sizes.h"
#include "io/safetensors.h"
#include "io/torch_file.h"

namespace headlab::io {

namespace {

namespace fs = std::filesystem;

class SafetensorsWeights final : public WeightFiles {
 public:
  explicit SafetensorsWeights(const std::string& path) : st_(SafetensorsModel::open(path)) {}
  std::vector<std::string> names() const override { return st_.names(); }
  bool contains(const std::string& name) const override { return st_.contains(name); }
  Shape shape(const std::string& name) const override { return st_.file_of(name).entry(name).shape; }
  std::string file_of(const std::string& name) const override { return st_.file_of(name).path(); }
  Tensor to_float(const std::string& name) const override { return st_.to_float(name); }

 private:
  SafetensorsModel st_;
};

class TorchWeights final : public WeightFiles {
 public:
  void add(std::shared_ptr<const TorchFile> file, const TorchStateDict& sd, const std::string& index_file = "") {
    files_.push_back(std::move(file));
    for (const auto& [name, i] : sd.tensors) {
      const bool fresh = where_.emplace(name, std::make_pair(files_.size() - 1, i)).second;
      HL_CHECK(fresh, index_file.empty() ? files_.back()->path() : index_file, ": tensor '", name,
               "' is saved twice");
    }
  }
  std::vector<std::string> names() const override {
    std::vector<std::string> out;
    for (const auto& [name, at] : where_) out.push_back(name);
    return out;
  }
  bool contains(const std::string& name) const override { return where_.count(name) != 0; }
  Shape shape(const std::string& name) const override {
    const auto [f, i] = at(name);
    return files_[f]->tensors()[static_cast<size_t>(i)].shape;
  }
  std::string file_of(const std::string& name) const override { return files_[at(name).first]->path(); }
  Tensor to_float(const std::string& name) const override {
    const auto [f, i] = at(name);
    return files_[f]->to_float(i, name);
  }
  // Every tensor the index lists for file `file` is in it.
  void check_listed(size_t file, const std::vector<std::string>& listed, const std::string& index_file) const {
    for (const std::string& name : listed) {
      const auto it = where_.find(name);
      HL_CHECK(it != where_.end() && it->second.first == file, index_file, ": weight_map puts tensor '", name,
               "' in ", fs::path(files_[file]->path()).filename().string(), ", which has no such tensor");
    }
  }

 private:
  std::pair<size_t, int64_t> at(const std::string& name) const {
    const auto it = where_.find(name);
    HL_CHECK(it != where_.end(), files_.empty() ? std::string("weights") : files_[0]->path(), ": no tensor '", name,
             "' (", where_.size(), " tensors)");
    return it->second;
  }
  std::vector<std::shared_ptr<const TorchFile>> files_;
  std::map<std::string, std::pair<size_t, int64_t>> where_;  // name -> (file, tensor index)
};

bool is_state_dict(const nlohmann::ordered_json& v) {
  if (!v.is_object() || v.empty()) return false;
  size_t tensors = 0;
  for (const auto& [k, x] : v.items()) tensors += torch_tensor_index(x) >= 0;
  return tensors * 2 >= v.size();  // mostly tensors: a state_dict with a stray value is named below
}

std::string keys_of(const nlohmann::ordered_json& v) {
  std::string out;
  size_t n = 0;
  for (const auto& [k, x] : v.items()) {
    if (n++ == 12) return out + ", ...";
    out += (out.empty() ? "" : ", ") + k;
  }
  return out;
}

// The prefix every name carries, of those torch.compile ("_orig_mod.") and DataParallel ("module.") add.
std::string common_prefix(const std::vector<std::pair<std::string, int64_t>>& tensors) {
  for (const char* prefix : {"_orig_mod.", "module."}) {
    bool all = !tensors.empty();
    for (const auto& [name, i] : tensors) all = all && name.starts_with(prefix);
    if (all) return prefix;
  }
  return "";
}

}  // namespace

TorchStateDict find_state_dict(const TorchFile& file) {
  const nlohmann::ordered_json& v = file.value();
  TorchStateDict sd;
  const nlohmann::ordered_json* dict = nullptr;
  if (is_state_dict(v)) {
    dict = &v;
  } else if (v.is_object()) {
    for (const char* key : {"model", "state_dict", "model_state_dict", "module"})
      if (v.contains(key) && is_state_dict(v.at(key))) {
        dict = &v.at(key), sd.key = key;
        break;
      }
  }
  if (!dict) {
    const std::string object = torch_unbuilt_object(v);
    HL_CHECK(!(v.is_object() && v.contains("__object__")), file.path(), ": the file saves an object of ", object,
             ", which headlab does not build (it runs no code from a file): save the model's state_dict instead, "
             "torch.save(model.state_dict(), f)");
    HL_FAIL(file.path(), ": no state_dict found (a dict of parameter names to tensors, itself or under \"model\", "
                         "\"state_dict\", \"model_state_dict\" or \"module\"); the file holds ",
            v.is_object() ? "a dict of " + keys_of(v) : std::string("a ") + v.type_name(),
            object.empty() ? "" : " and an object of " + object + ", which headlab does not build (it runs no code from a file)");
  }
  for (const auto& [name, x] : dict->items()) {
    const int64_t i = torch_tensor_index(x);
    if (i >= 0) {
      sd.tensors.emplace_back(name, i);
      continue;
    }
    const std::string object = torch_unbuilt_object(x);
    HL_FAIL(file.path(), ": state_dict entry '", name, "' is ",
            object.empty() ? "not a tensor (" + x.dump() + ")"
                           : "an object of " + object + ", which headlab does not build (it runs no code from a file)");
  }
  const std::string prefix = common_prefix(sd.tensors);
  for (auto& [name, i] : sd.tensors) name = name.substr(prefix.size());
  return sd;
}

std::unique_ptr<WeightFiles> torch_weights(std::shared_ptr<const TorchFile> file, const TorchStateDict& sd) {
  auto w = std::make_unique<TorchWeights>();
  w->add(std::move(file), sd);
  return w;
}

std::unique_ptr<WeightFiles> open_folder_weights(const std::string& folder) {
  const fs::path f(folder);
  for (const char* name : {"model.safetensors", "model.safetensors.index.json"})
    if (path_present((f / name).string())) return std::make_unique<SafetensorsWeights>(folder);
  const std::string single = (f / "pytorch_model.bin").string(), index = (f / "pytorch_model.bin.index.json").string();
  if (path_present(single)) {
    auto file = std::make_shared<const TorchFile>(single);
    return torch_weights(file, find_state_dict(*file));
  }
  HL_CHECK(path_present(index), folder,
           ": holds neither model.safetensors, model.safetensors.index.json, pytorch_model.bin nor "
           "pytorch_model.bin.index.json");
  // Shards: the index names each tensor's file, beside it; every listed tensor must be in the file it names.
  const nlohmann::json j = parse_json_text(read_whole_file(index, WholeFile::config, "PyTorch index"), index);
  HL_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), index,
           ": expected an object with a \"weight_map\" object of tensor name -> shard file");
  std::map<std::string, std::vector<std::string>> listed;  // shard -> its tensors
  for (const auto& [name, shard] : j["weight_map"].items()) {
    HL_CHECK(shard.is_string(), index, ": weight_map's tensor '", name, "' names ", json_text(shard),
             ", expected a shard file name");
    const std::string s = shard.get<std::string>();
    HL_CHECK(!s.empty() && s.find('/') == std::string::npos && s != "." && s != "..", index, ": weight_map's tensor '",
             name, "' names ", json_text(shard), ", expected a file name in the index's folder");
    listed[s].push_back(name);
  }
  auto w = std::make_unique<TorchWeights>();
  size_t k = 0;
  for (const auto& [shard, names] : listed) {
    auto file = std::make_shared<const TorchFile>((f / shard).string());
    w->add(file, find_state_dict(*file), index);
    w->check_listed(k++, names, index);
  }
  return w;
}

}  // namespace headlab::io
