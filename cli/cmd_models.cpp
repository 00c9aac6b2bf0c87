// headlab tokenize / convert / export: pretrained models' files (io/families.h: each family's format) from the
// command line. tokenize runs a model's subword tokenizer (a folder's, a checkpoint's or --tokenizer); convert
// writes a Hugging Face folder or a llama2.c checkpoint as a self-contained headlab checkpoint, its tokenizer's
// files inside; export writes a headlab checkpoint as its family's folder (a GPT's: a GPT2LMHeadModel folder;
// a llama's: a LlamaForCausalLM folder) that PyTorch loads, its tokenizer's files beside.
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>

#include "analysis/files.h"
#include "base/input_path.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "io/atomic_file.h"
#include "io/families.h"
#include "io/sources.h"
#include "nn/layers.h"
#include "tasks/bpe_tokenizer.h"
#include "tasks/sentencepiece_tokenizer.h"
#include "tasks/tokenizer_discovery.h"

namespace headlab::cli {

namespace fs = std::filesystem;

Action add_tokenize(CLI::App& app) {
  struct Args {
    std::string model, tokenizer, text, prompt;
    bool show = false, no_bos = false;
  };
  auto a = std::make_shared<Args>();
  add_model_argument(app, a->model, a->tokenizer);  // or a folder of tokenizer files alone
  auto* text = app.add_option("--text", a->text, "the file to tokenize (UTF-8)")->type_name(kInputFile);
  auto* prompt = app.add_option("--prompt", a->prompt, "the text to tokenize");
  text->excludes(prompt);
  app.add_flag("--show", a->show, "print the tokens as text instead of their ids (GPT-2's as vocab.json spells them)");
  app.add_flag("--no-bos", a->no_bos, "leave out the BOS a prompt starts with (SentencePiece LLaMA models: <s>)");
  return [a, text, prompt] {
    HL_CHECK(text->count() + prompt->count() == 1, "tokenize: give --text FILE or --prompt TEXT");
    const std::string input = a->text.empty() ? a->prompt : read_input_file(a->text, "tokenize: --text");
    // A folder (a model's, or tokenizer files alone): its config.json's vocabulary and its tokenizer files, the
    // weights unread; a checkpoint file: loaded.
    std::shared_ptr<const tasks::TextTokenizer> alone;
    std::optional<Loaded> l;
    std::error_code ec;
    if (fs::is_directory(a->model, ec)) {
      int64_t vocab = 0;
      if (const io::ModelSource* source = io::source_claiming(a->model)) {  // a model's folder: its config.json
        const nlohmann::json section = source->read_config(a->model);
        vocab = io::family_of(section).model.vocab_size(section);
      }
      std::string vocab_path, merges_path;
      for (auto [name, where] : {std::pair{"vocab.json", &vocab_path}, std::pair{"merges.txt", &merges_path}})
        if (fs::exists(fs::path(a->model) / name, ec)) *where = (fs::path(a->model) / name).string();
      const tasks::FolderTokenizer found = tasks::folder_tokenizer(a->model, vocab_path, merges_path);
      HL_CHECK(!a->tokenizer.empty() || found.kind != tasks::FolderTokenizer::Kind::none, "tokenize: '", a->model,
               "' has no tokenizer: ", found.describe());
      alone = a->tokenizer.empty() ? found.make(vocab) : tasks::tokenizer_from_file(a->tokenizer, vocab);
    } else {
      l.emplace(load("tokenize", a->model, "cpu", "", a->tokenizer));
    }
    const tasks::TextTokenizer* tok = alone ? alone.get() : l->subword();
    HL_CHECK(tok, "tokenize: '", a->model, "' has the ", l->task->name(),
             " task's own tokenizer, not a subword one (tokenize reads pretrained models and their checkpoints)");
    const std::vector<int64_t> ids = tok->encode_prompt(input, !a->no_bos, a->text.empty() ? "prompt" : a->text);
    const auto* bpe = dynamic_cast<const tasks::BpeTokenizer*>(tok);
    std::string line;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) line += ' ';
      line += !a->show                        ? std::to_string(ids[i])
              : bpe && ids[i] < bpe->tokens() ? bpe->token_string(ids[i])
                                              : tok->token_text(ids[i]);
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
    io::AtomicFolder folder(a->out, "export");  // locked; written whole, then swapped in
    const io::TokenizerFiles tokenizer = l.config.tokenizer_files();
    family.folder->write(folder.temp_path(), model, tokenizer);
    folder.commit();
    std::cout << "export: wrote " << join_path(a->out, "config.json") << " and "
              << join_path(a->out, "model.safetensors") << " (" << family.folder->model_types().front() << ": "
              << l.config.describe_model() << ", vocabulary " << model.shape().vocab_size << ")\n";
    if (!model.shape().kept_heads.empty())
      std::cout << "export: the pruned heads are written as zeros at full width (" << analysis::kept_heads_text(model)
                << " kept), so the folder computes what the pruned model computes\n";
    if (tokenizer.empty()) {
      std::cout << "export: no tokenizer files: this checkpoint's tokenizer is headlab's " << l.task->name()
                << " vocabulary, not a subword tokenizer's\n";
    } else {
      std::string names;
      for (const auto& [name, bytes] : tokenizer.files) names.append(names.empty() ? "" : " and ").append(name);
      std::cout << "export: wrote " << names << " (" << l.subword()->describe() << ", from the checkpoint)\n";
    }
    return 0;
  };
}

