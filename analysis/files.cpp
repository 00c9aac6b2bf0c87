// The files the analysis commands write: CSV, JSON, HDF5 and pictures (through plot/).
#include "analysis/files.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <tuple>

#include <omp.h>

#include "analysis/ablation.h"
#include "analysis/table.h"
#include "io/atomic_file.h"
#include "io/h5file.h"
#include "plot/plot.h"

namespace headlab::analysis {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

}  // namespace

// ---- files ----
namespace {

// A picture through plot/, written to a temp name and renamed like every other file (plot/ sits
// below io/, so the atomic part is here). The temp name keeps the extension plot/ picks the format by;
// plot/'s errors name the file the caller asked for, not the temp name.
template <typename Draw>
void save_picture(const std::string& path, const char* who, Draw draw) {
  io::AtomicFile f(path, who);
  try {
    draw(f.temp_path());
  } catch (const Error& e) {
    std::string msg = e.what();
    for (size_t at = 0; (at = msg.find(f.temp_path(), at)) != std::string::npos; at += path.size())
      msg.replace(at, f.temp_path().size(), path);
    throw Error(msg);
  }
  f.commit();
}

}  // namespace

std::string head_label(int64_t layer, int64_t head) { return "L" + std::to_string(layer) + "H" + std::to_string(head); }

std::string head_name(const nn::Model& model, int64_t l, int64_t h) {
  return model.attention_label(l) + "H" + std::to_string(model.original_head(l, h));
}

std::string removed_heads_str(const PruneStep& s, const nn::Model& model) {
  std::string out;
  for (const auto& [l, h] : s.removed) {
    if (!out.empty()) out += " ";
    out += head_name(model, l, h);
  }
  return out;
}

std::string kept_heads_text(const std::vector<std::vector<int64_t>>& kept) {
  std::string out;
  for (size_t l = 0; l < kept.size(); ++l) {
    out.append(l ? "; layer " : "layer ").append(std::to_string(l)).append(": ");
    for (size_t i = 0; i < kept[l].size(); ++i) out.append(i ? "," : "").append(std::to_string(kept[l][i]));
  }
  return out;
}

std::string kept_heads_text(const nn::Model& model) {
  const bool decoder = model.is_decoder();
  std::string out;
  for (int64_t l = 0; l < model.attention_count(); ++l) {
    out.append(l ? "; " : "").append(decoder ? "layer " + std::to_string(l) : model.attention_label(l)).append(": ");
    for (int64_t h = 0; h < model.heads_at(l); ++h)
      out.append(h ? "," : "").append(std::to_string(model.original_head(l, h)));
  }
  return out;
}

std::string token_label(const std::string& t) {
  if (t == " ") return "sp";
  if (t == "\n") return "\\n";
  if (t == "\t") return "\\t";
  std::string out;
  for (unsigned char c : t) out += (c >= 32 && c < 127) ? static_cast<char>(c) : '?';
  return out.empty() ? "?" : out;
}

