// The circuit patcher's state (analysis/circuit_internal.h): the chunks of prompt rows with their stored
// clean and corrupted runs (made, made again when not stored, averaged), the memory budgets that size
// chunks and copies, what edge attribution shares, and CircuitPatcher's calls (metric, the baseline).
#include <algorithm>
#include <numeric>

#include "analysis/circuit_internal.h"
#include "base/sizes.h"

namespace headlab::analysis {

namespace {

using Input = CircuitGraph::Input;
using Impl = CircuitPatcher::Impl;
constexpr int64_t kBudgetBytes = int64_t{256} << 20;  // the least one forward may take (evaluate_interventions' budget)

}  // namespace

// ---- the patcher's state ----
Impl::Impl(nn::DecoderModel& m, const CircuitOptions& o)
    : model(m),
      guard(m),
      graph(m),
      options(o),
      comm(o.collectives ? o.collectives : train::single_process()),
      C(m.shape().d_model) {
  model.eval();
  detail::set_controls(model, {}, {});  // the model's head controls are not applied
  attention_group.assign(static_cast<size_t>(graph.n_layers()), -1);
  mlp_group.assign(static_cast<size_t>(graph.n_layers()), -1);
  for (size_t g = 0; g < graph.groups().size(); ++g) {
    const CircuitGraph::Group& grp = graph.groups()[g];
    if (grp.input == Input::q) attention_group[static_cast<size_t>(grp.layer)] = static_cast<int64_t>(g);
    if (grp.input == Input::mlp) mlp_group[static_cast<size_t>(grp.layer)] = static_cast<int64_t>(g);
  }
}

Chunk Impl::make_chunk(const PromptPairs& pairs, int64_t first, int64_t B) {
  const NoGradGuard no_grad;
  Chunk c;
  c.B = B, c.T = pairs.T, c.first_row = first;
  const Device dev = model.device();
  const auto rows_of = [&](const std::vector<int64_t>& v, int64_t width) {
    return tensor(std::vector<int64_t>(v.begin() + first * width, v.begin() + (first + B) * width), {B, width}).to(dev);
  };
  c.clean_tokens = rows_of(pairs.clean, pairs.T), c.corrupt_tokens = rows_of(pairs.corrupt, pairs.T);
  const Tensor answer = rows_of(pairs.answer, 1).reshape({B}), wrong = rows_of(pairs.wrong, 1).reshape({B});
  const Tensor& W_U = model.lm_head().weight;  // (V, C): the unembedding's rows
  c.direction = sub(index_select(W_U, 0, answer), index_select(W_U, 0, wrong)).detach();
  const Tensor& b_U = model.lm_head().bias;
  c.bias_diff = b_U.defined() ? sub(index_select(b_U, 0, answer), index_select(b_U, 0, wrong)).detach()
                              : zeros({B}, W_U.dtype(), dev);
  if (pairs.probability_metric()) {
    const auto M = static_cast<int64_t>(pairs.candidates.size());
    c.candidates = tensor(pairs.candidates, {M}).to(dev);
    c.weights =
        tensor(std::vector<double>(pairs.weights.begin() + first * M, pairs.weights.begin() + (first + B) * M), {B, M})
            .to(W_U.dtype())
            .to(dev);
  }
  // The clean and corrupted prompts in one forward of 2B rows (clean first): each GEMM packs the weights
  // once for twice the rows (GPT-2 small, 8 pairs of 15 tokens a chunk: packing was a third of the GEMMs' time).
  Chunk both;
  both.B = 2 * B, both.T = c.T;
  both.direction = cat({c.direction, c.direction}, 0), both.bias_diff = cat({c.bias_diff, c.bias_diff}, 0);
  if (c.candidates.defined()) both.candidates = c.candidates, both.weights = cat({c.weights, c.weights}, 0);
  const int64_t P = B * c.T * C;
  Recorded rec;
  rec.outputs = Tensor::empty({graph.node_count(), 2 * P}, detail::model_dtype(model), dev);
  // Every element is written by the forward below, mostly a node's few hundred KB at a time on one thread; on
  // the CPU its fresh pages (0.9 GB at GPT-2 shape and 64 pairs) are faulted in far faster by a parallel fill
  // (path patching there: 2.49 -> 2.32 s, medians of 10 interleaved runs).
  rec.outputs.zero_();
  Pass p;
  p.record = true;
  p.tokens = cat({c.clean_tokens, c.corrupt_tokens}, 0);
  const std::vector<double> ld = forward(both, p, &rec).to_vector<double>();  // (1, 2B)
  c.clean_ld.assign(ld.begin(), ld.begin() + B), c.corrupt_ld.assign(ld.begin() + B, ld.end());
  // clean_resid[l]: the stream entering layer l; the recording holds the stream after each layer.
  // Copies (a view would keep the corrupted rows alive, and the embeddings' would see the delta below).
  c.clean_resid.push_back(clone(rec.outputs.select(0, 0).reshape({2 * B, c.T, C}).narrow(0, 0, B)));
  for (const Tensor& r : rec.resid) c.clean_resid.push_back(clone(r.narrow(0, 0, B)));
  rec.resid.clear();
  // Every node's outputs, (N, 2P): clean then corrupted, as the forward wrote them. The corrupted half
  // stays; the clean half is overwritten with clean - corrupted, so the chunk keeps 2NP floats, allocated once.
  c.corrupt_out = rec.outputs.narrow(1, P, P);
  c.delta = rec.outputs.narrow(1, 0, P);
  c.delta.sub_(c.corrupt_out);
  const int64_t N = graph.node_count();
  c.delta_last = c.delta.reshape({N, B, c.T, C}).select(2, c.T - 1).reshape({N, B * C});
  return c;
}

void Impl::compute_means() {
  if (mean_out.defined()) return;
  const int64_t N = graph.node_count(), TC = positions * C;
  std::vector<double> sum(static_cast<size_t>(N * TC), 0.0);
  Chunk scratch;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& c = runs(i, scratch);
    const std::vector<double> s = add(c.corrupt_out, c.delta).reshape({N, c.B, TC}).sum({1}).to_vector<double>();
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += s[i];
  }
  comm->allreduce_sum(sum.data(), static_cast<int64_t>(sum.size()));
  for (double& v : sum) v /= static_cast<double>(rows);
  mean_out = tensor(sum, {N, TC}).to(detail::model_dtype(model)).to(model.device());
}

