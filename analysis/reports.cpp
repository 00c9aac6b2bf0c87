// The result tables of headlab ablate and headlab heads (reports.h).
#include "analysis/reports.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <sstream>

#include "analysis/report.h"
#include "nn/gpt.h"

namespace headlab::analysis {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

Column fixed(std::string name, int precision = 4) { return {std::move(name), NumberFormat::fixed, precision}; }
Column signed_col(std::string name, int precision = 4) {
  return {std::move(name), NumberFormat::signed_fixed, precision};
}
Column integer(std::string name) { return {std::move(name), NumberFormat::integer, 0}; }

std::vector<std::string> attention_kinds(const nn::Model& m) {
  std::vector<std::string> kinds;
  for (int64_t l = 0; l < m.attention_count(); ++l)
    if (std::find(kinds.begin(), kinds.end(), m.attention_kind(l)) == kinds.end()) kinds.push_back(m.attention_kind(l));
  return kinds;
}

const char* kind_title(const std::string& kind) {
  if (kind == "encoder") return "encoder self-attention";
  if (kind == "decoder") return "decoder self-attention";
  if (kind == "cross") return "encoder-decoder (cross) attention";
  return "self-attention";
}

std::string signed3(double v) { return fmt_signed(v, 3); }

}  // namespace

Table importance_table(const AblationResult& a, const nn::Model& model) {
  const bool ex = a.base.has_exact_match;
  Table t("",
          {integer("rank"), text_column("head"), fixed("importance"), {"raw dL/dgate", NumberFormat::scientific, 2}});
  for (const char* kind : {"zero", "mean", "resample"}) {
    t.columns.push_back(signed_col(std::string(kind) + " dloss"));
    t.columns.push_back(signed_col(std::string(kind) + " dacc"));
    if (ex) t.columns.push_back(signed_col(std::string(kind) + " dexact"));
  }
  std::vector<const HeadAblation*> by_imp;
  for (const auto& h : a.heads) by_imp.push_back(&h);
  std::stable_sort(by_imp.begin(), by_imp.end(), [](auto* x, auto* y) { return x->importance > y->importance; });
  int rank = 1;
  for (const HeadAblation* h : by_imp) {
    std::vector<Cell> row = {static_cast<double>(rank++), head_name(model, h->layer, h->head), h->importance,
                             h->importance_raw};
    for (const Scores* s : {&h->zero, &h->mean, &h->resample}) {
      row.emplace_back(s->loss - a.base.loss);
      row.emplace_back(s->token_accuracy - a.base.token_accuracy);
      if (ex) row.emplace_back(s->exact_match - a.base.exact_match);
    }
    t.add_row(std::move(row));
  }
  return t;
}

Table pruning_table(const PruningCurve& c, const nn::Model& model, const std::string& title) {
  HL_CHECK(!c.steps.empty(), "pruning_table: the curve is empty");
  const bool ex = c.steps.front().scores.has_exact_match;
  const bool ft =
      std::any_of(c.steps.begin(), c.steps.end(), [](const PruneStep& s) { return s.finetuned.has_value(); });
  Table t(title, {integer("step"), integer("heads_pruned"), fixed("fraction_pruned", 3), fixed("loss"),
                  fixed("token_accuracy")});
  if (ex) t.columns.push_back(fixed("exact_match"));
  if (ft) {
    t.columns.push_back(fixed("finetuned_loss"));
    t.columns.push_back(fixed("finetuned_token_accuracy"));
    if (ex) t.columns.push_back(fixed("finetuned_exact_match"));
  }
  t.columns.push_back(text_column("removed"));
  for (size_t i = 0; i < c.steps.size(); ++i) {
    const PruneStep& s = c.steps[i];
    std::vector<Cell> row = {static_cast<double>(i), static_cast<double>(s.pruned), s.fraction};
    auto scores = [&](const Scores& v) {
      row.emplace_back(v.loss);
      row.emplace_back(v.token_accuracy);
      if (ex) row.emplace_back(v.exact_match);
    };
    scores(s.scores);
    if (ft) scores(s.finetuned.value_or(Scores{}));  // NaN where a step was not fine-tuned
    row.emplace_back(removed_heads_str(s, model));
    t.add_row(std::move(row));
  }
  return t;
}

