// Wrapper vs fused causal attention (multi-head, grouped-query, multi-query): the same weights in both forms, timed
// and compared.
#include "analysis/compare.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "backends/backend.h"
#include "base/json_text.h"
#include "nn/attention.h"

namespace headlab::analysis {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

}  // namespace

// ---- wrapper vs fused ----
CompareConfig parse_compare_config(const std::string& spec) {
  std::vector<std::string> parts;
  std::stringstream ss(spec);
  for (std::string p; std::getline(ss, p, ',');) parts.push_back(p);
  HL_CHECK(parts.size() == 6 || parts.size() == 7, "compare: config '", spec,
           "' must be name,B,T,d_in,d_out,heads[,kv_heads]");
  CompareConfig c;
  c.name = parts[0];
  int64_t* fields[] = {&c.B, &c.T, &c.d_in, &c.d_out, &c.heads, &c.kv_heads};
  const char* names[] = {"B", "T", "d_in", "d_out", "heads", "kv_heads"};
  for (int i = 0; i + 1 < static_cast<int>(parts.size()); ++i) {
    size_t used = 0;
    try {
      *fields[i] = std::stoll(parts[static_cast<size_t>(i) + 1], &used);
    } catch (const std::exception&) {
      used = 0;
    }
    HL_CHECK(used > 0 && used == parts[static_cast<size_t>(i) + 1].size() && *fields[i] > 0, "compare: config '", spec,
             "': ", names[i], " must be a positive integer, got '", parts[static_cast<size_t>(i) + 1], "'");
  }
  HL_CHECK(c.d_out % c.heads == 0, "compare: config '", spec, "': d_out ", c.d_out, " must be divisible by heads ",
           c.heads);
  HL_CHECK(c.heads % c.kv() == 0, "compare: config '", spec, "': kv_heads ", c.kv_heads, " must divide heads ",
           c.heads);
  return c;
}

std::vector<CompareConfig> peer_compare_grid() {
  return {{"seed-toy", 2, 6, 3, 2, 2},
          {"small", 32, 64, 128, 128, 4},
          {"medium", 8, 256, 256, 256, 8},
          {"gpt2-ctx256", 8, 256, 768, 768, 12}};
}

double attention_flops_forward(const CompareConfig& c, bool per_head_keys) {
  const double B = static_cast<double>(c.B), T = static_cast<double>(c.T), di = static_cast<double>(c.d_in),
               d = static_cast<double>(c.d_out);
  const double kv = per_head_keys ? d : static_cast<double>(c.kv() * (c.d_out / c.heads));  // keys' width
  return 2 * B * T * di * (d + 2 * kv) + 2 * 2 * B * T * T * d + 2 * B * T * d * d;
}