void save_heads_csv(const std::string& path, const AblationResult& a, const std::vector<HeadColumn>& extra,
                    const nn::Model* model) {
  const bool ex = a.base.has_exact_match;
  const bool named = model && !model->is_decoder();
  const Column integer{"", NumberFormat::integer, 0}, number{"", NumberFormat::fixed, 4};
  auto col = [](Column c, std::string name) { return c.name = std::move(name), c; };
  Table t;
  if (named) t.columns.push_back(text_column("module"));
  for (const char* name : {"layer", "head"}) t.columns.push_back(col(integer, name));
  for (const char* name : {"importance", "importance_raw"}) t.columns.push_back(col(number, name));
  for (const std::string kind : {"zero", "mean", "resample"}) {
    t.columns.push_back(col(number, kind + "_delta_loss"));
    t.columns.push_back(col(number, kind + "_delta_accuracy"));
    if (ex) t.columns.push_back(col(number, kind + "_delta_exact_match"));
  }
  for (const HeadColumn& c : extra) t.columns.push_back(text_column(c.name));
  for (const auto& h : a.heads) {
    std::vector<Cell> row;
    if (named) row.emplace_back(model->attention_label(h.layer));
    row.insert(row.end(), {Cell(static_cast<double>(h.layer)), Cell(static_cast<double>(h.original_head)),
                           Cell(h.importance), Cell(h.importance_raw)});
    for (const Scores* s : {&h.zero, &h.mean, &h.resample}) {
      row.emplace_back(s->loss - a.base.loss);
      row.emplace_back(s->token_accuracy - a.base.token_accuracy);
      if (ex) row.emplace_back(s->exact_match - a.base.exact_match);
    }
    for (const HeadColumn& c : extra) {
      HL_CHECK(static_cast<size_t>(h.layer) < c.values.size() &&
                   static_cast<size_t>(h.head) < c.values[static_cast<size_t>(h.layer)].size(),
               "save_heads_csv: column ", c.name, " has no value for layer ", h.layer, " head ", h.head);
      row.emplace_back(c.values[static_cast<size_t>(h.layer)][static_cast<size_t>(h.head)]);
    }
    t.add_row(std::move(row));
  }
  io::write_file_atomic(path, render_csv(t), "save_heads_csv");
}

namespace {

// A HeadMap as a layer x (original) head heatmap; heads pruned before are NaN (grey).
plot::Heatmap head_heatmap(const HeadMap& map, const nn::Model& model) {
  plot::Heatmap m;
  m.title = map.title;
  m.x_label = "head";
  m.y_label = "layer";
  m.colorbar_label = map.colorbar_label;
  m.rows = model.attention_count();
  m.cols = model.full_heads();
  m.values.assign(static_cast<size_t>(m.rows * m.cols), kNaN);
  HL_CHECK(static_cast<int64_t>(map.values.size()) == m.rows, "save_head_map_png: ", map.values.size(),
           " layers of values for a model of ", m.rows);
  for (int64_t l = 0; l < m.rows; ++l)
    for (size_t h = 0; h < map.values[static_cast<size_t>(l)].size(); ++h)
      m.values[static_cast<size_t>(l * m.cols + model.original_head(l, static_cast<int64_t>(h)))] =
          map.values[static_cast<size_t>(l)][h];
  const bool decoder = model.is_decoder();  // rows "0", "1"; else "enc.L0", ...
  for (int64_t l = 0; l < m.rows; ++l) m.row_labels.push_back(decoder ? std::to_string(l) : model.attention_label(l));
  for (int64_t h = 0; h < m.cols; ++h) m.col_labels.push_back(std::to_string(h));
  m.vmin = map.vmin;
  m.vmax = map.vmax;
  m.annotate = true;
  return m;
}

}  // namespace

void save_head_map_png(const std::string& path, const HeadMap& map, const nn::Model& model) {
  save_picture(path, "save_head_map_png",
               [&](const std::string& tmp) { plot::save_heatmap(head_heatmap(map, model), tmp); });
}

void save_head_maps_png(const std::string& path, const std::string& title, const std::vector<HeadMap>& maps,
                        const nn::Model& model, double vmin, double vmax) {
  HL_CHECK(!maps.empty(), "save_head_maps_png: no maps");
  plot::HeatmapGrid g;
  g.title = title;
  g.grid_rows = 1;
  g.grid_cols = static_cast<int64_t>(maps.size());
  g.vmin = vmin;
  g.vmax = vmax;
  g.colorbar_label = maps.front().colorbar_label;
  for (const HeadMap& m : maps) g.panels.push_back(head_heatmap(m, model));
  save_picture(path, "save_head_maps_png", [&](const std::string& tmp) { plot::save_heatmap_grid(g, tmp); });
}

