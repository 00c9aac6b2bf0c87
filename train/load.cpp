#include "train/load.h"

#include <filesystem>

#include "base/input_path.h"
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
  io::HfGpt2 hf = io::read_hf_gpt2(path);
  HL_CHECK(!hf.vocab_path.empty() && !hf.merges_path.empty(), cmd, ": the folder '", path,
           "' has no vocab.json and merges.txt (GPT-2's tokenizer)");
  l.from_folder = true;
  train::RunConfig& c = l.config;
  c.model = hf.config;
  c.task.name = "text";
  c.task.options.text_path = text;
  c.task.options.bpe = std::make_shared<const tasks::BpeTokenizer>(
      tasks::BpeTokenizer::from_files(hf.vocab_path, hf.merges_path, hf.config.vocab_size));
  // What the analyses read at GPT-2's scale by default: one batch of 8 rows.
  c.run.batch_size = 8;
  c.run.eval_batches = 1;
  const std::shared_ptr<nn::GPTModel> model = io::build_hf_gpt2(std::move(hf), path);
  model->to(Device::parse(device));
  l.model = model;
  l.ckpt.config = c.to_json();
  l.ckpt.tokenizer = c.tokenizer_files();
  for (const auto& [name, t] : model->named_parameters()) l.ckpt.model.emplace_back(name, t.detach());
  l.task = c.make_task();
  return l;
}

const tasks::BpeTokenizer* Loaded::bpe() const {
  const auto* text = dynamic_cast<const tasks::BpeTextTask*>(task.get());
  return text ? &text->bpe() : nullptr;
}

nn::GPTModel& Loaded::gpt(const char* cmd) const {
  auto* g = dynamic_cast<nn::GPTModel*>(model.get());
  HL_CHECK(g, cmd, ": this command needs a GPT checkpoint; this one holds an encoder-decoder");
  return *g;
}

}  // namespace headlab::train
