// headlab sae: sparse autoencoders on a model's hook points (analysis/sae_activations.h).
//   headlab sae train MODEL --hook NAME [--hook NAME ...] [--transcoder IN:OUT ...] --text FILE
//                   --arch relu|topk|jumprelu [--k K] [--expansion E] --out DIR      one SAE a hook (and one
//                   transcoder a pair), from one stream of forward passes, as SAELens folders
//   headlab sae eval MODEL SAE_DIR [SAE_DIR ...] --text FILE [--json]   SAELens's evals of each at its hook
//   headlab sae features MODEL SAE_DIR --prompt TEXT [--features N | --feature F ...] [--position P] [--json]
//                   the most active features on a prompt, each one's pre-activation split over the heads that
//                   wrote its input, its head shares (hook_z) and its logit effects (analysis/sae_features.h)
//   headlab sae pages MODEL SAE_DIR --text FILE --out FILE.html [--features N | --feature F ...] [--contexts K]
//                   feature pages: each feature's top activating contexts, logit effects and heads
//                   (analysis/sae_pages.h)
#include <algorithm>
#include <cmath>
#include <iostream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>

#include "analysis/sae_activations.h"
#include "analysis/sae_features.h"
#include "analysis/sae_pages.h"
#include "cli/commands.h"
#include "cli/common.h"

