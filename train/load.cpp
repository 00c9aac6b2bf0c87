#include "train/load.h"

#include <filesystem>

#include "base/input_path.h"
#include "io/hf_folder.h"
#include "tasks/chars.h"

namespace headlab::train {

namespace fs = std::filesystem;

Loaded load(const char* cmd, const std::string& path, const std::string& device, const std::string& text) {
  Loaded l;
  if (!io::is_hf_model_folder(path)) {
    std::error_code ec;
    HL_CHECK(!fs::is_directory(path, ec), cmd, ": checkpoint '", path,
             "' is a folder, not a file, and has no config.json (a model folder holds config.json, "
             "model.safetensors or its shards, vocab.json and merges.txt)");
    check_input_file(path, std::string(cmd) + ": checkpoint", true);
    l.ckpt = io::load_checkpoint(path);
    l.config = train::config_of(l.ckpt, path);
    l.model = io::load_model(l.ckpt, path, Device::parse(device));
    l.task = l.config.make_task(text);
    return l;
  }
  const io::Family& family = io::family_of_folder(path);
  io::FolderModel folder = family.folder->read(path);
  HL_CHECK(!folder.vocab_path.empty() && !folder.merges_path.empty(), cmd, ": the folder '", path,
           "' has no vocab.json and merges.txt (its byte-level BPE tokenizer)");
  l.from_folder = true;
  train::RunConfig& c = l.config;
  c.model = folder.config;
  c.task.name = "text";
  c.task.options.text_path = text;
  c.task.options.bpe = std::make_shared<const tasks::BpeTokenizer>(
      tasks::BpeTokenizer::from_files(folder.vocab_path, folder.merges_path, family.model.vocab_size(folder.config)));
  // What the analyses read at GPT-2's scale by default: one batch of 8 rows.
  c.run.batch_size = 8;
  c.run.eval_batches = 1;
  l.model = io::build_folder_model(std::move(folder), path);
  l.model->to(Device::parse(device));
  l.ckpt.config = c.to_json();
  l.ckpt.tokenizer = c.tokenizer_files();
  for (const auto& [name, t] : l.model->named_parameters()) l.ckpt.model.emplace_back(name, t.detach());
  l.task = c.make_task();
  return l;
}

const tasks::BpeTokenizer* Loaded::bpe() const {
  const auto* text = dynamic_cast<const tasks::BpeTextTask*>(task.get());
  return text ? &text->bpe() : nullptr;
}

nn::DecoderModel& Loaded::decoder(const char* cmd) const {
  auto* d = dynamic_cast<nn::DecoderModel*>(model.get());
  HL_CHECK(d, cmd, ": this command needs a GPT checkpoint (a decoder-only model, or a model folder); this one holds a ",
           config.family().model.arch(), " model");
  return *d;
}

}  // namespace headlab::train
