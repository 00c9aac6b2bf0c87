// headlab compare: the wrapper and fused multi-head attention, timed side by side (analysis/compare.h),
// as a terminal table, compare.csv, compare.json and compare.png.
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
#include "backends/backend.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "io/h5file.h"
#include "train/config.h"

namespace headlab::cli {

namespace fs = std::filesystem;

namespace {

struct CompareArgs {
  std::vector<int64_t> heads{1, 2, 4, 8, 16}, emb{256}, tokens{128}, batch{8};
  std::vector<std::string> configs;
  bool no_peer = false, no_sweep = false;
  std::string device = "cpu", out = ".", x = "auto";
  int64_t repeats = 10, warmup = 2;
  uint64_t seed = 0;
  int threads = 0;
};

void print_compare_header(const analysis::CompareOptions& o) {
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

void print_compare_row(const analysis::CompareResult& r) {
  const auto& c = r.config;
  auto line = [&](const char* form, const analysis::FormMeasurement& m, bool first) {
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

}  // namespace

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
    analysis::CompareOptions o;
    o.device = Device::parse(a->device);
    o.repeats = a->repeats;
    o.warmup = a->warmup;
    o.seed = a->seed;
    backend_for(o.device);  // a clear error before any work when the device is missing
    std::vector<analysis::CompareConfig> sweep, extra;
    if (!a->no_sweep)
      for (int64_t B : a->batch)
        for (int64_t T : a->tokens)
          for (int64_t d : a->emb)
            for (int64_t H : a->heads) {
              HL_CHECK(d % H == 0, "compare: emb dim ", d, " is not divisible by ", H, " heads");
              sweep.push_back({"sweep", B, T, d, d, H});
            }
    if (!a->no_peer)
      for (const auto& c : analysis::peer_compare_grid()) extra.push_back(c);
    for (const auto& s : a->configs) extra.push_back(analysis::parse_compare_config(s));
    HL_CHECK(!sweep.empty() || !extra.empty(), "compare: nothing to measure (--no-sweep and --no-peer-grid without --config)");
    make_dir(a->out, "compare");
    print_compare_header(o);
    std::vector<analysis::CompareResult> results, sweep_results;
    for (const auto* list : {&extra, &sweep})
      for (const auto& c : *list) {
        results.push_back(analysis::compare_attention(c, o));
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
    write_text(csv, analysis::compare_csv(results, o), "compare");
    write_text(js, analysis::compare_json(results, o).dump(2) + "\n", "compare");
    analysis::save_compare_png(png, sweep_results.empty() ? results : sweep_results, a->x, o.device);
    std::cout << "\nwrote " << csv << ", " << js << ", " << png << "\n";
    return 0;
  };
}

}  // namespace headlab::cli
