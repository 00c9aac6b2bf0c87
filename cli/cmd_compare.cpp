// headlab compare: the wrapper and fused causal attention (multi-head, grouped-query, multi-query), timed side by
// side (analysis/compare.h),
// as a terminal table, compare.csv, compare.json and compare.png, beside the PyTorch eager peer
// (bench/torch_mha_peer.py) when python3-torch is installed.
#include <stdio.h>
#include <sys/wait.h>
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
#include "analysis/machine_load.h"
#include "backends/backend.h"
#include "base/input_path.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "io/h5file.h"
#include "train/config.h"
#include "train/memory.h"

namespace headlab::cli {

namespace fs = std::filesystem;

namespace {

struct CompareArgs {
  std::vector<int64_t> heads{1, 2, 4, 8, 16}, emb{256}, tokens{128}, batch{8};
  std::vector<int64_t> kv_heads{0};  // 0: multi-head
  std::vector<std::string> configs;
  bool no_peer = false, no_sweep = false;
  std::string device = "cpu", out = ".", x = "auto", torch_peer = "auto", torch_peer_script = HEADLAB_TORCH_MHA_PEER;
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
            << "KV = key/value heads (grouped-query below H, multi-query at 1): the wrapper's heads of a group share "
               "one W_key/W_value; KV B/tok = float32 key/value cache bytes per token and layer\n"
            << "FLOPs count GEMMs (2 per multiply-add; f+b = 3x forward); peak = backend bytes above what was live\n\n";
  std::cout << pad("config", 13, true) << pad("B", 4) << pad("T", 6) << pad("d_in", 6) << pad("d_out", 6) << pad("H", 4)
            << pad("KV", 4) << "  " << pad("form", 8, true) << pad("params", 10) << pad("KV B/tok", 9)
            << pad("GFLOP", 8) << pad("fwd ms", 10) << pad("IQR", 17) << pad("GFLOP/s", 9) << pad("f+b ms", 10)
            << pad("IQR", 17) << pad("GFLOP/s", 9) << pad("peak fwd", 11) << pad("peak f+b", 11) << pad("max|dy|", 9)
            << pad("max|dx|", 9) << "\n";
}

std::string ms(double s) { return fmt(s * 1e3, s * 1e3 < 10 ? 3 : 1); }

constexpr int kConfigWidth = 43;  // the config columns of a row: name, B, T, d_in, d_out, H, KV

// The time columns of a row: median, IQR and GFLOP/s, forward then forward+backward.
std::string time_columns(const analysis::TimeStats& fwd, const analysis::TimeStats& fb, double flops_fwd,
                         double flops_fb) {
  std::ostringstream os;
  os << pad(ms(fwd.median), 10) << pad(ms(fwd.p25) + "-" + ms(fwd.p75), 17)
     << pad(fmt(flops_fwd / fwd.median / 1e9, 1), 9) << pad(ms(fb.median), 10) << pad(ms(fb.p25) + "-" + ms(fb.p75), 17)
     << pad(fmt(flops_fb / fb.median / 1e9, 1), 9);
  return os.str();
}

void print_compare_row(const analysis::CompareResult& r) {
  const auto& c = r.config;
  auto line = [&](const char* form, const analysis::FormMeasurement& m, bool first) {
    std::ostringstream os;
    if (first)
      os << pad(c.name, 13, true) << pad(std::to_string(c.B), 4) << pad(std::to_string(c.T), 6)
         << pad(std::to_string(c.d_in), 6) << pad(std::to_string(c.d_out), 6) << pad(std::to_string(c.heads), 4)
         << pad(std::to_string(c.kv()), 4);
    else
      os << std::string(kConfigWidth, ' ');
    os << "  " << pad(form, 8, true) << pad(std::to_string(m.params), 10)
       << pad(std::to_string(r.kv_cache_bytes_per_token), 9) << pad(fmt(m.flops_forward / 1e9, 3), 8)
       << time_columns(m.forward, m.forward_backward, m.flops_forward, m.flops_forward + m.flops_backward)
       << pad(fmt_bytes(m.peak_forward), 11) << pad(fmt_bytes(m.peak_forward_backward), 11);
    if (!first) os << pad(fmt_sci(r.max_abs_out), 9) << pad(fmt_sci(r.max_abs_dx), 9);
    std::cout << os.str() << "\n";
  };
  line("wrapper", r.wrapper, true);
  line("fused", r.fused, false);
  // The PyTorch peer's rows, when it ran: the same FLOPs, its times.
  auto peer = [&](const char* form, const analysis::PeerTimes& t, const analysis::FormMeasurement& m) {
    std::cout << std::string(kConfigWidth, ' ') << "  " << pad(form, 8, true) << pad("", 27)
              << time_columns(t.forward, t.forward_backward, m.flops_forward, m.flops_forward + m.flops_backward)
              << "\n";
  };
  if (r.torch_wrapper) peer("torch wr", *r.torch_wrapper, r.wrapper);
  if (r.torch_fused) peer("torch fu", *r.torch_fused, r.fused);
  std::cout << std::flush;
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char ch : s) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return q + "'";
}

// Runs a shell command; its stdout, and whether it exited 0.
std::pair<std::string, bool> run_capture(const std::string& command) {
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return {"", false};
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  const int status = pclose(pipe);
  return {out, status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0};
}

// The PyTorch eager peer: bench/torch_mha_peer.py under the first python3 that can import torch
// (Debian's python3-torch lives under /usr/bin/python3), run for each config right after headlab
// measured it, with the same threads, warm-up, repeats and seed.
struct TorchPeer {
  std::string script, python;
  bool enabled = false;