void save_composition_png(const std::string& path, const std::vector<CompositionScore>& comp,
                          const nn::DecoderModel& model) {
  HL_CHECK(!comp.empty(), "save_composition_png: no pair of heads to draw (a model of one layer)");
  const int64_t L = model.n_layers(), H = model.full_heads(), n = (L - 1) * H;
  plot::HeatmapGrid g;
  g.title = "composition (Elhage et al.): how much of head a's output head b reads";
  g.grid_rows = 1;
  g.grid_cols = 3;
  g.colorbar_label = "score";
  g.vmax = 0;
  for (const CompositionScore& c : comp)
    for (double v : {c.q, c.k, c.v})
      if (std::isfinite(v)) g.vmax = std::max(g.vmax, v);
  if (g.vmax <= 0) g.vmax = 1;
  for (const auto& [kind, member] :
       {std::pair{"Q-composition", &CompositionScore::q}, std::pair{"K-composition", &CompositionScore::k},
        std::pair{"V-composition", &CompositionScore::v}}) {
    plot::Heatmap m;
    m.title = kind;
    m.x_label = "head b (reads)";
    m.y_label = "head a (writes)";
    m.rows = m.cols = n;
    m.values.assign(static_cast<size_t>(n * n), kNaN);
    for (int64_t i = 0; i < n; ++i) {
      m.row_labels.push_back(head_label(i / H, i % H));
      m.col_labels.push_back(head_label(i / H + 1, i % H));
    }
    for (const CompositionScore& c : comp)
      m.values[static_cast<size_t>((c.layer_a * H + c.head_a) * n + (c.layer_b - 1) * H + c.head_b)] = c.*member;
    m.annotate = true;
    g.panels.push_back(std::move(m));
  }
  save_picture(path, "save_composition_png", [&](const std::string& tmp) { plot::save_heatmap_grid(g, tmp); });
}

void save_importance_png(const std::string& path, const AblationResult& a, const nn::Model& model) {
  if (gradient_reliable(a)) {
    save_head_map_png(path,
                      {"head importance (Michel et al. 2019): mean abs dL/dgate, normalised per layer", "importance",
                       a.importance.normalized, 0.0, std::nullopt},
                      model);
    return;
  }
  // The gradient scores disagree with measurement here (gradient_warning): draw what was measured.
  HeadMatrix dloss = head_matrix(model, kNaN);
  for (const auto& h : a.heads)
    dloss[static_cast<size_t>(h.layer)][static_cast<size_t>(h.head)] = h.zero.loss - a.base.loss;
  save_head_map_png(path,
                    {"heads by zero ablation's loss increase (the gradient importance is unreliable here)",
                     "loss increase", dloss, std::nullopt, std::nullopt},
                    model);
}

void save_logit_lens_png(const std::string& path, const LogitLens& lens, const std::vector<std::string>& tokens) {
  HL_CHECK(static_cast<int64_t>(tokens.size()) == lens.T, "save_logit_lens_png: ", tokens.size(),
           " token texts for a lens over ", lens.T, " tokens");
  plot::Heatmap m;
  m.title = "logit lens: the probability each layer's stream, read out through ln_final and the unembedding, gives "
            "the next token";
  m.x_label = "the next token (position t + 1)";
  m.y_label = "stream entering";
  m.colorbar_label = "probability";
  m.rows = static_cast<int64_t>(lens.rows.size());
  m.cols = lens.T - 1;
  m.row_labels = lens.rows;
  m.col_labels.assign(tokens.begin() + 1, tokens.end());
  m.values = lens.prob;
  m.vmin = 0.0, m.vmax = 1.0;
  m.annotate = true;
  save_picture(path, "save_logit_lens_png", [&](const std::string& tmp) { plot::save_heatmap(m, tmp); });
}