namespace headlab::cli {

namespace {

struct SaeArgs {
  std::string action, model, tokenizer, text, out, device = "cpu", arch = "topk", b_dec_init = "geometric_median";
  std::string prompt;
  std::vector<std::string> hooks, transcoders, saes;
  std::vector<int64_t> features;
  int64_t logits = 5, contexts = 10;
  std::optional<int64_t> top_features;  // features: 5; pages: 20
  std::optional<int64_t> position;
  int64_t k = 32, expansion = 16, training_tokens = 1'000'000, batch_size = 4096, buffer_rows = 262144;
  int64_t rows_per_forward = 8, tokens = 0, log_every = 50, eval_every = 0, eval_tokens = 4096, batches = 8;
  int64_t checkpoint_every = 0;
  bool resume = false;
  double lr = 3e-4, l1 = 5.0, l0 = 1.0, aux = 1.0 / 32, init_threshold = 0.001, bandwidth = 0.001;
  bool json = false;
  uint64_t seed = 0;
  int threads = 0;
};

// The model and its context (--tokens or the model's), with --text read as the task's text.
struct Model {
  Loaded in;
  int64_t T = 0;
};
Model load_model(const SaeArgs& a, const char* cmd) {
  set_threads(a.threads);
  Model m{load(cmd, a.model, a.device, a.text, a.tokenizer), 0};
  // a text model reads windows of its text; a task checkpoint (reverse, sort, ...) its task's own examples
  const std::string task = m.in.task->name();
  const bool text_task = task == "text" || task == "chars";
  HL_CHECK(a.text.empty() || text_task, cmd, ": --text applies to chars and subword models; '", a.model, "' is a ",
           task, " checkpoint (its activations come from its task's examples)");
  HL_CHECK(a.tokens == 0 || text_task, cmd, ": --tokens applies to chars and subword models; a ", task,
           " task's rows are as long as its examples");
  HL_CHECK(!m.in.from_folder || !a.text.empty() || a.action == "features", cmd,
           ": give --text FILE (the text whose activations it reads)");
  const int64_t context = m.in.config.batch_tokens();
  m.T = a.tokens > 0 ? a.tokens : context;
  HL_CHECK(m.T <= context, cmd, ": --tokens ", m.T, " is longer than the model's context (", context, ")");
  if (text_task && a.action != "features") m.in.task->check_context_length(m.T);
  return m;
}

// --transcoder IN:OUT as a target, or the error naming the flag and what it got.
analysis::SaeTarget transcoder_of(const std::string& spec) {
  const size_t colon = spec.find(':');
  HL_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < spec.size() &&
               spec.find(':', colon + 1) == std::string::npos,
           "sae train: --transcoder takes IN:OUT, two hook points (e.g. "
           "blocks.0.ln2.hook_normalized:blocks.0.hook_mlp_out), got '",
           spec, "'");
  analysis::SaeTarget t{spec.substr(0, colon), spec.substr(colon + 1)};
  HL_CHECK(t.in != t.out, "sae train: --transcoder ", spec, " reads and reconstructs one hook: that is an SAE (--hook ",
           t.in, ")");
  return t;
}

int run_train(const SaeArgs& a) {
  HL_CHECK(!a.hooks.empty() || !a.transcoders.empty(),
           "sae train: name the hook point(s) to train on: --hook NAME (e.g. blocks.0.hook_resid_post), or "
           "--transcoder IN:OUT");
  HL_CHECK(a.saes.empty(), "sae train: SAE folders are read by sae eval, not by sae train (got '", a.saes.front(),
           "')");
  HL_CHECK(!a.out.empty(), "sae train: give --out DIR (one SAELens folder a hook is written there)");
  std::vector<analysis::SaeTarget> targets;
  for (const std::string& h : a.hooks) targets.push_back({h, ""});
  for (const std::string& spec : a.transcoders) targets.push_back(transcoder_of(spec));
  for (size_t i = 0; i < targets.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      HL_CHECK(targets[i].name() != targets[j].name(), "sae train: ", targets[i].name(), " is named twice");
  Model m = load_model(a, "sae train");
  const io::FolderLock lock = make_locked_dir(a.out, "sae");  // "sae: 'DIR' ...", as every writer names itself
  analysis::SaeTrainArgs t;
  t.targets = targets;
  t.arch = parse_enum<nn::SaeArch>(a.arch, "sae train: --arch");
  t.k = a.k, t.expansion = a.expansion, t.training_tokens = a.training_tokens, t.batch_size = a.batch_size;
  t.buffer_rows = a.buffer_rows, t.rows_per_forward = a.rows_per_forward, t.context = m.T, t.log_every = a.log_every;
  t.eval_every = a.eval_every, t.eval_tokens = a.eval_tokens;
  t.checkpoint_every = a.checkpoint_every, t.resume = a.resume;
  t.b_dec_init = parse_enum<train::BdecInit>(a.b_dec_init, "sae train: --b-dec-init");
  t.options.adam.lr = a.lr;
  t.options.loss.l1 = a.l1, t.options.loss.l0 = a.l0, t.options.loss.aux = a.aux,
  t.options.loss.bandwidth = a.bandwidth;
  t.options.init_threshold = a.init_threshold;
  t.seed = a.seed, t.out = a.out;
  std::cout << "sae train: " << enum_name(t.arch) << " SAEs (" << a.expansion << "x"
            << (t.arch == nn::SaeArch::topk ? ", k " + std::to_string(a.k) : std::string()) << ") on " << a.hooks.size()
            << " hook(s) and " << a.transcoders.size() << " transcoder pair(s) of " << a.model << ", "
            << a.training_tokens << " tokens in batches of " << a.batch_size << ", shuffled in a buffer of "
            << a.buffer_rows << " rows, " << a.rows_per_forward << " sequences of " << m.T << " tokens a forward\n";
  const analysis::SaeTrainReport r = analysis::train_saes(
      m.in, a.model, t, [](const std::string& line) { std::cout << "sae train: " << line << "\n"; });
  if (a.resume)
    std::cout << "sae train: resumed from " << a.out << "/checkpoint; the " << r.dropped
              << " activations its shuffling buffer held then were not trained on\n";
  std::cout << "sae train: " << r.steps << " steps, " << r.tokens << " tokens in " << fmt(r.seconds, 1) << " s ("
            << fmt(static_cast<double>(r.tokens - r.resumed_tokens) / r.seconds, 0)
            << " tokens/s; of it the model's forward passes " << fmt(r.forward_seconds, 1) << " s and the SAE steps "
            << fmt(r.step_seconds, 1) << " s, one after the other)\n";
  for (size_t i = 0; i < r.folders.size(); ++i)
    std::cout << "sae train: wrote " << r.folders[i] << " (held out: explained variance "
              << fmt(r.held_out[i].explained_variance, 4) << ", L0 " << fmt(r.held_out[i].l0, 1) << "; dead "
              << r.last[i].dead << " at the end)\n";
  return 0;
}

int run_eval(const SaeArgs& a) {
  HL_CHECK(!a.saes.empty(), "sae eval: name the SAE folder(s) to evaluate after the model");
  HL_CHECK(a.hooks.empty() && a.transcoders.empty(),
           "sae eval: --hook and --transcoder are sae train's; an SAE's hooks are its cfg.json's hook_name (and a "
           "transcoder's hook_name_out)");
  Model m = load_model(a, "sae eval");
  nlohmann::json out = nlohmann::json::array();
  for (const std::string& dir : a.saes) {
    io::LoadedSae s = io::read_sae_folder(dir);
    HL_CHECK(!s.origin.hook_name.empty(), "sae eval: ", dir, "/cfg.json names no hook_name");
    s.sae->to(m.in.model->device());
    const analysis::SaeEvalReport r =
        analysis::evaluate_sae(m.in, *s.sae, s.origin, a.batches, a.rows_per_forward, m.T);
    const nlohmann::json j = {{"sae", dir},
                              {"hook_name", s.origin.hook_name},
                              {"hook_name_out", s.origin.transcoder() ? nlohmann::json(r.hook) : nlohmann::json()},
                              {"tokens", r.tokens},
                              {"explained_variance", r.explained_variance},
                              {"mse", r.mse},
                              {"l0", r.l0},
                              {"l1", r.l1},
                              {"ce_loss_score", r.ce_loss_score},
                              {"ce_loss_without_sae", r.ce_loss_without_sae},
                              {"ce_loss_with_sae", r.ce_loss_with_sae},
                              {"ce_loss_with_ablation", r.ce_loss_with_ablation},
                              {"kl_div_score", r.kl_div_score},
                              {"kl_div_with_sae", r.kl_div_with_sae},
                              {"kl_div_with_ablation", r.kl_div_with_ablation},
                              {"dead_features", r.dead_features},
                              {"dense_features", r.dense_features},
                              {"d_sae", r.d_sae}};
    out.push_back(j);
    if (a.json) continue;
    std::cout << dir << (s.origin.transcoder() ? " from " + s.origin.hook_name + " to " : std::string(" at ")) << r.hook
              << " over " << r.tokens << " validation tokens:\n"
              << "  explained variance " << fmt(r.explained_variance, 4) << ", mse " << fmt(r.mse, 4) << ", L0 "
              << fmt(r.l0, 1) << ", L1 " << fmt(r.l1, 2) << "\n"
              << "  ce_loss_score " << fmt(r.ce_loss_score, 4) << " (loss " << fmt(r.ce_loss_without_sae, 4)
              << " clean, " << fmt(r.ce_loss_with_sae, 4) << " with the SAE, " << fmt(r.ce_loss_with_ablation, 4)
              << " with the hook zeroed)\n"
              << (r.ce_loss_with_ablation <= r.ce_loss_without_sae
                      ? "  (zeroing the hook does not raise the loss on this text, so ce_loss_score measures nothing "
                        "here: the model does not know this text; evaluate on text like its training data)\n"
                      : "")
              << "  kl_div_score " << fmt(r.kl_div_score, 4) << " (KL " << fmt(r.kl_div_with_sae, 4)
              << " with the SAE, " << fmt(r.kl_div_with_ablation, 4) << " zeroed)\n"
              << "  features: " << r.dead_features << " of " << r.d_sae << " dead (active on no token), "
              << r.dense_features << " dense (active on more than 10% of tokens)\n";
  }
  if (a.json) std::cout << out.dump(2) << "\n";
  return 0;
}

// The features of the SAE (one folder) on --prompt: a table a feature, or JSON.
int run_features(const SaeArgs& a) {
  HL_CHECK(a.saes.size() == 1, "sae features: name one SAE folder after the model (got ", a.saes.size(), ")");
  HL_CHECK(!a.prompt.empty(), "sae features: give --prompt TEXT (the text whose features it shows)");
  HL_CHECK(a.hooks.empty() && a.transcoders.empty(), "sae features: --hook and --transcoder are sae train's");
  Model m = load_model(a, "sae features");
  io::LoadedSae s = io::read_sae_folder(a.saes[0]);
  HL_CHECK(!s.origin.hook_name.empty(), "sae features: ", a.saes[0], "/cfg.json names no hook_name");
  s.sae->to(m.in.model->device());
  analysis::FeatureOptions o;
  o.features = a.top_features.value_or(5), o.position = a.position, o.logits = a.logits, o.chosen = a.features;
  const std::vector<int64_t> ids = m.in.task->encode_prompt(a.prompt).ids;
  const analysis::FeatureReport r =
      analysis::features_on_prompt(m.in.decoder("sae features"), *s.sae, s.origin, ids, o);
  const tasks::Task& task = *m.in.task;
  const auto effects = [&](const std::vector<analysis::TokenEffect>& v) {
    nlohmann::json j = nlohmann::json::array();
    for (const analysis::TokenEffect& e : v)
      j.push_back({{"token", task.token_text(e.token)}, {"id", e.token}, {"effect", e.effect}});
    return j;
  };
  if (a.json) {
    nlohmann::json tokens = nlohmann::json::array(), features = nlohmann::json::array();
    for (int64_t id : r.ids) tokens.push_back(task.token_text(id));
    for (const analysis::FeatureOnPrompt& f : r.features) {
      nlohmann::json parts = nlohmann::json::object();
      for (size_t i = 0; i < f.labels.size(); ++i) parts[f.labels[i]] = f.parts[i];
      features.push_back({{"feature", f.feature},
                          {"activations", f.activations},
                          {"position", f.position},
                          {"activation", f.activation},
                          {"pre_activation", f.pre_activation},
                          {"bias", f.bias},
                          {"parts", parts},
                          {"head_shares", f.head_shares},
                          {"top_logits", effects(f.top_logits)},
                          {"bottom_logits", effects(f.bottom_logits)}});
    }
    std::cout << nlohmann::json{{"sae", a.saes[0]},
                                {"hook_name", r.hook},
                                {"split", r.split},
                                {"tokens", tokens},
                                {"features", features}}
                     .dump(2)
              << "\n";
    return 0;
  }
  std::cout << "sae features: " << a.saes[0] << " at " << r.hook << " on " << r.ids.size() << " tokens; "
            << (r.split.empty() ? std::string("pre-activations not split over heads (") + r.hook +
                                      " is not what heads write: the stream, attn_out or hook_z are)"
                                : "pre-activations split over " + r.split)
            << "\n";
  if (r.features.empty()) std::cout << "  no feature is active on the prompt\n";
  for (const analysis::FeatureOnPrompt& f : r.features) {
    std::cout << "feature " << f.feature << ": " << fmt(f.activation, 4) << " at token " << f.position << " '"
              << task.token_text(r.ids[static_cast<size_t>(f.position)]) << "' (pre-activation "
              << fmt(f.pre_activation, 4) << ")\n";
    std::vector<size_t> order(f.parts.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](size_t x, size_t y) { return std::abs(f.parts[x]) > std::abs(f.parts[y]); });
    if (!order.empty()) {
      std::cout << "  written by";
      for (size_t i = 0; i < std::min<size_t>(order.size(), 6); ++i)
        std::cout << (i ? ", " : " ") << f.labels[order[i]] << " " << fmt(f.parts[order[i]], 4);
      std::cout << "; bias " << fmt(f.bias, 4) << "\n";
    }
    if (!f.head_shares.empty()) {
      std::cout << "  its output direction by head:";
      for (size_t h = 0; h < f.head_shares.size(); ++h) std::cout << " " << fmt(f.head_shares[h], 3);
      std::cout << "\n";
    }
    const auto list = [&](const char* what, const std::vector<analysis::TokenEffect>& v) {
      if (v.empty()) return;
      std::cout << "  " << what << ":";
      for (const analysis::TokenEffect& e : v)
        std::cout << " '" << task.token_text(e.token) << "' " << fmt(e.effect, 3);
      std::cout << "\n";
    };
    list("promotes", f.top_logits);
    list("suppresses", f.bottom_logits);
  }
  return 0;
}

// Feature pages of the SAE (one folder) over the text's validation windows, as one self-contained page.
int run_pages(const SaeArgs& a) {
  HL_CHECK(a.saes.size() == 1, "sae pages: name one SAE folder after the model (got ", a.saes.size(), ")");
  HL_CHECK(!a.out.empty(), "sae pages: give --out FILE.html (the page it writes)");
  HL_CHECK(a.hooks.empty() && a.transcoders.empty(), "sae pages: --hook and --transcoder are sae train's");
  HL_CHECK(a.prompt.empty(), "sae pages: its contexts come from --text; --prompt is sae features'");
  check_output_file(a.out, "sae pages: --out");
  Model m = load_model(a, "sae pages");
  io::LoadedSae s = io::read_sae_folder(a.saes[0]);
  HL_CHECK(!s.origin.hook_name.empty(), "sae pages: ", a.saes[0], "/cfg.json names no hook_name");
  s.sae->to(m.in.model->device());
  analysis::FeaturePagesOptions o;
  o.features = a.top_features.value_or(20), o.chosen = a.features, o.contexts = a.contexts;
  o.logits = a.logits;
  const analysis::FeaturePages pages = analysis::feature_pages(m.in.decoder("sae pages"), *m.in.task, *s.sae, s.origin,
                                                               a.batches, a.rows_per_forward, m.T, o);
  analysis::save_feature_pages(a.out, pages, *m.in.task, a.saes[0]);
  std::cout << "sae pages: " << pages.features.size() << " features of " << a.saes[0] << " over " << pages.tokens
            << " validation tokens: wrote " << a.out << "\n";
  return 0;
}

}  // namespace

