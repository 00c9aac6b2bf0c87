// Feature pages (analysis/sae_pages.h): the corpus scan, each page's contexts and splits, and the HTML.
#include "analysis/sae_pages.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "analysis/explorer.h"
#include "analysis/hooked_run.h"
#include "io/atomic_file.h"

namespace headlab::analysis {

namespace {

// A kept context: where a feature fired, as the scan found it; `text` hashes the tokens up to the peak.
struct Hit {
  float activation = 0;
  int64_t batch = 0, row = 0, position = 0;
  uint64_t text = 0;
};

// The tokens [t - 16, t] of a row, hashed (FNV-1a): a text's windows overlap, and one passage is one context.
uint64_t text_before(const std::vector<int64_t>& ids, int64_t row, int64_t T, int64_t t) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t i = std::max<int64_t>(0, t - 16); i <= t; ++i)
    h = (h ^ static_cast<uint64_t>(ids[static_cast<size_t>(row * T + i)])) * 1099511628211ull;
  return h;
}

// Up to K hits, the largest, at most one a sequence and one a passage (a feature fires on neighbours alike).
void keep(std::vector<Hit>& hits, const Hit& h, size_t K) {
  for (Hit& other : hits)
    if ((other.batch == h.batch && other.row == h.row) || other.text == h.text) {
      if (h.activation > other.activation) other = h;
      return;
    }
  if (hits.size() < K) return hits.push_back(h);
  auto least = std::min_element(hits.begin(), hits.end(),
                                [](const Hit& a, const Hit& b) { return a.activation < b.activation; });
  if (h.activation > least->activation) *least = h;
}

}  // namespace

FeaturePages feature_pages(nn::DecoderModel& model, const tasks::Task& task, nn::SparseAutoencoder& sae,
                           const io::SaeOrigin& origin, int64_t batches, int64_t B, int64_t T,
                           const FeaturePagesOptions& o) {
  const NoGradGuard no_grad;
  const int64_t d_sae = sae.config().d_sae, d_in = sae.config().d_in;
  for (int64_t j : o.chosen)
    HL_CHECK(j >= 0 && j < d_sae, "sae pages: feature ", j, " is not one of the SAE's ", d_sae);
  FeaturePages pages;
  pages.hook = origin.hook_name, pages.d_sae = d_sae;
  std::vector<std::vector<Hit>> hits(static_cast<size_t>(d_sae));
  std::vector<double> fired(static_cast<size_t>(d_sae), 0.0), largest(static_cast<size_t>(d_sae), 0.0);
  const auto K = static_cast<size_t>(o.contexts);
  std::map<int64_t, std::vector<int64_t>> inputs;  // the batches' token ids, kept only where a context is
  for (int64_t b = 0; b < batches; ++b) {
    const tasks::Batch batch = task.batch(tasks::Split::val, static_cast<uint64_t>(b), B, T);
    const HookedRun run = run_hooked(model, tensor(batch.inputs, {B, T}).to(model.device()), {origin.hook_name});
    const Tensor act = run.cache.at(origin.hook_name);
    HL_CHECK(act.numel() == B * T * d_in, "sae pages: ", origin.hook_name, "'s activations are ", act.numel() / (B * T),
             " wide a token, the SAE's d_in is ", d_in);
    const std::vector<float> f =
        to_dtype(to_device(sae.encode(reshape(act, {B * T, d_in})), kCPU), DType::f32).to_vector<float>();
    for (int64_t t = 0; t < B * T; ++t)
      for (int64_t j = 0; j < d_sae; ++j) {
        const float v = f[static_cast<size_t>(t * d_sae + j)];
        if (v <= 0) continue;
        fired[static_cast<size_t>(j)] += 1;
        largest[static_cast<size_t>(j)] = std::max(largest[static_cast<size_t>(j)], static_cast<double>(v));
        keep(hits[static_cast<size_t>(j)], {v, b, t / T, t % T, text_before(batch.inputs, t / T, T, t % T)}, K);
      }
    pages.tokens += B * T;
  }
  std::vector<int64_t> chosen = o.chosen;
  if (chosen.empty()) {
    std::vector<int64_t> order(static_cast<size_t>(d_sae));
    for (int64_t j = 0; j < d_sae; ++j) order[static_cast<size_t>(j)] = j;
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return largest[static_cast<size_t>(a)] > largest[static_cast<size_t>(b)];
    });
    for (int64_t j : order)
      if (static_cast<int64_t>(chosen.size()) < o.features && largest[static_cast<size_t>(j)] > 0) chosen.push_back(j);
  }
  for (int64_t j : chosen)
    for (const Hit& h : hits[static_cast<size_t>(j)])
      if (!inputs.count(h.batch))
        inputs[h.batch] = task.batch(tasks::Split::val, static_cast<uint64_t>(h.batch), B, T).inputs;

  for (int64_t j : chosen) {
    FeaturePage p;
    p.feature = j, p.max_activation = largest[static_cast<size_t>(j)];
    p.frequency = fired[static_cast<size_t>(j)] / static_cast<double>(std::max<int64_t>(1, pages.tokens));
    std::vector<Hit> kept = hits[static_cast<size_t>(j)];
    std::sort(kept.begin(), kept.end(), [](const Hit& a, const Hit& b) { return a.activation > b.activation; });
    for (const Hit& h : kept) {
      const std::vector<int64_t>& all = inputs.at(h.batch);
      FeatureContext c;
      c.ids.assign(all.begin() + h.row * T, all.begin() + (h.row + 1) * T);
      FeatureOptions fo;
      fo.chosen = {j}, fo.position = h.position, fo.logits = o.logits;
      const FeatureReport r = features_on_prompt(model, sae, origin, c.ids, fo);
      const FeatureOnPrompt& f = r.features.front();
      c.activations = f.activations, c.position = h.position, c.activation = f.activation;
      if (p.contexts.empty()) {  // what depends on the feature alone
        p.top_logits = f.top_logits, p.bottom_logits = f.bottom_logits, p.head_shares = f.head_shares;
        p.labels = f.labels, p.parts.assign(f.parts.size(), 0.0);
        pages.split = r.split;
      }
      for (size_t i = 0; i < f.parts.size(); ++i) p.parts[i] += f.parts[i] / static_cast<double>(kept.size());
      p.contexts.push_back(std::move(c));
    }
    pages.features.push_back(std::move(p));
  }
  return pages;
}

