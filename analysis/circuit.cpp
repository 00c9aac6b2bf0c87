// Circuits: the graph of a GPT, the patched forward over stored clean and corrupted runs, path
// patching, edge attribution patching and circuit discovery (analysis/circuit.h).
#include "analysis/circuit.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "analysis/head_control.h"

namespace headlab::analysis {

namespace {

using Input = CircuitGraph::Input;
using Clock = std::chrono::steady_clock;
constexpr int64_t kBudgetBytes = int64_t{256} << 20;  // activations of one forward, as evaluate_interventions budgets

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

const char* input_name(Input in) {
  switch (in) {
    case Input::q:
      return "q";
    case Input::k:
      return "k";
    case Input::v:
      return "v";
    case Input::mlp:
      return "mlp";
    case Input::logits:
      return "logits";
  }
  return "?";
}

}  // namespace

// ---- the graph ----
CircuitGraph::CircuitGraph(const nn::GPTModel& model) : n_layers_(model.n_layers()) {
  const bool mlp = !model.config().attn_only;
  nodes_.push_back({-1, -1});  // the embeddings
  const auto add_group = [&](int64_t layer, Input input, int64_t count) {
    const auto senders = static_cast<int64_t>(nodes_.size());
    groups_.push_back({layer, static_cast<int64_t>(receivers_.size()), count, senders, input});
    for (int64_t i = 0; i < count; ++i) {
      const int64_t head = input == Input::q ? i % (count / 3) : -1;
      const Input in =
          input == Input::q ? std::array{Input::q, Input::k, Input::v}[static_cast<size_t>(i / (count / 3))] : input;
      receivers_.push_back({layer, head, in, senders, edges_});
      edges_ += senders;
    }
  };
  for (int64_t l = 0; l < n_layers_; ++l) {
    const int64_t H = model.attention(l).head_count();
    auto& orig = original_heads_.emplace_back();
    for (int64_t h = 0; h < H; ++h) orig.push_back(model.original_head(l, h));
    if (H > 0) add_group(l, Input::q, 3 * H);
    for (int64_t h = 0; h < H; ++h) nodes_.push_back({l, h});
    if (mlp) {
      add_group(l, Input::mlp, 1);
      nodes_.push_back({l, -1});
    }
  }
  add_group(n_layers_, Input::logits, 1);
}

int64_t CircuitGraph::first_node_of_layer(int64_t layer) const {
  HL_CHECK(layer >= 0 && layer <= n_layers_, "CircuitGraph: no layer ", layer, " (", n_layers_, " layers)");
  for (int64_t n = 1; n < node_count(); ++n)
    if (nodes_[static_cast<size_t>(n)].layer >= layer) return n;
  return node_count();
}

std::string CircuitGraph::node_name(int64_t node) const {
  const Node& n = nodes_.at(static_cast<size_t>(node));
  if (n.layer < 0) return "embed";
  if (n.head < 0) return "MLP" + std::to_string(n.layer);
  std::string s = "L";
  s.append(std::to_string(n.layer))
      .append("H")
      .append(std::to_string(original_heads_[static_cast<size_t>(n.layer)][static_cast<size_t>(n.head)]));
  return s;
}

int64_t CircuitGraph::node_of_receiver(int64_t receiver) const {
  const Receiver& r = receivers_.at(static_cast<size_t>(receiver));
  if (r.input == Input::logits) return -1;
  for (int64_t n = 1; n < node_count(); ++n) {
    const Node& nd = nodes_[static_cast<size_t>(n)];
    if (nd.layer == r.layer && nd.head == r.head) return n;
  }
  HL_FAIL("CircuitGraph: receiver ", receiver, " has no node");
}

std::string CircuitGraph::receiver_name(int64_t receiver) const {
  const Receiver& r = receivers_.at(static_cast<size_t>(receiver));
  if (r.input == Input::logits) return "logits";
  std::string s = node_name(node_of_receiver(receiver));
  if (r.input != Input::mlp) s.append(".").append(input_name(r.input));
  return s;
}

int64_t CircuitGraph::edge_receiver(int64_t edge) const {
  HL_CHECK(edge >= 0 && edge < edges_, "CircuitGraph: no edge ", edge, " (", edges_, " edges)");
  const auto it = std::upper_bound(receivers_.begin(), receivers_.end(), edge,
                                   [](int64_t e, const Receiver& r) { return e < r.first_edge; });
  return static_cast<int64_t>(it - receivers_.begin()) - 1;
}

int64_t CircuitGraph::edge_sender(int64_t edge) const {
  return edge - receivers_[static_cast<size_t>(edge_receiver(edge))].first_edge;
}

std::string CircuitGraph::edge_name(int64_t edge) const {
  std::string s = node_name(edge_sender(edge));
  return s.append(" -> ").append(receiver_name(edge_receiver(edge)));
}

int64_t CircuitGraph::edge(int64_t sender, int64_t receiver) const {
  const Receiver& r = receivers_.at(static_cast<size_t>(receiver));
  return sender >= 0 && sender < r.senders ? r.first_edge + sender : -1;
}

int64_t CircuitGraph::parse_node(const std::string& name, const char* who) const {
  for (int64_t n = 0; n < node_count(); ++n)
    if (node_name(n) == name) return n;
  HL_FAIL(who, ": the model has no node '", name, "' (nodes: embed, L<layer>H<head>",
          node_count() > 1 && nodes_.back().head < 0 ? ", MLP<layer>" : "", "; layers 0..", n_layers_ - 1, ")");
}

std::vector<int64_t> CircuitGraph::parse_receivers(const std::string& name, const char* who) const {
  std::vector<int64_t> out;
  for (int64_t r = 0; r < static_cast<int64_t>(receivers_.size()); ++r) {
    const std::string rn = receiver_name(r);
    if (rn == name || (receivers_[static_cast<size_t>(r)].head >= 0 && node_name(node_of_receiver(r)) == name))
      out.push_back(r);
  }
  HL_CHECK(!out.empty(), who, ": the model has no receiver '", name,
           "' (receivers: L<layer>H<head> (its q, k and v), L<layer>H<head>.q/.k/.v, MLP<layer>, logits)");
  return out;
}

// ---- the patched forward ----

// One chunk of prompt rows with its stored runs.
struct Chunk {
  int64_t B = 0, T = 0, first_row = 0;
  Tensor clean_tokens, corrupt_tokens;  // (B, T) int64
  Tensor direction;                     // (B, C): W_U[answer] - W_U[wrong]
  Tensor bias_diff;                     // (B): the head's bias difference (zeros without one)
  Tensor candidates, weights;           // probability metric: (M) token ids, (B, M) signs; else undefined
  Tensor corrupt_out, delta;            // (N, B*T*C): corrupted outputs of every node; clean - corrupted
  Tensor delta_last;                    // (N, B*C): delta at the last position
  std::vector<Tensor> clean_resid;      // [layer 0..L] (B, T, C): the clean stream entering each layer
  std::vector<double> clean_ld, corrupt_ld;
};

struct CircuitPatcher::Impl {
  struct LayerWeights {
    int64_t H = 0, D = 0;
    std::shared_ptr<nn::CausalMultiHead> fused;  // keeps a converted wrapper's copy alive
    Tensor Wq, Wk, Wv;                           // (H, C, D)
    Tensor bq, bk, bv;                           // (H, 1, D) or undefined
    Tensor Wo;                                   // (H, D, C)
    Tensor bo;                                   // (C) or undefined
  };
  // What one forward does beyond the plain run.
  struct Pass {
    int64_t copies = 1, first_layer = 0;
    std::vector<Tensor> patches;            // [group]: (K, R, senders) or undefined (nothing patched there)
    std::vector<Tensor>* probes = nullptr;  // filled per group with zero leaves added to the inputs
    Tensor start;                           // the stream entering layer 0 (B, T, C), when not the clean one
    std::vector<Replace> replaced;          // [copy]: the node whose output is set to a value of its own
    bool record = false;                    // K = 1, from layer 0, no patches: fill `recorded`
    Tensor tokens;                          // record: (B, T)
  };
  struct Recorded {
    std::vector<Tensor> outputs;  // [node] (B*T*C)
    std::vector<Tensor> resid;    // [layer 0..L] (B, T, C)
  };

