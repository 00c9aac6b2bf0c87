// headlab attention: every head's attention weights for one input, as attention.h5 and a picture.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <sstream>

#include "analysis/analysis.h"
#include "analysis/explorer.h"
#include "backends/backend.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "io/h5file.h"
#include "nn/generate.h"
#include "train/config.h"

namespace headlab::cli {

namespace fs = std::filesystem;

namespace {

struct AttentionArgs {
  std::string path, prompt, out = ".", device = "cpu";
  int64_t max_new = -1;
  int threads = 0;
};

}  // namespace

Action add_attention(CLI::App& app) {
  auto a = std::make_shared<AttentionArgs>();
  app.add_option("checkpoint", a->path, "checkpoint file (.h5)")->required();
  app.add_option("--prompt", a->prompt, "the input: a task input (e.g. 31415) or text for chars checkpoints")
      ->required();
  app.add_option("--max-new-tokens", a->max_new,
                 "greedy tokens appended before drawing (default: a task's answer and end token; chars: 0)")
      ->check(non_negative_number());
  app.add_option("--out", a->out, "folder for attention.h5, attention.png and attention.html")->capture_default_str();
  app.add_option("--device", a->device, "cpu | cuda | cuda:N")->capture_default_str();
  app.add_option("--threads", a->threads, "CPU threads (0: all cores)")->check(non_negative_number());
  return [a] {
    set_threads(a->threads);
    const io::Checkpoint ck = io::load_checkpoint(a->path);
    std::shared_ptr<nn::GPTModel> model = io::model_from_checkpoint(ck, a->path, Device::parse(a->device));
    const std::unique_ptr<tasks::Task> task = train::RunConfig::from_json(ck.config).make_task();
    const nn::GPTConfig& cfg = model->config();
    const tasks::Prompt p = task->encode_prompt(a->prompt);
    const int64_t extra = a->max_new >= 0 ? a->max_new : (p.answer_length >= 0 ? p.answer_length + 1 : 0);
    std::vector<int64_t> ids = p.ids;
    if (static_cast<int64_t>(ids.size()) > cfg.context_length)  // as generate: the last context_length tokens
      ids.erase(ids.begin(), ids.end() - cfg.context_length);
    nn::GenerateOptions gen;
    gen.max_new_tokens = extra;
    gen.end_id = task->end_id();
    gen.keep_end = true;
    for (int64_t id : nn::generate(*model, ids, gen)) ids.push_back(id);
    if (static_cast<int64_t>(ids.size()) > cfg.context_length)  // the map shows what the model last saw
      ids.erase(ids.begin(), ids.end() - cfg.context_length);
    const analysis::AttentionMaps maps = analysis::attention_maps(*model, ids);
    std::vector<std::string> tokens;
    std::string text;
    for (int64_t id : ids) {
      tokens.push_back(task->tokenizer().decode({id}));
      text += tokens.back();
    }
    make_dir(a->out, "attention");
    const std::string h5path = join_path(a->out, "attention.h5"), png = join_path(a->out, "attention.png");
    analysis::save_attention_h5(h5path, maps, tokens, a->prompt, a->path);
    analysis::save_attention_png(png, maps, tokens);
    const std::string html = join_path(a->out, "attention.html");
    analysis::save_attention_html(html, maps, tokens, a->path + ": " + text);
    std::cout << "headlab attention: " << a->path << ", " << maps.T << " tokens: " << text << "\n"
              << cfg.n_layers << " layers, heads per layer " << kept_str(maps.kept) << "\n"
              << "wrote " << h5path << " (weights " << shape_str({maps.layers, maps.heads, maps.T, maps.T})
              << " float32, token_ids, kept; tokens as JSON in the root attribute 'tokens'), " << png << " and "
              << html << " (interactive, self-contained)\n";
    return 0;
  };
}

}  // namespace headlab::cli