// Every node's output at the last position read along answer - wrong through the final norm, frozen at
// the clean stream there; the rest of the stream (the out_proj biases), the norm's bias and the
// unembedding's bias make the constant.
DirectLogitAttribution Impl::logit_attribution() {
  const NoGradGuard no_grad;
  const int64_t N = graph.node_count();
  std::vector<double> sums(static_cast<size_t>(N + 2), 0.0);  // the nodes, the constant, the clean difference
  Chunk scratch;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& c = runs(i, scratch);
    const int64_t B = c.B, T = c.T;
    const Tensor x = c.clean_resid.back().select(1, T - 1);  // (B, C): what the final norm reads
    const nn::FrozenNorm frozen = model.freeze_final_norm(x);
    const Tensor dir = frozen.back(c.direction);                                            // (B, C)
    const Tensor out = add(c.corrupt_out, c.delta).reshape({N, B, T, C}).select(2, T - 1);  // (N, B, C)
    const Tensor per_node = mul(out, dir.unsqueeze(0)).sum({2});                            // (N, B)
    const Tensor rest = sub(x, out.sum({0}));                                               // (B, C)
    const Tensor constant = add(add(mul(rest, dir).sum({1}), frozen.bias_along(c.direction)), c.bias_diff);
    const Tensor clean = add(mul(model.normalize_final(x), c.direction).sum({1}), c.bias_diff);  // (B)
    const std::vector<double> n = per_node.sum({1}).to_vector<double>();
    for (int64_t i = 0; i < N; ++i) sums[static_cast<size_t>(i)] += n[static_cast<size_t>(i)];
    sums[static_cast<size_t>(N)] += constant.sum().item<double>();
    sums[static_cast<size_t>(N + 1)] += clean.sum().item<double>();
  }
  comm->allreduce_sum(sums.data(), static_cast<int64_t>(sums.size()));
  for (double& v : sums) v /= static_cast<double>(rows);
  DirectLogitAttribution r;
  r.node.assign(sums.begin(), sums.begin() + N);
  r.constant = sums[static_cast<size_t>(N)], r.clean = sums[static_cast<size_t>(N + 1)];
  return r;
}