  nn::GPTModel& model;
  CircuitGraph graph;
  CircuitOptions options;
  std::shared_ptr<train::Collectives> comm;
  std::vector<LayerWeights> layers;
  std::vector<Chunk> chunks;
  LogitDifference baseline;
  Tensor mean_out;  // (N, T*C): every node's clean output averaged over the prompts, once asked for
  int64_t rows = 0, positions = 0, forwards = 0, C = 0;
  bool was_training = false;

  Impl(nn::GPTModel& m, const CircuitOptions& o)
      : model(m),
        graph(m),
        options(o),
        comm(o.collectives ? o.collectives : train::single_process()),
        C(m.config().emb_dim) {
    was_training = m.is_training();
    model.eval();
    const NoGradGuard no_grad;
    for (int64_t l = 0; l < model.n_layers(); ++l) {
      LayerWeights w;
      nn::CausalMultiHead& att = model.attention(l);
      w.H = att.head_count(), w.D = att.head_size();
      if (w.H == 0) {
        layers.push_back(w);
        continue;
      }
      w.fused = att.form() == nn::AttentionForm::fused ? nullptr : nn::convert_attention(att, nn::AttentionForm::fused);
      auto& f = dynamic_cast<nn::CausalMultiHeadAttention&>(w.fused ? *w.fused : att);
      const auto per_head = [&](const nn::Linear& lin) {  // (H*D, C) -> (H, C, D)
        return lin.weight.detach().reshape({w.H, w.D, C}).transpose(1, 2).contiguous();
      };
      const auto bias = [&](const nn::Linear& lin) {
        return lin.bias.defined() ? lin.bias.detach().reshape({w.H, 1, w.D}) : Tensor();
      };
      w.Wq = per_head(*f.W_query), w.Wk = per_head(*f.W_key), w.Wv = per_head(*f.W_value);
      w.bq = bias(*f.W_query), w.bk = bias(*f.W_key), w.bv = bias(*f.W_value);
      // out_proj (C, H*D) -> (H, D, C)
      w.Wo = f.out_proj->weight.detach().reshape({C, w.H, w.D}).permute({1, 2, 0}).contiguous();
      w.bo = f.out_proj->bias.defined() ? f.out_proj->bias.detach() : Tensor();
      layers.push_back(w);
    }
  }
  ~Impl() {
    if (was_training) model.train();
  }

  // The groups' patch matrices for K copies; the first layer any copy patches (n_layers: the logits only).
  Pass pass_for(const std::vector<const EdgePatch*>& copies) const {
    Pass p;
    p.copies = static_cast<int64_t>(copies.size());
    p.first_layer = graph.n_layers();
    const DType dt = detail::model_dtype(model);
    for (const CircuitGraph::Group& g : graph.groups()) {
      const int64_t e0 = graph.receivers()[static_cast<size_t>(g.first)].first_edge, n = g.count * g.senders;
      std::vector<double> m(static_cast<size_t>(p.copies * n), 0.0);
      bool any = false;
      for (size_t k = 0; k < copies.size(); ++k)
        for (int64_t i = 0; i < n; ++i) {
          const double v = (*copies[k])[static_cast<size_t>(e0 + i)];
          m[k * static_cast<size_t>(n) + static_cast<size_t>(i)] = v;
          any = any || v != 0;
        }
      p.patches.push_back(any ? tensor(m, {p.copies, g.count, g.senders}).to(dt).to(model.device()) : Tensor());
      if (any) p.first_layer = std::min(p.first_layer, g.layer);
    }
    return p;
  }