Table l0_table(const L0Result& l0, Metric metric, const nn::Model& model, const std::string& title) {
  Table t(title, {fixed("penalty"), integer("heads closed"), fixed(enum_name(metric), 3), fixed("loss"),
                  text_column("which")});
  for (const L0Point& p : l0.points) {
    std::string which;
    for (const auto& [l, h] : p.closed) which.append(which.empty() ? "" : " ").append(head_name(model, l, h));
    t.add_row({p.penalty, static_cast<double>(p.closed.size()), metric_value(p.scores, metric), p.scores.loss,
               which.empty() ? "none" : which});
  }
  return t;
}

Table best_head_table(const nn::Model& model, const AblationResult& a, const std::vector<BestHeadOnly>& best,
                      Metric metric, std::string* mean_change, const std::string& title) {
  const std::vector<std::string> kinds = attention_kinds(model);
  const double base = metric_value(a.base, metric);
  Table t(title, {integer("layer")});
  for (const std::string& k : kinds) {
    t.columns.push_back(text_column(std::string(kind_title(k)) + ": best head"));
    t.columns.push_back(fixed(enum_name(metric), 3));
    t.columns.push_back(signed_col("delta", 3));
  }
  int64_t layers = 0;
  for (const auto& b : best) layers = std::max(layers, model.attention_layer(b.layer) + 1);
  std::map<std::string, std::pair<double, int64_t>> mean_delta;  // kind -> (sum, count)
  for (int64_t layer = 0; layer < layers; ++layer) {
    std::vector<Cell> row = {static_cast<double>(layer)};
    for (const std::string& k : kinds) {
      const auto it = std::find_if(best.begin(), best.end(), [&](const BestHeadOnly& b) {
        return model.attention_kind(b.layer) == k && model.attention_layer(b.layer) == layer;
      });
      if (it == best.end()) {
        for (int i = 0; i < 3; ++i) row.emplace_back(std::string());
        continue;
      }
      const double m = metric_value(it->scores, metric);
      row.emplace_back(head_name(model, it->layer, it->best_head) + " (of " +
                       std::to_string(model.heads_at(it->layer)) + ")");
      row.emplace_back(m);
      row.emplace_back(m - base);
      mean_delta[k].first += m - base;
      ++mean_delta[k].second;
    }
    t.add_row(std::move(row));
  }
  if (mean_change) {
    std::string s;
    for (const std::string& k : kinds) {
      const auto& [sum, count] = mean_delta[k];
      s.append(s.empty() ? "" : "; ")
          .append(kind_title(k))
          .append(" ")
          .append(signed3(count ? sum / static_cast<double>(count) : kNaN));
    }
    *mean_change = s;
  }
  return t;
}

namespace {

HeadMatrix by_head(const nn::GPTModel& m, const auto& rows, auto value) {
  HeadMatrix v = head_matrix(m, kNaN);
  for (const auto& r : rows) v[static_cast<size_t>(r.layer)][static_cast<size_t>(r.head)] = value(r);
  return v;
}

HeadColumn csv_column(const std::string& name, const HeadMatrix& values) {
  HeadColumn c{name, {}};
  for (const auto& row : values) {
    auto& out = c.values.emplace_back();
    for (double v : row) out.push_back(fmt(v, 6));
  }
  return c;
}

}  // namespace