const Chunk& Impl::runs(size_t i, Chunk& scratch) {
  const Chunk& c = chunks[i];
  if (c.stored) return c;
  scratch = Chunk();
  scratch = make_chunk(pairs, c.first_row, c.B);
  rerun_rows += c.B;
  return scratch;
}

int64_t Impl::stored_row_budget(int64_t T) const {
  if (options.stored_rows > 0) return options.stored_rows;
  // A row's runs: every node's corrupted output and clean - corrupted one, the clean stream entering each
  // layer and the final norm, the last position's deltas.
  const int64_t per_row = ((2 * graph.node_count() + graph.n_layers() + 1) * T + graph.node_count()) * C *
                          dtype_size(detail::model_dtype(model));
  // 2 GiB: the runs are cheap to make again (one forward of both prompts a chunk against a pass's many patched copies:
  // stories260K's heads on 4000 rows took 179 s with every run stored or with 250 rows stored).
  const double most = double(int64_t{2} << 30), available = available_memory();
  const double budget =
      (available > 0 ? std::min(most, available / 4) : most) / static_cast<double>(comm->local_size());
  return std::max<int64_t>(1, static_cast<int64_t>(budget / static_cast<double>(std::max<int64_t>(per_row, 1))));
}

int64_t Impl::widest_group() const {
  int64_t widest = 1;
  for (const CircuitGraph::Group& g : graph.groups()) widest = std::max(widest, g.count);
  return widest;
}

int64_t Impl::activation_budget() const {
  const int64_t weights = model.num_parameters() * dtype_size(detail::model_dtype(model));
  return std::clamp(weights, kBudgetBytes, kBudgetBytes * 4);
}

int64_t Impl::chunk_rows(int64_t T, bool backward) const {
  if (options.chunk_rows > 0) return options.chunk_rows;
  const int64_t layers_alive = backward ? graph.n_layers() : 1;
  const int64_t per_rank = (rows + comm->size() - 1) / comm->size();
  // A chunk's runs (2 N) are counted in the stored budget when every row of this rank's is kept.
  const int64_t runs = !backward && stored_row_budget(T) >= per_rank ? 0 : 2 * graph.node_count();
  const int64_t per_row = (runs + graph.node_count() + widest_group() * 4 + 16 * layers_alive) * T * C *
                          dtype_size(detail::model_dtype(model));
  const int64_t budget = backward ? 2 * kBudgetBytes : activation_budget();
  return std::max<int64_t>(1, budget / std::max<int64_t>(per_row, 1));
}

int64_t Impl::even_chunks(int64_t rows, int64_t most) {
  most = std::min(most, rows);
  for (int64_t d = most; d * 2 >= most; --d)
    if (rows % d == 0) return d;
  return most;
}

int64_t Impl::copies_per_forward(const Chunk& c) const {
  if (options.max_copies > 0) return options.max_copies;
  const int64_t logits = c.candidates.defined() ? 2 * c.B * model.shape().out_vocab_size : 0;  // and softmax
  const int64_t per_copy = ((graph.node_count() + widest_group() * 3 + 16) * c.B * c.T * C + logits) *
                           dtype_size(detail::model_dtype(model));
  return std::max<int64_t>(1, activation_budget() / std::max<int64_t>(per_copy, 1));
}

