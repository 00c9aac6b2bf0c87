// load(): the path's source (io/sources.h) asked once, and what it read turned into a model with its task: a
// headlab checkpoint as it was trained, a pretrained model as a checkpoint of the task "text".
#include "loader/load.h"

#include <utility>

#include "base/error.h"
#include "io/sources.h"
#include "tasks/chars.h"
#include "tasks/sentencepiece_tokenizer.h"

namespace headlab::loader {

namespace {

// An encoder's masked share of the text, BERT's 15%.
constexpr double kMaskedLmProb = 0.15;

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

Loaded load(const char* cmd, const std::string& path, const std::string& device, const std::string& text,
            const std::string& tokenizer) {
  const io::ModelSource& source = io::source_of(path, std::string(cmd) + ": checkpoint");
  // --tokenizer before anything is read: a llama2.c file needs one, a headlab checkpoint carries its own.
  const io::TokenizerOption option = source.tokenizer_option();
  HL_CHECK(!tokenizer.empty() || option != io::TokenizerOption::required, cmd, ": '", path, "' is a ", source.name(),
           "; give its tokenizer with --tokenizer FILE (llama2.c's tokenizer.bin)");
  HL_CHECK(tokenizer.empty() || option != io::TokenizerOption::refused, cmd,
           ": --tokenizer applies to llama2.c checkpoints and model folders; '", path,
           "' is neither (a headlab checkpoint carries its tokenizer)");
  io::SourceModel contents = source.read(path);
  Loaded l;
  if (contents.checkpoint) {
    l.ckpt = std::move(*contents.checkpoint);
    l.config = train::config_of(l.ckpt, path);
    l.model = io::adopt_model(l.ckpt, path, Device::parse(device));
    l.task = l.config.make_task(text);
    return l;
  }
  // A pretrained model: --tokenizer FILE, else the files found with it (a folder's: tasks/tokenizer_discovery.h).
  const tasks::FolderTokenizer& found = contents.tokenizer;
  const bool has_own = found.kind != tasks::FolderTokenizer::Kind::none || contents.embedded_tokenizer;
  HL_CHECK(!tokenizer.empty() || has_own, cmd, ": the ", source.name(), " '", path,
           "' has no tokenizer headlab reads (vocab.json and merges.txt, tokenizer.model, a byte-level BPE or "
           "WordPiece tokenizer.json, BERT's vocab.txt, llama2.c's tokenizer.bin, or a GGUF file's own); give one "
           "with --tokenizer FILE (a SentencePiece model, llama2.c's tokenizer.bin or a tokenizer.json)");
  l.from_folder = true;
  train::RunConfig& c = l.config;
  c.model = contents.pretrained.config;
  const int64_t vocab = c.family().model.vocab_size(c.model);
  std::shared_ptr<const tasks::TextTokenizer> tok = !tokenizer.empty() ? tasks::tokenizer_from_file(tokenizer, vocab)
                                                    : contents.embedded_tokenizer ? contents.embedded_tokenizer
                                                                                  : found.make(vocab);
  pretrained_text_task(c, std::move(tok), text);
  l.model = io::build_folder_model(std::move(contents.pretrained), path);
  if (const nn::DecoderModel* d = l.model->as_decoder(); d && !d->shape().causal)
    c.task.options.mask_prob = kMaskedLmProb;  // an encoder is scored on what it predicts: masked tokens
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
  auto* d = model->as_decoder();
  HL_CHECK(d, cmd,
           ": this command needs a decoder-only model (GPT, LLaMA, GPT-NeoX: a checkpoint, model folder or file); this "
           "one holds an ",
           config.family().model.arch(), " model");
  return *d;
}

}  // namespace headlab::loader