HeadsScores heads_scores(const nn::GPTModel& model, const HeadsFindings& f) {
  const AblationResult& abl = f.ablation;
  HeadsScores s;
  s.zero = by_head(model, abl.heads, [&](auto& h) { return h.zero.loss - abl.base.loss; });
  s.mean = by_head(model, abl.heads, [&](auto& h) { return h.mean.loss - abl.base.loss; });
  s.resample = by_head(model, abl.heads, [&](auto& h) { return h.resample.loss - abl.base.loss; });
  s.noising = by_head(model, f.patching.heads, [](auto& p) { return p.noising; });
  s.denoising = by_head(model, f.patching.heads, [](auto& p) { return p.denoising; });
  s.dla = f.dla.vs_mean.heads;
  auto type_score = [&](double HeadTypeScores::*field) {
    return by_head(model, f.types.heads, [&](auto& t) { return t.*field; });
  };
  s.previous = type_score(&HeadTypeScores::previous_token);
  s.first = type_score(&HeadTypeScores::first_token);
  s.separator = type_score(&HeadTypeScores::separator);
  s.entropy = type_score(&HeadTypeScores::entropy);
  s.entropy_normalized = type_score(&HeadTypeScores::entropy_normalized);
  s.induction = type_score(&HeadTypeScores::induction);
  s.duplicate = type_score(&HeadTypeScores::duplicate_token);
  const AblationResult& rep = f.repeated;
  s.repeated_zero = by_head(model, rep.heads, [&](auto& h) { return h.zero.loss - rep.base.loss; });
  s.repeated_mean = by_head(model, rep.heads, [&](auto& h) { return h.mean.loss - rep.base.loss; });
  for (int64_t l = 0; l < model.n_layers(); ++l)
    s.labels.emplace_back(static_cast<size_t>(model.attention(l).head_count()));
  for (const auto& t : f.types.heads) s.labels[static_cast<size_t>(t.layer)][static_cast<size_t>(t.head)] = t.label;
  return s;
}

std::vector<HeadColumn> heads_csv_columns(const HeadsFindings& f, const HeadsScores& s) {
  return {csv_column("dla_logit_vs_mean", s.dla),
          csv_column("dla_logit", f.dla.logit.heads),
          csv_column("patch_noising", s.noising),
          csv_column("patch_denoising", s.denoising),
          csv_column("previous_token", s.previous),
          csv_column("first_token", s.first),
          csv_column("separator", s.separator),
          csv_column("entropy", s.entropy),
          csv_column("entropy_normalized", s.entropy_normalized),
          csv_column("induction", s.induction),
          csv_column("duplicate_token", s.duplicate),
          csv_column("repeated_zero_delta_loss", s.repeated_zero),
          csv_column("repeated_mean_delta_loss", s.repeated_mean),
          HeadColumn{"label", s.labels}};
}