Action add_sae(CLI::App& app) {
  auto a = std::make_shared<SaeArgs>();
  app.add_option("action", a->action, "train | eval | features | pages")
      ->check(CLI::IsMember({"train", "eval", "features", "pages"}))
      ->required();
  add_model_argument(app, a->model, a->tokenizer);
  app.add_option("saes", a->saes,
                 "eval, features: the SAE folder(s) (SAELens's layout: cfg.json, sae_weights.safetensors)")
      ->type_name(kInputFolder);
  app.add_option(
         "--text", a->text,
         "a text model's text: train reads its first 90%, eval its last 10% (a task checkpoint: its task's examples)")
      ->type_name(kInputFile);
  app.add_option("--hook", a->hooks, "train: a hook point to train an SAE on (repeat for several, one forward pass)");
  app.add_option("--transcoder", a->transcoders,
                 "train: IN:OUT, a transcoder from one hook point to another (an MLP's "
                 "blocks.L.ln2.hook_normalized:blocks.L.hook_mlp_out); repeatable, the same forward passes");
  app.add_option("--arch", a->arch, "train: relu | topk | jumprelu")
      ->check(CLI::IsMember({"relu", "topk", "jumprelu", "standard"}))
      ->capture_default_str();
  app.add_option("--k", a->k, "train: topk's features kept a token")
      ->check(positive_number(1e6))
      ->capture_default_str();
  app.add_option("--expansion", a->expansion, "train: d_sae = E x d_in")
      ->check(positive_number(1024))
      ->capture_default_str();
  app.add_option("--training-tokens", a->training_tokens, "train: activations to train on")
      ->check(positive_number(1e13))
      ->capture_default_str();
  app.add_option("--batch-size", a->batch_size, "train: activations a step")
      ->check(positive_number(1e8))
      ->capture_default_str();
  app.add_option("--buffer-rows", a->buffer_rows,
                 "train: the shuffling buffer's activations (its memory: rows x the hooks' widths x 4 bytes)")
      ->check(positive_number(1e10))
      ->capture_default_str();
  app.add_option("--rows-per-forward", a->rows_per_forward, "sequences a forward pass")
      ->check(positive_number(1e6))
      ->capture_default_str();
  app.add_option("--tokens", a->tokens, "tokens a sequence (default: the model's context)")
      ->check(positive_number(1e9));
  app.add_option("--batches", a->batches, "eval, pages: forward passes of --rows-per-forward sequences")
      ->check(positive_number(1e9))
      ->capture_default_str();
  app.add_option("--lr", a->lr, "train: Adam's learning rate")->check(positive_number(10))->capture_default_str();
  app.add_option("--l1", a->l1, "train: relu's decoder-norm-weighted L1 coefficient")
      ->check(non_negative_number(1e6))
      ->capture_default_str();
  app.add_option("--l0", a->l0, "train: jumprelu's L0 coefficient")
      ->check(non_negative_number(1e6))
      ->capture_default_str();
  app.add_option("--init-threshold", a->init_threshold,
                 "train: jumprelu's initial thresholds (SAELens's 0.001; they rise slowly, by Adam's lr in log space a "
                 "step: short runs start near the activations' scale)")
      ->check(positive_number(1e6))
      ->capture_default_str();
  app.add_option("--bandwidth", a->bandwidth, "train: jumprelu's straight-through window (SAELens's 0.001)")
      ->check(positive_number(1e6))
      ->capture_default_str();
  app.add_option("--aux", a->aux, "train: topk's AuxK coefficient (Gao et al. 1/32)")
      ->check(non_negative_number(1e6))
      ->capture_default_str();
  app.add_option("--b-dec-init", a->b_dec_init, "train: geometric_median | mean | zeros")
      ->check(CLI::IsMember({"geometric_median", "mean", "zeros"}))
      ->capture_default_str();
  app.add_option("--log-every", a->log_every, "train: a progress line every N steps")
      ->check(positive_number(1e9))
      ->capture_default_str();
  app.add_option("--eval-every", a->eval_every,
                 "train: held-out explained variance and L0 every N steps (0: only at the end)")
      ->check(non_negative_number(1e9))
      ->capture_default_str();
  app.add_option("--eval-tokens", a->eval_tokens, "train: the held-out activations (the val split's), read once")
      ->check(positive_number(1e8))
      ->capture_default_str();
  app.add_option(
         "--checkpoint-every", a->checkpoint_every,
         "train: every N steps replace <out>/checkpoint (each SAE's folder, its Adam state, the stream's place) "
         "for --resume (0: none)")
      ->check(non_negative_number(1e12))
      ->capture_default_str();
  app.add_flag("--resume", a->resume,
               "train: go on from <out>/checkpoint up to --training-tokens (the same hooks, --arch, --k and "
               "--expansion; the buffer's rows at the checkpoint are not trained on)");
  app.add_option("--out", a->out,
                 "train: the folder to write, one SAELens folder a hook inside; pages: the page (features.html)")
      ->type_name(kOutputDir);
  app.add_option("--prompt", a->prompt, "features: the text whose features it shows");
  app.add_option("--features", a->top_features,
                 "features, pages: the most active features it shows (features: 5, pages: 20)")
      ->check(positive_number(1e6));
  app.add_option("--feature", a->features, "features, pages: show this feature (repeat for several) instead")
      ->check(non_negative_number(1e12));
  app.add_option("--position", a->position,
                 "features: rank and split the features at this token (negative: from the end)")
      ->check(in_range(-1e9, 1e9));
  app.add_option("--contexts", a->contexts, "pages: top activating contexts a feature")
      ->check(positive_number(1e4))
      ->capture_default_str();
  app.add_option("--logits", a->logits, "features: tokens each feature promotes and suppresses most")
      ->check(non_negative_number(1e6))
      ->capture_default_str();
  app.add_flag("--json", a->json, "eval, features: the results as JSON");
  app.add_option("--device", a->device, "cpu | cuda | cuda:N")->capture_default_str();
  add_seed_option(app, a->seed, "train: the SAEs' initial weights and the buffer's shuffling");
  add_threads_option(app, a->threads);
  return [a] {
    return a->action == "train"      ? run_train(*a)
           : a->action == "eval"     ? run_eval(*a)
           : a->action == "features" ? run_features(*a)
                                     : run_pages(*a);
  };
}

}  // namespace headlab::cli
