// headlab tokenize / convert / export: the Hugging Face GPT-2 layout (io/hf_gpt2.h) from the command line.
// tokenize runs a folder's byte-level BPE tokenizer; convert writes a folder as a self-contained headlab
// checkpoint; export writes a headlab GPT checkpoint as a GPT2LMHeadModel folder that PyTorch loads.
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
  app.add_option("--out", a->out, "the folder to write (config.json, model.safetensors, and GPT-2's tokenizer files)")
      ->type_name(kOutputDir)
      ->required();
  return [a] {
    const Loaded l = load("export", a->checkpoint, "cpu");
    const nn::GPTModel& model = l.gpt("export");
    const io::FolderLock lock = make_locked_dir(a->out, "export");
    const io::TokenizerFiles tokenizer = l.config.tokenizer_files();
    io::write_hf_gpt2(a->out, model, tokenizer);
    const nn::GPTConfig& c = model.config();
    std::cout << "export: wrote " << join_path(a->out, "config.json") << " and "
              << join_path(a->out, "model.safetensors") << " (GPT2LMHeadModel: " << c.n_layers << " layers x "
              << c.n_heads << " heads, n_embd " << c.emb_dim << ", vocabulary " << c.vocab_size << ")\n";
    if (!c.kept_heads.empty())
      std::cout << "export: the pruned heads are written as zeros at full width (" << kept_str(model)
                << " kept), so the folder computes what the pruned model computes\n";
    if (tokenizer.empty())
      std::cout << "export: no tokenizer files: this checkpoint's tokenizer is headlab's " << l.task->name()
                << " vocabulary, not GPT-2's BPE\n";
    else
      std::cout << "export: wrote vocab.json and merges.txt (GPT-2's tokenizer, from the checkpoint)\n";
    return 0;
  };
}

Action add_convert(CLI::App& app) {
  struct Args {
    std::string folder, out;
  };
  auto a = std::make_shared<Args>();
  app.add_option("model", a->folder, "a Hugging Face GPT-2 folder (config.json, weights, vocab.json, merges.txt)")
      ->type_name(kInputFolder)
      ->required();
  app.add_option("--out", a->out, "the checkpoint to write (.h5)")->type_name(kOutputFile)->required();
  return [a] {
    check_input_folder(a->folder, "convert: model");
    HL_CHECK(io::is_hf_model_folder(a->folder), "convert: model '", a->folder,
             "' has no config.json: not a Hugging Face model folder");
    const Loaded l = load("convert", a->folder, "cpu");
    check_output_file(a->out, "convert: --out");
    io::save_checkpoint(a->out, l.ckpt);
    const nn::GPTConfig& c = l.gpt("convert").config();
    std::cout << "convert: wrote " << a->out << " (GPT-2: " << c.n_layers << " layers x " << c.n_heads
              << " heads, n_embd " << c.emb_dim << ", " << l.model->num_parameters()
              << " parameters, GPT-2's tokenizer inside)\n";
    return 0;
  };
}

}  // namespace headlab::cli