std::string heads_report_md(const nn::GPTModel& model, const EvalSet& data, const HeadsRun& run, const HeadsFindings& f,
                            const HeadsScores& s) {
  const nn::GPTConfig& cfg = model.config();
  const AblationResult& abl = f.ablation;
  const tasks::Batch& b0 = data.batches.front();
  std::ostringstream md;
  md << "# Heads of `" << run.checkpoint
     << "`\n\nEvery head's attention on a validation row, with these scores "
        "beside it: [attention.html](attention.html) (open it in a browser).\n\n";
  md << "| | |\n|---|---|\n| task | " << run.task << " |\n| model | " << cfg.n_layers << " layers x " << cfg.n_heads
     << " heads, emb " << cfg.emb_dim << " |\n| data | " << data.batches.size() << " validation batches of " << b0.B
     << " x " << cfg.context_length << ", " << data.tokens() << " scored tokens |\n| unablated | loss "
     << fmt(abl.base.loss) << ", token accuracy " << fmt(abl.base.token_accuracy) << " |\n| time | ablation "
     << fmt(f.seconds_ablation, 2) << " s (" << 3 * abl.heads.size() << " ablations, one batched pass), DLA "
     << fmt(f.seconds_dla, 2) << " s, patching " << fmt(f.seconds_patching, 2) << " s, head types "
     << fmt(f.seconds_types, 2) << " s |\n\n";
  md << "## Ablation\n\nLoss increase when the head's context is replaced by zero, its mean over the data, or its "
        "context on another row (resample), on "
     << data.tokens() << " scored tokens.\n\n![resample ablation](ablation.png)\n\n"
     << render_markdown(
            head_value_table(model, by_magnitude(s.resample),
                             {{"zero: d loss", s.zero}, {"mean: d loss", s.mean}, {"resample: d loss", s.resample}}));
  md << "\n## Direct logit attribution\n\nEach head's direct contribution, through out_proj and the unembedding "
        "with the final layer norm's scale frozen per token, to logit(correct) minus the mean logit (and to the "
        "raw correct logit), mean over "
     << f.dla.tokens << " scored tokens. Embeddings " << fmt_signed(f.dla.vs_mean.embeddings, 3)
     << ", final norm shift " << fmt_signed(f.dla.vs_mean.final_shift, 3) << ", feed-forward blocks";
  for (double v : f.dla.vs_mean.feed_forward) md << " " << fmt_signed(v, 3);
  md << ", out_proj biases";
  for (double v : f.dla.vs_mean.out_proj_bias) md << " " << fmt_signed(v, 3);
  md << "; everything sums to " << fmt(f.dla.vs_mean.sum(), 4) << " = the model's " << fmt(f.dla.vs_mean.total, 4)
     << ".\n\n![direct logit attribution](dla.png)\n\n"
     << render_markdown(head_value_table(model, by_magnitude(s.dla),
                                         {{"DLA vs mean", s.dla}, {"DLA raw logit", f.dla.logit.heads}}));
  md << "\n## Activation patching\n\nCorrupted input: " << f.corruption << ". Clean loss " << fmt(f.patching.clean.loss)
     << ", corrupted " << fmt(f.patching.corrupted.loss) << " (on the clean targets, " << f.patching.tokens
     << " tokens). Noising: the clean run with the head's context from the corrupted run, as a fraction of the "
        "gap it opens; denoising: the corrupted run with the head's clean context, the fraction of the gap it "
        "closes.\n\n![patching](patching.png)\n\n"
     << render_markdown(
            head_value_table(model, by_magnitude(s.denoising), {{"noising", s.noising}, {"denoising", s.denoising}}));
  if (run.by_position)
    md << "\n### Denoising by position\n\n" << render_markdown(denoising_by_position_table(f.patching, b0.T));
  const HeadTypes& ht = f.types;
  md << "\n## Head types\n\nMean attention weight on the previous token, the first token and the separator, over "
     << ht.queries << " query positions of the data (" << ht.separator_queries
     << " after a separator); mean attention entropy (nats, and divided by its maximum log(q+1)); induction and "
        "duplicate-token scores on "
     << ht.induction_rows << " rows of " << ht.induction_half << " random tokens repeated twice ("
     << ht.induction_queries << " queries). A label when a score is clear: >= " << fmt(kPatternThreshold, 1)
     << " for the pattern scores, >= " << fmt(kRepeatThreshold, 1) << " for induction and duplicate-token, "
     << "normalised entropy >= " << fmt(kBroadThreshold, 1) << " for broad.\n\n![head types](types.png)\n\n"
     << render_markdown(head_types_table(ht));
  if (!f.repeated.heads.empty()) {
    md << "\n## Copying from the context\n\nLoss on " << f.repeated_rows << " rows of " << f.repeated_half
       << " random tokens written twice, scored where the second copy can be predicted from the first ("
       << f.repeated.base.tokens << " tokens): " << fmt(f.repeated.base.loss)
       << " unablated (uniform guessing: " << fmt(std::log(static_cast<double>(cfg.vocab_size)))
       << "). The loss increase with each head ablated: an "
       << "induction head's ablation costs the most.\n\n"
       << render_markdown(head_value_table(model, by_magnitude(s.repeated_mean),
                                           {{"zero: d loss", s.repeated_zero},
                                            {"mean: d loss", s.repeated_mean},
                                            {"induction score", s.induction}}));
  }
  if (!f.composition.empty()) {
    md << "\n## Composition\n\nElhage et al.'s composition scores of every head a with every head b of a later "
          "layer, |W_OV^a W^b|_F / (|W_OV^a|_F |W^b|_F) with W^b = W_QK^b (Q), W_QK^b^T (K) or W_OV^b (V); norm1's "
          "scale folded into the reads. All pairs: composition.csv.\n\n![composition](composition.png)\n\n"
       << induction_pairs_text(f.types, f.composition);
  }
  return md.str();
}

