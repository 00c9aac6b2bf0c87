// headlab heads on task data (analysis/heads_report.h): the run, a value per head, the tables, report.md
// and the files.
#include "analysis/heads_report.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <sstream>

#include "analysis/explorer.h"
#include "io/atomic_file.h"
#include "tasks/algorithmic.h"

namespace headlab::analysis {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

HeadMatrix by_head(const nn::DecoderModel& m, const auto& rows, auto value) {
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

HeadsScores heads_scores(const nn::DecoderModel& model, const HeadsFindings& f) {
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
  s.self = type_score(&HeadTypeScores::self_token);
  s.next = type_score(&HeadTypeScores::next_token);
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
          csv_column("self_token", s.self),
          csv_column("next_token", s.next),
          csv_column("repeated_zero_delta_loss", s.repeated_zero),
          csv_column("repeated_mean_delta_loss", s.repeated_mean),
          HeadColumn{"label", s.labels}};
}

std::string heads_report_md(const nn::DecoderModel& model, const EvalSet& data, const HeadsRun& run,
                            const HeadsFindings& f, const HeadsScores& s) {
  const nn::DecoderShape& cfg = model.shape();
  const AblationResult& abl = f.ablation;
  const tasks::Batch& b0 = data.batches.front();
  std::ostringstream md;
  md << "# Heads of `" << run.checkpoint
     << "`\n\nEvery head's attention on a validation row, with these scores "
        "beside it: [attention.html](attention.html) (open it in a browser).\n\n";
  md << "| | |\n|---|---|\n| task | " << run.task << " |\n| model | " << cfg.n_layers << " layers x " << cfg.n_heads
     << " heads, emb " << cfg.d_model << " |\n| data | " << count_of(static_cast<int64_t>(data.batches.size()), "validation batch", "validation batches") << " of " << b0.B
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
  if (!f.dla_computed) {
    md << "\n## Direct logit attribution\n\nNot computed: the model norms the stream after every residual add "
          "(post-LN) and reads it through a masked-LM head, so no component's share of a logit is linear.\n";
  } else {
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
  }
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
       << " unablated (uniform guessing: " << fmt(std::log(static_cast<double>(cfg.out_vocab_size)))
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

Table heads_summary_table(const nn::DecoderModel& model, const HeadsScores& s) {
  Table t("", {text_column("head"), signed_column("zero dloss"), signed_column("resample"), signed_column("DLA", 3),
               signed_column("noising", 3), signed_column("denoising", 3), text_column("type")});
  for (int64_t l = 0; l < model.n_layers(); ++l)
    for (int64_t h = 0; h < model.attention(l).head_count(); ++h) {
      const auto L = static_cast<size_t>(l), H = static_cast<size_t>(h);
      t.add_row({head_label(l, model.original_head(l, h)), s.zero[L][H], s.resample[L][H], s.dla[L][H], s.noising[L][H],
                 s.denoising[L][H], s.labels[L][H]});
    }
  return t;
}

Table head_value_table(const nn::DecoderModel& model, const std::vector<std::pair<int64_t, int64_t>>& order,
                       const std::vector<std::pair<std::string, HeadMatrix>>& columns) {
  Table t("", {text_column("head")});
  for (const auto& [name, v] : columns) t.columns.push_back(signed_column(name, 3));
  for (const auto& [l, h] : order) {
    std::vector<Cell> row = {head_label(l, model.original_head(l, h))};
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
  Table t("", {text_column("head"), fixed_column("previous", 3), fixed_column("first", 3), fixed_column("separator", 3),
               fixed_column("self", 3), fixed_column("next", 3), fixed_column("entropy", 3),
               fixed_column("entropy / max", 3), fixed_column("induction", 3), fixed_column("duplicate", 3),
               text_column("label")});
  for (const HeadTypeScores& h : types.heads)
    t.add_row({head_label(h.layer, h.original_head), h.previous_token, h.first_token, h.separator, h.self_token,
               h.next_token, h.entropy, h.entropy_normalized, h.induction, h.duplicate_token, h.label});
  return t;
}

Table denoising_by_position_table(const PatchingResult& p, int64_t T) {
  Table t("", {text_column("head")});
  for (int64_t i = 0; i < T; ++i) t.columns.push_back(fixed_column(std::to_string(i), 2));
  for (const HeadPatching& h : p.heads) {
    std::vector<Cell> row = {head_label(h.layer, h.original_head)};
    for (double v : h.denoising_by_position) row.emplace_back(v);
    row.resize(t.columns.size(), kNaN);
    t.add_row(std::move(row));
  }
  return t;
}

namespace {

HeadTypeOptions head_type_options(const loader::Loaded& in) {
  HeadTypeOptions to;
  const auto* algo = dynamic_cast<const tasks::AlgorithmicTask*>(in.task.get());
  to.separator_id = algo ? algo->sep_id() : -1;
  // an encoder's rows end in [SEP], which Clark et al. found so many of BERT's heads attend to
  const nn::DecoderModel* d = in.model->as_decoder();
  if (const tasks::TextTokenizer* t = in.subword(); t && d && !d->shape().causal && t->mask())
    to.separator_id = t->eos().value_or(-1);
  return to;
}

}  // namespace

void check_find_heads(const loader::Loaded& in, const EvalSet& data) {
  HL_CHECK(!data.batches.empty(), "heads: the evaluation data has no batches");
  check_head_types(in.decoder("heads").shape(), data.batches.front().T, head_type_options(in));
}

HeadsFindings find_heads(const loader::Loaded& in, const EvalSet& data, const HeadsOptions& o) {
  check_find_heads(in, data);
  nn::DecoderModel& model = in.decoder("heads");
  const auto timed = [](auto&& f) {
    const auto start = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  HeadsFindings f;
  f.seconds_ablation = timed([&] { f.ablation = ablate_heads(model, data); });
  f.dla_computed = !model.shape().post_ln;  // no component's share of a logit is linear there
  if (f.dla_computed) {
    f.seconds_dla = timed([&] { f.dla = logit_attribution(model, data); });
  } else {
    for (DirectAttribution* a : {&f.dla.vs_mean, &f.dla.logit}) {
      a->heads = head_matrix(model, kNaN);
      a->out_proj_bias = a->feed_forward = std::vector<double>(static_cast<size_t>(model.n_layers()), kNaN);
      a->embeddings = a->final_shift = a->total = kNaN;
    }
  }
  const auto* algo = dynamic_cast<const tasks::AlgorithmicTask*>(in.task.get());
  f.seconds_types = timed([&] { f.types = head_types(model, data, head_type_options(in)); });
  std::vector<Batch> corrupted;
  if (algo) {
    for (size_t i = 0; i < data.batches.size(); ++i) corrupted.push_back(algo->corrupt(data.batches[i], o.seed + i));
    f.corruption = "one prompt digit of every row changed to another digit (the answer changes with it)";
  } else {
    corrupted = rotated_rows(data);
    f.corruption = "every row replaced by the next row of the data (another stretch of the text)";
  }
  f.seconds_patching = timed([&] { f.patching = patch_heads(model, data, corrupted, o.by_position); });
  // Copying from the context: ablation on repeated random tokens (at most 128 per copy: GPT-2's 512
  // would multiply the cost by 16 for the same answer).
  f.repeated_rows = 16;
  f.repeated_half = std::min<int64_t>(f.types.induction_half, 128);
  if (f.repeated_half >= 2 && model.shape().causal)  // its targets are the next tokens: a decoder's
    f.seconds_repeated = timed([&] {
      f.repeated =
          ablate_heads(model, repeated_tokens_set(std::min(model.shape().vocab_size, model.shape().out_vocab_size),
                                                  f.repeated_rows, f.repeated_half, o.seed));
    });
  f.composition = composition_scores(model);
  return f;
}

std::string heads_text(const nn::DecoderModel& model, const HeadsFindings& f, const HeadsScores& s) {
  const AblationResult& abl = f.ablation;
  std::ostringstream os;
  os << "unablated: loss " << fmt(abl.base.loss) << ", token accuracy " << fmt(abl.base.token_accuracy) << "\n\n"
     << render_text(heads_summary_table(model, s));
  if (f.dla_computed)
    os << "DLA: each head's direct share of logit(correct) - mean logit (final norm's scale frozen), mean over "
       << f.dla.tokens << " tokens; the components sum to " << fmt(f.dla.vs_mean.sum(), 4)
       << " (model: " << fmt(f.dla.vs_mean.total, 4) << ")\n";
  else
    os << "DLA: not computed (post-LN: no component's share of a logit is linear)\n";
  os << "patching: " << f.corruption << "; corrupted loss " << fmt(f.patching.corrupted.loss) << " vs clean "
     << fmt(f.patching.clean.loss) << "; effects are fractions of that gap\n";
  const std::vector<CompositionScore>& comp = f.composition;
  if (!comp.empty()) {  // the strongest pairs of each kind, and the induction circuits
    os << "\ncomposition (Elhage et al.; |W_OV^a W_QK^b|_F over the norms; ln1's scale folded in), "
          "strongest pairs:\n";
    for (const auto& [kind, member] : {std::pair{"Q", &CompositionScore::q}, std::pair{"K", &CompositionScore::k},
                                       std::pair{"V", &CompositionScore::v}}) {
      std::vector<CompositionScore> top = comp;
      std::partial_sort(top.begin(), top.begin() + std::min<size_t>(3, top.size()), top.end(),
                        [m = member](const auto& x, const auto& y) { return x.*m > y.*m; });
      os << "  " << kind << ":";
      for (size_t i = 0; i < std::min<size_t>(3, top.size()); ++i)
        os << "  L" << top[i].layer_a << "H" << top[i].head_a << " -> L" << top[i].layer_b << "H" << top[i].head_b
           << " " << fmt(top[i].*member, 3);
      os << "\n";
    }
    os << induction_pairs_text(f.types, comp);
  }
  if (!f.repeated.heads.empty()) {
    const auto& rep = f.repeated;
    const auto worst = std::max_element(rep.heads.begin(), rep.heads.end(),
                                        [](const auto& x, const auto& y) { return x.mean.loss < y.mean.loss; });
    os << "repeated random tokens (" << f.repeated_rows << " rows of 2 x " << f.repeated_half << "): loss "
       << fmt(rep.base.loss) << "; ablating (mean) " << head_label(worst->layer, worst->original_head)
       << " raises it most, to " << fmt(worst->mean.loss) << " (+" << fmt(worst->mean.loss - rep.base.loss) << ")\n";
  }
  return os.str();
}

std::vector<std::string> write_heads_files(const std::string& out, const loader::Loaded& in, const EvalSet& data,
                                           const HeadsOptions& o, const HeadsFindings& f, const HeadsScores& s) {
  const nn::DecoderModel& model = in.decoder("heads");
  const auto path = [&](const char* name) { return (std::filesystem::path(out) / name).string(); };
  save_heads_csv(path("heads.csv"), f.ablation, heads_csv_columns(f, s));
  if (f.dla_computed)
    save_head_map_png(path("dla.png"),
                      {"direct logit attribution: logit(correct) - mean logit", "logit", s.dla, {}, {}}, model);
  save_head_map_png(
      path("patching.png"),
      {"activation patching, denoising: fraction of the loss gap restored", "fraction", s.denoising, {}, {}}, model);
  save_head_maps_png(path("types.png"), "head types: attention-pattern scores (entropy as a fraction of its maximum)",
                     {{"previous token", "score", s.previous, {}, {}},
                      {"first token", "score", s.first, {}, {}},
                      {"induction", "score", s.induction, {}, {}},
                      {"entropy", "score", s.entropy_normalized, {}, {}}},
                     model, 0.0, 1.0);
  save_head_map_png(path("ablation.png"), {"resample ablation: loss increase", "d loss", s.resample, 0.0, {}}, model);
  // The explorer page on the first validation row, with every score beside its head.
  std::vector<ExplorerScore> scores{
      {"resample: d loss", s.resample},       {"zero: d loss", s.zero},       {"DLA (vs mean)", s.dla},
      {"patching: denoising", s.denoising},   {"previous token", s.previous}, {"induction", s.induction},
      {"entropy / max", s.entropy_normalized}};
  if (!f.dla_computed) scores.erase(scores.begin() + 2);
  save_row_explorer(path("attention.html"), *in.model, *in.task, data.batches.front(), 0,
                    o.checkpoint + ": validation row 0", scores);
  std::vector<std::string> wrote = {"heads.csv",    "report.md", "ablation.png",
                                    "patching.png", "types.png", "attention.html"};
  if (f.dla_computed) wrote.insert(wrote.begin() + 3, "dla.png");
  if (!f.composition.empty()) {  // every pair
    std::string csv = "layer_a,head_a,layer_b,head_b,q_composition,k_composition,v_composition\n";
    for (const CompositionScore& c : f.composition)
      csv += std::to_string(c.layer_a) + "," + std::to_string(c.head_a) + "," + std::to_string(c.layer_b) + "," +
             std::to_string(c.head_b) + "," + fmt(c.q, 6) + "," + fmt(c.k, 6) + "," + fmt(c.v, 6) + "\n";
    io::write_file_atomic(path("composition.csv"), csv, "heads");
    save_composition_png(path("composition.png"), f.composition, model);
    wrote.insert(wrote.end(), {"composition.csv", "composition.png"});
  }
  io::write_file_atomic(path("report.md"),
                        heads_report_md(model, data, {o.checkpoint, in.task->name(), o.by_position}, f, s), "heads");
  return wrote;
}

}  // namespace headlab::analysis
