// The tape: every differentiable op records a Node (its backward closure, its inputs and the tensors
// the closure reads) on its output; backward() walks the nodes reachable from the root in reverse
// creation order, checking each node's saved tensors for in-place edits before running it.
// Gradients always accumulate, so repeated inputs and micro-batch accumulation need nothing special.
#pragma once
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "autograd/tensor.h"

namespace headlab {

class Grads;
class Saved;
// A backward maps the gradient of an op's output to its inputs' gradients. Every tensor it touches
// comes from its node: the values it reads as `saved` (version-checked before it runs), the inputs
// by position through `g` (needs / acc / metadata, never values). It captures scalars only.
using BackwardFn = std::function<void(const Tensor& dout, Saved saved, Grads& g)>;

struct Node {
  std::string name;  // "MatmulBackward"
  uint64_t seq = 0;  // creation order: a node is always newer than its inputs' nodes
  struct Input {
    Tensor tensor;  // undefined where the op was given none (linear without bias)
    // The input's grad_fn when this node was recorded. An in-place op later gives the input tensor
    // a new grad_fn; this node's gradient still belongs to the history it actually read.
    std::shared_ptr<Node> fn;
    bool requires_grad = false;  // as recorded: an input that needed no gradient then gets none later
  };
  std::vector<Input> inputs;  // every input, in record()'s order: closures address them by position
  struct SavedTensor {
    Tensor tensor;  // undefined where the op saved an undefined tensor (indices stay stable)
    uint64_t version = 0;
  };
  std::vector<SavedTensor> saved;  // the tensors backward reads, checked for in-place edits
  BackwardFn fn;                   // released after backward unless the graph is retained
  std::vector<TensorHook> hooks;   // hooks of the (non-leaf) tensor this node produced
  bool released = false;
};

// The tensors a backward reads, in the order record() was given them. The engine has checked,
// before the closure runs, that none of them was modified in place since the forward.
class Saved {
 public:
  const Tensor& operator[](size_t i) const;  // an index past the end throws, naming the op
  size_t size() const { return node_->saved.size(); }

 private:
  friend struct BackwardPass;
  explicit Saved(const Node& node) : node_(&node) {}
  const Node* node_;
};

// What a backward can do with its op's inputs, each addressed by its position in record()'s
// `inputs`: ask whether it needs a gradient, add to that gradient, read its metadata. Never its
// values: a value backward reads must be saved, so that an in-place edit of it is caught.
class Grads {
 public:
  bool needs(size_t i) const;
  // Adds g to input i's gradient; a g of broadcast shape is summed back down to its shape first.
  void acc(size_t i, const Tensor& g);
  size_t num_inputs() const;
  const Shape& shape(size_t i) const;
  DType dtype(size_t i) const;
  Device device(size_t i) const;

 private:
  friend struct BackwardPass;
  const Node::Input& input(size_t i) const;  // the running node's input i; out of range throws
  // A gradient slot is a history node `fn`, or the leaf `t` when fn is null. add() brings g to
  // t's shape and dtype first.
  bool needs_slot(const Node* fn, const Tensor& t) const;
  void add(const Node* fn, const Tensor& t, const Tensor& g);
  const Node* running_ = nullptr;
  std::unordered_map<const Node*, Tensor> node_grads_;
  std::unordered_map<const TensorImpl*, Tensor> leaf_grads_;
  std::unordered_set<const Node*> needed_nodes_;         // functional grad(): nodes on a path to a target
  std::unordered_set<const TensorImpl*> target_leaves_;  // functional grad(): leaves asked for
  bool functional_ = false;
};

// A borrowed list of tensors for record(): braces ({a, b}, {}) or a vector; alive for the call.
class TensorList : public std::span<const Tensor> {
 public:
  TensorList(std::initializer_list<Tensor> ts) : std::span<const Tensor>(ts.begin(), ts.size()) {}
  TensorList(const std::vector<Tensor>& ts) : std::span<const Tensor>(ts) {}
};

namespace detail {
// record()'s untyped halves (engine.cpp). should_record runs anomaly mode's output check and says
// whether a node is wanted (grad mode on and some input requires grad).
bool should_record(const char* op, const Tensor& out, std::span<const Tensor> inputs);
void record_node(const char* op, Tensor& out, std::span<const Tensor> inputs, std::span<const Tensor> saved,
                 BackwardFn fn);
bool should_record_inplace(const char* op, const Tensor& self);
void record_inplace_node(const char* op, Tensor& self, std::span<const Tensor> saved, BackwardFn fn);
[[noreturn]] void saved_index_error(const Node& node, size_t i);

// Sets the capture watch of autograd/tensor.h for one scope.
class ClosureWatch {
 public:
  explicit ClosureWatch(const char* op) : prev_(t_closure_op) { t_closure_op = op; }
  ~ClosureWatch() { t_closure_op = prev_; }
  ClosureWatch(const ClosureWatch&) = delete;
  ClosureWatch& operator=(const ClosureWatch&) = delete;