std::string induction_pairs_text(const HeadTypes& types, const std::vector<CompositionScore>& comp) {
  const std::vector<InductionPair> pairs = induction_pairs(types, comp);
  if (pairs.empty()) return "No head of a layer after the first is labelled induction.\n";
  std::ostringstream o;
  for (const InductionPair& p : pairs)
    o << "- induction head " << head_label(p.induction.layer, p.induction.original_head) << " (induction score "
      << fmt(p.induction.induction, 3) << "): its keys read most from "
      << head_label(p.partner.layer, p.partner.original_head) << " (K-composition " << fmt(p.k.k, 3)
      << "; mean over its partners " << fmt(p.k_mean, 3) << "), a head with previous-token score "
      << fmt(p.partner.previous_token, 3) << (p.partner.label.empty() ? "" : " (" + p.partner.label + ")") << "\n";
  return o.str();
}

Table heads_summary_table(const nn::GPTModel& model, const HeadsScores& s) {
  Table t("", {text_column("head"), signed_col("zero dloss"), signed_col("resample"), signed_col("DLA", 3),
               signed_col("noising", 3), signed_col("denoising", 3), text_column("type")});
  const nn::GPTConfig& cfg = model.config();
  for (int64_t l = 0; l < model.n_layers(); ++l)
    for (int64_t h = 0; h < model.attention(l).head_count(); ++h) {
      const auto L = static_cast<size_t>(l), H = static_cast<size_t>(h);
      t.add_row({head_label(l, original_head(cfg, l, h)), s.zero[L][H], s.resample[L][H], s.dla[L][H], s.noising[L][H],
                 s.denoising[L][H], s.labels[L][H]});
    }
  return t;
}

Table head_value_table(const nn::GPTModel& model, const std::vector<std::pair<int64_t, int64_t>>& order,
                       const std::vector<std::pair<std::string, HeadMatrix>>& columns) {
  Table t("", {text_column("head")});
  for (const auto& [name, v] : columns) t.columns.push_back(signed_col(name, 3));
  for (const auto& [l, h] : order) {
    std::vector<Cell> row = {head_label(l, original_head(model.config(), l, h))};
    for (const auto& [name, v] : columns) row.emplace_back(v[static_cast<size_t>(l)][static_cast<size_t>(h)]);
    t.add_row(std::move(row));
  }
  return t;
}

std::vector<std::pair<int64_t, int64_t>> by_magnitude(const HeadMatrix& v) {
  std::vector<std::pair<int64_t, int64_t>> order;
  for (size_t l = 0; l < v.size(); ++l)
    for (size_t h = 0; h < v[l].size(); ++h) order.emplace_back(l, h);
  std::stable_sort(order.begin(), order.end(), [&](auto& a, auto& b) {
    return std::fabs(v[static_cast<size_t>(a.first)][static_cast<size_t>(a.second)]) >
           std::fabs(v[static_cast<size_t>(b.first)][static_cast<size_t>(b.second)]);
  });
  return order;
}

Table head_types_table(const HeadTypes& types) {
  Table t("", {text_column("head"), fixed("previous", 3), fixed("first", 3), fixed("separator", 3), fixed("entropy", 3),
               fixed("entropy / max", 3), fixed("induction", 3), fixed("duplicate", 3), text_column("label")});
  for (const HeadTypeScores& h : types.heads)
    t.add_row({head_label(h.layer, h.original_head), h.previous_token, h.first_token, h.separator, h.entropy,
               h.entropy_normalized, h.induction, h.duplicate_token, h.label});
  return t;
}