std::string logit_lens_csv(const LogitLens& lens, const std::vector<std::string>& tokens) {
  HL_CHECK(static_cast<int64_t>(tokens.size()) == lens.T, "logit_lens_csv: ", tokens.size(),
           " token texts for a lens over ", lens.T, " tokens");
  Table t("", {text_column("row"), integer_column("position"), text_column("token"), text_column("next_token"),
               {"probability", NumberFormat::scientific, 4}, integer_column("rank")});
  for (size_t r = 0; r < lens.rows.size(); ++r)
    for (int64_t p = 0; p + 1 < lens.T; ++p)
      t.add_row({lens.rows[r], static_cast<double>(p), tokens[static_cast<size_t>(p)], tokens[static_cast<size_t>(p + 1)],
                 lens.prob_at(r, p), lens.rank_at(r, p)});
  return render_csv(t);
}

void save_pruning_png(const std::string& path, const PruningCurve& c, double stop_below) {
  HL_CHECK(!c.steps.empty(), "save_pruning_png: the curve is empty");
  plot::LineChart ch;
  ch.title = "iterative head pruning (importance recomputed after each step)";
  ch.x_label = "fraction of heads pruned";
  ch.y_label = "score on the evaluation data";
  ch.width = 900;
  ch.height = 560;
  plot::Series acc{"token accuracy", {}, {}}, ex{"exact match", {}, {}}, thr{"stop threshold", {}, {}};
  plot::Series acc_ft{"token accuracy, fine-tuned", {}, {}}, ex_ft{"exact match, fine-tuned", {}, {}};
  auto add = [](plot::Series& to, double x, double y) {
    to.x.push_back(x);
    to.y.push_back(y);
  };
  for (const auto& s : c.steps) {
    add(acc, s.fraction, s.scores.token_accuracy);
    if (s.scores.has_exact_match) add(ex, s.fraction, s.scores.exact_match);
    if (!s.finetuned) continue;
    add(acc_ft, s.fraction, s.finetuned->token_accuracy);
    if (s.finetuned->has_exact_match) add(ex_ft, s.fraction, s.finetuned->exact_match);
  }
  for (const plot::Series* series : {&acc, &ex, &acc_ft, &ex_ft})
    if (!series->x.empty()) ch.series.push_back(*series);
  if (stop_below > 0) {
    thr.x = {0.0, c.steps.back().fraction > 0 ? c.steps.back().fraction : 1.0};
    thr.y = {stop_below, stop_below};
    ch.series.push_back(thr);
  }
  save_picture(path, "save_pruning_png", [&](const std::string& tmp) { plot::save_line_chart(ch, tmp); });
}

void save_attention_h5(const std::string& path, const AttentionMaps& maps, const std::vector<std::string>& tokens,
                       const std::string& prompt, const std::string& checkpoint) {
  save_attention_h5(path, {{"", &maps, tokens, {}}}, prompt, checkpoint);
}

void save_attention_h5(const std::string& path, const std::vector<AttentionText>& kinds, const std::string& prompt,
                       const std::string& checkpoint) {
  io::h5::Writer w(path, "attention file");
  w.set_attr("/", "format", "headlab-attention");
  w.set_attr("/", "checkpoint", checkpoint);
  w.set_attr("/", "prompt", prompt);
  for (const AttentionText& k : kinds) {
    const AttentionMaps& maps = *k.maps;
    const std::vector<std::string>& keys = checked_key_tokens("save_attention_h5", maps, k.tokens, k.key_tokens);
    const std::string at = k.group.empty() ? "" : k.group + "/", where = k.group.empty() ? "/" : k.group;
    w.write_f32(at + "weights", {maps.layers, maps.heads, maps.T, maps.S}, maps.weights.data());
    w.set_attr(at + "weights", "dims", "layer, head (original index; NaN where pruned), query, key");
    w.write<int64_t>(at + "token_ids", {maps.T}, maps.ids);
    std::vector<int64_t> kept(static_cast<size_t>(maps.layers * maps.heads), 0);
    for (int64_t l = 0; l < maps.layers; ++l)
      for (int64_t h : maps.kept[static_cast<size_t>(l)]) kept[static_cast<size_t>(l * maps.heads + h)] = 1;
    w.write<int64_t>(at + "kept", {maps.layers, maps.heads}, kept);
    w.set_attr(where, "tokens", nlohmann::json(k.tokens).dump());
    if (!k.group.empty()) {
      w.write<int64_t>(at + "key_token_ids", {maps.S}, maps.key_ids);
      w.set_attr(where, "key_tokens", nlohmann::json(keys).dump());
      w.set_attr(where, "kind", maps.kind);
    }
  }
  w.commit();
}

