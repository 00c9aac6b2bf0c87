// The backward engine, grad mode, anomaly mode and gradcheck.
#include "autograd/engine.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <sstream>

#include "backends/backend.h"

namespace headlab {

namespace {
thread_local bool g_grad_enabled = true;
bool g_anomaly = false;
// The last sequence number this thread gave a node. Per thread: data-parallel training's threads each
// build their own graphs, and one counter shared by them moved its cache line between cores at every op.
thread_local uint64_t t_last_seq = 0;

// "masked_fill" -> "MaskedFillBackward"
std::string backward_name(const char* op) {
  std::string out;
  bool upper = true;
  for (const char* c = op; *c; ++c) {
    if (*c == '_') {
      upper = true;
      continue;
    }
    out += upper ? static_cast<char>(std::toupper(static_cast<unsigned char>(*c))) : *c;
    upper = false;
  }
  return out + "Backward";
}

// A new node for `op`, its saved tensors and their versions in place. Saving the op's output itself
// would make a cycle (out -> node -> out), so the node keeps a history-free alias of it instead. Its
// sequence number is newer than this thread's last node's and than every input's node's (made on this
// thread or another), which is all backward's ordering needs.
std::shared_ptr<Node> new_node(const char* op, const Tensor& out, std::span<const Tensor> saved,
                               std::vector<Node::Input> inputs) {
  auto node = std::make_shared<Node>();
  node->name = backward_name(op);
  uint64_t newest = t_last_seq;
  for (const Node::Input& in : inputs)
    if (in.fn) newest = std::max(newest, in.fn->seq);
  node->seq = t_last_seq = newest + 1;
  node->inputs = std::move(inputs);
  node->saved.reserve(saved.size());
  for (const Tensor& t : saved) {
    if (!t.defined())
      node->saved.emplace_back();
    else
      node->saved.push_back({t.impl() == out.impl() ? t.detach() : t, t.version()});
  }
  return node;
}

}  // namespace

bool grad_enabled() { return g_grad_enabled; }
NoGradGuard::NoGradGuard() : prev_(g_grad_enabled) { g_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { g_grad_enabled = prev_; }
void set_anomaly_mode(bool on) { g_anomaly = on; }
bool anomaly_mode() { return g_anomaly; }

bool any_requires_grad(std::span<const Tensor> ts) {
  for (const Tensor& t : ts)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

void check_inplace(const char* op, const Tensor& self) {
  HL_CHECK(!(g_grad_enabled && self.is_leaf() && self.requires_grad()), op,
           ": a leaf tensor that requires grad cannot be modified in place; use the out-of-place form, "
           "or wrap the update in NoGradGuard");
}

namespace detail {

void throw_tensor_in_closure() {
  const char* op = t_closure_op;
  t_closure_op = nullptr;  // building the message must not trip the watch again
  HL_FAIL(op,
          ": its backward closure captures a Tensor. Pass the tensors backward reads to record() as saved "
          "(the closure gets them as saved[i], their in-place edits caught) and reach the inputs by position "
          "(g.needs(i), g.acc(i, ...), g.shape(i)); capture scalars only");
}

void saved_index_error(const Node& node, size_t i) {
  HL_FAIL(node.name, ": backward asked for saved tensor ", i, " but the op saved ", node.saved.size(),
          "; list it in record()'s saved");
}

bool should_record(const char* op, const Tensor& out, std::span<const Tensor> inputs) {
  if (g_anomaly && !out.all_finite())
    HL_FAIL("anomaly: ", op, " produced NaN or Inf in its output of shape ", shape_str(out.shape()));
  return g_grad_enabled && any_requires_grad(inputs);
}

void record_node(const char* op, Tensor& out, std::span<const Tensor> inputs, std::span<const Tensor> saved,
                 BackwardFn fn) {
  std::vector<Node::Input> edges;
  edges.reserve(inputs.size());
  for (const Tensor& t : inputs) {
    const bool rg = t.defined() && t.requires_grad();
    edges.push_back({t, rg ? t.grad_fn() : nullptr, rg});
  }
  std::shared_ptr<Node> node = new_node(op, out, saved, std::move(edges));
  node->fn = std::move(fn);
  out.impl()->grad_fn = std::move(node);
}

bool should_record_inplace(const char* op, const Tensor& self) {
  if (g_anomaly && !self.all_finite())
    HL_FAIL("anomaly: ", op, " produced NaN or Inf in its output of shape ", shape_str(self.shape()));
  return g_grad_enabled && self.requires_grad();
}

void record_inplace_node(const char* op, Tensor& self, std::span<const Tensor> saved, BackwardFn fn) {
  // The old history lives on in a fresh handle that keeps the old node; self gets the new node.
  auto old_impl = std::make_shared<TensorImpl>(*self.impl());
  old_impl->hooks.clear();
  Tensor old(std::move(old_impl));
  std::shared_ptr<Node> old_fn = old.grad_fn();
  std::vector<Node::Input> edges;
  edges.push_back({std::move(old), std::move(old_fn), true});
  std::shared_ptr<Node> node = new_node(op, self, saved, std::move(edges));
  node->fn = std::move(fn);
  self.impl()->grad_fn = std::move(node);
}

}  // namespace detail

// ---- Grads ----
const Node::Input& Grads::input(size_t i) const {
  HL_CHECK(running_ && i < running_->inputs.size(), running_ ? running_->name : std::string("backward"),
           ": backward asked for input ", i, " but the op has ", running_ ? running_->inputs.size() : 0);
  return running_->inputs[i];
}

size_t Grads::num_inputs() const { return running_ ? running_->inputs.size() : 0; }
const Shape& Grads::shape(size_t i) const { return input(i).tensor.shape(); }
DType Grads::dtype(size_t i) const { return input(i).tensor.dtype(); }
Device Grads::device(size_t i) const { return input(i).tensor.device(); }

bool Grads::needs_slot(const Node* fn, const Tensor& t) const {
  if (!functional_) return true;
  if (!fn) return target_leaves_.count(t.impl()) > 0;
  return needed_nodes_.count(fn) > 0;
}

bool Grads::needs(size_t i) const {
  const Node::Input& in = input(i);
  return in.requires_grad && needs_slot(in.fn.get(), in.tensor);
}

void Grads::acc(size_t i, const Tensor& g) {
  const Node::Input& in = input(i);
  if (in.requires_grad && needs_slot(in.fn.get(), in.tensor)) add(in.fn.get(), in.tensor, g);
}

namespace {
// Whether `t`, held by the caller alone, is also the only tensor over its storage, which it covers
// densely: nothing else can see it change in place, or be stolen (as PyTorch's AccumulateGrad steals).
bool sole_owner(const Tensor& t) {
  const TensorImpl& impl = *t.impl();
  return t.impl_ptr().use_count() == 1 && impl.storage.use_count() == 1 && !impl.storage->owner && t.offset() == 0 &&
         t.is_contiguous() && impl.storage->nbytes == static_cast<size_t>(t.numel()) * dtype_size(t.dtype());
}
}  // namespace

void Grads::add(const Node* fn, const Tensor& t, const Tensor& g_in) {
  HL_CHECK(g_in.defined(), "backward: a gradient for a tensor of shape ", shape_str(t.shape()), " is undefined");
  Tensor g = g_in.shape() == t.shape() ? g_in : g_in.sum_to(t.shape());
  if (g.dtype() != t.dtype()) g = g.to(t.dtype());
  Tensor& slot = fn ? node_grads_[fn] : leaf_grads_[t.impl()];
  if (!slot.defined())
    slot = g;
  else if (sole_owner(slot) && !slot.shares_storage(g))  // a second path's gradient: summed in place
    slot.add_(g);
  else
    slot = slot.add(g);
}

// ---- the backward pass ----
struct BackwardPass {
  Grads grads;
  // Reachable nodes, newest first. Held strongly: releasing a node's inputs during the pass
  // would otherwise free nodes that are still to be visited.
  std::vector<std::shared_ptr<Node>> order;

  void collect(const std::vector<Tensor>& roots) {
    std::vector<std::shared_ptr<Node>> stack;
    std::unordered_set<Node*> seen;
    for (const Tensor& r : roots)
      if (r.grad_fn() && seen.insert(r.grad_fn().get()).second) stack.push_back(r.grad_fn());
    while (!stack.empty()) {
      std::shared_ptr<Node> n = stack.back();
      stack.pop_back();
      order.push_back(n);
      for (const Node::Input& in : n->inputs)
        if (in.fn && seen.insert(in.fn.get()).second) stack.push_back(in.fn);
    }
    std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a->seq > b->seq; });
  }

  // Functional mode: a node is needed when some target can be reached from it.
  void mark_needed(const std::vector<Tensor>& targets) {
    grads.functional_ = true;
    std::unordered_set<const Node*> target_nodes;
    for (const Tensor& t : targets) {
      if (t.is_leaf())
        grads.target_leaves_.insert(t.impl());
      else
        target_nodes.insert(t.grad_fn().get());
    }
    // Oldest first, so a node's inputs are decided before the node.
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      Node* n = it->get();
      bool needed = false;
      for (const Node::Input& in : n->inputs) {
        if (!in.requires_grad) continue;
        if (!in.fn)
          needed |= grads.target_leaves_.count(in.tensor.impl()) > 0;
        else
          needed |= target_nodes.count(in.fn.get()) > 0 || grads.needed_nodes_.count(in.fn.get()) > 0;
      }
      // A node freed by an earlier backward has lost its edges: keep it so run() reports the reuse
      // instead of silently returning zero gradients.
      if (needed || n->released) grads.needed_nodes_.insert(n);
    }
    for (const Node* n : target_nodes) grads.needed_nodes_.insert(n);
  }