// ---- shared with edge attribution ----
void check_pairs(const nn::DecoderModel& model, const PromptPairs& pairs, const char* who) {
  const nn::DecoderShape& shape = model.shape();
  HL_CHECK(pairs.rows() > 0 && pairs.T > 0, who, ": no prompt pairs");
  HL_CHECK(pairs.T <= shape.context_length, who, ": prompts of ", pairs.T, " tokens do not fit the model's context of ",
           shape.context_length);
  // Prompts are read (vocab_size); answers are predicted (out_vocab_size, where the model predicts fewer).
  const auto check_ids = [&](const std::vector<int64_t>& ids, const char* what, int64_t V) {
    for (size_t i = 0; i < ids.size(); ++i)
      HL_CHECK(ids[i] >= 0 && ids[i] < V, who, ": ", what, " token ", ids[i], " (at ", i, ") is outside the ",
               V == shape.vocab_size ? "vocabulary" : "predicted vocabulary", " of ", V);
  };
  check_ids(pairs.clean, "clean", shape.vocab_size), check_ids(pairs.corrupt, "corrupt", shape.vocab_size);
  HL_CHECK(pairs.clean != pairs.corrupt, who, ": every clean prompt equals its corrupted one; nothing to compare");
  const int64_t V_out = shape.out_vocab_size;
  check_ids(pairs.answer, "answer", V_out), check_ids(pairs.wrong, "wrong", V_out);
  check_ids(pairs.candidates, "candidate", V_out);
  HL_CHECK(pairs.weights.size() == pairs.candidates.size() * static_cast<size_t>(pairs.rows()), who,
           ": the probability metric's weights list ", pairs.weights.size(),
           " values, not rows x candidates = ", pairs.rows(), " x ", pairs.candidates.size());
}

void gather_rows(train::Collectives& comm, LogitDifference& d) {
  comm.allreduce_sum(d.clean.data(), static_cast<int64_t>(d.clean.size()));
  comm.allreduce_sum(d.corrupt.data(), static_cast<int64_t>(d.corrupt.size()));
}

void finish_baseline(LogitDifference& d) {
  const auto mean = [](const std::vector<double>& v) {
    return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  };
  d.clean_mean = mean(d.clean), d.corrupt_mean = mean(d.corrupt);
}

// ---- the patcher ----
CircuitPatcher::CircuitPatcher(nn::DecoderModel& model, const PromptPairs& pairs, const CircuitOptions& options) {
  check_pairs(model, pairs, "circuit");
  impl_ = std::make_unique<Impl>(model, options);
  Impl& s = *impl_;
  s.pairs = pairs;
  s.rows = pairs.rows(), s.positions = pairs.T;
  const int64_t step = Impl::even_chunks(pairs.rows(), s.chunk_rows(pairs.T, false));
  s.baseline.clean.assign(static_cast<size_t>(s.rows), 0.0);
  s.baseline.corrupt.assign(static_cast<size_t>(s.rows), 0.0);
  int64_t room = s.stored_row_budget(pairs.T);
  for (int64_t first = 0, i = 0; first < pairs.rows(); first += step, ++i) {
    if (i % s.comm->size() != s.comm->rank()) continue;  // another rank's chunk
    Chunk& c = s.chunks.emplace_back(s.make_chunk(pairs, first, std::min(step, pairs.rows() - first)));
    std::copy(c.clean_ld.begin(), c.clean_ld.end(), s.baseline.clean.begin() + first);
    std::copy(c.corrupt_ld.begin(), c.corrupt_ld.end(), s.baseline.corrupt.begin() + first);
    c.stored = c.B <= room;
    room -= c.stored ? c.B : 0;
    if (!c.stored) {  // only its rows: its runs are made again when read
      Chunk rows_only;
      rows_only.B = c.B, rows_only.T = c.T, rows_only.first_row = c.first_row;
      c = std::move(rows_only);
    }
  }
  gather_rows(*s.comm, s.baseline);
  finish_baseline(s.baseline);
  s.baseline.normalized(0);  // throws when clean and corrupted score the same
}

