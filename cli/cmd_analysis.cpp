// headlab compare / ablate / attention: option parsing, the terminal tables and the files (CSV, JSON,
// Markdown, PNG, HDF5). The measurements themselves live in train/analysis.h.
#include <omp.h>

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

#include "backends/backend.h"
#include "cli/commands.h"
#include "train/analysis.h"
#include "train/h5file.h"
#include "train/plot.h"
#include "train/trainer.h"

namespace headlab::cli {

namespace fs = std::filesystem;

// Defined in cmd_train.cpp: number checks with short error messages.
CLI::Validator positive_number();
CLI::Validator non_negative_number();

namespace {

std::string fmt(double v, int precision = 4) {
  if (std::isnan(v)) return "nan";
  std::ostringstream os;
  os << std::fixed << std::setprecision(precision) << v;
  return os.str();
}

std::string fmt_signed(double v, int precision = 4) {
  if (std::isnan(v)) return "nan";
  std::ostringstream os;
  os << std::showpos << std::fixed << std::setprecision(precision) << v;
  return os.str();
}

std::string fmt_sci(double v, int precision = 1) {
  std::ostringstream os;
  os << std::scientific << std::setprecision(precision) << v;
  return os.str();
}

std::string fmt_bytes(int64_t b) {
  std::ostringstream os;
  const double v = static_cast<double>(b);
  if (std::abs(v) >= 1 << 20) os << std::fixed << std::setprecision(1) << v / (1 << 20) << " MiB";
  else if (std::abs(v) >= 1 << 10) os << std::fixed << std::setprecision(1) << v / (1 << 10) << " KiB";
  else os << b << " B";
  return os.str();
}

std::string pad(const std::string& s, size_t w, bool left = false) {
  if (s.size() >= w) return s;
  return left ? s + std::string(w - s.size(), ' ') : std::string(w - s.size(), ' ') + s;
}

void make_dir(const std::string& dir, const char* cmd) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  HL_CHECK(!ec && fs::is_directory(dir), cmd, ": cannot create output folder '", dir, "': ",
           ec ? ec.message() : std::string("not a folder"));
}

void write_text(const std::string& path, const std::string& text, const char* cmd) {
  std::ofstream f(path, std::ios::trunc);
  HL_CHECK(f.good(), cmd, ": cannot write '", path, "'");
  f << text;
  f.close();
  HL_CHECK(f.good(), cmd, ": writing '", path, "' failed (disk full?)");
}

std::string join_path(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

int threads_in_use() { return omp_get_max_threads(); }

// ============================================================================================
// compare

struct CompareArgs {
  std::vector<int64_t> heads{1, 2, 4, 8, 16}, emb{256}, tokens{128}, batch{8};
  std::vector<std::string> configs;
  bool no_peer = false, no_sweep = false;
  std::string device = "cpu", out = ".", x = "auto";
  int64_t repeats = 10, warmup = 2;
  uint64_t seed = 0;
  int threads = 0;
};

void print_compare_header(const train::CompareOptions& o) {
  std::cout << "headlab compare: device " << o.device.str() << ", " << threads_in_use() << " threads, " << o.warmup
            << " warm-up runs, then the median of " << o.repeats
            << " (spread: IQR p25-p75); the two forms are timed in turn within each repeat\n"
            << "wrapper = H CausalAttention heads of width d_out/H + out_proj; fused = CausalMultiHeadAttention "
               "(same weights)\n"
            << "FLOPs count GEMMs (2 per multiply-add; f+b = 3x forward); peak = backend bytes above what was live\n\n";
  std::cout << pad("config", 13, true) << pad("B", 4) << pad("T", 6) << pad("d_in", 6) << pad("d_out", 6) << pad("H", 4)
            << "  " << pad("form", 8, true) << pad("params", 10) << pad("GFLOP", 8) << pad("fwd ms", 10)
            << pad("IQR", 17) << pad("GFLOP/s", 9) << pad("f+b ms", 10) << pad("IQR", 17) << pad("GFLOP/s", 9)
            << pad("peak fwd", 11) << pad("peak f+b", 11) << pad("max|dy|", 9) << pad("max|dx|", 9) << "\n";
}

std::string ms(double s) { return fmt(s * 1e3, s * 1e3 < 10 ? 3 : 1); }

void print_compare_row(const train::CompareResult& r) {
  const auto& c = r.config;
  auto line = [&](const char* form, const train::FormMeasurement& m, bool first) {
    std::ostringstream os;
    if (first)
      os << pad(c.name, 13, true) << pad(std::to_string(c.B), 4) << pad(std::to_string(c.T), 6)
         << pad(std::to_string(c.d_in), 6) << pad(std::to_string(c.d_out), 6) << pad(std::to_string(c.heads), 4);
    else
      os << std::string(39, ' ');
    os << "  " << pad(form, 8, true) << pad(std::to_string(m.params), 10) << pad(fmt(m.flops_forward / 1e9, 3), 8)
       << pad(ms(m.forward.median), 10) << pad(ms(m.forward.p25) + "-" + ms(m.forward.p75), 17)
       << pad(fmt(m.flops_forward / m.forward.median / 1e9, 1), 9) << pad(ms(m.forward_backward.median), 10)
       << pad(ms(m.forward_backward.p25) + "-" + ms(m.forward_backward.p75), 17)
       << pad(fmt((m.flops_forward + m.flops_backward) / m.forward_backward.median / 1e9, 1), 9)
       << pad(fmt_bytes(m.peak_forward), 11) << pad(fmt_bytes(m.peak_forward_backward), 11);
    if (!first) os << pad(fmt_sci(r.max_abs_out), 9) << pad(fmt_sci(r.max_abs_dx), 9);
    std::cout << os.str() << "\n";
  };
  line("wrapper", r.wrapper, true);
  line("fused", r.fused, false);
  std::cout << std::flush;
}

// ============================================================================================
// ablate

struct AblateArgs {
  std::string path, out, text, device = "cpu", metric, criterion = "gradient";
  int64_t batches = 0, batch_size = 0, prune = -1, repeats = 20;
  double threshold = 0.9, step = 0.1, prune_to_metric = std::nan("");
  bool full_curve = false;
  int threads = 0;
};

struct PrunedReport {
  bool done = false;
  std::string path;
  int64_t removed = 0, params_before = 0, params_after = 0;
  std::vector<std::vector<int64_t>> kept_original;
  double max_diff = 0;
  train::Scores gated, scores;
  train::TimeStats time_before, time_after;
  int64_t B = 0, T = 0;
};

// Spearman correlation of a head's importance with the loss increase of zeroing it.
double agreement(const train::AblationResult& a, bool normalized) {
  std::vector<double> imp, dloss;
  for (const auto& h : a.heads) {
    imp.push_back(normalized ? h.importance : h.importance_raw);
    dloss.push_back(h.zero.loss - a.base.loss);
  }
  return train::rank_correlation(imp, dloss);
}

std::string scores_line(const train::Scores& s) {
  std::string out = "loss " + fmt(s.loss) + "  token accuracy " + fmt(s.token_accuracy);
  if (s.has_exact_match) out += "  exact match " + fmt(s.exact_match);
  return out;
}

std::string kept_str(const std::vector<std::vector<int64_t>>& kept) {
  std::string out;
  for (size_t l = 0; l < kept.size(); ++l) {
    if (l) out += "; ";
    out += "layer " + std::to_string(l) + ": ";
    for (size_t i = 0; i < kept[l].size(); ++i) {
      if (i) out += ",";
      out += std::to_string(kept[l][i]);
    }
  }
  return out;
}

std::string report_md(const AblateArgs& args, const train::Checkpoint& ck, const nn::GPTModel& model,
                      const train::EvalSet& data, const train::AblationResult& a, const train::PruningCurve& curve,
                      double stop_below, const PrunedReport& pr, const std::string& task_name) {
  const nn::GPTConfig& cfg = model.config();
  const bool ex = a.base.has_exact_match;
  std::ostringstream os;
  os << "# Head ablation report\n\n## Summary\n\n";
  os << "| | |\n|---|---|\n";
  os << "| checkpoint | `" << args.path << "`" << (ck.has_trainer ? " (step " + std::to_string(ck.trainer.step) + ")" : "")
     << " |\n";
  os << "| task | " << task_name << " |\n";
  os << "| model | " << cfg.n_layers << " layers x " << cfg.n_heads << " heads (" << cfg.attention
     << " attention), emb " << cfg.emb_dim << ", head size " << cfg.head_dim() << ", context " << cfg.context_length
     << ", " << model.num_parameters() << " parameters |\n";
  if (!cfg.kept_heads.empty()) os << "| kept heads (already pruned) | " << kept_str(cfg.kept_heads) << " |\n";
  os << "| data | " << data.batches.size() << " validation batches of " << data.batches.front().B << " x "
     << data.batches.front().T << " tokens, " << data.tokens() << " scored tokens |\n";
  os << "| unpruned | loss " << fmt(a.base.loss) << ", token accuracy " << fmt(a.base.token_accuracy);
  if (ex) os << ", exact match " << fmt(a.base.exact_match);
  os << " |\n";
  os << "| pruning | " << args.criterion << " criterion; metric " << train::metric_name(curve.metric)
     << ", stop below " << fmt(stop_below) << " |\n";
  os << "| gradient scores vs zero ablation | Spearman " << fmt(agreement(a, true), 2) << " (normalised), "
     << fmt(agreement(a, false), 2) << " (raw) |\n";
  const auto by_imp = [&] {
    std::vector<const train::HeadAblation*> v;
    for (const auto& h : a.heads) v.push_back(&h);
    std::sort(v.begin(), v.end(), [](auto* x, auto* y) { return x->importance > y->importance; });
    return v;
  }();
  if (!by_imp.empty()) {
    const auto& t = *by_imp.front();
    os << "| most important head | layer " << t.layer << " head " << t.original_head << " (zero ablation: loss "
       << fmt_signed(t.zero.loss - a.base.loss) << ", token accuracy "
       << fmt_signed(t.zero.token_accuracy - a.base.token_accuracy) << ") |\n";
  }
  if (curve.steps.size() > 1) {
    const int64_t keep_n = train::prune_count_for_metric(curve, stop_below);
    os << "| prunable at the threshold | " << keep_n << " of " << curve.total_heads << " heads ("
       << fmt(100.0 * static_cast<double>(keep_n) / static_cast<double>(curve.total_heads), 0) << "%) |\n";
  }
  os << "\n![head importance](importance.png)\n\n";

  os << "## Heads by importance\n\n";
  os << "Importance: I_h = E_x |dL/d gate_h| over the evaluation batches, divided by the l2 norm of its layer's "
        "scores (Michel, Levy & Neubig 2019). Zero ablation sets the head's gate to 0; mean ablation replaces the "
        "head's context by its mean over the evaluation data. Deltas are ablated minus unpruned.\n\n";
  os << "| rank | layer | head | importance | raw mean abs dL/dgate | zero: d loss | zero: d token acc |"
     << (ex ? " zero: d exact |" : "") << " mean: d loss | mean: d token acc |" << (ex ? " mean: d exact |" : "")
     << "\n|";
  for (int i = 0; i < (ex ? 11 : 9); ++i) os << "---|";
  os << "\n";
  int rank = 1;
  for (const auto* h : by_imp) {
    os << "| " << rank++ << " | " << h->layer << " | " << h->original_head << " | " << fmt(h->importance) << " | "
       << fmt_sci(h->importance_raw, 2) << " | " << fmt_signed(h->zero.loss - a.base.loss) << " | "
       << fmt_signed(h->zero.token_accuracy - a.base.token_accuracy) << " |";
    if (ex) os << " " << fmt_signed(h->zero.exact_match - a.base.exact_match) << " |";
    os << " " << fmt_signed(h->mean.loss - a.base.loss) << " | "
       << fmt_signed(h->mean.token_accuracy - a.base.token_accuracy) << " |";
    if (ex) os << " " << fmt_signed(h->mean.exact_match - a.base.exact_match) << " |";
    os << "\n";
  }

  os << "\n## Pruning curve\n\n";
  os << "Each step masks the least important " << fmt(100 * args.step, 0)
     << "% of the remaining heads (at least one; every layer keeps one head) and recomputes the importance of the "
        "heads left"
     << (args.criterion == "gradient" ? " (gradient scores)" : " (loss increase when the head is masked too)")
     << ".\n\n";
  os << "| step | heads pruned | fraction | loss | token accuracy |" << (ex ? " exact match |" : "")
     << " removed (layer/head) |\n|---|---|---|---|---|" << (ex ? "---|" : "") << "---|\n";
  for (size_t i = 0; i < curve.steps.size(); ++i) {
    const auto& s = curve.steps[i];
    os << "| " << i << " | " << s.pruned << " | " << fmt(s.fraction, 3) << " | " << fmt(s.scores.loss) << " | "
       << fmt(s.scores.token_accuracy) << " |";
    if (ex) os << " " << fmt(s.scores.exact_match) << " |";
    os << " " << train::removed_heads_str(s, cfg) << " |\n";
  }
  os << "\n![pruning curve](pruning.png)\n\n";

  os << "## Pruned model\n\n";
  if (!pr.done) {
    os << "Not written (use `--prune K` or `--prune-to-metric X`).\n";
  } else {
    os << "| | |\n|---|---|\n";
    os << "| file | `" << pr.path << "` |\n";
    os << "| heads removed | " << pr.removed << " of " << curve.total_heads << " |\n";
    os << "| kept heads (original indices) | " << kept_str(pr.kept_original) << " |\n";
    os << "| parameters | " << pr.params_before << " -> " << pr.params_after << " ("
       << fmt(100.0 * static_cast<double>(pr.params_before - pr.params_after) / static_cast<double>(pr.params_before), 1)
       << "% fewer) |\n";
    os << "| forward time, batch " << pr.B << " x " << pr.T << " (median of " << pr.time_before.repeats << ") | "
       << fmt(pr.time_before.median * 1e3, 3) << " ms -> " << fmt(pr.time_after.median * 1e3, 3) << " ms (speed-up "
       << fmt(pr.time_before.median / pr.time_after.median, 2) << "x; IQR " << fmt(pr.time_before.p25 * 1e3, 3) << "-"
       << fmt(pr.time_before.p75 * 1e3, 3) << " -> " << fmt(pr.time_after.p25 * 1e3, 3) << "-"
       << fmt(pr.time_after.p75 * 1e3, 3) << " ms) |\n";
    os << "| max abs logit difference, pruned vs gated | " << fmt_sci(pr.max_diff, 2) << " |\n";
    os << "| scores, gated model | " << scores_line(pr.gated) << " |\n";
    os << "| scores, pruned.h5 | " << scores_line(pr.scores) << " |\n";
  }
  return os.str();
}

// ============================================================================================
// attention

struct AttentionArgs {
  std::string path, prompt, out = ".", device = "cpu";
  int64_t max_new = -1;
  int threads = 0;
};

}  // namespace

// ============================================================================================

Action add_compare(CLI::App& app) {
  auto a = std::make_shared<CompareArgs>();
  app.add_option("--heads", a->heads, "sweep: head counts (comma-separated)")
      ->delimiter(',')
      ->check(positive_number())
      ->capture_default_str();
  app.add_option("--emb-dim", a->emb, "sweep: d_in = d_out values")->delimiter(',')->check(positive_number())->capture_default_str();
  app.add_option("--tokens", a->tokens, "sweep: sequence lengths T")->delimiter(',')->check(positive_number())->capture_default_str();
  app.add_option("--batch", a->batch, "sweep: batch sizes B")->delimiter(',')->check(positive_number())->capture_default_str();
  app.add_option("--config", a->configs, "extra config name,B,T,d_in,d_out,heads (repeatable; the PyTorch peer's format)");
  app.add_flag("--no-peer-grid", a->no_peer,
               "leave out the PyTorch peer's default configs (seed-toy, small, medium, gpt2-ctx256)");
  app.add_flag("--no-sweep", a->no_sweep, "leave out the heads x emb-dim x tokens x batch sweep");
  app.add_option("--device", a->device, "cpu | cuda | cuda:N")->capture_default_str();
  app.add_option("--repeats", a->repeats, "timed runs per measurement (the median is reported)")
      ->check(positive_number())
      ->capture_default_str();
  app.add_option("--warmup", a->warmup, "untimed runs before timing")->check(non_negative_number())->capture_default_str();
  app.add_option("--seed", a->seed, "seed for weights and inputs")->capture_default_str();
  app.add_option("--x", a->x, "x axis of compare.png: auto | heads | tokens | emb | batch")
      ->check(CLI::IsMember({"auto", "heads", "tokens", "emb", "batch"}))
      ->capture_default_str();
  app.add_option("--out", a->out, "folder for compare.csv, compare.json and compare.png")->capture_default_str();
  app.add_option("--threads", a->threads, "CPU threads (0: all cores)")->check(non_negative_number());
  return [a] {
    set_threads(a->threads);
    train::CompareOptions o;
    o.device = Device::parse(a->device);
    o.repeats = a->repeats;
    o.warmup = a->warmup;
    o.seed = a->seed;
    backend_for(o.device);  // a clear error before any work when the device is missing
    std::vector<train::CompareConfig> sweep, extra;
    if (!a->no_sweep)
      for (int64_t B : a->batch)
        for (int64_t T : a->tokens)
          for (int64_t d : a->emb)
            for (int64_t H : a->heads) {
              HL_CHECK(d % H == 0, "compare: emb dim ", d, " is not divisible by ", H, " heads");
              sweep.push_back({"sweep", B, T, d, d, H});
            }
    if (!a->no_peer)
      for (const auto& c : train::peer_compare_grid()) extra.push_back(c);
    for (const auto& s : a->configs) extra.push_back(train::parse_compare_config(s));
    HL_CHECK(!sweep.empty() || !extra.empty(), "compare: nothing to measure (--no-sweep and --no-peer-grid without --config)");
    make_dir(a->out, "compare");
    print_compare_header(o);
    std::vector<train::CompareResult> results, sweep_results;
    for (const auto* list : {&extra, &sweep})
      for (const auto& c : *list) {
        results.push_back(train::compare_attention(c, o));
        if (list == &sweep) sweep_results.push_back(results.back());
        print_compare_row(results.back());
      }
    std::cout << "\nfused speed-up over wrapper (median time ratio):\n";
    for (const auto& r : results)
      std::cout << "  " << pad(r.config.name, 12, true) << " H=" << pad(std::to_string(r.config.heads), 2, true)
                << " T=" << pad(std::to_string(r.config.T), 4, true) << " d=" << pad(std::to_string(r.config.d_out), 4, true)
                << "  forward " << fmt(r.wrapper.forward.median / r.fused.forward.median, 2) << "x  fwd+bwd "
                << fmt(r.wrapper.forward_backward.median / r.fused.forward_backward.median, 2) << "x\n";
    const std::string csv = join_path(a->out, "compare.csv"), js = join_path(a->out, "compare.json"),
                      png = join_path(a->out, "compare.png");
    write_text(csv, train::compare_csv(results, o), "compare");
    write_text(js, train::compare_json(results, o).dump(2) + "\n", "compare");
    train::save_compare_png(png, sweep_results.empty() ? results : sweep_results, a->x, o.device);
    std::cout << "\nwrote " << csv << ", " << js << ", " << png << "\n"
              << "PyTorch peer on the same configs: /usr/bin/python3 /work/shared/peers/torch_mha_cpu.py --threads "
              << threads_in_use() << " (its wrapper has no out_proj)\n";
    return 0;
  };
}

Action add_ablate(CLI::App& app) {
  auto a = std::make_shared<AblateArgs>();
  app.add_option("checkpoint", a->path, "checkpoint file (.h5)")->required();
  app.add_option("--out", a->out, "output folder (default: <checkpoint folder>/ablation)");
  app.add_option("--text", a->text, "chars checkpoints: evaluate on the last 10% of this text instead");
  app.add_option("--batches", a->batches, "validation batches (default: the run's --eval-batches)")
      ->check(positive_number());
  app.add_option("--batch-size", a->batch_size, "rows per batch (default: the run's --batch-size)")
      ->check(positive_number());
  app.add_option("--metric", a->metric, "pruning metric: exact_match (task default) | token_accuracy (chars default)")
      ->check(CLI::IsMember({"exact_match", "token_accuracy"}));
  app.add_option("--threshold", a->threshold, "stop pruning below this fraction of the unpruned metric")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--step", a->step, "fraction of the remaining heads pruned per step")
      ->check(CLI::Range(0.001, 1.0))
      ->capture_default_str();
  app.add_option("--criterion", a->criterion,
                 "pruning order: gradient (Michel et al. importance) | ablation (loss increase of masking the head)")
      ->check(CLI::IsMember({"gradient", "ablation"}))
      ->capture_default_str();
  app.add_flag("--full-curve", a->full_curve, "continue the pruning curve until every layer has one head left");
  auto* k = app.add_option("--prune", a->prune, "write pruned.h5 without the K least important heads (pruning order)")
                ->check(non_negative_number());
  app.add_option("--prune-to-metric", a->prune_to_metric,
                 "write pruned.h5 pruned by the curve as far as the metric stays >= X")
      ->excludes(k);
  app.add_option("--repeats", a->repeats, "timed forward passes for the pruned model's speed-up")
      ->check(positive_number())
      ->capture_default_str();
  app.add_option("--device", a->device, "cpu | cuda | cuda:N")->capture_default_str();
  app.add_option("--threads", a->threads, "CPU threads (0: all cores)")->check(non_negative_number());
  return [a] {
    set_threads(a->threads);
    const train::Checkpoint ck = train::load_checkpoint(a->path);
    const Device device = Device::parse(a->device);
    std::shared_ptr<nn::GPTModel> model = train::model_from_checkpoint(ck, a->path, device);
    const std::unique_ptr<Task> task = train::task_from_config(ck.config, a->text);
    HL_CHECK(a->text.empty() || task->name() == "chars", "ablate: --text applies to chars checkpoints; '", a->path,
             "' is a ", task->name(), " checkpoint");
    const nn::GPTConfig& cfg = model->config();
    const nlohmann::json tr = ck.config.value("training", nlohmann::json::object());
    const int64_t n = a->batches > 0 ? a->batches : tr.value("eval_batches", int64_t{8});
    const int64_t B = a->batch_size > 0 ? a->batch_size : tr.value("batch_size", int64_t{64});
    const std::string out = a->out.empty() ? join_path(fs::path(a->path).parent_path().string(), "ablation") : a->out;
    make_dir(out, "ablate");
    const train::EvalSet data = train::make_eval_set(*task, n, B, cfg.context_length);
    const train::Metric metric = a->metric.empty() ? train::default_metric(data) : train::parse_metric(a->metric);

    std::cout << "headlab ablate: " << a->path << " (task " << task->name() << ", " << cfg.attention << " attention, "
              << cfg.n_layers << " layers x " << cfg.n_heads << " heads"
              << (cfg.kept_heads.empty() ? "" : " before pruning, kept " + kept_str(cfg.kept_heads)) << ", "
              << model->num_parameters() << " parameters, device " << device.str() << ")\n"
              << "data: " << n << " validation batches of " << B << " x " << cfg.context_length << " ("
              << data.tokens() << " scored tokens); pruning metric " << train::metric_name(metric) << "\n";
    const train::AblationResult abl = train::ablate_heads(*model, data);
    const double base_metric = train::metric_value(abl.base, metric);
    double stop_below = a->threshold * base_metric;
    if (!std::isnan(a->prune_to_metric)) stop_below = std::min(stop_below, a->prune_to_metric);
    std::cout << "unpruned: " << scores_line(abl.base) << "\n\n";

    // per-head table, by importance
    std::vector<const train::HeadAblation*> by_imp;
    for (const auto& h : abl.heads) by_imp.push_back(&h);
    std::sort(by_imp.begin(), by_imp.end(), [](auto* x, auto* y) { return x->importance > y->importance; });
    const bool ex = abl.base.has_exact_match;
    std::cout << "heads by importance (|dL/d gate|, normalised per layer); deltas of zero and mean ablation\n  "
              << pad("layer", 5) << pad("head", 5) << pad("importance", 11) << pad("zero dloss", 12) << pad("dacc", 9)
              << (ex ? pad("dexact", 9) : "") << pad("mean dloss", 12) << pad("dacc", 9) << (ex ? pad("dexact", 9) : "")
              << "\n";
    for (const auto* h : by_imp)
      std::cout << "  " << pad(std::to_string(h->layer), 5) << pad(std::to_string(h->original_head), 5)
                << pad(fmt(h->importance, 3), 11) << pad(fmt_signed(h->zero.loss - abl.base.loss), 12)
                << pad(fmt_signed(h->zero.token_accuracy - abl.base.token_accuracy, 3), 9)
                << (ex ? pad(fmt_signed(h->zero.exact_match - abl.base.exact_match, 3), 9) : "")
                << pad(fmt_signed(h->mean.loss - abl.base.loss), 12)
                << pad(fmt_signed(h->mean.token_accuracy - abl.base.token_accuracy, 3), 9)
                << (ex ? pad(fmt_signed(h->mean.exact_match - abl.base.exact_match, 3), 9) : "") << "\n";

    std::cout << "agreement of the gradient scores with zero ablation (Spearman, over heads): normalised "
              << fmt(agreement(abl, true), 2) << ", raw " << fmt(agreement(abl, false), 2) << "\n";

    // pruning curve
    train::PruneOptions po;
    po.step_fraction = a->step;
    po.criterion = train::parse_criterion(a->criterion);
    po.metric = metric;
    po.stop_below = a->full_curve ? -1.0 : stop_below;
    po.min_pruned = std::max<int64_t>(a->prune, 0);
    int64_t max_prunable = 0;
    for (int64_t l = 0; l < cfg.n_layers; ++l) max_prunable += model->attention(l).head_count() - 1;
    HL_CHECK(a->prune <= max_prunable, "ablate: --prune ", a->prune, " is more than the ", max_prunable,
             " heads that can go (every layer keeps one head)");
    const train::PruningCurve curve = train::iterative_pruning(*model, data, po);
    std::cout << "\npruning curve (" << a->criterion << " criterion, " << fmt(100 * a->step, 0)
              << "% of the remaining heads per step; stop below "
              << train::metric_name(metric) << " " << fmt(stop_below) << " = "
              << (!std::isnan(a->prune_to_metric) && a->prune_to_metric < a->threshold * base_metric
                      ? "--prune-to-metric"
                      : fmt(a->threshold, 2) + " x unpruned")
              << ")\n  " << pad("pruned", 7) << pad("fraction", 9) << pad("loss", 9) << pad("tok acc", 9)
              << (ex ? pad("exact", 9) : "") << "  removed\n";
    for (const auto& s : curve.steps)
      std::cout << "  " << pad(std::to_string(s.pruned), 7) << pad(fmt(s.fraction, 3), 9) << pad(fmt(s.scores.loss), 9)
                << pad(fmt(s.scores.token_accuracy, 3), 9) << (ex ? pad(fmt(s.scores.exact_match, 3), 9) : "")
                << "  " << train::removed_heads_str(s, cfg) << "\n";

    // physical pruning
    PrunedReport pr;
    if (a->prune >= 0 || !std::isnan(a->prune_to_metric)) {
      const int64_t k_remove =
          a->prune >= 0 ? a->prune : train::prune_count_for_metric(curve, a->prune_to_metric);
      const auto keep = train::kept_after(*model, curve.order, k_remove);
      pr.done = true;
      pr.removed = k_remove;
      pr.path = join_path(out, "pruned.h5");
      train::save_checkpoint(pr.path, train::prune_checkpoint(ck, keep, a->path));
      // Load it back the way every command does, and hold it against the gated model.
      const train::Checkpoint pck = train::load_checkpoint(pr.path);
      std::shared_ptr<nn::GPTModel> pruned = train::model_from_checkpoint(pck, pr.path, device);
      pr.kept_original = pruned->config().kept_heads;
      const train::HeadMatrix gates = train::gates_keeping(*model, keep);
      pr.max_diff = train::max_logit_difference(*model, gates, *pruned, data);
      pr.gated = train::evaluate_heads(*model, data, gates);
      pr.scores = train::evaluate_heads(*pruned, data);
      pr.params_before = model->num_parameters();
      pr.params_after = pruned->num_parameters();
      const Batch& b0 = data.batches.front();
      pr.B = b0.B;
      pr.T = b0.T;
      const Tensor idx = tensor(b0.inputs, {b0.B, b0.T}).to(device);
      auto fwd = [&](nn::GPTModel& m) -> std::function<void()> {
        return [&m, &idx] {
          NoGradGuard no_grad;
          m.forward(idx);
        };
      };
      const auto times = train::time_interleaved({fwd(*model), fwd(*pruned)}, device, 3, a->repeats);
      pr.time_before = times[0];
      pr.time_after = times[1];
      if (k_remove == 0)
        std::cout << "\nnote: no step of the curve keeps " << train::metric_name(metric) << " >= "
                  << fmt(a->prune_to_metric) << ", so pruned.h5 keeps every head";
      std::cout << "\npruned model: removed " << k_remove << " of " << curve.total_heads << " heads, kept "
                << kept_str(pr.kept_original) << "\n  wrote " << pr.path << "; parameters " << pr.params_before
                << " -> " << pr.params_after << " ("
                << fmt(100.0 * static_cast<double>(pr.params_before - pr.params_after) /
                           static_cast<double>(pr.params_before),
                       1)
                << "% fewer)\n  forward (batch " << pr.B << " x " << pr.T << ", median of " << a->repeats
                << "): " << fmt(pr.time_before.median * 1e3, 3) << " ms -> " << fmt(pr.time_after.median * 1e3, 3)
                << " ms, speed-up " << fmt(pr.time_before.median / pr.time_after.median, 2) << "x\n"
                << "  max |logits(pruned) - logits(gated)| = " << fmt_sci(pr.max_diff, 2) << "\n"
                << "  pruned.h5: " << scores_line(pr.scores) << "\n";
    }

    train::save_heads_csv(join_path(out, "heads.csv"), abl);
    train::save_pruning_csv(join_path(out, "pruning.csv"), curve, cfg);
    train::save_importance_png(join_path(out, "importance.png"), abl, cfg);
    train::save_pruning_png(join_path(out, "pruning.png"), curve, a->full_curve ? -1.0 : stop_below);
    write_text(join_path(out, "report.md"),
               report_md(*a, ck, *model, data, abl, curve, stop_below, pr, task->name()), "ablate");
    std::cout << "\nwrote " << out << "/{heads.csv, pruning.csv, report.md, importance.png, pruning.png"
              << (pr.done ? ", pruned.h5" : "") << "}\n";
    return 0;
  };
}

Action add_attention(CLI::App& app) {
  auto a = std::make_shared<AttentionArgs>();
  app.add_option("checkpoint", a->path, "checkpoint file (.h5)")->required();
  app.add_option("--prompt", a->prompt, "the input: a task input (e.g. 31415) or text for chars checkpoints")
      ->required();
  app.add_option("--max-new-tokens", a->max_new,
                 "greedy tokens appended before drawing (default: a task's answer and end token; chars: 0)")
      ->check(non_negative_number());
  app.add_option("--out", a->out, "folder for attention.h5 and attention.png")->capture_default_str();
  app.add_option("--device", a->device, "cpu | cuda | cuda:N")->capture_default_str();
  app.add_option("--threads", a->threads, "CPU threads (0: all cores)")->check(non_negative_number());
  return [a] {
    set_threads(a->threads);
    const train::Checkpoint ck = train::load_checkpoint(a->path);
    std::shared_ptr<nn::GPTModel> model = train::model_from_checkpoint(ck, a->path, Device::parse(a->device));
    const std::unique_ptr<Task> task = train::task_from_config(ck.config);
    const nn::GPTConfig& cfg = model->config();
    const Prompt p = task->encode_prompt(a->prompt);
    const int64_t extra = a->max_new >= 0 ? a->max_new : (p.answer_length >= 0 ? p.answer_length + 1 : 0);
    std::vector<int64_t> ids = p.ids;
    if (static_cast<int64_t>(ids.size()) > cfg.context_length)  // as generate: the last context_length tokens
      ids.erase(ids.begin(), ids.end() - cfg.context_length);
    ids = train::greedy_continue(*model, ids, extra, task->end_id());
    const train::AttentionMaps maps = train::attention_maps(*model, ids);
    std::vector<std::string> tokens;
    std::string text;
    for (int64_t id : ids) {
      tokens.push_back(task->tokenizer().decode({id}));
      text += tokens.back();
    }
    make_dir(a->out, "attention");
    const std::string h5path = join_path(a->out, "attention.h5"), png = join_path(a->out, "attention.png");
    train::save_attention_h5(h5path, maps, tokens, a->prompt, a->path);
    train::save_attention_png(png, maps, tokens);
    std::cout << "headlab attention: " << a->path << ", " << maps.T << " tokens: " << text << "\n"
              << cfg.n_layers << " layers, heads per layer " << kept_str(maps.kept) << "\n"
              << "wrote " << h5path << " (weights " << h5::shape_str({maps.layers, maps.heads, maps.T, maps.T})
              << " float32, token_ids, kept; tokens as JSON in the root attribute 'tokens') and " << png << "\n";
    return 0;
  };
}

}  // namespace headlab::cli
