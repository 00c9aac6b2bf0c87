// headlab eval / generate / inspect: everything they need is in the checkpoint.
#include <algorithm>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>

#include "cli/commands.h"
#include "cli/common.h"
#include "io/sources.h"
#include "nn/generate.h"
#include "nn/layers.h"
#include "tasks/chars.h"
#include "tasks/sentencepiece_tokenizer.h"
#include "train/config.h"
#include "train/evaluate.h"
#include "train/memory.h"

namespace headlab::cli {

namespace {

// eval of a text (BPE) model: the perplexity of a whole text file (train::evaluate_text).
int eval_text(const Loaded& l, const std::string& path, const std::string& text, int64_t stride) {
  HL_CHECK(!text.empty(), "eval: a subword (text) model is evaluated on a text: give --text FILE");
  std::vector<int64_t> ids = l.subword()->encode(read_input_file(text, "eval: --text"), text);
  if (const auto bos = l.subword()->bos()) ids.insert(ids.begin(), *bos);
  nn::DecoderModel& model = l.decoder("eval");
  const nn::DecoderShape& c = model.shape();
  const int64_t ctx = c.context_length, s = stride > 0 ? stride : std::max<int64_t>(1, ctx / 2);
  HL_CHECK(s <= ctx, "eval: --stride ", s, " is longer than the context (", ctx, " tokens)");
  HL_CHECK(ids.size() >= 2, "eval: --text '", text, "' is ", ids.size(), " token", ids.size() == 1 ? "" : "s",
           (ids.empty() ? " (the file is empty)" : ""), "; a perplexity needs at least 2 (a token and the next)");
  const train::TextScores r = train::evaluate_text(model, ids, s);
  HL_CHECK(std::isfinite(r.loss), "eval: the loss is ", fmt(r.loss), ": '", path, "' holds a diverged model");
  std::cout << "model " << path << " (" << l.config.describe_model() << ")\ntext " << text << ": " << ids.size()
            << " tokens, " << r.windows << " windows of " << ctx << " (stride " << s << ")\n"
            << std::fixed << std::setprecision(4) << "loss            " << r.loss << "\n"
            << "perplexity      " << r.perplexity << "\n(" << r.tokens << " scored tokens)\n";
  return 0;
}

// inspect's table: name, shape and size of each parameter (in weights; blocks named by their type), and the total.
void print_parameters(const NamedTensors& parameters) {
  int64_t total = 0;
  for (const auto& [name, t] : parameters) {
    Shape shape = t.shape();
    std::string shown = shape_str(shape);
    if (is_block_quantized(t.dtype())) {
      shape.back() *= dtype_block(t.dtype());
      shown = shape_str(shape) + " " + dtype_name(t.dtype());
    }
    std::cout << "  " << std::left << std::setw(44) << name << std::setw(16) << shown << std::right << std::setw(10)
              << shape_numel(shape) << "\n";
    total += shape_numel(shape);
  }
  std::cout << "  " << std::left << std::setw(60) << "total" << std::right << std::setw(10) << total << "\n";
}

// A decoder section stores 0 for "the default" of some sizes (nn/decoder_config.h); inspect shows what it means.
void explain_defaults(nlohmann::json& j) {
  if (!j.is_object()) return;
  for (auto& [key, value] : j.items()) explain_defaults(value);
  const auto size = [&](const char* k) { return j.contains(k) && j[k].is_number_integer() ? j[k].get<int64_t>() : -1; };
  const int64_t emb = size("emb_dim"), heads = size("n_heads");
  if (emb <= 0 || heads <= 0) return;
  const auto meaning = [](const char* rule, int64_t v) {
    return std::string("0 (the default: ").append(rule).append(" = ").append(std::to_string(v)).append(")");
  };
  if (size("head_dim") == 0) j["head_dim"] = meaning("emb_dim / n_heads", emb / heads);
  if (size("n_kv_heads") == 0) j["n_kv_heads"] = meaning("n_heads", heads);
  if (size("hidden_dim") == 0) j["hidden_dim"] = meaning("4 x emb_dim", 4 * emb);
}

nlohmann::json explained(nlohmann::json j) {
  explain_defaults(j);
  return j;
}

// inspect on a pretrained model (a model folder, a llama2.c checkpoint: any source but headlab's own): its config as
// headlab reads it, what its format says of it, its tokenizer and the parameters by headlab's names.
int inspect_pretrained(const std::string& path, const io::ModelSource& source, const io::SourceModel& m,
                       const std::string& tokenizer) {
  const nlohmann::json& config = m.pretrained.config;
  const nn::ModelFamily& family = io::family_of(config).model;
  // The one the file holds, the files found with it, or "none (...)".
  std::string tokenizer_line = m.embedded_tokenizer ? m.embedded_tokenizer->describe()
                                                    : m.tokenizer.describe();
  if (!tokenizer.empty())  // read before the first line: a bad --tokenizer fails with nothing printed
    tokenizer_line = tokenizer + ": " + tasks::tokenizer_from_file(tokenizer, family.vocab_size(config))->describe();
  else if (source.tokenizer_option() == io::TokenizerOption::required)
    tokenizer_line = "none given (--tokenizer FILE)";
  std::cout << source.name() << " " << path << " (family " << family.arch()
            << ")\n\nconfig (as headlab reads it: " << family.describe(config) << ")\n"
            << explained(config).dump(2) << "\n"
            << (m.notes.empty() ? "" : m.notes + "\n") << "tokenizer: " << tokenizer_line << "\n\nparameters\n";
  print_parameters(m.pretrained.parameters);
  return 0;
}

}  // namespace

Action add_eval(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  auto tokenizer = std::make_shared<std::string>();
  auto text = std::make_shared<std::string>();
  auto device = std::make_shared<std::string>("cpu");
  auto batches = std::make_shared<int64_t>(0);
  auto threads = std::make_shared<int>(0);
  auto stride = std::make_shared<int64_t>(0);
  add_model_argument(app, *path, *tokenizer);
  app.add_option("--text", *text,
                 "chars checkpoints: evaluate on the last 10% of this text instead; subword models (model folders, "
                 "llama2.c files, their conversions): the whole file's perplexity")
      ->type_name(kInputFile);
  app.add_option("--stride", *stride,
                 "subword models: windows of the context start every N tokens, each scoring the tokens no earlier "
                 "window scored (default: half the context)")
      ->check(positive_number(1e9));
  app.add_option("--batches", *batches, "validation batches (default: the run's --eval-batches)")
      ->check(non_negative_number(1e15));
  app.add_option("--device", *device, "cpu | cuda")->capture_default_str();
  add_threads_option(app, *threads);
  return [=] {
    set_threads(*threads);
    Loaded l = load("eval", *path, *device, "", *tokenizer);
    const nn::DecoderModel* decoder = l.model->as_decoder();
    // An encoder predicts the tokens it reads masked, not the next: the masked-LM task's batches of --text
    if (decoder && !decoder->shape().causal) {
      HL_CHECK(!text->empty(), "eval: '", *path,
               "' is an encoder, scored on masked tokens of a text: give --text FILE");
      HL_CHECK(*stride == 0, "eval: --stride applies to decoders' perplexity; '", *path,
               "' is an encoder, scored on the masked tokens of --batches rows");
    } else if (l.subword()) {
      HL_CHECK(*batches == 0, "eval: --batches applies to task checkpoints; '", *path,
               "' is a subword model, scored on the whole --text (its windows set by --stride)");
      return eval_text(l, *path, *text, *stride);
    }
    HL_CHECK(*stride == 0, "eval: --stride applies to subword models (model folders, llama2.c files), with --text");
    HL_CHECK(text->empty() || dynamic_cast<const tasks::TextWindowsTask*>(l.task.get()),
             "eval: --text applies to text models (chars); '", *path, "' was trained on the ", l.task->name(),
             " task, which reads no text");
    if (!text->empty()) l.task = l.config.make_task(*text);
    // Checkpoints made elsewhere (tools/import_torch.py) may have no training section: defaults.
    const train::RunSettings& run = l.config.run;
    const int64_t n = *batches > 0 ? *batches : run.eval_batches;
    const int64_t B = run.batch_size;
    train::check_evaluation_fits(
        l.config, l.model->device().is_cuda(), n, B, "eval",
        "lower --batches (now " + std::to_string(n) + "); the checkpoint's batch size is " + std::to_string(B));
    std::vector<tasks::Batch> data;
    for (int64_t i = 0; i < n; ++i)
      data.push_back(l.task->batch(tasks::Split::val, static_cast<uint64_t>(i), B, l.config.batch_tokens()));
    const train::Scores r = train::evaluate(*l.model, data);
    HL_CHECK(std::isfinite(r.loss), "eval: the model's loss on the validation data is ", fmt(r.loss),
             ": the checkpoint holds a diverged model");
    std::cout << "checkpoint " << *path << " (task " << l.task->name() << ", step "
              << (l.ckpt.has_trainer ? l.ckpt.trainer.step : 0) << ")\nmodel: " << l.config.describe_model() << "\n";
    std::cout << std::fixed << std::setprecision(4) << "val loss        " << r.loss << "\n"
              << "token accuracy  " << r.token_accuracy << "\n";
    if (r.has_exact_match) std::cout << "exact match     " << r.exact_match << "\n";
    if (nn::EncoderDecoder* m = l.seq2seq()) {
      const train::DecodeScores d = train::evaluate_decoding(*m, *l.seq2seq_task(), data);
      // (the exact match above is teacher forced; a row is decoded right iff it is right there too)
      std::cout << "BLEU            " << d.bleu << " (greedy decoding, d2l's BLEU with k = 2, mean of " << d.rows
                << " rows; decoded exact match " << d.exact_match << ")\n";
    }
    const bool masked = l.config.task.options.mask_prob > 0;
    std::cout << "(" << r.tokens << (masked ? " masked tokens scored (a masked language model)" : " scored tokens")
              << " in " << n << " batches of " << B << ")\n";
    return 0;
  };
}

Action add_generate(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  auto tokenizer = std::make_shared<std::string>();
  auto prompt = std::make_shared<std::string>();
  auto max_new = std::make_shared<int64_t>(64);
  auto temperature = std::make_shared<double>(0.0);
  auto top_k = std::make_shared<int64_t>(0);
  auto prefill_chunk = std::make_shared<int64_t>(nn::GenerateOptions{}.prefill_chunk);
  auto seed = std::make_shared<uint64_t>(0);
  auto device = std::make_shared<std::string>("cpu");
  auto dtype = std::make_shared<std::string>("float32");
  add_model_argument(app, *path, *tokenizer);
  app.add_option("--prompt", *prompt, "text to continue; for task checkpoints a task input, e.g. 31415 or 123+45")
      ->required();
  app.add_option("--max-new-tokens", *max_new, "tokens to generate at most")
      ->check(non_negative_number(1e15))
      ->capture_default_str();
  app.add_option("--temperature", *temperature, "0: greedy; otherwise sample from softmax(logits / T)")
      ->check(non_negative_number(1e6))
      ->capture_default_str();
  app.add_option("--top-k", *top_k, "sample only from the k most likely tokens (0: all)")
      ->check(non_negative_number(1e9));
  app.add_option("--prefill-chunk", *prefill_chunk,
                 "prompt tokens per forward while the key/value cache fills (its activations take this many rows; "
                 "0: the whole prompt at once)")
      ->check(non_negative_number(1e9))
      ->capture_default_str();
  add_seed_option(app, *seed, "sampling seed");
  app.add_option("--device", *device, "cpu | cuda")->capture_default_str();
  app.add_option("--dtype", *dtype,
                 "bfloat16: the decoder's linear weights stored in bfloat16 (half their memory; on the CPU about half "
                 "the bytes a decoding step reads); q8_0, q4_k: as ggml's blocks (about a quarter, an eighth; a tied "
                 "head too), read as they are; everything else float32")
      ->check(CLI::IsMember({"float32", "bfloat16", "q8_0", "q4_k"}))
      ->capture_default_str();
  return [=] {
    nn::GenerateOptions o;
    o.max_new_tokens = *max_new;
    o.temperature = *temperature;
    o.top_k = *top_k;
    o.prefill_chunk = *prefill_chunk;
    o.seed = *seed;
    Loaded l = load("generate", *path, *device, "", *tokenizer);
    HL_CHECK(*dtype == "float32" || !l.seq2seq(), "generate: --dtype ", *dtype, " takes a decoder model, not ", *path);
    if (nn::EncoderDecoder* m = l.seq2seq()) {  // greedy, as d2l's predict_seq2seq
      const tasks::Seq2SeqTask& task = *l.seq2seq_task();
      const std::vector<int64_t> src = task.encode_source(*prompt);
      const int64_t S = static_cast<int64_t>(src.size());
      const std::vector<std::vector<int64_t>> out = nn::greedy_decode(
          *m, tensor(src, {1, S}).to(m->device()), tensor(std::vector<int64_t>{S}, {1}).to(m->device()), task.bos_id(),
          task.end_id(), std::min(*max_new, m->config().max_len));
      std::cout << task.decode_source(src) << " => " << task.format_answer(out.front()) << std::endl;
      return 0;
    }
    nn::DecoderModel& model = l.decoder("generate");
    if (*dtype == "bfloat16") nn::to_bfloat16_weights(model);
    if (*dtype == "q8_0" || *dtype == "q4_k") nn::to_quantized_weights(model, *dtype == "q8_0" ? DType::q8_0 : DType::q4_k);
    const tasks::Prompt p = l.task->encode_prompt(*prompt);
    // A task answer stops at its end token or its known length; text runs to max_new_tokens.
    if (p.answer_length >= 0) o.max_new_tokens = std::min<int64_t>(*max_new, p.answer_length + 1);
    train::check_generation_fits(l.config.model, model.device().is_cuda(), static_cast<int64_t>(p.ids.size()),
                                 o.max_new_tokens, o.prefill_chunk, "generate");
    o.end_id = l.task->end_id();
    const std::vector<int64_t> generated = nn::generate(model, p.ids, o);
    std::cout << l.task->format_continuation(p, generated) << std::endl;
    return 0;
  };
}

Action add_inspect(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  auto tokenizer = std::make_shared<std::string>();
  add_model_argument(app, *path, *tokenizer);
  return [=] {
    const io::ModelSource& source = io::source_of(*path, "inspect: checkpoint");
    HL_CHECK(tokenizer->empty() || source.tokenizer_option() != io::TokenizerOption::refused,
             "inspect: --tokenizer applies to llama2.c checkpoints and model folders; '", *path,
             "' is neither (a headlab checkpoint carries its tokenizer)");
    const io::SourceModel contents = source.read(*path);
    if (!contents.checkpoint) return inspect_pretrained(*path, source, contents, *tokenizer);
    const io::Checkpoint& ck = *contents.checkpoint;
    nlohmann::json cfg = ck.config;
    if (cfg.contains("tokenizer") && cfg["tokenizer"].contains("vocab")) {  // the vocabulary on one line
      std::string v;
      for (const auto& tok : cfg["tokenizer"]["vocab"]) v += tok.get<std::string>();
      cfg["tokenizer"]["vocab"] =
          nlohmann::json(v).dump() + " (" + std::to_string(cfg["tokenizer"]["vocab"].size()) + " tokens)";
    }
    explain_defaults(cfg);
    std::cout << "checkpoint " << *path << "\n\nconfig\n" << cfg.dump(2) << "\n\nparameters\n";
    print_parameters(ck.model);
    if (ck.has_optimizer)
      std::cout << "\noptimizer " << enum_name(ck.optimizer.kind) << " " << ck.optimizer.to_json().dump() << " ("
                << ck.optimizer_state.size() << " state tensors)\n";
    if (ck.has_trainer) {
      const auto& t = ck.trainer;
      std::cout << "\ntraining state\n  step " << t.step << ", next batch " << t.data_index << ", generator (seed "
                << t.rng_seed << ", offset " << t.rng_offset << "), " << std::fixed << std::setprecision(1)
                << t.elapsed_seconds << " s trained\n";
      if (!t.metrics.empty()) {
        std::cout << "\nmetrics\n  " << std::setw(6) << "step" << std::setw(12) << "train loss" << std::setw(10)
                  << "val loss" << std::setw(10) << "val acc" << std::setw(10) << "exact" << std::setw(10) << "lr"
                  << std::setw(11) << "grad norm" << std::setw(11) << "tok/s"
                  << "\n";
        for (const auto& m : t.metrics)
          std::cout << "  " << std::setw(6) << m.step << std::setprecision(4) << std::setw(12) << m.train_loss
                    << std::setw(10) << m.val_loss << std::setw(10) << m.val_accuracy << std::setw(10)
                    << m.val_exact_match << std::scientific << std::setprecision(2) << std::setw(10) << m.lr
                    << std::fixed << std::setprecision(3) << std::setw(11) << m.grad_norm << std::setprecision(0)
                    << std::setw(11) << m.tokens_per_s << "\n";
      }
    }
    return 0;
  };
}

}  // namespace headlab::cli