CircuitPatcher::~CircuitPatcher() = default;
const CircuitGraph& CircuitPatcher::graph() const { return impl_->graph; }
const LogitDifference& CircuitPatcher::baseline() const { return impl_->baseline; }
int64_t CircuitPatcher::forwards() const { return impl_->forwards; }
int64_t CircuitPatcher::rerun_rows() const { return impl_->rerun_rows; }
int64_t CircuitPatcher::own_rows() const {
  int64_t n = 0;
  for (const Chunk& c : impl_->chunks) n += c.B;
  return n;
}
int64_t CircuitPatcher::stored_rows() const {
  int64_t n = 0;
  for (const Chunk& c : impl_->chunks) n += c.stored ? c.B : 0;
  return n;
}
int64_t CircuitPatcher::positions() const { return impl_->positions; }
DirectLogitAttribution CircuitPatcher::direct_logit_attribution() const { return impl_->logit_attribution(); }

std::string stored_runs_text(const CircuitPatcher& patcher) {
  if (patcher.stored_rows() == patcher.own_rows()) return "";
  return "stored runs: " + std::to_string(patcher.stored_rows()) + " of the " + std::to_string(patcher.own_rows()) +
         " rows this process runs (--stored-rows; by default what 2 GiB, or a quarter of the available memory, "
         "holds); the others' clean and corrupted runs are made again in every pass\n";
}

std::vector<double> CircuitPatcher::metric(const std::vector<EdgePatch>& patches) { return metric(patches, {}); }

std::vector<double> CircuitPatcher::metric(const std::vector<EdgePatch>& patches,
                                           const std::vector<Replace>& replaced) {
  Impl& s = *impl_;
  for (const EdgePatch& p : patches)
    HL_CHECK(static_cast<int64_t>(p.size()) == s.graph.edge_count(), "circuit: a patch lists ", p.size(),
             " edges, the graph has ", s.graph.edge_count());
  HL_CHECK(replaced.empty() || replaced.size() == patches.size(), "circuit: ", replaced.size(), " replaced nodes for ",
           patches.size(), " patches");
  for (const Replace& r : replaced) {
    HL_CHECK(r.node >= -1 && r.node < s.graph.node_count(), "circuit: no node ", r.node, " to replace (",
             s.graph.node_count(), " nodes)");
    HL_CHECK(r.position >= -1 && r.position < s.positions, "circuit: no position ", r.position, " to replace at (",
             s.positions, " positions)");
  }
  const NoGradGuard no_grad;
  if (std::any_of(replaced.begin(), replaced.end(), [](const Replace& r) { return r.with == Replace::Value::mean; }))
    s.compute_means();
  std::vector<double> sums(patches.size(), 0.0);
  Chunk scratch;
  for (size_t i = 0; i < s.chunks.size(); ++i) {
    const Chunk& c = s.runs(i, scratch);
    const auto per = static_cast<size_t>(s.copies_per_forward(c));
    for (size_t k0 = 0; k0 < patches.size(); k0 += per) {
      std::vector<const EdgePatch*> copies;
      for (size_t k = k0; k < std::min(patches.size(), k0 + per); ++k) copies.push_back(&patches[k]);
      Impl::Pass p = s.pass_for(copies);
      if (!replaced.empty()) {
        p.replaced.assign(replaced.begin() + static_cast<std::ptrdiff_t>(k0),
                          replaced.begin() + static_cast<std::ptrdiff_t>(k0 + copies.size()));
        // A replaced node must be computed, not read from the clean run: start no later than its layer
        // (the embeddings, unless set to their clean value everywhere: from layer 0).
        for (const Replace& r : p.replaced)
          if (r.node > 0 || (r.node == 0 && (r.position >= 0 || r.with != Replace::Value::clean)))
            p.first_layer =
                std::min(p.first_layer, std::max<int64_t>(0, s.graph.nodes()[static_cast<size_t>(r.node)].layer));
      }
      const std::vector<double> ld = s.forward(c, p).sum({1}).to_vector<double>();  // (K)
      for (size_t k = 0; k < copies.size(); ++k) sums[k0 + k] += ld[k];
      s.forwards += static_cast<int64_t>(copies.size());
    }
  }
  s.comm->allreduce_sum(sums.data(), static_cast<int64_t>(sums.size()));
  for (double& v : sums) v = s.baseline.normalized(v / static_cast<double>(s.rows));
  return sums;
}

}  // namespace headlab::analysis
