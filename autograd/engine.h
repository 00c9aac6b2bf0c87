// The tape: every differentiable op records a Node (its backward closure and its input edges) on
// its output; backward() walks the nodes reachable from the root in reverse creation order.
// Gradients always accumulate, so repeated inputs and micro-batch accumulation need nothing special.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "autograd/tensor.h"

namespace headlab {

class Grads;
using BackwardFn = std::function<void(const Tensor& dout, Grads& g)>;

struct Node {
  std::string name;            // "MatmulBackward"
  uint64_t seq = 0;            // creation order: a node is always newer than its inputs' nodes
  std::vector<Tensor> inputs;  // edges to the inputs that require grad
  // Each input's grad_fn when this node was recorded. An in-place op later gives the input tensor
  // a new grad_fn; this node's gradient still belongs to the history it actually read.
  std::vector<std::shared_ptr<Node>> input_fns;
  struct Saved {
    std::shared_ptr<Storage> storage;
    uint64_t version;
  };
  std::vector<Saved> saved;        // tensors whose values backward reads: checked for in-place edits
  BackwardFn fn;                   // released after backward unless the graph is retained
  std::vector<TensorHook> hooks;   // hooks of the (non-leaf) tensor this node produced
  bool released = false;
};

// What a backward closure sees: whether an input needs a gradient, and where to add it.
class Grads {
 public:
  bool needs(const Tensor& t) const;
  // Adds g to t's gradient; a g of broadcast shape is summed back down to t's shape first.
  void acc(const Tensor& t, const Tensor& g);

 private:
  friend struct BackwardPass;
  const Node* node_of(const Tensor& t) const;  // t's grad_fn as the running node recorded it
  const Node* running_ = nullptr;
  std::unordered_map<const Node*, Tensor> node_grads_;
  std::unordered_map<const TensorImpl*, Tensor> leaf_grads_;
  std::unordered_set<const Node*> needed_nodes_;         // functional grad(): nodes on a path to a target
  std::unordered_set<const TensorImpl*> target_leaves_;  // functional grad(): leaves asked for
  bool functional_ = false;
};

// Records `fn` as the backward of `out` when grad mode is on and an input requires grad.
// `saved` lists the tensors whose values fn reads, so in-place edits to them are caught.
void record(const char* op, Tensor& out, const std::vector<Tensor>& inputs, BackwardFn fn,
            const std::vector<Tensor>& saved = {});
// For in-place ops: `self` gets a new node whose single input is its previous history, and
// dself maps the gradient of the new value to the gradient of the old one. Call it after the
// kernel ran and the version was bumped; modifying a leaf that requires grad is an error.
void record_inplace(const char* op, Tensor& self, std::function<Tensor(const Tensor&)> dself,
                    const std::vector<Tensor>& saved = {});
bool any_requires_grad(const std::vector<Tensor>& ts);
// Throws before an in-place op touches a leaf that requires grad (its value is part of the graph).
void check_inplace(const char* op, const Tensor& self);

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
                          const std::vector<Tensor>& inputs, double eps = 1e-6, double atol = 1e-5,
                          double rtol = 1e-3);

}  // namespace headlab