void save_attention_png(const std::string& path, const AttentionMaps& maps, const std::vector<std::string>& tokens,
                        const std::vector<std::string>& key_tokens) {
  const std::vector<std::string>& keys = checked_key_tokens("save_attention_png", maps, tokens, key_tokens);
  std::vector<std::string> labels, key_labels;
  std::string text;
  for (const auto& t : tokens) {
    labels.push_back(token_label(t));
    text += t;
  }
  for (const auto& t : keys) key_labels.push_back(token_label(t));
  plot::HeatmapGrid g;
  g.title = maps.kind + " weights: " + token_label(text);
  g.x_label = "key";
  g.y_label = "query";
  g.colorbar_label = "attention weight";
  g.vmin = 0;
  g.vmax = 1;
  size_t cols = 1;
  for (const auto& k : maps.kept) cols = std::max(cols, k.size());
  g.grid_rows = maps.layers;
  g.grid_cols = static_cast<int64_t>(cols);
  const int64_t T = maps.T, S = maps.S;
  for (int64_t l = 0; l < maps.layers; ++l) {
    const auto& kept = maps.kept[static_cast<size_t>(l)];
    const std::string& layer = maps.layer_names.at(static_cast<size_t>(l));
    for (size_t i = 0; i < cols; ++i) {
      plot::Heatmap m;
      m.rows = T;
      m.cols = S;
      m.row_labels = labels;
      m.col_labels = key_labels;
      if (i < kept.size()) {
        const int64_t h = kept[i];
        m.title = layer + "H" + std::to_string(h);
        const float* w = maps.weights.data() + (l * maps.heads + h) * T * S;
        m.values.assign(w, w + T * S);
      } else {  // a pruned model's layer with fewer heads than the widest layer
        m.title = layer + " (pruned)";
        m.values.assign(static_cast<size_t>(T * S), kNaN);
      }
      g.panels.push_back(m);
    }
  }
  save_picture(path, "save_attention_png", [&](const std::string& tmp) { plot::save_heatmap_grid(g, tmp); });
}