 private:
  const char* prev_;
};

// Moves a closure into a BackwardFn, making sure it holds no Tensor. A trivially copyable closure
// (scalars only: the common case) cannot, and is moved as is. Any other one (it holds a Shape, say)
// is copied under the capture watch: every member is copied, vector elements included, so a
// captured Tensor anywhere in it throws, naming the op.
template <typename F>
BackwardFn adopt_closure(const char* op, F&& fn) {
  using C = std::remove_cvref_t<F>;
  if constexpr (std::is_trivially_copyable_v<C>) {
    return BackwardFn(std::forward<F>(fn));
  } else {
    ClosureWatch watch(op);
    const C& copy_from = fn;
    return BackwardFn(copy_from);
  }
}
}  // namespace detail

// Records `fn` as the backward of `out` when grad mode is on and an input requires grad.
// `inputs` are the op's differentiable arguments (g.needs(i) / g.acc(i, ...) address them by
// position); `saved` lists every tensor whose values fn reads, handed back to fn as saved[i] after
// their versions were checked (saving `out` itself is fine: the node keeps a history-free alias).
// fn captures scalars only; one that captures a Tensor throws here.
//   record("mul", out, {a, b}, /*saved=*/{a, b}, [](const Tensor& dout, Saved s, Grads& g) {...});
template <typename F>
void record(const char* op, Tensor& out, TensorList inputs, TensorList saved, F&& fn) {
  static_assert(std::is_invocable_r_v<void, const std::remove_cvref_t<F>&, const Tensor&, Saved, Grads&>,
                "record: the backward must be callable as (const Tensor& dout, Saved saved, Grads& g)");
  if (!detail::should_record(op, out, inputs)) return;
  detail::record_node(op, out, inputs, saved, detail::adopt_closure(op, std::forward<F>(fn)));
}

// For in-place ops: `self` gets a new node whose single input is its previous history, and
// dself(dout, saved) maps the gradient of the new value to the gradient of the old one. Call it
// after the kernel ran and the version was bumped; modifying a leaf that requires grad is an error.
template <typename F>
void record_inplace(const char* op, Tensor& self, TensorList saved, F&& dself) {
  static_assert(std::is_invocable_r_v<Tensor, const std::remove_cvref_t<F>&, const Tensor&, Saved>,
                "record_inplace: the backward must be callable as (const Tensor& dout, Saved saved) -> Tensor");
  if (!detail::should_record_inplace(op, self)) return;
  auto fn = [dself = std::forward<F>(dself)](const Tensor& dout, Saved s, Grads& g) { g.acc(0, dself(dout, s)); };
  detail::record_inplace_node(op, self, saved, detail::adopt_closure(op, std::move(fn)));
}

bool any_requires_grad(std::span<const Tensor> ts);
// Throws before an in-place op touches a leaf that requires grad (its value is part of the graph).
void check_inplace(const char* op, const Tensor& self);

inline const Tensor& Saved::operator[](size_t i) const {
  if (i >= node_->saved.size()) [[unlikely]]
    detail::saved_index_error(*node_, i);
  return node_->saved[i].tensor;
}

// Runs backward from `roots` (each with its incoming gradient) and accumulates into leaves' .grad.
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots, bool retain_graph);
// Gradients of `outputs` with respect to `inputs`, without touching any .grad.
// An input that the outputs do not depend on gets a zero gradient.
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {}, bool retain_graph = false);

// ---- grad mode and anomaly mode ----
bool grad_enabled();
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};
void set_anomaly_mode(bool on);
bool anomaly_mode();

// ---- gradient checking (central differences in float64) ----
struct GradcheckResult {
  bool ok = true;
  double max_abs_error = 0;
  std::string message;  // the first mismatch: input, element, analytical vs numerical
};
// fn maps the inputs (float64 leaves with requires_grad) to one tensor of any shape.
GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                          const std::vector<Tensor>& inputs, double eps = 1e-6, double atol = 1e-5, double rtol = 1e-3);

}  // namespace headlab