CompareResult compare_attention(const CompareConfig& c, const CompareOptions& o) {
  HL_CHECK(c.B > 0 && c.T > 0 && c.d_in > 0 && c.d_out > 0 && c.heads > 0 && c.d_out % c.heads == 0 &&
               c.kv_heads >= 0 && c.heads % c.kv() == 0,
           "compare: config '", c.name, "' needs positive sizes, d_out divisible by heads and kv_heads dividing them");
  Backend& be = backend_for(o.device);
  Generator gen(o.seed);
  manual_seed(o.seed);  // module initialisation draws from the default generator
  const int64_t D = c.d_out / c.heads;
  auto wrapper = std::make_shared<nn::MultiHeadAttentionWrapper>(nn::CausalAttentionSizes{.d_in = c.d_in,
                                                                                          .d_out = c.d_out,
                                                                                          .context_length = c.T,
                                                                                          .num_heads = c.heads,
                                                                                          .head_dim = D,
                                                                                          .num_kv_heads = c.kv(),
                                                                                          .dropout = 0.0,
                                                                                          .qkv_bias = false,
                                                                                          .out_bias = true,
                                                                                          .rotary = {}});
  wrapper->to(o.device);
  wrapper->eval();
  std::shared_ptr<nn::CausalMultiHeadAttention> fused = nn::wrapper_to_fused(*wrapper);
  fused->eval();
  const Tensor x = randn({c.B, c.T, c.d_in}, gen).to(o.device);
  const Tensor dy = randn({c.B, c.T, c.d_out}, gen).to(o.device);

  CompareResult r;
  r.config = c;
  r.kv_cache_bytes_per_token = 2 * c.kv() * D * static_cast<int64_t>(sizeof(float));
  const Tensor xg = x.detach().requires_grad_(true);
  auto fwd = [&](nn::CausalMultiHead& m) -> std::function<void()> {
    return [&m, &x] {
      NoGradGuard no_grad;
      Tensor y = m.forward(x);
    };
  };
  auto fwd_bwd = [&](nn::CausalMultiHead& m) -> std::function<void()> {
    return [&m, &xg] {
      m.zero_grad();
      xg.zero_grad();
      m.forward(xg).sum().backward();  // the peer's loss
    };
  };
  // Both forms timed in turn within each repeat, so a busy machine slows them alike.
  const auto tf = time_interleaved({fwd(*wrapper), fwd(*fused)}, o.device, o.warmup, o.repeats);
  const auto tb = time_interleaved({fwd_bwd(*wrapper), fwd_bwd(*fused)}, o.device, o.warmup, o.repeats);
  auto peak = [&](const std::function<void()>& fn) {
    wrapper->zero_grad();
    fused->zero_grad();
    xg.zero_grad();
    be.synchronize();
    const size_t before = be.bytes_in_use();
    be.reset_peak();
    fn();
    be.synchronize();
    return static_cast<int64_t>(be.peak_bytes()) - static_cast<int64_t>(before);
  };
  int form = 0;
  for (auto* m : {static_cast<nn::CausalMultiHead*>(wrapper.get()), static_cast<nn::CausalMultiHead*>(fused.get())}) {
    FormMeasurement& fm = form == 0 ? r.wrapper : r.fused;
    fm.params = m->num_parameters();
    fm.flops_forward = attention_flops_forward(c, form == 0);
    fm.flops_backward = 2 * fm.flops_forward;
    fm.forward = tf[static_cast<size_t>(form)];
    fm.forward_backward = tb[static_cast<size_t>(form)];
    fm.peak_forward = peak(fwd(*m));
    fm.peak_forward_backward = peak(fwd_bwd(*m));  // includes the parameter and input gradients it creates
    ++form;
  }
  wrapper->zero_grad();
  fused->zero_grad();

  // The gap: same weights, same x, same dL/dy.
  const Tensor xw = x.detach().requires_grad_(true), xf = x.detach().requires_grad_(true);
  const Tensor yw = wrapper->forward(xw), yf = fused->forward(xf);
  const Tensor dxw = grad({yw}, {xw}, {dy})[0], dxf = grad({yf}, {xf}, {dy})[0];
  r.max_abs_out = amax(abs(sub(yw.detach(), yf.detach()))).item<double>();
  r.max_abs_dx = amax(abs(sub(dxw, dxf))).item<double>();
  return r;
}

void attach_torch_peer(CompareResult& r, const std::string& json_line) {
  const CompareConfig& c = r.config;
  nlohmann::json j;
  try {
    j = parse_json_text(json_line, "compare: cannot read the PyTorch peer's output for config '" + c.name + "'");
    const nlohmann::json kv = j.value("kv_heads", j.at("heads"));  // a peer before kv_heads: multi-head
    HL_CHECK(j.at("B") == c.B && j.at("T") == c.T && j.at("d_in") == c.d_in && j.at("d_out") == c.d_out &&
                 j.at("heads") == c.heads && kv == c.kv(),
             "compare: the PyTorch peer measured B=", j.at("B"), " T=", j.at("T"), " d_in=", j.at("d_in"),
             " d_out=", j.at("d_out"), " heads=", j.at("heads"), " kv_heads=", kv, " for config '", c.name, "'");
    auto form = [&](const char* name) {
      auto stats = [&](const nlohmann::json& t) {
        TimeStats s;
        s.median = t.at("median").get<double>() / 1e3;
        s.p25 = t.at("p25").get<double>() / 1e3;
        s.p75 = t.at("p75").get<double>() / 1e3;
        s.min = s.max = kNaN;  // the peer reports quartiles only
        s.repeats = j.value("repeats", int64_t{0});
        return s;
      };
      const nlohmann::json& f = j.at(name);
      return PeerTimes{stats(f.at("forward")), stats(f.at("forward_backward"))};
    };
    r.torch_wrapper = form("wrapper");
    r.torch_fused = form("fused");
    r.torch_version = j.value("torch", "");
  } catch (const nlohmann::json::exception& e) {
    HL_FAIL("compare: cannot read the PyTorch peer's output for config '", c.name, "' (", e.what(),
            "): ", json_line.substr(0, 200));
  }
}

}  // namespace headlab::analysis