  void seed(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots) {
    for (size_t i = 0; i < roots.size(); ++i) {
      const Tensor& r = roots[i];
      HL_CHECK(r.defined() && r.requires_grad(), "backward: tensor ", i,
               " does not require grad and has no grad_fn (nothing to differentiate)");
      Tensor g = i < grad_roots.size() ? grad_roots[i] : Tensor();
      if (!g.defined()) {
        HL_CHECK(r.numel() == 1, "backward: grad can be implicitly created only for scalar outputs, got shape ",
                 shape_str(r.shape()), "; pass a gradient of that shape");
        g = Tensor::empty(r.shape(), r.dtype(), r.device()).fill_(1.0);
      }
      HL_CHECK(g.shape() == r.shape(), "backward: gradient has shape ", shape_str(g.shape()), ", expected ",
               shape_str(r.shape()));
      HL_CHECK(g.device() == r.device(), "backward: gradient is on ", g.device().str(), ", output on ",
               r.device().str());
      if (grads.needs_slot(r.grad_fn().get(), r)) grads.add(r.grad_fn().get(), r, g);
    }
  }

  void run(bool retain_graph) {
    NoGradGuard no_grad;  // gradients of gradients are not recorded
    for (const std::shared_ptr<Node>& node : order) {
      Node* n = node.get();
      auto it = grads.node_grads_.find(n);
      if (it == grads.node_grads_.end()) continue;  // nothing flowed here
      if (grads.functional_ && !grads.needed_nodes_.count(n)) continue;
      HL_CHECK(!n->released, "backward: trying to backward through ", n->name,
               " a second time; its saved tensors were freed. Pass retain_graph=true to the first backward.");
      // The one place saved tensors are checked: a closure reads tensor values only through them.
      for (size_t i = 0; i < n->saved.size(); ++i) {
        const Node::SavedTensor& s = n->saved[i];
        HL_CHECK(!s.tensor.defined() || s.tensor.version() == s.version, n->name,
                 ": one of the tensors saved for backward was modified by an in-place operation (its version is ",
                 s.tensor.version(), ", expected ", s.version, "); clone it before modifying it (saved tensor ", i,
                 " of shape ", shape_str(s.tensor.shape()), ")");
      }
      Tensor dout = it->second;
      for (const TensorHook& h : n->hooks) {
        Tensor r = h(dout);
        if (r.defined()) dout = r;
      }
      if (g_anomaly && !dout.all_finite()) HL_FAIL("anomaly: the gradient flowing into ", n->name, " holds NaN or Inf");
      grads.running_ = n;
      const OpScope scope(n->name.c_str());
      n->fn(dout, Saved(*n), grads);
      grads.running_ = nullptr;
      if (!retain_graph) {
        n->fn = nullptr;
        n->inputs.clear();
        n->saved.clear();
        n->released = true;
      }
      if (!grads.functional_) grads.node_grads_.erase(n);  // free intermediate gradients early
    }
  }