std::string compare_csv(const std::vector<CompareResult>& rows, const CompareOptions& o) {
  Table t;
  const Column integer{"", NumberFormat::integer, 0}, number{"", NumberFormat::fixed, 4};
  auto add = [&](const Column& kind, std::initializer_list<const char*> names) {
    for (const char* name : names) t.columns.push_back({name, kind.format, kind.precision});
  };
  t.columns.push_back(text_column("config"));
  add(integer, {"B", "T", "d_in", "d_out", "heads", "kv_heads"});
  t.columns.push_back(text_column("form"));
  add(integer, {"params", "kv_cache_bytes_per_token"});
  add(number,
      {"gflop_forward", "gflop_forward_backward", "forward_ms_median", "forward_ms_p25", "forward_ms_p75",
       "forward_ms_min", "forward_ms_max", "forward_gflops", "forward_backward_ms_median", "forward_backward_ms_p25",
       "forward_backward_ms_p75", "forward_backward_ms_min", "forward_backward_ms_max", "forward_backward_gflops"});
  add(integer, {"peak_forward_bytes", "peak_forward_backward_bytes"});
  add(number, {"max_abs_diff_output", "max_abs_diff_input_grad"});
  add(integer, {"repeats"});
  t.columns.push_back(text_column("device"));
  add(integer, {"threads"});
  add(number, {"torch_forward_ms_median", "torch_forward_backward_ms_median"});
  auto d = [](auto v) { return Cell(static_cast<double>(v)); };
  for (const auto& r : rows) {
    const auto& c = r.config;
    for (int f = 0; f < 2; ++f) {
      const FormMeasurement& m = f == 0 ? r.wrapper : r.fused;
      const double fb = m.flops_forward + m.flops_backward;
      std::vector<Cell> row = {c.name,
                               d(c.B),
                               d(c.T),
                               d(c.d_in),
                               d(c.d_out),
                               d(c.heads),
                               d(c.kv()),
                               std::string(f == 0 ? "wrapper" : "fused"),
                               d(m.params),
                               d(r.kv_cache_bytes_per_token),
                               m.flops_forward / 1e9,
                               fb / 1e9};
      for (const TimeStats* ts : {&m.forward, &m.forward_backward}) {
        for (double v : {ts->median, ts->p25, ts->p75, ts->min, ts->max}) row.emplace_back(v * 1e3);
        row.emplace_back((ts == &m.forward ? m.flops_forward : fb) / ts->median / 1e9);
      }
      row.insert(row.end(), {d(m.peak_forward), d(m.peak_forward_backward), Cell(r.max_abs_out), Cell(r.max_abs_dx),
                             d(o.repeats), Cell(o.device.str()), d(omp_get_max_threads())});
      const std::optional<PeerTimes>& peer = f == 0 ? r.torch_wrapper : r.torch_fused;
      if (peer)
        row.insert(row.end(), {Cell(peer->forward.median * 1e3), Cell(peer->forward_backward.median * 1e3)});
      else
        row.insert(row.end(), {Cell(std::string()), Cell(std::string())});
      t.add_row(std::move(row));
    }
  }
  return render_csv(t);
}

namespace {
nlohmann::json time_json(const TimeStats& t) {
  return {{"median_ms", t.median * 1e3}, {"p25_ms", t.p25 * 1e3}, {"p75_ms", t.p75 * 1e3},
          {"min_ms", t.min * 1e3},       {"max_ms", t.max * 1e3}, {"repeats", t.repeats}};
}
}  // namespace

nlohmann::json compare_json(const std::vector<CompareResult>& rows, const CompareOptions& o) {
  nlohmann::json j = {{"device", o.device.str()},
                      {"threads", omp_get_max_threads()},
                      {"warmup", o.warmup},
                      {"repeats", o.repeats},
                      {"seed", o.seed},
                      {"flops", "GEMM FLOPs, 2 per multiply-add; forward_backward = forward + 2 x forward"},
                      {"peak_bytes", "backend peak during the call minus the bytes in use before it"},
                      {"configs", nlohmann::json::array()}};
  for (const auto& r : rows) {
    const auto& c = r.config;
    nlohmann::json e = {{"name", c.name},
                        {"B", c.B},
                        {"T", c.T},
                        {"d_in", c.d_in},
                        {"d_out", c.d_out},
                        {"heads", c.heads},
                        {"kv_heads", c.kv()},
                        {"kv_cache_bytes_per_token", r.kv_cache_bytes_per_token},
                        {"max_abs_diff_output", r.max_abs_out},
                        {"max_abs_diff_input_grad", r.max_abs_dx}};
    for (int f = 0; f < 2; ++f) {
      const FormMeasurement& m = f == 0 ? r.wrapper : r.fused;
      const double fb = m.flops_forward + m.flops_backward;
      e[f == 0 ? "wrapper" : "fused"] = {{"params", m.params},
                                         {"gflop_forward", m.flops_forward / 1e9},
                                         {"gflop_forward_backward", fb / 1e9},
                                         {"forward", time_json(m.forward)},
                                         {"forward_backward", time_json(m.forward_backward)},
                                         {"forward_gflops", m.flops_forward / m.forward.median / 1e9},
                                         {"forward_backward_gflops", fb / m.forward_backward.median / 1e9},
                                         {"peak_forward_bytes", m.peak_forward},
                                         {"peak_forward_backward_bytes", m.peak_forward_backward}};
      const std::optional<PeerTimes>& t = f == 0 ? r.torch_wrapper : r.torch_fused;
      if (t)
        e[f == 0 ? "wrapper" : "fused"]["torch"] = {{"version", r.torch_version},
                                                    {"forward", time_json(t->forward)},
                                                    {"forward_backward", time_json(t->forward_backward)}};
    }
    j["configs"].push_back(e);
  }
  return j;
}