  // The logit difference of every copy and row, (K, B), for chunk c under pass p.
  Tensor forward(const Chunk& c, const Pass& p, Recorded* rec = nullptr) {
    const int64_t K = p.copies, B = c.B, T = c.T, P = B * T * C, L = graph.n_layers();
    const int64_t l0 = p.first_layer;
    const int64_t N0 = l0 == 0 ? 1 : graph.first_node_of_layer(l0);  // nodes before N0: the clean run's
    const bool patched = std::any_of(p.patches.begin(), p.patches.end(), [](const Tensor& t) { return t.defined(); });
    Tensor resid;  // (K, B, T, C)
    if (p.record) {
      resid = model.embed(p.tokens).unsqueeze(0);
      rec->outputs.push_back(resid.reshape({P}));
    } else {
      const Tensor start = p.start.defined() ? p.start : c.clean_resid[static_cast<size_t>(l0)];
      resid = start.unsqueeze(0).expand({K, B, T, C});
    }
    std::vector<Tensor> own_delta;  // nodes N0..: out - corrupt_out, (K, P)
    int64_t next_node = N0;
    // Where each copy sets `node` to `with`, (K, 1, T, 1) of 0/1; undefined when no copy does.
    const auto replaced_at = [&](int64_t node, Replace::Value with) -> Tensor {
      std::vector<double> m(static_cast<size_t>(K * T), 0.0);
      bool any = false;
      for (size_t k = 0; k < p.replaced.size(); ++k)
        if (p.replaced[k].node == node && p.replaced[k].with == with)
          for (int64_t t = 0; t < T; ++t)
            if (p.replaced[k].position < 0 || p.replaced[k].position == t) m[k * T + t] = 1.0, any = true;
      return any ? tensor(m, {K, 1, T, 1}).to(resid.dtype()).to(resid.device()) : Tensor();
    };
    // Node `node`'s value `with`, (1, B, T, C) or (1, 1, T, C) for the mean; undefined for zero.
    const auto value_of = [&](int64_t node, Replace::Value with) -> Tensor {
      const Tensor corrupt = c.corrupt_out.select(0, node).reshape({1, B, T, C});
      switch (with) {
        case Replace::Value::clean:
          return add(corrupt, c.delta.select(0, node).reshape({1, B, T, C}));
        case Replace::Value::corrupt:
          return corrupt;
        case Replace::Value::mean:
          return mean_out.select(0, node).reshape({1, 1, T, C});
        case Replace::Value::zero:
          break;
      }
      return Tensor();
    };
    constexpr Replace::Value kValues[] = {Replace::Value::clean, Replace::Value::corrupt, Replace::Value::zero,
                                          Replace::Value::mean};
    // out (K, P) of node `node` with the copies that set it given their value there instead.
    const auto replace = [&](const Tensor& out, int64_t node) -> Tensor {
      Tensor o = out.reshape({K, B, T, C});
      for (Replace::Value with : kValues) {
        const Tensor m = replaced_at(node, with);
        if (!m.defined()) continue;
        const Tensor v = value_of(node, with);
        o = v.defined() ? add(o, mul(m, sub(v, o))) : sub(o, mul(m, o));
      }
      return o.reshape({K, P});
    };
    // The embeddings set at some positions. Clean: the corrupted ones elsewhere (copies setting them
    // everywhere subtract zeros); another value: the clean ones elsewhere (the stream starts clean).
    if (l0 == 0 && !p.record && !p.replaced.empty()) {
      const Tensor m = replaced_at(0, Replace::Value::clean);
      if (m.defined()) {
        std::vector<double> restoring(static_cast<size_t>(K), 0.0);
        for (size_t k = 0; k < p.replaced.size(); ++k)
          restoring[k] = p.replaced[k].node == 0 && p.replaced[k].with == Replace::Value::clean ? 1.0 : 0.0;
        const Tensor r = tensor(restoring, {K, 1, 1, 1}).to(resid.dtype()).to(resid.device());
        resid = sub(resid, mul(sub(r, m), c.delta.select(0, 0).reshape({1, B, T, C})));
      }
      const Tensor clean_embed = value_of(0, Replace::Value::clean);
      for (Replace::Value with : kValues) {
        const Tensor mw = with == Replace::Value::clean ? Tensor() : replaced_at(0, with);
        if (!mw.defined()) continue;
        const Tensor v = value_of(0, with);
        resid = add(resid, mul(mw, v.defined() ? sub(v, clean_embed) : neg(clean_embed)));
      }
    }
    const auto emit = [&](const Tensor& out) {  // out (K, B, T, C): the next node's output
      if (rec) rec->outputs.push_back(out.reshape({P}));
      if (patched) own_delta.push_back(sub(out.reshape({K, P}), c.corrupt_out.select(0, next_node).unsqueeze(0)));
      ++next_node;
    };
    // The patch of group g's receivers, (K, R, width): width P, or B*C at the last position (last).
    const auto patch_of = [&](size_t g, bool last) -> Tensor {
      const Tensor& M = p.patches.empty() ? Tensor() : p.patches[g];
      if (!M.defined()) return Tensor();
      const int64_t S = M.size(2), S0 = std::min(S, N0);
      const Tensor& stored = last ? c.delta_last : c.delta;
      Tensor out = matmul(M.narrow(2, 0, S0), stored.narrow(0, 0, S0));  // (K, R, S0) @ (S0, width)
      if (S > N0) {
        std::vector<Tensor> own;
        for (int64_t j = 0; j < S - N0; ++j) {
          const Tensor& d = own_delta[static_cast<size_t>(j)];
          own.push_back(last ? d.reshape({K, B, T, C}).select(2, T - 1).reshape({K, B * C}) : d);
        }
        out = add(out, matmul(M.narrow(2, N0, S - N0), stack(own, 1)));  // (K, R, n) @ (K, n, width)
      }
      return out;
    };
    // Group g's inputs: the stream minus the patch, plus a probe leaf; (K, R, width) or undefined (the stream itself).
    const auto inputs_of = [&](size_t g, const Tensor& stream, int64_t R, bool last) -> Tensor {
      const Tensor patch = patch_of(g, last);
      if (!patch.defined() && !p.probes) return Tensor();
      const int64_t width = stream.size(1);
      Tensor x = patch.defined() ? sub(stream.unsqueeze(1), patch) : stream.unsqueeze(1).expand({K, R, width});
      if (p.probes) {
        Tensor probe = zeros({K, R, width}, stream.dtype(), stream.device());
        probe.requires_grad_(true);
        p.probes->push_back(probe);
        x = add(x, probe);
      }
      return x;
    };

    size_t g = 0;
    for (int64_t l = 0; l < L; ++l) {
      const LayerWeights& w = layers[static_cast<size_t>(l)];
      const auto block = model.block(l);
      if (w.H > 0) {
        if (l >= l0) {
          const int64_t H = w.H, D = w.D;
          const Tensor X = inputs_of(g, resid.reshape({K, P}), 3 * H, false);  // (K, 3H, P)
          Tensor xq, xk, xv;                                                   // (H or 1, K*B*T, C)
          if (X.defined()) {
            const Tensor n = block->norm1->forward(X.reshape({K, 3, H, B * T, C}));
            const auto take = [&](int64_t i) { return n.select(1, i).transpose(0, 1).reshape({H, K * B * T, C}); };
            xq = take(0), xk = take(1), xv = take(2);
          } else {
            xq = xk = xv = block->norm1->forward(resid.reshape({K * B * T, C})).unsqueeze(0);
          }
          // (H, KBT, C) @ (H, C, D) -> (H, KBT, D) -> (KB, H, T, D)
          const auto project = [&](const Tensor& x, const Tensor& W, const Tensor& b) {
            Tensor y = matmul(x, W);
            if (b.defined()) y = add(y, b);
            return y.reshape({H, K * B, T, D}).transpose(0, 1);
          };
          const Tensor ctx = scaled_dot_product_attention(project(xq, w.Wq, w.bq), project(xk, w.Wk, w.bk),
                                                          project(xv, w.Wv, w.bv), AttentionMask::causal());
          Tensor out = matmul(ctx.transpose(0, 1).reshape({H, K * B * T, D}), w.Wo);  // (H, KBT, C)
          const bool sets_a_head = std::any_of(p.replaced.begin(), p.replaced.end(), [&](const Replace& r) {
            return r.node >= next_node && r.node < next_node + H;
          });
          if (sets_a_head) {  // only then are the heads' outputs taken apart and stacked again
            std::vector<Tensor> heads;
            for (int64_t h = 0; h < H; ++h)
              heads.push_back(replace(out.select(0, h).reshape({K, P}), next_node + h).reshape({K * B * T, C}));
            out = stack(heads, 0);
          }
          for (int64_t h = 0; h < H; ++h) emit(out.select(0, h).reshape({K, B, T, C}));
          Tensor sum = out.sum({0}).reshape({K, B, T, C});
          if (w.bo.defined()) sum = add(sum, w.bo);
          resid = add(resid, sum);
        }
        ++g;
      }
      if (block->ff) {
        if (l >= l0) {
          const Tensor X = inputs_of(g, resid.reshape({K, P}), 1, false);  // (K, 1, P)
          const Tensor x = X.defined() ? X.reshape({K, B, T, C}) : resid;
          Tensor out = block->ff->forward(block->norm2->forward(x));  // (K, B, T, C)
          if (!p.replaced.empty()) out = replace(out.reshape({K, P}), next_node).reshape({K, B, T, C});
          emit(out);
          resid = add(resid, out);
        }
        ++g;
      }
      if (rec) rec->resid.push_back(resid.select(0, 0));  // the stream after layer l
    }
    // The logits: at the last position only, along each row's answer - wrong direction.
    const Tensor last = resid.select(2, T - 1).reshape({K, B * C});
    const Tensor X = inputs_of(g, last, 1, true);
    const Tensor x = (X.defined() ? X : last).reshape({K, B, C});
    const Tensor y = model.final_norm->forward(x);
    if (c.candidates.defined()) {  // sum_m weights[b, m] * p(candidates[m]): every logit, then the softmax
      const Tensor logits = linear(y, model.out_head->weight, model.out_head->bias);  // (K, B, V)
      return mul(index_select(softmax(logits, 2), 2, c.candidates), c.weights).sum({2});
    }
    return add(mul(y, c.direction).sum({2}), c.bias_diff);  // (K, B)
  }

