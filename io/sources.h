// Where a model comes from: one ModelSource per file format headlab reads (a headlab checkpoint, a Hugging Face
// folder, a llama2.c checkpoint, a PyTorch file), each saying whether a path is its own and reading it into headlab's terms.
// sources.cpp lists them, one line each; source_of(path) picks one, or says what the path is instead.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/families.h"
#include "tasks/tokenizer_discovery.h"

namespace headlab::io {

// What a source holds, in headlab's terms: a headlab checkpoint, or a pretrained model.
struct SourceModel {
  // A headlab checkpoint: all it holds (config, tokenizer, parameters, optimizer and trainer state), as
  // load_checkpoint reads it; the fields below stay empty.
  std::optional<Checkpoint> checkpoint;
  // A pretrained model: its family's config section and its parameters (and, from a folder, the paths of GPT-2's
  // vocab.json and merges.txt), ready for build_folder_model.
  FolderModel pretrained;
  tasks::FolderTokenizer tokenizer;  // the tokenizer files found with it (Kind::none: none found)
  // A tokenizer the file itself holds (GGUF's tokenizer.ggml.*), used where --tokenizer is not given; null: none.
  std::shared_ptr<const tasks::TextTokenizer> embedded_tokenizer;
  std::string notes;                 // what the format says beyond config and parameters ("head: tied to wte"); or ""
};

// What --tokenizer FILE means for a format's models.
enum class TokenizerOption {
  refused,    // the file carries its tokenizer (a headlab checkpoint)
  overrides,  // it replaces the tokenizer files found beside the model (a folder's)
  required,   // the format holds no tokenizer (llama2.c's checkpoints): the model loads only with one
};

class ModelSource {
 public:
  virtual ~ModelSource() = default;
  virtual std::string name() const = 0;  // "Hugging Face folder": what inspect and the errors call it
  // Whether `path` is in this format, by a cheap look (a folder's config.json, a file's signature or header); never
  // an error, and never an open() of what is not a regular file or a folder.
  virtual bool claims(const std::string& path) const = 0;
  // Everything the format holds at a path it claims; errors name the file and the item.
  virtual SourceModel read(const std::string& path) const = 0;
  // Its config section alone, the weights unread where the format allows (tokenize's vocabulary).
  virtual nlohmann::json read_config(const std::string& path) const = 0;
  virtual TokenizerOption tokenizer_option() const = 0;
};

// Every source, in the order they are asked.
const std::vector<const ModelSource*>& sources();
// The first source claiming `path`, or null: no checks and no errors (a folder of tokenizer files alone, a run's
// folder of checkpoints).
const ModelSource* source_claiming(const std::string& path);
// The source of a model path, the path checked first: a missing path, one that is neither a regular file nor a
// folder, a folder without config.json and a file no source claims are errors starting "<who> '<path>'" (who:
// "eval: checkpoint") and saying what the path is instead (a pickle torch.save did not write).
const ModelSource& source_of(const std::string& path, const std::string& who);

}  // namespace headlab::io