namespace {

// The page; /*DATA*/ is replaced by the JSON. One DOM node a token shown: contexts are cut around their peak.
constexpr const char* kTemplate = R"HTML(<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>headlab features</title>
<style>
body { font: 14px system-ui, sans-serif; margin: 0; display: flex; height: 100vh; color: #222; }
#list { width: 230px; overflow-y: auto; border-right: 1px solid #ccc; }
#list div { padding: 4px 8px; cursor: pointer; border-bottom: 1px solid #eee; }
#list div.on { background: #ffe2c4; }
#page { flex: 1; overflow-y: auto; padding: 8px 18px; }
h1 { font-size: 18px; } h2 { font-size: 15px; margin: 14px 0 4px; }
.ctx { font-family: ui-monospace, monospace; white-space: pre-wrap; margin: 3px 0; line-height: 1.7; }
.tok { border-radius: 2px; }
.peak { outline: 1px solid #a04000; }
table { border-collapse: collapse; } td { padding: 1px 8px; font-family: ui-monospace, monospace; }
.bar { display: inline-block; height: 10px; background: #4a7fd4; vertical-align: middle; }
.neg { background: #d45a4a; }
#meta { color: #666; }
</style></head><body>
<div id="list"></div>
<div id="page"><h1 id="title"></h1><div id="meta"></div><div id="body"></div></div>
<script>
const D = /*DATA*/;
const headlab = { data: D, state: { feature: null } };
const esc = s => s.replace(/[&<>"]/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c]));
const text = id => D.vocab[id] === undefined ? String(id) : D.vocab[id];
const BEFORE = 24, AFTER = 8;
// A token's colour: orange, its alpha the activation over the feature's largest.
const alpha = (a, max) => max > 0 ? Math.max(0, Math.min(1, a / max)) : 0;
function bars(labels, values) {
  const top = Math.max(1e-12, ...values.map(Math.abs));
  return "<table>" + labels.map((l, i) => "<tr><td>" + esc(l) + "</td><td>" + values[i].toFixed(4) +
    "</td><td><span class='bar" + (values[i] < 0 ? " neg" : "") + "' style='width:" +
    Math.round(120 * Math.abs(values[i]) / top) + "px'></span></td></tr>").join("") + "</table>";
}
function show(index) {
  const f = D.features[index];
  headlab.state.feature = f.feature;
  document.querySelectorAll("#list div").forEach((el, i) => el.classList.toggle("on", i === index));
  document.getElementById("title").textContent = "Feature " + f.feature;
  document.getElementById("meta").textContent = D.hook + ": largest activation " + f.max.toFixed(4) + ", fires on " +
    (100 * f.frequency).toFixed(2) + "% of " + D.tokens + " tokens";
  let h = "";
  if (f.top.length) {
    h += "<h2>Logit effects</h2><table><tr><td><b>promotes</b></td><td></td><td><b>suppresses</b></td><td></td></tr>";
    for (let i = 0; i < f.top.length; ++i)
      h += "<tr><td>" + esc(JSON.stringify(text(f.top[i][0]))) + "</td><td>" + f.top[i][1].toFixed(3) + "</td><td>" +
           esc(JSON.stringify(text(f.bottom[i][0]))) + "</td><td>" + f.bottom[i][1].toFixed(3) + "</td></tr>";
    h += "</table>";
  }
  if (f.head_shares.length)  // a hook_z SAE's, whose split is over the same heads
    h += "<h2>Written by (its output direction's share a head)</h2>" + bars(f.labels, f.head_shares);
  if (f.labels.length)
    h += "<h2>Made to fire by (pre-activation split at the peak, mean over its contexts; " + esc(D.split) + ")</h2>" +
         bars(f.labels, f.parts);
  h += "<h2>Top activating contexts</h2>";
  f.contexts.forEach((c, ci) => {
    const from = Math.max(0, c.position - BEFORE), to = Math.min(c.ids.length, c.position + AFTER + 1);
    h += "<div class='ctx' data-context='" + ci + "'>" + (from > 0 ? "… " : "");
    for (let t = from; t < to; ++t)
      h += "<span class='tok" + (t === c.position ? " peak" : "") + "' data-t='" + t + "' title='" +
           c.acts[t].toFixed(4) + "' style='background: rgba(255, 140, 0, " + alpha(c.acts[t], f.max).toFixed(4) +
           ")'>" + esc(text(c.ids[t])) + "</span>";
    h += (to < c.ids.length ? " …" : "") + "</div>";
  });
  document.getElementById("body").innerHTML = h;
  const here = "F" + f.feature;
  if (decodeURIComponent(location.hash.slice(1)) !== here) history.replaceState(null, "", "#" + here);
}
// What the page shows, for tests: the feature, and every context's tokens with their colour.
headlab.view = () => ({
  feature: headlab.state.feature,
  title: document.getElementById("title").textContent,
  contexts: [...document.querySelectorAll(".ctx")].map(c => [...c.querySelectorAll(".tok")].map(s => ({
    t: Number(s.dataset.t), text: s.textContent, background: getComputedStyle(s).backgroundColor,
    peak: s.classList.contains("peak")})))
});
function fromHash() {
  const m = /^F(\d+)$/.exec(decodeURIComponent(location.hash.slice(1)));
  const i = m ? D.features.findIndex(f => f.feature === Number(m[1])) : -1;
  if (D.features.length) show(i >= 0 ? i : 0);
}
document.getElementById("list").innerHTML = D.features.map((f, i) => "<div data-index='" + i + "'>F" + f.feature +
  " <small>max " + f.max.toFixed(3) + ", " + (100 * f.frequency).toFixed(2) + "%</small></div>").join("");
document.querySelectorAll("#list div").forEach(el => el.addEventListener("click", () => show(Number(el.dataset.index))));
window.addEventListener("hashchange", fromHash);
if (!D.features.length) document.getElementById("title").textContent = "No feature fired on the corpus";
fromHash();
</script></body></html>
)HTML";

}  // namespace

std::string feature_pages_html(const FeaturePages& pages, const tasks::Task& task, const std::string& title) {
  nlohmann::json vocab = nlohmann::json::object(), features = nlohmann::json::array();
  const auto word = [&](int64_t id) { vocab[std::to_string(id)] = task.token_text(id); };
  const auto effects = [&](const std::vector<TokenEffect>& v) {
    nlohmann::json j = nlohmann::json::array();
    for (const TokenEffect& e : v) word(e.token), j.push_back({e.token, e.effect});
    return j;
  };
  for (const FeaturePage& p : pages.features) {
    nlohmann::json contexts = nlohmann::json::array();
    for (const FeatureContext& c : p.contexts) {
      for (int64_t id : c.ids) word(id);
      contexts.push_back({{"ids", c.ids}, {"acts", c.activations}, {"position", c.position}});
    }
    features.push_back({{"feature", p.feature},
                        {"max", p.max_activation},
                        {"frequency", p.frequency},
                        {"top", effects(p.top_logits)},
                        {"bottom", effects(p.bottom_logits)},
                        {"head_shares", p.head_shares},
                        {"labels", p.labels},
                        {"parts", p.parts},
                        {"contexts", contexts}});
  }
  return page_with_data(kTemplate, {{"title", title},
                                    {"hook", pages.hook},
                                    {"split", pages.split},
                                    {"tokens", pages.tokens},
                                    {"d_sae", pages.d_sae},
                                    {"vocab", vocab},
                                    {"features", features}});
}

void save_feature_pages(const std::string& path, const FeaturePages& pages, const tasks::Task& task,
                        const std::string& title) {
  io::write_file_atomic(path, feature_pages_html(pages, task, title), "sae pages");
}

}  // namespace headlab::analysis
