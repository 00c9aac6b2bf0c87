// headlab attention: every head's attention weights for one input, as attention.h5 and a picture.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
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
#include "base/input_path.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "io/h5file.h"
#include "nn/generate.h"
#include "train/config.h"
#include "train/memory.h"

namespace headlab::cli {

namespace fs = std::filesystem;

namespace {

struct AttentionArgs {
  std::string path, tokenizer, prompt, out, device = "cpu";
  int64_t max_new = -1;
  int threads = 0;
};

// What a decoder's attention page needs of its tokenizer (a task's, or a model folder's BPE).
struct DecoderTokens {
  std::vector<int64_t> prompt;
  int64_t answer_length = -1;  // a task answer's length; -1: open-ended text
  int64_t end_id = -1;
  std::function<std::string(int64_t)> text;  // one token as text
};

// A decoder: the prompt and its greedy continuation, one kind of attention.
int decoder_attention(const AttentionArgs& a, const Loaded& l, const DecoderTokens& t) {
  nn::DecoderModel& model = l.decoder("attention");
  const nn::DecoderShape& cfg = model.shape();
  const int64_t extra = a.max_new >= 0 ? a.max_new : (t.answer_length >= 0 ? t.answer_length + 1 : 0);
  HL_CHECK(!t.prompt.empty(), "attention: the prompt is empty; give at least one character");
  HL_CHECK(static_cast<int64_t>(t.prompt.size()) <= cfg.context_length, "attention: the prompt is ", t.prompt.size(),
           " tokens, longer than the model's context of ", cfg.context_length,
           "; shorten it (the map would show only its last ", cfg.context_length, " tokens)");
  // The generation, then a forward over the last window of T tokens keeping its maps: (layers, heads, T, T)
  // floats, twice (the weights and the file's copy).
  const int64_t T = std::min<int64_t>(static_cast<int64_t>(t.prompt.size()) + extra, cfg.context_length);
  const double map_bytes = 2.0 * 4 * static_cast<double>(cfg.n_layers) * static_cast<double>(cfg.n_heads) *
                               static_cast<double>(T) * static_cast<double>(T) +
                           train::estimate_memory(l.config.model, 1, T, false, 0).activations;
  train::check_generation_fits(l.config.model, model.device().is_cuda(), static_cast<int64_t>(t.prompt.size()), extra,
                               nn::GenerateOptions{}.prefill_chunk, "attention", map_bytes);
  std::vector<int64_t> ids = t.prompt;
  if (!cfg.causal) {  // an encoder continues nothing: the maps are the prompt's ([CLS] ... [SEP])
    HL_CHECK(a.max_new <= 0, "attention: --max-new-tokens: '", a.path,
             "' is an encoder, which does not generate; its maps are the prompt's");
  } else {
    nn::GenerateOptions gen;
    gen.max_new_tokens = extra;
    gen.end_id = t.end_id;
    gen.keep_end = true;
    for (int64_t id : nn::generate(model, ids, gen)) ids.push_back(id);
  }
  const int64_t dropped = std::max<int64_t>(0, static_cast<int64_t>(ids.size()) - cfg.context_length);
  ids.erase(ids.begin(), ids.begin() + dropped);  // the map shows what the model last saw
  const analysis::AttentionMaps maps = analysis::attention_maps(model, ids);
  std::vector<std::string> tokens;
  std::string text;
  for (int64_t id : ids) {
    tokens.push_back(t.text(id));
    text += tokens.back();
  }
  const io::FolderLock lock = make_locked_dir(a.out, "attention");
  const std::string h5path = join_path(a.out, "attention.h5"), png = join_path(a.out, "attention.png");
  analysis::save_attention_h5(h5path, maps, tokens, a.prompt, a.path);
  analysis::save_attention_png(png, maps, tokens);
  const std::string html = join_path(a.out, "attention.html");
  analysis::save_attention_html(html, maps, tokens, a.path + ": " + text);
  std::cout << "headlab attention: " << a.path << ", " << maps.T << " tokens: " << text << "\n"
            << cfg.n_layers << " layers, heads per layer " << analysis::kept_heads_text(maps.kept) << "\n"
            << "wrote " << h5path << " (weights " << shape_str({maps.layers, maps.heads, maps.T, maps.T})
            << " float32, token_ids, kept; tokens as JSON in the root attribute 'tokens'), " << png << " and " << html
            << " (interactive, self-contained)\n";
  if (dropped > 0)
    std::cout << "the continuation filled the context of " << cfg.context_length << ": the maps show the last "
              << cfg.context_length << " tokens, without the first " << dropped << " of the prompt\n";
  return 0;
}

// An encoder-decoder: the prompt as the source, decoded greedily; the decoder's input (bos and the decoded
// tokens) teacher forced, and its three kinds of attention: one file, one page, a picture each.
int seq2seq_attention(const AttentionArgs& a, const Loaded& l, nn::EncoderDecoder& model) {
  const tasks::Seq2SeqTask& task = *l.seq2seq_task();
  const std::vector<int64_t> src = task.encode_source(a.prompt);
  const int64_t S = static_cast<int64_t>(src.size());
  const int64_t max_steps = std::min<int64_t>(a.max_new >= 0 ? a.max_new : 64, model.config().max_len - 1);
  const std::vector<int64_t> decoded = nn::greedy_decode(model, tensor(src, {1, S}).to(model.device()),
                                                         tensor(std::vector<int64_t>{S}, {1}).to(model.device()),
                                                         task.bos_id(), task.end_id(), max_steps)
                                           .front();
  std::vector<int64_t> dec_in{task.bos_id()};
  dec_in.insert(dec_in.end(), decoded.begin(), decoded.end());
  const std::vector<analysis::AttentionMaps> kinds = analysis::attention_maps(model, src, dec_in);
  std::vector<std::string> source_tokens, target_tokens;
  for (int64_t id : src) source_tokens.push_back(task.decode_source({id}));
  for (int64_t id : dec_in) target_tokens.push_back(task.tokenizer().decode({id}));
  const std::string translation = task.decode_source(src) + " => " + task.format_answer(decoded);
  // encoder, decoder, cross: the text of their queries and keys
  const std::vector<analysis::AttentionText> texts = {{"encoder", &kinds[0], source_tokens, {}},
                                                      {"decoder", &kinds[1], target_tokens, {}},
                                                      {"cross", &kinds[2], target_tokens, source_tokens}};
  const io::FolderLock lock = make_locked_dir(a.out, "attention");
  const std::string h5path = join_path(a.out, "attention.h5"), html = join_path(a.out, "attention.html");
  analysis::save_attention_h5(h5path, texts, a.prompt, a.path);
  analysis::save_attention_html(html, texts, a.path + ": " + translation);
  std::vector<std::string> pngs;
  for (const analysis::AttentionText& t : texts) {
    pngs.push_back(join_path(a.out, "attention_" + t.group + ".png"));
    analysis::save_attention_png(pngs.back(), *t.maps, t.tokens, t.key_tokens);
  }
  std::cout << "headlab attention: " << a.path << ", " << translation << " (source " << S << " tokens, decoder input "
            << dec_in.size() << ")\n"
            << "heads " << analysis::kept_heads_text(model) << "\n"
            << "wrote " << h5path << " (groups encoder, decoder, cross: weights (layer, head, query, key) float32, "
            << "token_ids, key_token_ids, kept; tokens and key_tokens as JSON attributes), " << html
            << " (interactive, self-contained; the three kinds on one page)";
  for (const std::string& f : pngs) std::cout << ", " << f;
  std::cout << "\n";
  return 0;
}

}  // namespace

Action add_attention(CLI::App& app) {
  auto a = std::make_shared<AttentionArgs>();
  add_model_argument(app, a->path, a->tokenizer);
  app.add_option("--prompt", a->prompt,
                 "the input: a task input (e.g. 31415), text for chars checkpoints and pretrained models, an "
                 "encoder-decoder's source (e.g. \"three hundred and twelve\")")
      ->required();
  app.add_option("--max-new-tokens", a->max_new,
                 "greedy tokens appended before drawing (default: a task's answer and end token; chars: 0; "
                 "encoder-decoder: decoded to the end token, at most 64)")
      ->check(non_negative_number(1e15));
  app.add_option("--out", a->out,
                 output_folder_help("folder for attention.h5, attention.png and attention.html (encoder-decoder: a "
                                    "PNG per kind, attention_{encoder,decoder,cross}.png); the page's address names "
                                    "the head shown: attention.html#L1H3 opens layer L1's head 3, #L1 all its heads "
                                    "overlaid (an encoder-decoder's #cross.L0H2)",
                                    "attention"))
      ->type_name(kOutputDir);
  app.add_option("--device", a->device, "cpu | cuda | cuda:N")->capture_default_str();
  add_threads_option(app, a->threads);
  return [a] {
    set_threads(a->threads);
    a->out = output_folder(a->path, a->out, "attention");
    const Loaded l = load("attention", a->path, a->device, "", a->tokenizer);
    if (nn::EncoderDecoder* m = l.seq2seq()) return seq2seq_attention(*a, l, *m);
    const tasks::Prompt p = l.task->encode_prompt(a->prompt);
    const tasks::Task& task = *l.task;
    return decoder_attention(*a, l,
                             {p.ids, p.answer_length, task.end_id(), [&](int64_t id) { return task.token_text(id); }});
  };
}

}  // namespace headlab::cli