  // mode: auto (when python3 can import torch), on (an error when it cannot), off.
  TorchPeer(const std::string& mode, std::string path) : script(std::move(path)) {
    if (mode == "off") return;
    std::string why;
    if (!fs::exists(script))
      why = "its script " + script + " does not exist (--torch-peer-script)";
    else {
      for (const char* candidate : {"python3", "/usr/bin/python3"})
        if (python.empty() && run_capture(std::string(candidate) + " -c 'import torch' >/dev/null 2>&1").second)
          python = candidate;
      if (python.empty()) why = "no python3 can import torch (apt-get install python3-torch)";
    }
    HL_CHECK(why.empty() || mode != "on", "compare: --torch-peer on, but ", why);
    enabled = why.empty();
    if (!enabled) std::cout << "PyTorch peer left out: " << why << "\n\n";
  }

  void measure(analysis::CompareResult& r, const analysis::CompareOptions& o) {
    if (!enabled) return;
    const auto& c = r.config;
    const std::string spec = c.name + "," + std::to_string(c.B) + "," + std::to_string(c.T) + "," +
                             std::to_string(c.d_in) + "," + std::to_string(c.d_out) + "," + std::to_string(c.heads) +
                             "," + std::to_string(c.kv());
    const auto [out, ok] =
        run_capture(python + " " + shell_quote(script) + " --threads " + std::to_string(threads_in_use()) +
                    " --warmup " + std::to_string(o.warmup) + " --repeats " + std::to_string(o.repeats) + " --seed " +
                    std::to_string(o.seed) + " --config " + shell_quote(spec) + " 2>&1");
    if (!ok) {  // one failure ends the peer for this run; headlab's figures stand on their own
      std::cout << "PyTorch peer failed on config '" << c.name << "' and is left out from here on:\n" << out << "\n";
      enabled = false;
      return;
    }
    analysis::attach_torch_peer(r, out.substr(0, out.find('\n')));
  }
};

}  // namespace