Table denoising_by_position_table(const PatchingResult& p, int64_t T) {
  Table t("", {text_column("head")});
  for (int64_t i = 0; i < T; ++i) t.columns.push_back(fixed(std::to_string(i), 2));
  for (const HeadPatching& h : p.heads) {
    std::vector<Cell> row = {head_label(h.layer, h.original_head)};
    for (double v : h.denoising_by_position) row.emplace_back(v);
    row.resize(t.columns.size(), kNaN);
    t.add_row(std::move(row));
  }
  return t;
}

double agreement(const analysis::AblationResult& a, bool normalized) {
  std::vector<double> imp, dloss;
  for (const auto& h : a.heads) {
    imp.push_back(normalized ? h.importance : h.importance_raw);
    dloss.push_back(h.zero.loss - a.base.loss);
  }
  return analysis::rank_correlation(imp, dloss);
}

std::string criterion_text(const PruningCurve& curve, bool automatic) {
  std::string s = enum_name(curve.criterion);
  if (automatic)
    s += " (auto: " + std::to_string(curve.total_heads) +
         (curve.criterion == analysis::Criterion::ablation ? " heads <= " : " heads > ") +
         std::to_string(analysis::kAblationCriterionMaxHeads) + ")";
  return s;
}

std::string gradient_warning(const analysis::AblationResult& a) {
  const double rho = agreement(a, true);
  std::string why;
  if (a.base.loss < 0.01)
    why = "at a loss of " + fmt(a.base.loss) + " the gate gradients are mostly noise";
  else if (rho < 0.5)
    why = "they rank the heads unlike zero ablation";
  if (why.empty()) return "";
  return "the gradient scores are unreliable here (Spearman " + fmt(rho, 2) + " with zero ablation; " + why +
         "); the ablation criterion (the default up to " + std::to_string(analysis::kAblationCriterionMaxHeads) +
         " heads) measures instead";
}

std::string free_heads_text(const analysis::AblationResult& a, const analysis::PruningCurve& curve,
                            const nn::Model& model) {
  const auto free = analysis::free_heads(a, curve.metric);
  std::string names;
  for (const auto& [l, h] : free) names.append(names.empty() ? "" : " ").append(analysis::head_name(model, l, h));
  const int64_t n = static_cast<int64_t>(free.size());
  const double base = analysis::metric_value(a.base, curve.metric);
  const int64_t within = analysis::prune_count_for_metric(curve, base - 0.01 * std::fabs(base));
  std::string s = std::to_string(n) + " heads cost nothing alone (" + (names.empty() ? "none" : names) + ")";
  if (n == 0) return s;
  if (within >= n)
    return s + "; the curve prunes " + std::to_string(within) + " heads with " + enum_name(curve.metric) +
           " within 1% of unpruned";
  if (curve.criterion == analysis::Criterion::gradient)
    return s + "; this curve (gradient scores) keeps " + enum_name(curve.metric) + " within 1% of unpruned for " +
           std::to_string(within) + " heads: --criterion ablation prunes by measured cost";
  s += "; pruned together they are not free: " + std::string(enum_name(curve.metric)) +
       " stays within 1% of unpruned for " + std::to_string(within) + " of them";
  for (const auto& step : curve.steps)
    if (step.pruned == n)
      s += " (" + std::to_string(n) + ": " + fmt(analysis::metric_value(step.scores, curve.metric), 3) + ")";
  return s;
}

std::string scores_line(const analysis::Scores& s) {
  std::string out = "loss " + fmt(s.loss) + "  token accuracy " + fmt(s.token_accuracy);
  if (s.has_exact_match) out += "  exact match " + fmt(s.exact_match);
  return out;
}