  // Runs the clean and corrupted prompts of rows [first, first + B) and stores what patching reads.
  Chunk make_chunk(const PromptPairs& pairs, int64_t first, int64_t B) {
    const NoGradGuard no_grad;
    Chunk c;
    c.B = B, c.T = pairs.T, c.first_row = first;
    const Device dev = model.device();
    const auto rows_of = [&](const std::vector<int64_t>& v, int64_t width) {
      return tensor(std::vector<int64_t>(v.begin() + first * width, v.begin() + (first + B) * width), {B, width})
          .to(dev);
    };
    c.clean_tokens = rows_of(pairs.clean, pairs.T), c.corrupt_tokens = rows_of(pairs.corrupt, pairs.T);
    const Tensor answer = rows_of(pairs.answer, 1).reshape({B}), wrong = rows_of(pairs.wrong, 1).reshape({B});
    const Tensor& W_U = model.out_head->weight;  // (V, C)
    c.direction = sub(index_select(W_U, 0, answer), index_select(W_U, 0, wrong)).detach();
    const Tensor& b_U = model.out_head->bias;
    c.bias_diff = b_U.defined() ? sub(index_select(b_U, 0, answer), index_select(b_U, 0, wrong)).detach()
                                : zeros({B}, W_U.dtype(), dev);
    if (pairs.probability_metric()) {
      const auto M = static_cast<int64_t>(pairs.candidates.size());
      c.candidates = tensor(pairs.candidates, {M}).to(dev);
      c.weights =
          tensor(std::vector<double>(pairs.weights.begin() + first * M, pairs.weights.begin() + (first + B) * M),
                 {B, M})
              .to(W_U.dtype())
              .to(dev);
    }
    Recorded clean, corrupt;
    for (auto [tokens, rec, ld] :
         {std::tuple{&c.clean_tokens, &clean, &c.clean_ld}, std::tuple{&c.corrupt_tokens, &corrupt, &c.corrupt_ld}}) {
      Pass p;
      p.record = true;
      p.tokens = *tokens;
      rec->resid.clear();
      *ld = forward(c, p, rec).to_vector<double>();
    }
    // clean_resid[l]: the stream entering layer l; the recording holds the stream after each layer.
    c.clean_resid.push_back(clean.outputs.front().reshape({B, c.T, C}));
    for (const Tensor& r : clean.resid) c.clean_resid.push_back(r);
    c.corrupt_out = stack(corrupt.outputs, 0);
    c.delta = sub(stack(clean.outputs, 0), c.corrupt_out);
    const int64_t N = graph.node_count();
    c.delta_last = c.delta.reshape({N, B, c.T, C}).select(2, c.T - 1).reshape({N, B * C});
    return c;
  }