  void accumulate_leaves() {
    NoGradGuard no_grad;
    for (auto& [impl, g] : grads.leaf_grads_) {
      auto* leaf = const_cast<TensorImpl*>(impl);
      Tensor grad = std::move(g);
      for (const TensorHook& h : leaf->hooks) {
        Tensor r = h(grad);
        if (r.defined()) grad = r;
      }
      // A leaf's .grad always owns its storage: optimizers and clipping modify it in place. A gradient
      // no one else holds becomes .grad itself; otherwise a copy does.
      if (leaf->grad)
        leaf->grad = Tensor(leaf->grad).add(grad).impl_ptr();
      else
        leaf->grad = sole_owner(grad) ? std::move(grad).impl_ptr() : grad.clone().impl_ptr();
    }
  }

  // Functional grad(): the gradient reached for `in` (zeros when none flowed).
  Tensor gradient_of(const Tensor& in) {
    Tensor g;
    if (in.is_leaf()) {
      auto it = grads.leaf_grads_.find(in.impl());
      if (it != grads.leaf_grads_.end()) g = it->second;
    } else {
      auto it = grads.node_grads_.find(in.grad_fn().get());
      if (it != grads.node_grads_.end()) g = it->second;
    }
    if (g.defined()) return g;
    NoGradGuard no_grad;
    return Tensor::empty(in.shape(), in.dtype(), in.device()).zero_();
  }
};

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots, bool retain_graph) {
  BackwardPass pass;
  pass.collect(roots);
  pass.seed(roots, grad_roots);
  pass.run(retain_graph);
  pass.accumulate_leaves();
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, bool retain_graph) {
  for (size_t i = 0; i < inputs.size(); ++i)
    HL_CHECK(inputs[i].defined() && inputs[i].requires_grad(), "grad: input ", i,
             " does not require grad; call requires_grad_() on it before the forward pass");
  BackwardPass pass;
  pass.collect(outputs);
  pass.mark_needed(inputs);
  pass.seed(outputs, grad_outputs);
  pass.run(retain_graph);
  std::vector<Tensor> result;
  for (const Tensor& in : inputs) result.push_back(pass.gradient_of(in));
  return result;
}

