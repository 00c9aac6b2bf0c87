// headlab tokenize / convert / export: Hugging Face model folders (io/families.h: each family's format)
// from the command line. tokenize runs a folder's byte-level BPE tokenizer; convert writes a folder as a
// self-contained headlab checkpoint; export writes a headlab checkpoint as its family's folder (a GPT's:
// a GPT2LMHeadModel folder) that PyTorch loads.
#include <iostream>
#include <memory>

#include "analysis/files.h"
#include "base/input_path.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "io/families.h"
#include "io/hf_folder.h"
#include "tasks/bpe_tokenizer.h"

namespace headlab::cli {

Action add_tokenize(CLI::App& app) {
  struct Args {
    std::string model, text, prompt;
    bool show = false;
  };
  auto a = std::make_shared<Args>();
  app.add_option("model", a->model, "a folder with vocab.json and merges.txt (a Hugging Face GPT-2 folder)")
      ->type_name(kInputFolder)
      ->required();
  auto* text = app.add_option("--text", a->text, "the file to tokenize (UTF-8)")->type_name(kInputFile);
  auto* prompt = app.add_option("--prompt", a->prompt, "the text to tokenize");
  text->excludes(prompt);
  app.add_flag("--show", a->show, "print the tokens as vocab.json spells them (Ġ is a space) instead of their ids");
  return [a, text, prompt] {
    HL_CHECK(text->count() + prompt->count() == 1, "tokenize: give --text FILE or --prompt TEXT");
    check_input_folder(a->model, "tokenize: model");
    const std::string folder = a->model;
    const auto vocab_size_of = [&] {
      const io::Family& f = io::family_of_folder(folder);
      return f.model.vocab_size(f.folder->read_config(folder));
    };
    const int64_t vocab_size = io::is_hf_model_folder(folder) ? vocab_size_of() : 0;
    const tasks::BpeTokenizer tok =
        tasks::BpeTokenizer::from_files(join_path(folder, "vocab.json"), join_path(folder, "merges.txt"), vocab_size);
    const std::string input = a->text.empty() ? a->prompt : read_input_file(a->text, "tokenize: --text");
    const std::vector<int64_t> ids = tok.encode(input, a->text.empty() ? "prompt" : a->text);
    std::string line;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) line += ' ';
      line += a->show ? tok.token_string(ids[i]) : std::to_string(ids[i]);
    }
    std::cout << line << "\n";
    return 0;
  };
}

Action add_export(CLI::App& app) {
  struct Args {
    std::string checkpoint, out;
  };
  auto a = std::make_shared<Args>();
  app.add_option("checkpoint", a->checkpoint, "a headlab checkpoint (.h5) of a family with a Hugging Face format")
      ->type_name(kInputFile)
      ->required();
  app.add_option("--out", a->out, "the folder to write (config.json, model.safetensors, and the tokenizer's files)")
      ->type_name(kOutputDir)
      ->required();
  return [a] {
    const Loaded l = load("export", a->checkpoint, "cpu");
    const nn::DecoderModel& model = l.decoder("export");
    const io::Family& family = l.config.family();
    HL_CHECK(family.folder, "export: the ", family.model.arch(), " family has no Hugging Face folder format");
    const io::FolderLock lock = make_locked_dir(a->out, "export");
    const io::TokenizerFiles tokenizer = l.config.tokenizer_files();
    family.folder->write(a->out, model, tokenizer);
    std::cout << "export: wrote " << join_path(a->out, "config.json") << " and "
              << join_path(a->out, "model.safetensors") << " (" << family.folder->model_types().front() << ": "
              << l.config.describe_model() << ", vocabulary " << model.shape().vocab_size << ")\n";
    if (!model.shape().kept_heads.empty())
      std::cout << "export: the pruned heads are written as zeros at full width (" << analysis::kept_heads_text(model)
                << " kept), so the folder computes what the pruned model computes\n";
    if (tokenizer.empty())
      std::cout << "export: no tokenizer files: this checkpoint's tokenizer is headlab's " << l.task->name()
                << " vocabulary, not a byte-level BPE\n";
    else
      std::cout << "export: wrote vocab.json and merges.txt (the BPE tokenizer, from the checkpoint)\n";
    return 0;
  };
}

Action add_convert(CLI::App& app) {
  struct Args {
    std::string folder, out;
  };
  auto a = std::make_shared<Args>();
  app.add_option("model", a->folder, "a Hugging Face model folder (config.json, weights, vocab.json, merges.txt)")
      ->type_name(kInputFolder)
      ->required();
  app.add_option("--out", a->out, "the checkpoint to write (.h5)")->type_name(kOutputFile)->required();
  return [a] {
    check_input_folder(a->folder, "convert: model");
    HL_CHECK(io::is_hf_model_folder(a->folder), "convert: model '", a->folder,
             "' has no config.json: not a Hugging Face model folder");
    const Loaded l = load("convert", a->folder, "cpu");
    HL_CHECK(!l.ckpt.tokenizer.empty(), "convert: '", a->folder, "' has ", l.subword()->describe(),
             ", which a checkpoint cannot hold yet (headlab checkpoints hold GPT-2's vocab.json and merges.txt)");
    check_output_file(a->out, "convert: --out");
    io::save_checkpoint(a->out, l.ckpt);
    std::cout << "convert: wrote " << a->out << " (" << l.config.describe_model() << ", " << l.model->num_parameters()
              << " parameters, its tokenizer inside)\n";
    return 0;
  };
}

}  // namespace headlab::cli