  // mean_out from every rank's chunks.
  void compute_means() {
    if (mean_out.defined()) return;
    const int64_t N = graph.node_count(), TC = positions * C;
    std::vector<double> sum(static_cast<size_t>(N * TC), 0.0);
    for (const Chunk& c : chunks) {
      const std::vector<double> s = add(c.corrupt_out, c.delta).reshape({N, c.B, TC}).sum({1}).to_vector<double>();
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += s[i];
    }
    comm->allreduce_sum(sum.data(), static_cast<int64_t>(sum.size()));
    for (double& v : sum) v /= static_cast<double>(rows);
    mean_out = tensor(sum, {N, TC}).to(detail::model_dtype(model)).to(model.device());
  }

  // Every node's direct share of the clean logit difference answer - wrong (DirectLogitAttribution).
  DirectLogitAttribution logit_attribution() const {
    const NoGradGuard no_grad;
    const int64_t N = graph.node_count();
    const nn::LayerNorm& ln = *model.final_norm;
    std::vector<double> sums(static_cast<size_t>(N + 2), 0.0);  // the nodes, the constant, the clean difference
    for (const Chunk& c : chunks) {
      const int64_t B = c.B, T = c.T;
      const Tensor x = c.clean_resid.back().select(1, T - 1);  // (B, C): what the final norm reads
      const Tensor xc = sub(x, x.mean({1}, true));
      const Tensor sigma = sqrt(add(mul(xc, xc).mean({1}, true), ln.eps)).reshape({1, B});  // frozen
      const Tensor dir = ln.weight.defined() ? mul(c.direction, ln.weight) : c.direction;   // (B, C)
      // Each node's output at the last position, centred as the norm centres, over sigma, along dir: (N, B).
      const Tensor out = add(c.corrupt_out, c.delta).reshape({N, B, T, C}).select(2, T - 1);
      const Tensor centred = sub(out, out.mean({2}, true));
      const Tensor per_node = div(mul(centred, dir.unsqueeze(0)).sum({2}), sigma);
      // The rest of the centred stream is the out_proj biases'; then the norm's shift and the unembedding's bias.
      Tensor constant = div(mul(sub(xc, centred.sum({0})), dir).sum({1}).reshape({1, B}), sigma).reshape({B});
      if (ln.bias.defined()) constant = add(constant, mul(c.direction, ln.bias).sum({1}));
      constant = add(constant, c.bias_diff);
      const Tensor clean = add(mul(model.final_norm->forward(x), c.direction).sum({1}), c.bias_diff);  // (B)
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

  // The most receivers one group has (a layer's 3H q/k/v inputs): the width of the widest patched input.
  int64_t widest_group() const {
    int64_t widest = 1;
    for (const CircuitGraph::Group& g : graph.groups()) widest = std::max(widest, g.count);
    return widest;
  }
  // Prompt rows per chunk: the stored runs and one forward's activations within the budget; with a
  // backward (edge attribution) every layer's per-receiver inputs and their norms stay alive until it
  // runs, and twice the budget buys speed (measured: GPT-2 small, 5 rows a chunk, ~1 GB at the peak).
  int64_t chunk_rows(int64_t T, bool backward) const {
    if (options.chunk_rows > 0) return options.chunk_rows;
    const int64_t widest = widest_group();
    const int64_t layers_alive = backward ? graph.n_layers() : 1;
    const int64_t per_row =
        (graph.node_count() * 3 + widest * 4 * layers_alive + 16) * T * C * dtype_size(detail::model_dtype(model));
    return std::max<int64_t>(1, (backward ? 2 : 1) * kBudgetBytes / std::max<int64_t>(per_row, 1));
  }
  // Rows per chunk for `rows` rows at most `most` a chunk: a divisor of rows in [most / 2, most] when
  // there is one, since chunks of one shape reuse the allocator's cached blocks (GPT-2 small's edge
  // attribution: 1.06 GB at the peak in chunks of 4 rows, 1.64 GB in chunks of 5 and a last one of 4).
  static int64_t even_chunks(int64_t rows, int64_t most) {
    most = std::min(most, rows);
    for (int64_t d = most; d * 2 >= most; --d)
      if (rows % d == 0) return d;
    return most;
  }
  int64_t copies_per_forward(const Chunk& c) const {
    if (options.max_copies > 0) return options.max_copies;
    const int64_t widest = widest_group();
    const int64_t logits = c.candidates.defined() ? 2 * c.B * model.config().vocab_size : 0;  // and softmax
    const int64_t per_copy =
        ((graph.node_count() + widest * 3 + 16) * c.B * c.T * C + logits) * dtype_size(detail::model_dtype(model));
    return std::max<int64_t>(1, kBudgetBytes / std::max<int64_t>(per_copy, 1));
  }
};

namespace {

void check_pairs(const nn::GPTModel& model, const PromptPairs& pairs, const char* who) {
  const nn::GPTConfig& cfg = model.config();
  HL_CHECK(pairs.rows() > 0 && pairs.T > 0, who, ": no prompt pairs");
  HL_CHECK(pairs.T <= cfg.context_length, who, ": prompts of ", pairs.T, " tokens do not fit the model's context of ",
           cfg.context_length);
  const auto check_ids = [&](const std::vector<int64_t>& ids, const char* what) {
    for (size_t i = 0; i < ids.size(); ++i)
      HL_CHECK(ids[i] >= 0 && ids[i] < cfg.vocab_size, who, ": ", what, " token ", ids[i], " (at ", i,
               ") is outside the vocabulary of ", cfg.vocab_size);
  };
  check_ids(pairs.clean, "clean"), check_ids(pairs.corrupt, "corrupt");
  check_ids(pairs.answer, "answer"), check_ids(pairs.wrong, "wrong"), check_ids(pairs.candidates, "candidate");
  HL_CHECK(pairs.weights.size() == pairs.candidates.size() * static_cast<size_t>(pairs.rows()), who,
           ": the probability metric's weights list ", pairs.weights.size(),
           " values, not rows x candidates = ", pairs.rows(), " x ", pairs.candidates.size());
}

// Every row's logit differences where only this rank's chunks wrote theirs (zeros elsewhere), summed
// over the ranks: each rank then holds every row's.
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

}  // namespace

CircuitPatcher::CircuitPatcher(nn::GPTModel& model, const PromptPairs& pairs, const CircuitOptions& options) {
  check_pairs(model, pairs, "circuit");
  impl_ = std::make_unique<Impl>(model, options);
  Impl& s = *impl_;
  s.rows = pairs.rows(), s.positions = pairs.T;
  const int64_t step = Impl::even_chunks(pairs.rows(), s.chunk_rows(pairs.T, false));
  s.baseline.clean.assign(static_cast<size_t>(s.rows), 0.0);
  s.baseline.corrupt.assign(static_cast<size_t>(s.rows), 0.0);
  for (int64_t first = 0, i = 0; first < pairs.rows(); first += step, ++i) {
    if (i % s.comm->size() != s.comm->rank()) continue;  // another rank's chunk
    Chunk& c = s.chunks.emplace_back(s.make_chunk(pairs, first, std::min(step, pairs.rows() - first)));
    std::copy(c.clean_ld.begin(), c.clean_ld.end(), s.baseline.clean.begin() + first);
    std::copy(c.corrupt_ld.begin(), c.corrupt_ld.end(), s.baseline.corrupt.begin() + first);
  }
  gather_rows(*s.comm, s.baseline);
  finish_baseline(s.baseline);
  s.baseline.normalized(0);  // throws when clean and corrupted score the same
}

CircuitPatcher::~CircuitPatcher() = default;
const CircuitGraph& CircuitPatcher::graph() const { return impl_->graph; }
const LogitDifference& CircuitPatcher::baseline() const { return impl_->baseline; }
int64_t CircuitPatcher::forwards() const { return impl_->forwards; }
int64_t CircuitPatcher::positions() const { return impl_->positions; }

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
  for (const Chunk& c : s.chunks) {
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

// ---- path patching ----
std::vector<double> path_patching(CircuitPatcher& patcher, const std::vector<int64_t>& senders,
                                  const std::vector<int64_t>& receivers) {
  const CircuitGraph& g = patcher.graph();
  HL_CHECK(!receivers.empty(), "path_patching: no receivers");
  std::vector<EdgePatch> patches;
  for (int64_t s : senders) {
    HL_CHECK(s >= 0 && s < g.node_count(), "path_patching: no node ", s);
    EdgePatch& p = patches.emplace_back(static_cast<size_t>(g.edge_count()), 0.0);
    for (int64_t r : receivers) {
      HL_CHECK(r >= 0 && r < static_cast<int64_t>(g.receivers().size()), "path_patching: no receiver ", r);
      const int64_t e = g.edge(s, r);
      if (e >= 0) p[static_cast<size_t>(e)] = 1.0;
    }
  }
  return patcher.metric(patches);
}

// ---- activation patching, both ways; ablation; direct logit attribution ----
ActivationPatching activation_patching(CircuitPatcher& patcher, const std::vector<int64_t>& nodes, bool by_position) {
  const CircuitGraph& g = patcher.graph();
  std::vector<int64_t> every_receiver(g.receivers().size());
  std::iota(every_receiver.begin(), every_receiver.end(), 0);
  ActivationPatching r;
  r.noising = path_patching(patcher, nodes, every_receiver);
  // Denoising n: every edge from a node before n carries its corrupted output, n gives its clean one, and
  // every node after n computes from what it then reads: the corrupted run with n restored. Noising n
  // at one position: the clean run with n's corrupted output there.
  const int64_t T = by_position ? patcher.positions() : 0;
  std::vector<EdgePatch> patches;
  std::vector<Replace> replaced;
  const EdgePatch none(static_cast<size_t>(g.edge_count()), 0.0);
  for (int64_t n : nodes) {
    EdgePatch p = none;
    for (int64_t e = 0; e < g.edge_count(); ++e)
      if (g.edge_sender(e) < n) p[static_cast<size_t>(e)] = 1.0;
    for (int64_t t = -1; t < T; ++t) {  // every position, then each alone
      patches.push_back(p);
      replaced.push_back({n, t, Replace::Value::clean});
    }
    for (int64_t t = 0; t < T; ++t) {
      patches.push_back(none);
      replaced.push_back({n, t, Replace::Value::corrupt});
    }
  }
  const std::vector<double> m = patcher.metric(patches, replaced);
  for (size_t i = 0; i < nodes.size(); ++i) {
    const auto first = m.begin() + static_cast<std::ptrdiff_t>(i * static_cast<size_t>(2 * T + 1));
    r.denoising.push_back(*first);
    if (!by_position) continue;
    r.denoising_by_position.emplace_back(first + 1, first + 1 + T);
    r.noising_by_position.emplace_back(first + 1 + T, first + 1 + 2 * T);
  }
  return r;
}

NodeAblation ablate_nodes(CircuitPatcher& patcher, const std::vector<int64_t>& nodes) {
  const EdgePatch none(static_cast<size_t>(patcher.graph().edge_count()), 0.0);
  std::vector<Replace> replaced;
  for (int64_t n : nodes)
    for (Replace::Value with : {Replace::Value::zero, Replace::Value::mean}) replaced.push_back({n, -1, with});
  const std::vector<double> m = patcher.metric(std::vector<EdgePatch>(replaced.size(), none), replaced);
  NodeAblation r;
  for (size_t i = 0; i < nodes.size(); ++i) r.zero.push_back(m[2 * i]), r.mean.push_back(m[2 * i + 1]);
  return r;
}

DirectLogitAttribution CircuitPatcher::direct_logit_attribution() const { return impl_->logit_attribution(); }

// ---- edge attribution patching ----
EdgeAttribution edge_attribution(nn::GPTModel& model, const PromptPairs& pairs, int64_t ig_steps,
                                 const CircuitOptions& options) {
  check_pairs(model, pairs, "edge_attribution");
  HL_CHECK(ig_steps >= 0 && ig_steps <= 1000, "edge_attribution: ig_steps must be in [0, 1000], got ", ig_steps);
  const auto t0 = Clock::now();
  CircuitPatcher::Impl s(model, options);
  const CircuitGraph& g = s.graph;
  EdgeAttribution r;
  std::vector<double> raw(static_cast<size_t>(g.edge_count()), 0.0);  // sum over rows of d(logit difference)
  const int64_t step = CircuitPatcher::Impl::even_chunks(pairs.rows(), s.chunk_rows(pairs.T, true)),
                steps = std::max<int64_t>(ig_steps, 1);
  r.baseline.clean.assign(static_cast<size_t>(pairs.rows()), 0.0);
  r.baseline.corrupt.assign(static_cast<size_t>(pairs.rows()), 0.0);
  for (int64_t first = 0, chunk = 0; first < pairs.rows(); first += step, ++chunk) {
    if (chunk % s.comm->size() != s.comm->rank()) continue;  // another rank's chunk
    const Chunk c = s.make_chunk(pairs, first, std::min(step, pairs.rows() - first));
    std::copy(c.clean_ld.begin(), c.clean_ld.end(), r.baseline.clean.begin() + first);
    std::copy(c.corrupt_ld.begin(), c.corrupt_ld.end(), r.baseline.corrupt.begin() + first);
    std::vector<Tensor> grads;  // [group] (R, width): d(sum of the rows' logit differences)/d(input), over the steps
    for (int64_t k = 1; k <= steps; ++k) {
      std::vector<Tensor> probes;
      CircuitPatcher::Impl::Pass p;
      p.probes = &probes;
      if (ig_steps > 0) {  // the stream entering layer 0 on the line from the corrupted embeddings to the clean
        const double alpha = static_cast<double>(k) / static_cast<double>(steps);
        p.start = sub(c.clean_resid[0], mul(c.delta.select(0, 0).reshape({c.B, c.T, s.C}), 1.0 - alpha));
      }
      const Tensor total = s.forward(c, p).sum();
      const std::vector<Tensor> gs = grad({total}, probes);
      for (size_t i = 0; i < gs.size(); ++i) {
        const Tensor gi = mul(gs[i].select(0, 0), 1.0 / static_cast<double>(steps));
        if (grads.size() <= i)
          grads.push_back(gi);
        else
          grads[i] = add(grads[i], gi);
      }
    }
    const NoGradGuard no_grad;
    for (size_t gi = 0; gi < g.groups().size(); ++gi) {
      const CircuitGraph::Group& grp = g.groups()[gi];
      const bool last = grp.input == Input::logits;
      const Tensor& stored = last ? c.delta_last : c.delta;
      // patching s -> r moves x_r by -delta_s: effect ~ -(dm/dx_r) . delta_s, (R, width) @ (width, S)
      const std::vector<double> e = matmul(grads[gi], stored.narrow(0, 0, grp.senders).mT()).to_vector<double>();
      const int64_t e0 = g.receivers()[static_cast<size_t>(grp.first)].first_edge;
      for (size_t i = 0; i < e.size(); ++i) raw[static_cast<size_t>(e0) + i] -= e[i];
    }
  }
  s.comm->allreduce_sum(raw.data(), static_cast<int64_t>(raw.size()));
  gather_rows(*s.comm, r.baseline);
  finish_baseline(r.baseline);
  const double gap = r.baseline.clean_mean - r.baseline.corrupt_mean;
  HL_CHECK(gap != 0, "edge_attribution: the clean and corrupted runs score the same; nothing to attribute");
  r.effect.resize(raw.size());
  for (size_t e = 0; e < raw.size(); ++e) r.effect[e] = raw[e] / static_cast<double>(pairs.rows()) / gap;
  r.seconds = seconds_since(t0);
  return r;
}

// ---- circuit discovery ----
int64_t Circuit::kept_count() const { return std::count(kept.begin(), kept.end(), uint8_t{1}); }

namespace {

// Patches the edges that cannot matter: into a node none of whose outputs is kept, and out of a node
// (other than the embeddings) none of whose inputs is kept (its output is then its corrupted one).
void remove_dangling(const CircuitGraph& g, EdgePatch& patched) {
  const int64_t N = g.node_count();
  for (bool changed = true; changed;) {
    changed = false;
    std::vector<uint8_t> has_in(static_cast<size_t>(N), 0), has_out(static_cast<size_t>(N), 0);
    for (int64_t e = 0; e < g.edge_count(); ++e) {
      if (patched[static_cast<size_t>(e)] != 0) continue;
      has_out[static_cast<size_t>(g.edge_sender(e))] = 1;
      const int64_t n = g.node_of_receiver(g.edge_receiver(e));
      if (n >= 0) has_in[static_cast<size_t>(n)] = 1;
    }
    for (int64_t e = 0; e < g.edge_count(); ++e) {
      if (patched[static_cast<size_t>(e)] != 0) continue;
      const int64_t s = g.edge_sender(e), n = g.node_of_receiver(g.edge_receiver(e));
      if ((s > 0 && !has_in[static_cast<size_t>(s)]) || (n >= 0 && !has_out[static_cast<size_t>(n)])) {
        patched[static_cast<size_t>(e)] = 1.0;
        changed = true;
      }
    }
  }
}

}  // namespace

Circuit discover_circuit(CircuitPatcher& patcher, const std::vector<double>& attribution,
                         const DiscoveryOptions& options) {
  const CircuitGraph& g = patcher.graph();
  const int64_t E = g.edge_count();
  HL_CHECK(static_cast<int64_t>(attribution.size()) == E, "discover_circuit: the attribution lists ",
           attribution.size(), " edges, the graph has ", E);
  HL_CHECK(std::isfinite(options.tau) && options.tau >= 0, "discover_circuit: tau must be a number >= 0, got ",
           options.tau);
  HL_CHECK(options.first_group >= 1, "discover_circuit: the first group must hold >= 1 edge");
  const auto t0 = Clock::now();
  const int64_t forwards0 = patcher.forwards();
  Circuit c;
  c.attribution = attribution;
  EdgePatch patched(static_cast<size_t>(E), 0.0);
  double current = patcher.metric(patched);
  ++c.tests;
  // Patches `edges` on top of what is patched, for good when the metric falls by less than tau (ACDC's
  // rule for one edge); a group must also not raise it by tau, since edges that matter can cancel out
  // when patched together (an induction head's query and key both corrupted still find the match).
  const auto try_patch = [&](const std::vector<int64_t>& edges) {
    EdgePatch candidate = patched;
    for (int64_t e : edges) candidate[static_cast<size_t>(e)] = 1.0;
    const double m = patcher.metric(candidate);
    ++c.tests;
    if (current - m >= options.tau || (edges.size() > 1 && m - current >= options.tau)) return false;
    patched = std::move(candidate);
    current = m;
    return true;
  };
  std::vector<int64_t> order(static_cast<size_t>(E));
  if (options.plain_acdc) {  // receivers from the logits back, each one's senders from the last
    size_t i = 0;
    for (auto r = static_cast<int64_t>(g.receivers().size()) - 1; r >= 0; --r) {
      const CircuitGraph::Receiver& rc = g.receivers()[static_cast<size_t>(r)];
      for (int64_t s = rc.senders - 1; s >= 0; --s) order[i++] = rc.first_edge + s;
    }
    for (int64_t e : order) try_patch({e});
  } else {
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return std::abs(attribution[static_cast<size_t>(a)]) < std::abs(attribution[static_cast<size_t>(b)]);
    });
    // A group that fails is split in halves until single edges fail: those are kept.
    const std::function<bool(size_t, size_t)> test = [&](size_t lo, size_t hi) {
      if (try_patch(std::vector<int64_t>(order.begin() + static_cast<std::ptrdiff_t>(lo),
                                         order.begin() + static_cast<std::ptrdiff_t>(hi))))
        return true;
      if (hi - lo > 1) {
        const size_t mid = lo + (hi - lo) / 2;
        test(lo, mid);
        test(mid, hi);
      }
      return false;
    };
    size_t group = static_cast<size_t>(options.first_group);
    for (size_t lo = 0; lo < order.size();) {
      const size_t hi = std::min(order.size(), lo + group);
      group = test(lo, hi) ? group * 2 : std::max<size_t>(1, group / 2);
      lo = hi;
    }
  }
  remove_dangling(g, patched);
  c.metric = patcher.metric(patched);
  ++c.tests;
  c.kept.resize(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) c.kept[static_cast<size_t>(e)] = patched[static_cast<size_t>(e)] == 0 ? 1 : 0;
  c.forwards = patcher.forwards() - forwards0;
  c.seconds = seconds_since(t0);
  return c;
}

// ---- output ----
namespace {

// The circuit's kept edges (sender node, receiving node or -1 for the logits, the input fed) and the nodes
// they touch: what both renderings draw.
struct KeptEdges {
  struct Edge {
    int64_t edge, sender, node;
    Input input;
  };
  std::vector<Edge> edges;
  std::vector<uint8_t> used;  // [node]
  bool logits = false;
};

KeptEdges kept_edges(const CircuitGraph& g, const Circuit& c) {
  KeptEdges k;
  k.used.assign(static_cast<size_t>(g.node_count()), 0);
  for (int64_t e = 0; e < g.edge_count(); ++e) {
    if (!c.kept[static_cast<size_t>(e)]) continue;
    const int64_t s = g.edge_sender(e), r = g.edge_receiver(e), n = g.node_of_receiver(r);
    k.edges.push_back({e, s, n, g.receivers()[static_cast<size_t>(r)].input});
    k.used[static_cast<size_t>(s)] = 1;
    if (n >= 0) k.used[static_cast<size_t>(n)] = 1;
    k.logits = k.logits || n < 0;
  }
  return k;
}

std::string receiving_name(const CircuitGraph& g, int64_t node) { return node >= 0 ? g.node_name(node) : "logits"; }

}  // namespace

std::string circuit_json(const CircuitGraph& g, const Circuit& c, const LogitDifference& baseline) {
  const KeptEdges k = kept_edges(g, c);
  nlohmann::json edges = nlohmann::json::array();
  for (const KeptEdges::Edge& e : k.edges)
    edges.push_back({{"sender", g.node_name(e.sender)},
                     {"receiver", receiving_name(g, e.node)},
                     {"input", input_name(e.input)},
                     {"attribution", c.attribution[static_cast<size_t>(e.edge)]}});
  nlohmann::json nodes = nlohmann::json::array();
  for (int64_t n = 0; n < g.node_count(); ++n)
    if (k.used[static_cast<size_t>(n)]) nodes.push_back(g.node_name(n));
  if (k.logits) nodes.push_back("logits");
  nlohmann::json j;
  j["nodes"] = nodes;
  j["edges"] = edges;
  j["metric"] = {{"circuit", c.metric},
                 {"full_model", 1.0},
                 {"clean_logit_difference", baseline.clean_mean},
                 {"corrupt_logit_difference", baseline.corrupt_mean}};
  j["graph_edges"] = g.edge_count();
  j["kept_edges"] = c.kept_count();
  j["search"] = {{"forwards", c.forwards}, {"tests", c.tests}, {"seconds", c.seconds}};
  return j.dump(2) + "\n";
}

std::string circuit_dot(const CircuitGraph& g, const Circuit& c) {
  static const char* colours[] = {"#1f77b4", "#2ca02c", "#d62728", "#7f7f7f", "#000000"};  // by Input
  const KeptEdges k = kept_edges(g, c);
  std::ostringstream o;
  o << "digraph circuit {\n  rankdir=BT;\n  node [shape=box, style=\"rounded,filled\", fillcolor=\"#f4f4f4\", "
       "fontname=\"Helvetica\"];\n  edge [fontname=\"Helvetica\", fontsize=10];\n";
  std::vector<std::vector<std::string>> by_layer(static_cast<size_t>(g.n_layers() + 2));
  for (int64_t n = 0; n < g.node_count(); ++n)
    if (k.used[static_cast<size_t>(n)])
      by_layer[static_cast<size_t>(g.nodes()[static_cast<size_t>(n)].layer + 1)].push_back(g.node_name(n));
  if (k.logits) by_layer.back().push_back("logits");
  for (const auto& names : by_layer) {
    if (names.empty()) continue;
    o << "  { rank=same;";
    for (const std::string& nm : names) o << " \"" << nm << "\";";
    o << " }\n";
  }
  for (const KeptEdges::Edge& e : k.edges) {
    o << "  \"" << g.node_name(e.sender) << "\" -> \"" << receiving_name(g, e.node) << "\" [color=\""
      << colours[static_cast<int>(e.input)] << "\"";
    if (e.input == Input::q || e.input == Input::k || e.input == Input::v)
      o << ", label=\"" << input_name(e.input) << "\"";
    o << "];\n";
  }
  o << "}\n";
  return o.str();
}

}  // namespace headlab::analysis
