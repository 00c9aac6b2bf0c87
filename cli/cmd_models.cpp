// headlab tokenize / export: the Hugging Face GPT-2 layout (io/hf_gpt2.h) from the command line.
// tokenize runs a folder's byte-level BPE tokenizer; export writes a headlab GPT checkpoint as a
// GPT2LMHeadModel folder that PyTorch loads.
#include <iostream>
#include <memory>

#include "base/input_path.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "io/hf_gpt2.h"
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
    const int64_t vocab_size = io::is_hf_model_folder(folder) ? io::read_hf_gpt2_config(folder).config.vocab_size : 0;
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
  app.add_option("checkpoint", a->checkpoint, "a headlab GPT checkpoint (.h5)")->type_name(kInputFile)->required();
  app.add_option("--out", a->out, "the folder to write (config.json, model.safetensors)")
      ->type_name(kOutputDir)
      ->required();
  return [a] {
    check_input_file(a->checkpoint, "export: checkpoint", true);
    const Loaded l = load(a->checkpoint, "cpu");
    const nn::GPTModel& model = l.gpt("export");
    const io::FolderLock lock = make_locked_dir(a->out, "export");
    io::write_hf_gpt2(a->out, model);
    const nn::GPTConfig& c = model.config();
    std::cout << "export: wrote " << join_path(a->out, "config.json") << " and "
              << join_path(a->out, "model.safetensors") << " (GPT2LMHeadModel: " << c.n_layers << " layers x "
              << c.n_heads << " heads, n_embd " << c.emb_dim << ", vocabulary " << c.vocab_size << ")\n";
    if (!c.kept_heads.empty())
      std::cout << "export: the pruned heads are written as zeros at full width (" << kept_str(model)
                << " kept), so the folder computes what the pruned model computes\n";
    std::cout << "export: no tokenizer files: this checkpoint's tokenizer is headlab's " << l.task->name()
              << " vocabulary, not GPT-2's BPE\n";
    return 0;
  };
}

}  // namespace headlab::cli
