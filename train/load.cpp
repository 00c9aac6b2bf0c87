#include "train/load.h"

#include <filesystem>

#include "base/input_path.h"
#include "io/hf_folder.h"
#include "io/llama2c.h"
#include "tasks/chars.h"
#include "tasks/llama2c_tokenizer.h"
#include "tasks/sentencepiece_tokenizer.h"

namespace headlab::train {

namespace fs = std::filesystem;

namespace {

// What the analyses read of a pretrained model by default: one batch of 8 rows of the task "text".
void pretrained_text_task(train::RunConfig& c, std::shared_ptr<const tasks::TextTokenizer> tokenizer,
                          const std::string& text) {
  c.task.name = "text";
  c.task.options.text_path = text;
  c.task.options.subword = std::move(tokenizer);
  c.run.batch_size = 8;
  c.run.eval_batches = 1;
}

}  // namespace

FolderTokenizer folder_tokenizer(const std::string& folder, const io::FolderModel& m) {
  const auto file_in_folder = [&](const char* name) {
    const std::string p = (fs::path(folder) / name).string();
    return path_present(p) ? p : std::string();  // (the reader says what is wrong with it)
  };
  using Kind = FolderTokenizer::Kind;
  if (std::string p = file_in_folder("tokenizer.model"); !p.empty()) return {Kind::sentencepiece, p, ""};
  if (!m.vocab_path.empty() && !m.merges_path.empty()) return {Kind::gpt2_files, m.vocab_path, m.merges_path};
  if (std::string p = file_in_folder("tokenizer.json"); !p.empty())
    return {Kind::tokenizer_json, p, file_in_folder("tokenizer_config.json")};
  if (std::string p = file_in_folder("tokenizer.bin"); !p.empty()) return {Kind::llama2c, p, ""};
  return {};
}

std::shared_ptr<const tasks::TextTokenizer> FolderTokenizer::make(int64_t vocab_size) const {
  switch (kind) {
    case Kind::sentencepiece:
      return tasks::SentencePieceTokenizer::from_file(path, vocab_size);
    case Kind::gpt2_files:
      return std::make_shared<const tasks::BpeTokenizer>(tasks::BpeTokenizer::from_files(path, second, vocab_size));
    case Kind::tokenizer_json:
      return std::make_shared<const tasks::BpeTokenizer>(
          tasks::BpeTokenizer::from_tokenizer_json_file(path, vocab_size, second));
    case Kind::llama2c:
      return tasks::Llama2cTokenizer::from_file(path, vocab_size);
    case Kind::none:
      break;
  }
  HL_FAIL("tokenizer: ", describe());
}

std::string FolderTokenizer::describe() const {
  switch (kind) {
    case Kind::sentencepiece:
      return path + " (SentencePiece)";
    case Kind::gpt2_files:
      return path + ", " + second;
    case Kind::tokenizer_json:
      return path + (second.empty() ? "" : ", " + second);
    case Kind::llama2c:
      return path + " (llama2.c's)";
    case Kind::none:
      break;
  }
  return "none (no tokenizer.model, vocab.json and merges.txt, tokenizer.json or tokenizer.bin)";
}

Loaded load(const char* cmd, const std::string& path, const std::string& device, const std::string& text,
            const std::string& tokenizer) {
  Loaded l;
  if (!io::is_hf_model_folder(path) && io::is_llama2c_checkpoint(path)) {
    HL_CHECK(!tokenizer.empty(), cmd, ": '", path,
             "' is a llama2.c checkpoint; give its tokenizer with --tokenizer FILE (llama2.c's tokenizer.bin)");
    io::FolderModel m = io::read_llama2c(path);
    l.from_folder = true;
    train::RunConfig& c = l.config;
    c.model = m.config;
    pretrained_text_task(c, tasks::tokenizer_from_file(tokenizer, c.family().model.vocab_size(c.model)), text);
    l.model = io::build_folder_model(std::move(m), path);
    l.model->to(Device::parse(device));
    l.ckpt.config = c.to_json();
    l.ckpt.tokenizer = c.tokenizer_files();
    for (const auto& [name, t] : l.model->named_parameters()) l.ckpt.model.emplace_back(name, t.detach());
    l.task = c.make_task();
    return l;
  }
  if (!io::is_hf_model_folder(path)) {
    HL_CHECK(tokenizer.empty(), cmd, ": --tokenizer applies to llama2.c checkpoints and model folders; '", path,
             "' is neither (a headlab checkpoint carries its tokenizer)");
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
  // --tokenizer FILE, else the folder's (folder_tokenizer: tokenizer.model, vocab.json + merges.txt, tokenizer.json).
  using Kind = FolderTokenizer::Kind;
  const FolderTokenizer files = folder_tokenizer(path, folder);
  HL_CHECK(!tokenizer.empty() || files.kind != Kind::none, cmd, ": the folder '", path,
           "' has no tokenizer headlab reads (vocab.json and merges.txt, tokenizer.model, a byte-level BPE "
           "tokenizer.json or llama2.c's tokenizer.bin); give one with --tokenizer FILE (a SentencePiece model, "
           "llama2.c's tokenizer.bin or a tokenizer.json)");
  l.from_folder = true;
  train::RunConfig& c = l.config;
  c.model = folder.config;
  const int64_t vocab = family.model.vocab_size(folder.config);
  pretrained_text_task(c, tokenizer.empty() ? files.make(vocab) : tasks::tokenizer_from_file(tokenizer, vocab), text);
  l.model = io::build_folder_model(std::move(folder), path);
  l.model->to(Device::parse(device));
  l.ckpt.config = c.to_json();
  l.ckpt.tokenizer = c.tokenizer_files();
  for (const auto& [name, t] : l.model->named_parameters()) l.ckpt.model.emplace_back(name, t.detach());
  l.task = c.make_task();
  return l;
}

const tasks::TextTokenizer* Loaded::subword() const {
  const auto* text = dynamic_cast<const tasks::BpeTextTask*>(task.get());
  return text ? &text->subword() : nullptr;
}

nn::DecoderModel& Loaded::decoder(const char* cmd) const {
  auto* d = dynamic_cast<nn::DecoderModel*>(model.get());
  HL_CHECK(d, cmd,
           ": this command needs a GPT checkpoint (a decoder-only model, or a model folder); this one holds an ",
           config.family().model.arch(), " model");
  return *d;
}

}  // namespace headlab::train