std::string ablation_report_md(const nn::Model& model, const EvalSet& data, const AblationReport& r) {
  const AblationResult& a = r.ablation;
  const PruningCurve& curve = r.curve;
  const PrunedModelReport& pr = r.pruned;
  const std::optional<L0Result>& l0 = r.l0;
  const AblationTables& tables = r.tables;
  const double stop_below = r.stop_below;
  const bool gpt = dynamic_cast<const nn::GPTModel*>(&model) != nullptr;
  const bool ex = a.base.has_exact_match;
  std::ostringstream os;
  os << "# Head ablation report\n\n## Summary\n\n";
  os << "| | |\n|---|---|\n";
  os << "| checkpoint | `" << r.checkpoint << "`"
     << (r.checkpoint_step ? " (step " + std::to_string(*r.checkpoint_step) + ")" : "") << " |\n";
  os << "| task | " << r.task << " |\n";
  os << "| model | " << r.model_description << ", head size " << model.head_size_at(0) << ", " << model.num_parameters()
     << " parameters |\n";
  if (!r.kept_before.empty()) os << "| kept heads (already pruned) | " << r.kept_before << " |\n";
  os << "| data | " << data.batches.size() << " validation batches of " << data.batches.front().B << " x "
     << data.batches.front().T << " tokens, " << data.tokens() << " scored tokens |\n";
  os << "| unpruned | loss " << fmt(a.base.loss) << ", token accuracy " << fmt(a.base.token_accuracy);
  if (ex) os << ", exact match " << fmt(a.base.exact_match);
  os << " |\n";
  os << "| pruning | " << r.criterion << " criterion; metric " << enum_name(curve.metric) << ", stop below "
     << fmt(stop_below) << " |\n";
  os << "| gradient scores vs zero ablation | Spearman " << fmt(agreement(a, true), 2) << " (normalised), "
     << fmt(agreement(a, false), 2) << " (raw) |\n";
  if (l0) {  // a later place in the L0 order should mean a dearer head
    std::vector<double> rank, dloss;
    for (const auto& h : a.heads) {
      rank.push_back(l0->rank[static_cast<size_t>(h.layer)][static_cast<size_t>(h.head)]);
      dloss.push_back(h.zero.loss - a.base.loss);
    }
    os << "| L0 gate order vs zero ablation | Spearman " << fmt(analysis::rank_correlation(rank, dloss), 2) << " |\n";
  }
  if (const std::string w = gradient_warning(a); !w.empty()) os << "| warning | " << w << " |\n";
  os << "| free heads | " << free_heads_text(a, curve, model) << " |\n";
  const auto by_imp = [&] {
    std::vector<const analysis::HeadAblation*> v;
    for (const auto& h : a.heads) v.push_back(&h);
    std::sort(v.begin(), v.end(), [](auto* x, auto* y) { return x->importance > y->importance; });
    return v;
  }();
  if (!by_imp.empty()) {
    const auto& t = *by_imp.front();
    os << "| most important head | " << analysis::head_name(model, t.layer, t.head) << " (zero ablation: loss "
       << fmt_signed(t.zero.loss - a.base.loss) << ", token accuracy "
       << fmt_signed(t.zero.token_accuracy - a.base.token_accuracy) << ") |\n";
  }
  if (curve.steps.size() > 1) {
    const int64_t keep_n = analysis::prune_count_for_metric(curve, stop_below);
    os << "| prunable at the threshold | " << keep_n << " of " << curve.total_heads << " heads ("
       << fmt(100.0 * static_cast<double>(keep_n) / static_cast<double>(curve.total_heads), 0) << "%) |\n";
  }
  os << "\n![head importance](importance.png)\n\n";
  if (gpt)
    os << "Every head's attention on a validation row, with these scores beside it: "
          "[attention.html](attention.html).\n\n";

  os << "## Heads by importance\n\n";
  os << "Importance: I_h = E_x |dL/d gate_h| over the evaluation batches, divided by the l2 norm of its layer's "
        "scores (Michel, Levy & Neubig 2019). Zero ablation sets the head's gate to 0; mean ablation replaces the "
        "head's context by its mean over the evaluation data; resample ablation by its context on another "
        "validation row. Deltas are ablated minus unpruned, on "
     << data.tokens() << " scored tokens; all " << 3 * a.heads.size() << " ablations ran "
     << (gpt ? "as one batched pass" : "one pass each") << " (" << fmt(r.sweep_seconds, 2) << " s)"
     << (gpt ? "" : "; resample ablation is not computed for the encoder-decoder (nan)") << ".\n\n";
  os << analysis::render_markdown(tables.importance);

  if (l0) {
    os << "\n## Learned gates (L0)\n\nHard-concrete gates on every head of the frozen model, trained with the task's "
          "loss plus penalty x the expected number of open heads (Voita et al. 2019), "
       << r.l0_steps << " Adam steps per penalty. Scores: the model with the closed heads masked, on " << data.tokens()
       << " scored tokens.\n\n"
       << analysis::render_markdown(*tables.l0);
  }
  os << "\n## Pruning curve\n\n";
  os << "Each step masks the least important " << fmt(100 * r.step_fraction, 0)
     << "% of the remaining heads (at least one; every layer keeps one head) and recomputes the importance of the "
        "heads left"
     << (curve.criterion == analysis::Criterion::gradient ? " (gradient scores)"
         : curve.criterion == analysis::Criterion::l0
             ? " (l0: in the order the learned gates close them, not recomputed)"
             : " (what masking the head too costs, measured: the metric lost, then the loss increase)")
     << ".\n\n";
  const bool ft = r.finetune_curve;
  if (ft)
    os << "Each pruned model was also fine-tuned " << r.finetune_steps
       << " steps on its task (a fresh optimizer; `finetune/pruned_<k>/`): the fine-tuned columns.\n\n";
  os << analysis::render_markdown(tables.pruning);
  os << "\n![pruning curve](pruning.png)\n\n";
  os << "## Only the best head of each layer (Michel et al. 2019, Table 2)\n\nFor each attention layer, every "
        "head but one masked (the one that keeps "
     << enum_name(curve.metric) << " highest), the rest of the model whole; unpruned "
     << fmt(analysis::metric_value(a.base, curve.metric), 3) << ".\n\n"
     << analysis::render_markdown(tables.best_head) << "\nMean change per layer: " << tables.best_head_mean << ".\n\n";

  os << "## Pruned model\n\n";
  if (!pr.done) {
    os << "Not written (use `--prune K` or `--prune-to-metric X`).\n";
  } else {
    os << "| | |\n|---|---|\n";
    os << "| file | `" << pr.path << "` |\n";
    os << "| heads removed | " << pr.removed << " of " << curve.total_heads << " |\n";
    os << "| kept heads (original indices) | " << pr.kept << " |\n";
    os << "| parameters | " << pr.params_before << " -> " << pr.params_after << " ("
       << fmt(100.0 * static_cast<double>(pr.params_before - pr.params_after) / static_cast<double>(pr.params_before),
              1)
       << "% fewer) |\n";
    os << "| forward time, batch " << pr.B << " x " << pr.T << " (median of " << pr.time_before.repeats << ") | "
       << fmt(pr.time_before.median * 1e3, 3) << " ms -> " << fmt(pr.time_after.median * 1e3, 3) << " ms (speed-up "
       << fmt(pr.time_before.median / pr.time_after.median, 2) << "x; IQR " << fmt(pr.time_before.p25 * 1e3, 3) << "-"
       << fmt(pr.time_before.p75 * 1e3, 3) << " -> " << fmt(pr.time_after.p25 * 1e3, 3) << "-"
       << fmt(pr.time_after.p75 * 1e3, 3) << " ms) |\n";
    os << "| max abs logit difference, pruned vs gated | " << fmt_sci(pr.max_diff, 2) << " |\n";
    os << "| scores, gated model | " << scores_line(pr.gated) << " |\n";
    os << "| scores, pruned.h5 | " << scores_line(pr.scores) << " |\n";
    if (pr.finetuned)
      os << "| scores after fine-tuning " << r.finetune_steps << " steps (" << fmt(pr.finetuned->seconds, 1) << " s; `"
         << pr.finetuned->checkpoint << "`) | " << scores_line(pr.finetuned->after) << " |\n";
  }
  return os.str();
}

}  // namespace headlab::analysis