void save_compare_png(const std::string& path, const std::vector<CompareResult>& rows, const std::string& x_choice,
                      const Device& device) {
  HL_CHECK(!rows.empty(), "save_compare_png: nothing to draw");
  using Key = std::array<int64_t, 5>;  // heads, tokens, d_out, batch; key/value heads (0: multi-head) never on x
  auto key = [](const CompareConfig& c) { return Key{c.heads, c.T, c.d_out, c.B, c.kv_heads}; };
  const char* dim_names[] = {"heads", "tokens", "emb dim (d_out)", "batch", "key/value heads"};
  const char* short_names[] = {"H", "T", "d", "B", "KV"};
  size_t xd = 0;
  if (x_choice == "auto") {
    size_t best = 0;
    for (size_t d = 0; d < 4; ++d) {
      std::set<int64_t> vals;
      for (const auto& r : rows) vals.insert(key(r.config)[d]);
      if (vals.size() > best) best = vals.size(), xd = d;
    }
  } else {
    const std::map<std::string, size_t> dims = {{"heads", 0}, {"tokens", 1}, {"emb", 2}, {"batch", 3}};
    HL_CHECK(dims.count(x_choice), "save_compare_png: x must be auto, heads, tokens, emb or batch, got '", x_choice,
             "'");
    xd = dims.at(x_choice);
  }
  // One set of lines per combination of the other dimensions.
  std::map<Key, std::vector<const CompareResult*>> groups;
  for (const auto& r : rows) {
    Key k = key(r.config);
    k[xd] = 0;
    groups[k].push_back(&r);
  }
  plot::LineChart ch;
  ch.x_label = dim_names[xd];
  ch.y_label = "time per call, ms (median)";
  ch.log_x = true;
  ch.log_y = true;
  ch.width = 1000;
  ch.height = 640;
  std::ostringstream title;
  title << "wrapper vs fused attention (" << device.str() << "): time against " << dim_names[xd];
  if (groups.size() == 1) {
    const Key k = groups.begin()->first;
    title << " (";
    bool first = true;
    for (size_t d = 0; d < 5; ++d)
      if (d != xd && (d < 4 || k[d] != 0)) {
        title << (first ? "" : ", ") << short_names[d] << "=" << k[d];
        first = false;
      }
    title << ")";
  }
  ch.title = title.str();
  for (const auto& [k, members] : groups) {
    std::vector<const CompareResult*> sorted = members;
    std::sort(sorted.begin(), sorted.end(), [&](auto* a, auto* b) { return key(a->config)[xd] < key(b->config)[xd]; });
    std::string suffix;
    if (groups.size() > 1)
      for (size_t d = 0; d < 5; ++d)
        if (d != xd && (d < 4 || k[d] != 0)) suffix.append(" ").append(short_names[d]).append(std::to_string(k[d]));
    for (int form = 0; form < 2; ++form)
      for (int pass = 0; pass < 2; ++pass) {
        plot::Series s;
        s.name = std::string(form == 0 ? "wrapper" : "fused") + (pass == 0 ? " forward" : " fwd+bwd") + suffix;
        for (const CompareResult* r : sorted) {
          const FormMeasurement& m = form == 0 ? r->wrapper : r->fused;
          s.x.push_back(static_cast<double>(key(r->config)[xd]));
          s.y.push_back((pass == 0 ? m.forward.median : m.forward_backward.median) * 1e3);
        }
        ch.series.push_back(s);
      }
  }
  save_picture(path, "save_compare_png", [&](const std::string& tmp) { plot::save_line_chart(ch, tmp); });
}

}  // namespace headlab::analysis