Action add_compare(CLI::App& app) {
  auto a = std::make_shared<CompareArgs>();
  app.add_option("--heads", a->heads, "sweep: head counts (comma-separated)")
      ->delimiter(',')
      ->check(positive_number(1e6))
      ->capture_default_str();
  app.add_option("--emb-dim", a->emb, "sweep: d_in = d_out values")
      ->delimiter(',')
      ->check(positive_number(1e6))
      ->capture_default_str();
  app.add_option("--tokens", a->tokens, "sweep: sequence lengths T")
      ->delimiter(',')
      ->check(positive_number(1e6))
      ->capture_default_str();
  app.add_option("--batch", a->batch, "sweep: batch sizes B")
      ->delimiter(',')
      ->check(positive_number(1e6))
      ->capture_default_str();
  app.add_option("--kv-heads", a->kv_heads,
                 "key/value head counts each config runs with: 0 = multi-head (as many as its heads), a divisor of "
                 "every head count (grouped-query), 1 (multi-query); a --config with its own kv_heads keeps it")
      ->delimiter(',')
      ->check(non_negative_number(1e6))
      ->capture_default_str();
  app.add_option("--config", a->configs,
                 "extra config name,B,T,d_in,d_out,heads[,kv_heads] (repeatable; the PyTorch peer's format)");
  app.add_flag("--no-peer-grid", a->no_peer,
               "leave out the PyTorch peer's default configs (seed-toy, small, medium, gpt2-ctx256)");
  app.add_flag("--no-sweep", a->no_sweep, "leave out the heads x emb-dim x tokens x batch sweep");
  app.add_option("--device", a->device, "cpu | cuda | cuda:N")->capture_default_str();
  app.add_option("--repeats", a->repeats, "timed runs per measurement (the median is reported)")
      ->check(positive_number(1e6))
      ->capture_default_str();
  app.add_option("--warmup", a->warmup, "untimed runs before timing")
      ->check(non_negative_number(1e6))
      ->capture_default_str();
  add_seed_option(app, a->seed, "seed for weights and inputs");
  app.add_option("--x", a->x, "x axis of compare.png: auto | heads | tokens | emb | batch")
      ->check(CLI::IsMember({"auto", "heads", "tokens", "emb", "batch"}))
      ->capture_default_str();
  app.add_option("--out", a->out, "folder for compare.csv, compare.json and compare.png")
      ->type_name(kOutputDir)
      ->capture_default_str();
  add_threads_option(app, a->threads);
  app.add_option("--torch-peer", a->torch_peer,
                 "time the same forms in PyTorch eager (bench/torch_mha_peer.py) beside each config: auto (when "
                 "python3 can import torch) | on | off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  app.add_option("--torch-peer-script", a->torch_peer_script, "the PyTorch peer script")
      ->type_name(kInputFile)
      ->capture_default_str();
  CLI::Option* peer_script = app.get_option("--torch-peer-script");
  return [a, peer_script] {
    set_threads(a->threads);
    analysis::CompareOptions o;
    o.device = Device::parse(a->device);
    o.repeats = a->repeats;
    o.warmup = a->warmup;
    o.seed = a->seed;
    backend_for(o.device);  // a clear error before any work when the device is missing
    // python3 would block on a FIFO; a missing script is the peer's to report, unless the user named it.
    if (a->torch_peer != "off" || peer_script->count() > 0)
      check_input_file(a->torch_peer_script, "compare: --torch-peer-script", a->torch_peer != "off");
    // Each config once per --kv-heads value (a --config naming its own kv_heads: once, with it).
    const auto with_kv_heads = [&](analysis::CompareConfig c, std::vector<analysis::CompareConfig>& out) {
      if (c.kv_heads) {
        out.push_back(c);
        return;
      }
      for (int64_t kv : a->kv_heads) {
        HL_CHECK(kv == 0 || c.heads % kv == 0, "compare: --kv-heads ", kv, " does not divide the ", c.heads,
                 " heads of config '", c.name, "' (d_out ", c.d_out, ")");
        c.kv_heads = kv;
        out.push_back(c);
      }
    };
    std::vector<analysis::CompareConfig> sweep, extra;
    if (!a->no_sweep)
      for (int64_t B : a->batch)
        for (int64_t T : a->tokens)
          for (int64_t d : a->emb)
            for (int64_t H : a->heads) {
              HL_CHECK(d % H == 0, "compare: emb dim ", d, " is not divisible by ", H, " heads");
              with_kv_heads({"sweep", B, T, d, d, H}, sweep);
            }
    if (!a->no_peer)
      for (const auto& c : analysis::peer_compare_grid()) with_kv_heads(c, extra);
    for (const auto& s : a->configs) with_kv_heads(analysis::parse_compare_config(s), extra);
    HL_CHECK(!sweep.empty() || !extra.empty(),
             "compare: nothing to measure (--no-sweep and --no-peer-grid without --config)");
    if (!o.device.is_cuda()) {     // the largest measurement, before the first row: the wrapper's attention maps and
      train::MemoryEstimate need;  // their gradients (4 B H T^2 floats), activations and theirs (about 12 B T d)
      for (const auto* list : {&extra, &sweep})
        for (const auto& c : *list)
          need.activations =
              std::max(need.activations, sizeof(float) * (4.0 * double(c.B * c.heads) * double(c.T) * double(c.T) +
                                                          12.0 * double(c.B * c.T) * double(c.d_out)));
      train::check_memory_fits(need, "compare", "lower --tokens or --batch");
    }
    const io::FolderLock lock = make_locked_dir(a->out, "compare");
    TorchPeer torch(o.device.is_cuda() ? "off" : a->torch_peer, a->torch_peer_script);  // a CPU peer
    const analysis::OtherLoad load;  // what else ran on the machine meanwhile
    print_compare_header(o);
    std::vector<analysis::CompareResult> results, sweep_results;
    for (const auto* list : {&extra, &sweep})
      for (const auto& c : *list) {
        results.push_back(analysis::compare_attention(c, o));
        torch.measure(results.back(), o);
        if (list == &sweep) sweep_results.push_back(results.back());
        print_compare_row(results.back());
      }
    std::cout << "\nfused speed-up over wrapper (median time ratio):\n";
    for (const auto& r : results)
      std::cout << "  " << pad(r.config.name, 12, true) << " H=" << pad(std::to_string(r.config.heads), 2, true)
                << " KV=" << pad(std::to_string(r.config.kv()), 2, true)
                << " T=" << pad(std::to_string(r.config.T), 4, true)
                << " d=" << pad(std::to_string(r.config.d_out), 4, true) << "  forward "
                << fmt(r.wrapper.forward.median / r.fused.forward.median, 2) << "x  fwd+bwd "
                << fmt(r.wrapper.forward_backward.median / r.fused.forward_backward.median, 2) << "x\n";
    if (std::any_of(results.begin(), results.end(), [](const auto& r) { return r.torch_fused.has_value(); })) {
      std::cout << "\nheadlab over PyTorch " << results.front().torch_version
                << " eager, same form (median time ratio; > 1: headlab is faster):\n";
      for (const auto& r : results) {
        if (!r.torch_fused || !r.torch_wrapper) continue;
        auto x = [](const analysis::TimeStats& ours, const analysis::TimeStats& theirs) {
          return fmt(theirs.median / ours.median, 2) + "x";
        };
        std::cout << "  " << pad(r.config.name, 12, true) << " H=" << pad(std::to_string(r.config.heads), 2, true)
                  << " KV=" << pad(std::to_string(r.config.kv()), 2, true)
                  << " T=" << pad(std::to_string(r.config.T), 4, true)
                  << " d=" << pad(std::to_string(r.config.d_out), 4, true) << "  wrapper fwd "
                  << pad(x(r.wrapper.forward, r.torch_wrapper->forward), 7) << " fwd+bwd "
                  << pad(x(r.wrapper.forward_backward, r.torch_wrapper->forward_backward), 7) << "   fused fwd "
                  << pad(x(r.fused.forward, r.torch_fused->forward), 7) << " fwd+bwd "
                  << pad(x(r.fused.forward_backward, r.torch_fused->forward_backward), 7) << "\n";
      }
    }
    const std::string csv = join_path(a->out, "compare.csv"), js = join_path(a->out, "compare.json"),
                      png = join_path(a->out, "compare.png");
    write_text(csv, analysis::compare_csv(results, o), "compare");
    nlohmann::json json = analysis::compare_json(results, o);
    json["other_processes_busy_cores"] = load.cores();  // NaN (null) where /proc cannot be read
    write_text(js, json.dump(2) + "\n", "compare");
    analysis::save_compare_png(png, sweep_results.empty() ? results : sweep_results, a->x, o.device);
    std::cout << "\nwrote " << csv << ", " << js << ", " << png << "\n";
    if (const std::string w = load.warning(); !w.empty()) std::cerr << "compare: warning: " << w << "\n";
    return 0;
  };
}

}  // namespace headlab::cli