Action add_convert(CLI::App& app) {
  struct Args {
    std::string model, tokenizer, out, dtype = "float32";
    bool overwrite = false;
  };
  auto a = std::make_shared<Args>();
  add_model_argument(app, a->model, a->tokenizer);
  app.add_option("--out", a->out, "the checkpoint to write (.h5)")->type_name(kOutputFile)->required();
  app.add_option("--dtype", a->dtype,
                 "q8_0, q4_k: the decoder's linear weights (a tied head too) written as ggml's blocks, which every "
                 "command then reads as they are (about a quarter, an eighth of float32's bytes); float32: as read "
                 "(a quantized GGUF file's blocks stay blocks)")
      ->check(CLI::IsMember({"float32", "q8_0", "q4_k"}))
      ->capture_default_str();
  app.add_flag("--overwrite", a->overwrite, "replace --out if it exists (without it, convert refuses)");
  return [a] {
    check_output_file(a->out, "convert: --out");
    // The folder of --out is locked as every writer's is (a train run there holds it).
    const std::string folder = std::filesystem::path(a->out).parent_path().string();
    const io::FolderLock lock = make_locked_dir(folder.empty() ? "." : folder, "convert");
    HL_CHECK(a->overwrite || !std::filesystem::exists(a->out), "convert: --out '", a->out,
             "' exists; replace it with --overwrite, or choose another name");
    const Loaded l = load("convert", a->model, "cpu", "", a->tokenizer);
    HL_CHECK(l.from_folder, "convert: '", a->model,
             "' is a headlab checkpoint already (convert reads Hugging Face folders and llama2.c checkpoints)");
    io::Checkpoint ckpt = l.ckpt;
    if (a->dtype != "float32") {
      HL_CHECK(l.model->as_decoder(), "convert: --dtype ", a->dtype, " takes a decoder model, not ", a->model);
      nn::to_quantized_weights(*l.model, a->dtype == "q8_0" ? DType::q8_0 : DType::q4_k);
      ckpt.model = l.model->named_parameters();
    }
    io::save_checkpoint(a->out, ckpt);
    std::cout << "convert: wrote " << a->out << " (" << l.config.describe_model() << ", " << l.model->num_parameters()
              << " parameters, " << l.subword()->describe() << " inside)\n";
    return 0;
  };
}

}  // namespace headlab::cli