// ---- gradcheck ----
namespace {

// Memory offset (in elements) of logical element `i` of t.
int64_t element_offset(const Tensor& t, int64_t i) {
  int64_t off = t.offset();
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    off += (i % t.size(d)) * t.stride(d);
    i /= t.size(d);
  }
  return off;
}

}  // namespace

GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                          const std::vector<Tensor>& inputs, double eps, double atol, double rtol) {
  GradcheckResult res;
  for (size_t k = 0; k < inputs.size(); ++k) {
    HL_CHECK(inputs[k].dtype() == DType::f64 && inputs[k].device() == kCPU, "gradcheck: input ", k,
             " must be a float64 CPU tensor, got ", dtype_name(inputs[k].dtype()), " on ", inputs[k].device().str());
    HL_CHECK(inputs[k].requires_grad(), "gradcheck: input ", k, " does not require grad");
  }
  const Tensor out0 = fn(inputs);
  const int64_t n_out = out0.numel();
  // Analytical Jacobian, one output element at a time: J[k][o][i] = d out[o] / d in_k[i].
  std::vector<std::vector<double>> analytic(inputs.size());
  for (size_t k = 0; k < inputs.size(); ++k) analytic[k].assign(static_cast<size_t>(n_out * inputs[k].numel()), 0.0);
  for (int64_t o = 0; o < n_out; ++o) {
    Tensor out = fn(inputs);
    if (!out.requires_grad()) break;  // constant output: the Jacobian is zero
    Tensor onehot = Tensor::empty(out.shape(), DType::f64).zero_();
    onehot.data<double>()[o] = 1.0;
    std::vector<Tensor> gs = grad({out}, inputs, {onehot});
    for (size_t k = 0; k < inputs.size(); ++k) {
      const std::vector<double> gv = gs[k].to_vector<double>();
      for (int64_t i = 0; i < inputs[k].numel(); ++i) analytic[k][o * inputs[k].numel() + i] = gv[i];
    }
  }
  // Numerical Jacobian by central differences, perturbing the leaves' memory directly.
  NoGradGuard no_grad;
  for (size_t k = 0; k < inputs.size(); ++k) {
    double* base = static_cast<double*>(inputs[k].impl()->storage->data);
    for (int64_t i = 0; i < inputs[k].numel(); ++i) {
      double& x = base[element_offset(inputs[k], i)];
      const double orig = x;
      x = orig + eps;
      const std::vector<double> plus = fn(inputs).to_vector<double>();
      x = orig - eps;
      const std::vector<double> minus = fn(inputs).to_vector<double>();
      x = orig;
      for (int64_t o = 0; o < n_out; ++o) {
        const double num = (plus[o] - minus[o]) / (2 * eps);
        const double ana = analytic[k][o * inputs[k].numel() + i];
        const double err = std::abs(num - ana);
        res.max_abs_error = std::max(res.max_abs_error, err);
        if (res.ok && err > atol + rtol * std::abs(num)) {
          res.ok = false;
          std::ostringstream m;
          m << "gradcheck: input " << k << " element " << i << ", output element " << o << ": analytical " << ana
            << " vs numerical " << num;
          res.message = m.str();
        }
      }
    }
  }
  return res;
}

}  // namespace headlab
