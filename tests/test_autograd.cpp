// The tape and its rules: .grad accumulation, explicit output gradients, retain_graph, grad mode,
// detach, functional grad(), hooks, in-place safety through version counters (and the rule that
// makes it hold: a backward closure reads tensors only through its node, never by capture), anomaly
// mode, memory that stays flat over many training steps, and a small regression that actually learns.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <thread>

#include "backends/backend.h"
#include "examples/mlp_regression.h"
#include "tests/core_test_util.h"

using namespace headlab;
using namespace headlab::testing;

namespace {

Tensor leaf64(const std::vector<double>& v, const Shape& shape = {}) {
  Tensor t = f64(v, shape);
  t.requires_grad_();
  return t;
}

// Turns anomaly mode on for one scope.
struct AnomalyScope {
  AnomalyScope() { set_anomaly_mode(true); }
  ~AnomalyScope() { set_anomaly_mode(false); }
};

}  // namespace

TEST(Autograd, LeafGradAccumulatesAcrossBackwardCalls) {
  Tensor x = leaf64({1, 2, 3});
  EXPECT_FALSE(x.grad().defined());
  sum(mul(x, x)).backward();
  EXPECT_TRUE(all_close(x.grad(), {2, 4, 6}));
  sum(mul(x, x)).backward();  // a new graph; the gradient adds to .grad
  EXPECT_TRUE(all_close(x.grad(), {4, 8, 12}));
  sum(mul(x, 10.0)).backward();
  EXPECT_TRUE(all_close(x.grad(), {14, 18, 22}));
  EXPECT_EQ(x.grad().dtype(), DType::f64);
  EXPECT_FALSE(x.grad().requires_grad());
  x.zero_grad();
  EXPECT_FALSE(x.grad().defined());
}

TEST(Autograd, SharedSubexpressionsAndUnusedInputs) {
  Tensor x = leaf64({1, -2}), w = leaf64({3, 4}), unused = leaf64({7});
  const Tensor h = mul(x, w);                         // used twice below
  const Tensor y = sum(add(mul(h, h), mul(h, 3.0)));  // d/dh = 2h + 3
  y.backward();
  // dy/dx = (2 h + 3) w, dy/dw = (2 h + 3) x with h = (3, -8)
  EXPECT_TRUE(all_close(x.grad(), {9 * 3, -13 * 4}));
  EXPECT_TRUE(all_close(w.grad(), {9 * 1, -13 * -2}));
  EXPECT_FALSE(unused.grad().defined());
  // An input that does not require grad gets nothing and costs nothing.
  const Tensor c = f64({5, 5});
  Tensor z = leaf64({1, 1});
  sum(mul(z, c)).backward();
  EXPECT_TRUE(all_close(z.grad(), {5, 5}));
  EXPECT_FALSE(c.grad().defined());
}

// Nodes are ordered per thread and after their inputs: a graph continued on a thread that has made
// few nodes (a fresh one) still runs its newest nodes first.
TEST(Autograd, AGraphContinuedOnAnotherThreadRunsInOrder) {
  Tensor x = leaf64({1, -2});
  Tensor h = x;
  for (int i = 0; i < 50; ++i) h = add(h, 1.0);  // this thread's nodes: numbered far past a new thread's
  Tensor y;
  std::thread([&] { y = sum(mul(mul(h, h), 0.5)); }).join();  // dy/dh = h
  add(y, sum(h)).backward();                                  // + 1
  EXPECT_TRUE(all_close(x.grad(), {51 + 1, 48 + 1}));
}

TEST(Autograd, BackwardWithExplicitGradient) {
  Tensor x = leaf64({1, 2, 3});
  const Tensor y = mul(x, 3.0);
  y.backward(f64({1, 0.5, 2}));
  EXPECT_TRUE(all_close(x.grad(), {3, 1.5, 6}));
  // A (2, 2) output with a (2, 2) gradient through a matmul.
  Tensor a = leaf64({1, 2, 3, 4}, {2, 2});
  const Tensor b = f64({1, 0, 0, 2}, {2, 2});
  matmul(a, b).backward(f64({1, 1, 0, 1}, {2, 2}));  // dA = G @ B^T
  EXPECT_TRUE(all_close(a.grad(), {1, 2, 0, 2}));
  // Through engine-level backward with several roots.
  Tensor p = leaf64({2});
  backward({mul(p, 3.0), mul(p, p)}, {Tensor(), Tensor()}, false);
  EXPECT_TRUE(all_close(p.grad(), {3 + 4}));
}

TEST(Autograd, NonScalarBackwardNeedsAGradient) {
  Tensor x = leaf64({1, 2, 3});
  const Tensor y = mul(x, 2.0);
  EXPECT_ERROR(y.backward(), "backward: grad can be implicitly created only for scalar outputs, got shape [3]");
  EXPECT_ERROR(y.backward(f64({1, 2})), "backward: gradient has shape [2], expected [3]");
  EXPECT_ERROR(f64({1.0}).backward(), "does not require grad");
  EXPECT_FALSE(x.grad().defined());  // nothing ran
}

TEST(Autograd, RetainGraph) {
  Tensor x = leaf64({1, 2});
  const Tensor y = sum(exp(x));
  y.backward();
  const std::vector<double> once = {std::exp(1.0), std::exp(2.0)};
  EXPECT_TRUE(all_close(x.grad(), once, 1e-12));
  EXPECT_ERROR(y.backward(),
               "backward: trying to backward through SumBackward a second time; its saved tensors "
               "were freed. Pass retain_graph=true to the first backward.");
  x.zero_grad();
  const Tensor z = sum(exp(x));
  z.backward(Tensor(), true);
  z.backward();  // the graph was kept
  EXPECT_TRUE(all_close(x.grad(), {2 * once[0], 2 * once[1]}, 1e-12));
  EXPECT_ERROR(z.backward(), "a second time");
  // functional grad() honours retain_graph too
  const Tensor w = sum(mul(x, x));
  const std::vector<Tensor> g1 = grad({w}, {x}, {}, true);
  const std::vector<Tensor> g2 = grad({w}, {x});
  EXPECT_TRUE(all_close(g1[0], g2[0]));
  EXPECT_ERROR(grad({w}, {x}), "a second time");
}

TEST(Autograd, NoGradGuard) {
  Tensor x = leaf64({1, 2});
  EXPECT_TRUE(grad_enabled());
  {
    NoGradGuard guard;
    EXPECT_FALSE(grad_enabled());
    const Tensor y = mul(x, x);
    EXPECT_FALSE(y.requires_grad());
    EXPECT_FALSE(y.grad_fn());
    EXPECT_TRUE(y.is_leaf());
    EXPECT_TRUE(all_close(y, {1, 4}));  // values are still computed
    {
      NoGradGuard nested;
      EXPECT_FALSE(grad_enabled());
    }
    EXPECT_FALSE(grad_enabled());  // the inner guard restores the outer state
  }
  EXPECT_TRUE(grad_enabled());
  const Tensor y = mul(x, x);
  EXPECT_TRUE(y.requires_grad());
  EXPECT_EQ(y.grad_fn_name(), "MulBackward");
}

TEST(Autograd, Detach) {
  Tensor x = leaf64({1, 2, 3});
  const Tensor y = mul(x, 2.0);
  Tensor d = y.detach();
  EXPECT_TRUE(d.shares_storage(y));
  EXPECT_FALSE(d.requires_grad());
  EXPECT_TRUE(d.is_leaf());
  EXPECT_FALSE(mul(d, d).requires_grad());
  // A detached branch contributes no gradient.
  sum(add(mul(y, y.detach()), y)).backward();  // d/dx of y*c + y with c = 2x held constant = 2c + 2
  EXPECT_TRUE(all_close(x.grad(), {6, 10, 14}));
  // Same memory: a write through the detached handle shows in the original.
  d.fill_(0);
  EXPECT_TRUE(all_close(y, {0, 0, 0}));
}

TEST(Autograd, RequiresGradRules) {
  Tensor x = leaf64({1});
  Tensor y = mul(x, 2.0);
  EXPECT_ERROR(y.requires_grad_(),
               "requires_grad_: can only change requires_grad of leaf tensors (this one comes "
               "from AffineBackward); use detach() first");
  EXPECT_ERROR(arange(3).requires_grad_(), "only floating-point tensors can require gradients, got int64");
  Tensor z = f64({1});
  z.requires_grad_(true);
  EXPECT_TRUE(z.requires_grad());
  z.requires_grad_(false);
  EXPECT_FALSE(z.requires_grad());
  EXPECT_FALSE(mul(z, z).grad_fn());
}

TEST(Autograd, FunctionalGradLeavesDotGradAlone) {
  Tensor x = leaf64({1, 2}), w = leaf64({3, -1}), unused = leaf64({9, 9});
  const Tensor y = sum(mul(mul(x, w), x));  // y = sum(w x^2): dy/dx = 2 w x, dy/dw = x^2
  const std::vector<Tensor> g = grad({y}, {x, w, unused});
  ASSERT_EQ(g.size(), 3u);
  EXPECT_TRUE(all_close(g[0], {6, -4}));
  EXPECT_TRUE(all_close(g[1], {1, 4}));
  EXPECT_TRUE(all_close(g[2], {0, 0}));  // not reached: zeros
  EXPECT_FALSE(x.grad().defined());
  EXPECT_FALSE(w.grad().defined());
  EXPECT_FALSE(unused.grad().defined());
  EXPECT_FALSE(g[0].requires_grad());
  // With an explicit output gradient on a non-scalar output.
  const std::vector<Tensor> gv = grad({mul(x, w)}, {w}, {f64({10, 100})});
  EXPECT_TRUE(all_close(gv[0], {10, 200}));
  EXPECT_ERROR(grad({mul(x, 2.0)}, {f64({1.0})}), "grad: input 0 does not require grad");
}

TEST(Autograd, FunctionalGradWithRespectToAnIntermediate) {
  Tensor x = leaf64({1, 2, 3});
  const Tensor h = mul(x, x);  // non-leaf
  const Tensor y = sum(mul(h, f64({1, 10, 100})));
  const std::vector<Tensor> g = grad({y}, {h, x});
  EXPECT_TRUE(all_close(g[0], {1, 10, 100}));
  EXPECT_TRUE(all_close(g[1], {2, 40, 600}));
  EXPECT_FALSE(x.grad().defined());
  // Only the intermediate: the part of the graph below it is not needed.
  const Tensor h2 = exp(x);
  const std::vector<Tensor> gh = grad({sum(mul(h2, 3.0))}, {h2});
  EXPECT_TRUE(all_close(gh[0], {3, 3, 3}));
  EXPECT_FALSE(x.grad().defined());
}

TEST(Autograd, Hooks) {
  // A leaf hook that scales the gradient before it lands in .grad.
  Tensor x = leaf64({1, 2});
  x.register_hook([](const Tensor& g) { return mul(g, 2.0); });
  sum(mul(x, 3.0)).backward();
  EXPECT_TRUE(all_close(x.grad(), {6, 6}));
  // A non-leaf hook changes what flows further down.
  Tensor a = leaf64({1, 2});
  const Tensor h = mul(a, a);
  h.register_hook([](const Tensor& g) { return mul(g, 10.0); });
  sum(h).backward();
  EXPECT_TRUE(all_close(a.grad(), {20, 40}));
  // An observing hook (returns undefined) sees the gradient and keeps it.
  Tensor b = leaf64({1, 2});
  const Tensor hb = mul(b, 4.0);
  std::vector<double> seen;
  hb.register_hook([&seen](const Tensor& g) {
    seen = g.to_vector<double>();
    return Tensor();
  });
  mul(hb, f64({0.5, 2})).sum().backward();
  EXPECT_EQ(seen, (std::vector<double>{0.5, 2}));
  EXPECT_TRUE(all_close(b.grad(), {2, 8}));
  // Leaf and non-leaf hooks compose.
  Tensor c = leaf64({3});
  c.register_hook([](const Tensor& g) { return mul(g, -1.0); });
  const Tensor hc = mul(c, c);
  hc.register_hook([](const Tensor& g) { return add(g, 1.0); });
  sum(hc).backward();  // (1 + 1) * 2c, negated at the leaf
  EXPECT_TRUE(all_close(c.grad(), {-12}));
  EXPECT_ERROR(f64({1.0}).register_hook([](const Tensor& g) { return g; }),
               "register_hook: cannot register a hook on a tensor that does not require grad");
}

TEST(Autograd, InPlaceOnASavedTensorIsCaught) {
  Tensor x = leaf64({1, 2, 3});
  Tensor y = x.exp();  // exp saves its output for backward
  y.masked_fill_(tensor_bool({false, true, false}), 0.0);
  EXPECT_ERROR(y.sum().backward(),
               "ExpBackward: one of the tensors saved for backward was modified by an in-place "
               "operation (its version is 1, expected 0)");
  // Through a view: the counter belongs to the storage.
  Tensor x2 = leaf64({1, 2, 3, 4}, {2, 2});
  Tensor s = sigmoid(x2);
  const Tensor loss = sum(mul(s, s));
  Tensor row = s.select(0, 1);
  row.masked_fill_(tensor_bool({true, true}), 1.0);
  EXPECT_ERROR(loss.backward(), "modified by an in-place operation");
  // Cloning first keeps the saved value intact.
  Tensor x3 = leaf64({1, 2, 3});
  const Tensor e = x3.exp();
  Tensor ec = e.clone();
  ec.masked_fill_(tensor_bool({false, true, false}), 0.0);
  sum(add(e, ec)).backward();
  EXPECT_TRUE(all_close(x3.grad(), {2 * std::exp(1.0), std::exp(2.0), 2 * std::exp(3.0)}, 1e-12));
}

// add_ and sub_: the values of the out-of-place forms (a broadcast operand too), the gradient through the
// tensor they change, the version bump a saved tensor's check reads, and the refusals.
TEST(Autograd, InPlaceAddAndSubtract) {
  Tensor x = leaf64({1, 2, 3, 4}, {2, 2});
  Tensor y = mul(x, 3.0);
  y.sub_(f64({10, 20})).add_(f64({1, 1, 1, 1}, {2, 2}));
  EXPECT_TRUE(all_close(y, {-6, -13, 0, -7}, 0));
  sum(mul(y, y)).backward();  // d/dx of sum((3x - b + 1)^2) = 6 (3x - b + 1)
  EXPECT_TRUE(all_close(x.grad(), {-36, -78, 0, -42}, 1e-12));
  Tensor same = f64({1, 2});
  same.sub_(same);  // the tensor itself as the operand is fine
  EXPECT_TRUE(all_close(same, {0, 0}, 0));
  const Tensor e = leaf64({1, 2}).exp();
  Tensor saved = e;  // exp saved its output; sub_ bumps its version
  saved.sub_(f64({1, 1}));
  EXPECT_ERROR(e.sum().backward(), "modified by an in-place operation");
  Tensor leaf = leaf64({1, 2});
  EXPECT_ERROR(leaf.add_(f64({1, 1})), "add_: a leaf tensor that requires grad cannot be modified in place");
  Tensor plain = f64({1, 2});
  EXPECT_ERROR(plain.sub_(leaf64({1, 1})), "sub_: the operand requires grad");
  EXPECT_ERROR(plain.sub_(f64({1, 2, 3})), "sub_: shapes [2] and [3] cannot be broadcast");
  EXPECT_ERROR(plain.sub_(f64({1, 2, 3, 4}, {2, 2})),
               "sub_: operand of shape [2, 2] does not broadcast to the tensor's shape [2]");
  Tensor wide = f64({1, 2, 3});
  Tensor head = wide.narrow(0, 0, 2);
  EXPECT_ERROR(head.add_(wide.narrow(0, 1, 2)), "add_: the operand shares memory with the tensor it changes");
  EXPECT_ERROR(plain.add_(Tensor()), "add_: operand is an undefined tensor");
}

// The engine reuses gradient buffers no one else can see, as PyTorch's AccumulateGrad does: a leaf's gradient
// becomes its .grad without a copy, and a second path's gradient is summed into the first in place. Where
// someone else holds the buffer (a hook that kept it, a slice of a buffer another leaf's gradient shares),
// .grad is its own copy.
TEST(Autograd, GradientBuffersAreReusedOnlyWhereNoOneElseHoldsThem) {
  Tensor x = leaf64({1, 2, 3});
  sum(add(mul(x, x), mul(x, 3.0))).backward();  // two paths into x: 2x + 3
  EXPECT_TRUE(all_close(x.grad(), {5, 7, 9}, 0));
  Tensor kept, w = leaf64({1, 2});
  w.register_hook([&kept](const Tensor& g) {
    kept = g;
    return Tensor();
  });
  sum(mul(w, f64({3, 4}))).backward();
  EXPECT_FALSE(w.grad().shares_storage(kept));
  w.grad().fill_(0);  // what an optimizer's zeroing does: the hook's tensor is untouched
  EXPECT_TRUE(all_close(kept, {3, 4}, 0));
  Tensor a = leaf64({1, 2}), b = leaf64({3, 4, 5});
  sum(mul(cat({a, b}, 0), f64({1, 2, 3, 4, 5}))).backward();  // each gradient a slice of cat's
  EXPECT_TRUE(all_close(a.grad(), {1, 2}, 0));
  EXPECT_TRUE(all_close(b.grad(), {3, 4, 5}, 0));
  EXPECT_FALSE(a.grad().shares_storage(b.grad()));
  // A second backward adds to .grad; a non-leaf reached twice sums in place without touching its parts.
  Tensor h = mul(x, 2.0);
  const Tensor part = mul(h, 1.0);
  Tensor seen_part;
  part.register_hook([&seen_part](const Tensor& g) {
    seen_part = g;
    return Tensor();
  });
  sum(add(mul(part, 5.0), mul(h, 7.0))).backward();  // x's gradient: 2x + 3 + 2 * (5 + 7)
  EXPECT_TRUE(all_close(x.grad(), {29, 31, 33}, 0));
  EXPECT_TRUE(all_close(seen_part, {5, 5, 5}, 0));
}

// Every op whose backward reads a tensor's values saves it, so an in-place edit of that tensor between
// forward and backward is caught, naming the op. Each case edits one saved tensor: an input that
// needs no gradient, a parameter updated under NoGradGuard (an optimizer step between forward and
// backward), an intermediate, the op's own output, or an index / mask / target tensor.
TEST(Autograd, InPlaceEditOfASavedTensorIsCaughtForEveryOpThatReadsIt) {
  const Tensor m = tensor_bool({true, false, false, true, false, true}, {2, 3});
  struct Case {
    const char* name;           // the node expected in the message
    std::function<void()> run;  // forward, in-place edit, backward
  };
  const std::vector<Case> cases = {
      {"MulBackward",
       [] {  // a constant operand
         Tensor x = leaf64({1, 2, 3}), c = f64({4, 5, 6});
         const Tensor y = mul(x, c);
         c.fill_(0);
         sum(y).backward();
       }},
      {"MulBackward",
       [] {  // a parameter stepped by an optimizer before backward
         Tensor w = leaf64({1, 2, 3});
         const Tensor y = mul(w, f64({4, 5, 6}));
         {
           NoGradGuard no_grad;
           w.copy_(f64({0, 0, 0}));
         }
         sum(y).backward();
       }},
      {"DivBackward",
       [] {
         Tensor x = leaf64({1, 2}), d = f64({4, 5});
         const Tensor y = div(x, d);
         d.fill_(1);
         sum(y).backward();
       }},
      {"MaximumBackward",
       [] {
         Tensor x = leaf64({1, 7}), c = f64({4, 5});
         const Tensor y = maximum(x, c);
         c.fill_(9);
         sum(y).backward();
       }},
      {"MatmulBackward",
       [] {
         Tensor a = leaf64({1, 2, 3, 4}, {2, 2}), b = f64({1, 0, 0, 2}, {2, 2});
         const Tensor y = matmul(a, b);
         b.fill_(3);
         sum(y).backward();
       }},
      {"MatmulBackward",
       [] {  // a non-leaf input edited through a transposed view
         Tensor a = leaf64({1, 2, 3, 4}, {2, 2});
         Tensor h = mul(a, 1.0);
         const Tensor y = matmul(f64({1, 2, 3, 4}, {2, 2}), h.mT());
         h.mT().masked_fill_(tensor_bool({true, false, false, false}, {2, 2}), 0.0);
         sum(y).backward();
       }},
      {"LinearBackward",
       [] {
         Tensor x = leaf64({1, 2, 3, 4}, {2, 2}), w = leaf64({1, 0, 0, 1}, {2, 2});
         const Tensor y = linear(x, w, Tensor());
         {
           NoGradGuard no_grad;
           w.fill_(2);
         }
         sum(y).backward();
       }},
      {"SoftmaxBackward",
       [m] {  // the output it saves
         Tensor x = leaf64({1, 2, 3, 4, 5, 6}, {2, 3});
         Tensor y = softmax(x, -1);
         y.masked_fill_(m, 0.0);
         sum(mul(y, y)).backward();
       }},
      {"LogSoftmaxBackward",
       [m] {
         Tensor x = leaf64({1, 2, 3, 4, 5, 6}, {2, 3});
         Tensor y = log_softmax(x, 1);
         y.masked_fill_(m, 0.0);
         sum(y).backward();
       }},
      {"CausalSoftmaxBackward",
       [] {
         Tensor x = leaf64({1, 2, 3, 4}, {2, 2});
         Tensor y = causal_softmax(x, 0.5);
         y.select(0, 1).masked_fill_(tensor_bool({true, false}), 0.0);  // through a view
         sum(mul(y, y)).backward();
       }},
      {"LayerNormBackward",
       [m] {  // its input
         Tensor x = leaf64({1, 2, 3, 4, 5, 7}, {2, 3});
         Tensor h = mul(x, 1.0);
         const Tensor y = layer_norm(h, Tensor(), Tensor());
         h.masked_fill_(m, 0.0);
         sum(mul(y, y)).backward();
       }},
      {"LayerNormBackward",
       [] {  // its weight, stepped before backward
         Tensor x = leaf64({1, 2, 3, 4, 5, 7}, {2, 3}), w = leaf64({1, 2, 3}), b = leaf64({0, 0, 0});
         const Tensor y = layer_norm(x, w, b);
         {
           NoGradGuard no_grad;
           w.fill_(1);
         }
         sum(mul(y, y)).backward();
       }},
      {"CrossEntropyBackward",
       [] {  // its targets
         Tensor x = leaf64({1, 2, 3, 4, 5, 7}, {2, 3});
         Tensor t = i64({2, 0});
         const Tensor loss = cross_entropy(x, t);
         t.fill_(1);
         loss.backward();
       }},
      {"CrossEntropyBackward",
       [m] {  // its logits
         Tensor x = leaf64({1, 2, 3, 4, 5, 7}, {2, 3});
         Tensor h = mul(x, 1.0);
         const Tensor loss = cross_entropy(h, i64({2, 0}));
         h.masked_fill_(m, 0.0);
         loss.backward();
       }},
      {"IndexSelectBackward",
       [] {  // the indices it scatters by
         Tensor x = leaf64({1, 2, 3, 4, 5, 6}, {2, 3});
         Tensor idx = i64({2, 0, 2}, {3});
         const Tensor y = index_select(x, 1, idx);
         idx.fill_(1);
         sum(y).backward();
       }},
      {"IndexSelectBackward",
       [] {  // embedding is index_select underneath
         Tensor w = leaf64({1, 2, 3, 4, 5, 6}, {3, 2});
         Tensor ids = i64({2, 0, 2, 1}, {2, 2});
         const Tensor y = embedding(w, ids);
         ids.fill_(0);
         sum(y).backward();
       }},
      {"WhereBackward",
       [] {  // its condition
         Tensor x = leaf64({1, 2, 3});
         Tensor cond = tensor_bool({true, false, true});
         const Tensor y = where(cond, x, f64({0, 0, 0}));
         cond.fill_(1);
         sum(y).backward();
       }},
      {"MaskedFillBackward",
       [] {  // its mask
         Tensor x = leaf64({1, 2, 3});
         Tensor mask = tensor_bool({true, false, true});
         const Tensor y = masked_fill(x, mask, 0.0);
         mask.fill_(0);
         sum(y).backward();
       }},
      {"MaskedFillBackward",
       [] {  // the mask of the in-place form
         Tensor x = leaf64({1, 2, 3});
         Tensor mask = tensor_bool({true, false, true});
         Tensor y = mul(x, 1.0);
         y.masked_fill_(mask, 0.0);
         mask.fill_(0);
         sum(y).backward();
       }},
      {"LogBackward",
       [] {  // a unary op that reads its input
         Tensor x = leaf64({1, 2, 3});
         Tensor h = mul(x, 1.0);
         const Tensor y = log(h);
         h.fill_(1);
         sum(y).backward();
       }},
      {"TanhBackward",
       [] {  // one that reads its output
         Tensor x = leaf64({1, 2, 3});
         Tensor y = tanh(x);
         y.fill_(0);
         sum(y).backward();
       }},
      {"AmaxBackward",
       [] {
         Tensor x = leaf64({1, 5, 3, 4}, {2, 2});
         Tensor h = mul(x, 1.0);
         const Tensor y = amax(h, {1});
         h.fill_(0);
         sum(y).backward();
       }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string msg = error_of(c.run);
    EXPECT_EQ(msg.rfind(std::string(c.name) + ": one of the tensors saved for backward was modified by an in-place "
                                              "operation",
                        0),
              0u)
        << "message: " << msg;
  }
}

// As in PyTorch (`y = a + b; a.add_(1); y.backward()` is fine), an op whose backward does not read a
// tensor's values does not save it, and editing that tensor after the forward is allowed; the
// gradients are those of the values the forward saw.
TEST(Autograd, InPlaceEditOfATensorBackwardDoesNotReadIsAllowed) {
  const Tensor mask = tensor_bool({false, true, true});
  {  // add and sub of an input
    Tensor x = leaf64({1, 2, 3});
    Tensor a = mul(x, 1.0), b = f64({4, 5, 6});
    const Tensor y = add(a, b), z = sub(b, a);
    a.masked_fill_(mask, 9.0);
    b.fill_(0);
    sum(add(mul(y, 2.0), z)).backward();  // d/dx = 2 - 1
    EXPECT_TRUE(all_close(x.grad(), {1, 1, 1}));
  }
  {  // a parameter stepped under NoGradGuard between an add's forward and its backward
    Tensor w = leaf64({1, 2});
    const Tensor y = add(w, f64({3, 4}));
    {
      NoGradGuard no_grad;
      w.copy_(f64({0, 0}));
    }
    sum(y).backward();
    EXPECT_TRUE(all_close(w.grad(), {1, 1}));
  }
  {  // shape ops, copies and reductions read no values
    Tensor x = leaf64({1, 2, 3, 4, 5, 6}, {2, 3});
    Tensor h = mul(x, 1.0);
    const Tensor y = add(add(sum(h.permute({1, 0}).clone(), {0}).sum(), cat({h, h}, 0).slice(1, 0, 2).sum()),
                         mul(h.to(DType::f32).sum().to(DType::f64), 3.0));
    h.fill_(0);
    y.backward();
    EXPECT_TRUE(all_close(x.grad(), {6, 6, 4, 6, 6, 4}));
  }
  {  // index_select, where and masked_fill read their index / condition / mask, not their inputs
    Tensor x = leaf64({1, 2, 3});
    Tensor a = mul(x, 1.0), b = mul(x, 2.0), c = mul(x, 3.0);
    const Tensor y = add(add(index_select(a, 0, i64({2, 2, 0}, {3})).sum(), where(mask, b, f64({0, 0, 0})).sum()),
                         masked_fill(c, mask, 0.0).sum());
    a.fill_(0);
    b.fill_(0);
    c.fill_(0);
    y.backward();
    EXPECT_TRUE(all_close(x.grad(), {1 + 0 + 3, 0 + 2 + 0, 2 + 2 + 0}));
  }
  {  // dropout replays its mask from (seed, offset): editing its input or output is harmless
    Tensor x = leaf64({1, 2, 3, 4, 5, 6, 7, 8});
    Tensor h = mul(x, 1.0);
    Generator gen(7);
    Tensor y = dropout(h, 0.5, true, gen);
    std::vector<double> expected;  // 1 / (1 - p) where the element was kept
    for (double v : y.to_vector<double>()) expected.push_back(v != 0 ? 2.0 : 0.0);
    ASSERT_NE(std::count(expected.begin(), expected.end(), 0.0), 0);
    ASSERT_NE(std::count(expected.begin(), expected.end(), 2.0), 0);
    h.fill_(0);
    y.fill_(5);
    sum(y).backward();
    EXPECT_TRUE(all_close(x.grad(), expected));
  }
}

// Every tensor a backward touches comes from its node, so the in-place check cannot be forgotten:
// record() rejects a closure that captures a Tensor (directly, or inside a container), and a
// closure that asks for a saved tensor or an input it was not given fails with the op's name.
TEST(Autograd, ABackwardClosureThatCapturesATensorIsRejected) {
  Tensor x = leaf64({1, 2, 3});
  Tensor out = mul(x.detach(), 2.0);
  EXPECT_ERROR(record("leaky", out, {x}, {}, [x](const Tensor& dout, Saved, Grads& g) { g.acc(0, mul(dout, x)); }),
               "leaky: its backward closure captures a Tensor. Pass the tensors backward reads to record() as saved");
  EXPECT_FALSE(out.grad_fn());  // nothing was recorded
  const std::vector<Tensor> held = {x};
  EXPECT_ERROR(record("leaky_list", out, {x}, {},
                      [held, k = 2.0](const Tensor& dout, Saved, Grads& g) { g.acc(0, mul(dout, held[0] * k)); }),
               "leaky_list: its backward closure captures a Tensor");
  Tensor h = mul(x, 1.0);
  EXPECT_ERROR(record_inplace("leaky_", h, {}, [x](const Tensor& dout, Saved) { return mul(dout, x); }),
               "leaky_: its backward closure captures a Tensor");
  EXPECT_EQ(h.grad_fn_name(), "AffineBackward");  // its history is untouched
  const Tensor copy = x;                          // the watch is off again after a rejection
  EXPECT_TRUE(copy.shares_storage(x));

  // Scalars and shapes may be captured; saved tensors come back as saved[i].
  Tensor y = mul(x.detach(), x.detach());
  record("scaled_square", y, {x}, {x}, [k = 2.0, shape = x.shape()](const Tensor& dout, Saved s, Grads& g) {
    ASSERT_EQ(s.size(), 1u);
    g.acc(0, reshape(mul(mul(dout, s[0]), k), shape));
  });
  EXPECT_EQ(y.grad_fn_name(), "ScaledSquareBackward");
  sum(y).backward();
  EXPECT_TRUE(all_close(x.grad(), {2, 4, 6}));

  // Out-of-range positions name the op.
  Tensor z = mul(x.detach(), 2.0);
  record("short", z, {x}, {x}, [](const Tensor& dout, Saved s, Grads& g) { g.acc(0, mul(dout, s[1])); });
  EXPECT_ERROR(sum(z).backward(), "ShortBackward: backward asked for saved tensor 1 but the op saved 1");
  Tensor z2 = mul(x.detach(), 2.0);
  record("stray", z2, {x}, {}, [](const Tensor& dout, Saved, Grads& g) { g.acc(1, dout); });
  EXPECT_ERROR(sum(z2).backward(), "StrayBackward: backward asked for input 1 but the op has 1");
}

TEST(Autograd, InPlaceOnANonLeafGivesTheRightGradient) {
  Tensor x = leaf64({1, 2, 3, 4});
  Tensor y = mul(x, 2.0);  // an affine op saves nothing, so editing y is safe
  const uint64_t v0 = y.version();
  y.masked_fill_(tensor_bool({false, true, false, true}), 5.0);
  EXPECT_EQ(y.version(), v0 + 1);
  EXPECT_EQ(y.grad_fn_name(), "MaskedFillBackward");
  EXPECT_TRUE(all_close(y, {2, 5, 6, 5}));
  sum(mul(y, y)).backward();  // d/dx = 2 y * 2 where kept, 0 where filled
  EXPECT_TRUE(all_close(x.grad(), {8, 0, 24, 0}));
  // Twice in a row, and with a broadcast mask.
  Tensor a = leaf64({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = mul(a, a);
  b.masked_fill_(tensor_bool({true, false, false}), 0.0);
  b.masked_fill_(tensor_bool({false, true}, {2, 1}), -1.0);
  sum(b).backward();
  EXPECT_TRUE(all_close(a.grad(), {0, 4, 6, 0, 0, 0}));
}

TEST(Autograd, InPlaceAfterAUseKeepsTheHistoryThatUseRead) {
  // y reads h before h is edited in place: y's gradient belongs to the old h, whose history is
  // x * 2, and a later use of h sees the edit.
  Tensor x = leaf64({1, 2, 3});
  Tensor h = mul(x, 2.0);
  const Tensor y = add(h, f64({1, 1, 1}));  // add saves nothing, so the edit below is legal
  h.masked_fill_(tensor_bool({false, true, false}), 0.0);
  sum(y).backward(Tensor(), true);  // kept: h's history is used again below
  EXPECT_TRUE(all_close(x.grad(), {2, 2, 2}));
  x.zero_grad();
  const Tensor y2 = add(h, f64({1, 1, 1}));
  Tensor h2 = h;                          // another handle to the edited tensor
  sum(add(y2, mul(h2, 3.0))).backward();  // both uses see the fill: 4 * 2 where kept, 0 where filled
  EXPECT_TRUE(all_close(x.grad(), {8, 0, 8}));
  // The functional form routes the same way.
  Tensor a = leaf64({1, 2});
  Tensor b = exp(a);
  const Tensor c = sub(b, f64({1, 1}));
  Tensor b2 = mul(b, 1.0);
  const Tensor d = add(b2, f64({0, 0}));
  b2.masked_fill_(tensor_bool({true, false}), 0.0);
  const std::vector<Tensor> g = grad({add(sum(c), sum(d))}, {a});
  EXPECT_TRUE(all_close(g[0], {2 * std::exp(1.0), 2 * std::exp(2.0)}, 1e-12));
}

TEST(Autograd, InPlaceOnALeafThatRequiresGrad) {
  Tensor w = leaf64({1, 2});
  EXPECT_ERROR(w.masked_fill_(tensor_bool({true, false}), 0.0),
               "masked_fill_: a leaf tensor that requires grad cannot be modified in place");
  EXPECT_ERROR(w.fill_(1.0), "fill_: a leaf tensor that requires grad cannot be modified in place");
  EXPECT_ERROR(w.copy_(f64({3, 4})), "copy_: a leaf tensor that requires grad cannot be modified in place");
  EXPECT_TRUE(all_close(w, {1, 2}));  // untouched
  {
    NoGradGuard guard;  // the optimizer's way
    w.copy_(f64({3, 4}));
    w.masked_fill_(tensor_bool({true, false}), 0.0);
  }
  EXPECT_TRUE(all_close(w, {0, 4}));
  EXPECT_TRUE(w.is_leaf());
  EXPECT_TRUE(w.requires_grad());
}

TEST(Autograd, AnomalyModeNamesTheOp) {
  {
    const Tensor quiet = log(f64({-1.0}));  // off: NaN passes silently
    EXPECT_TRUE(std::isnan(quiet.item<double>()));
  }
  AnomalyScope anomaly;
  EXPECT_TRUE(anomaly_mode());
  EXPECT_ERROR(log(leaf64({1, -1})), "anomaly: log produced NaN or Inf in its output of shape [2]");
  EXPECT_ERROR(div(f64({1.0}), f64({0.0})), "anomaly: div produced NaN or Inf");
  // A finite forward whose backward blows up: sqrt'(0) = inf flows into the op below it.
  Tensor x = leaf64({0, 1});
  const Tensor y = sum(sqrt(mul(x, 1.0)));
  EXPECT_ERROR(y.backward(), "anomaly: the gradient flowing into AffineBackward holds NaN or Inf");
}

TEST(Autograd, VersionCounters) {
  Tensor t = zeros({4});
  const uint64_t v0 = t.version();
  t.fill_(1);
  EXPECT_EQ(t.version(), v0 + 1);
  t.zero_();
  EXPECT_EQ(t.version(), v0 + 2);
  t.copy_(ones({4}));
  EXPECT_EQ(t.version(), v0 + 3);
  t.masked_fill_(tensor_bool({true, false, false, false}), 2);
  EXPECT_EQ(t.version(), v0 + 4);
  Tensor v = t.narrow(0, 1, 2);  // views share the counter both ways
  v.fill_(3);
  EXPECT_EQ(t.version(), v0 + 5);
  EXPECT_EQ(v.version(), t.version());
  (void)add(t, t);  // out-of-place ops leave it alone
  (void)t.view({2, 2});
  EXPECT_EQ(t.version(), v0 + 5);
  EXPECT_TRUE(all_close(t, {2, 3, 3, 1}));
  EXPECT_EQ(t.clone().version(), 0u);  // a fresh storage starts at 0
}

// Every op's graph is freed with its output even when no backward ever runs (no reference
// cycle between a tensor and the node that made it), and the backend gets all its bytes back.
TEST(Autograd, GraphsAreFreedWithoutBackward) {
  using Op = std::function<Tensor(const Tensor&)>;
  const Tensor m = tensor_bool({true, false, false, true, false, true}, {2, 3});
  const std::vector<std::pair<const char*, Op>> ops = {
      {"add", [](const Tensor& x) { return add(x, x); }},
      {"sub", [](const Tensor& x) { return sub(x, f64({1})); }},
      {"mul", [](const Tensor& x) { return mul(x, x); }},
      {"div", [](const Tensor& x) { return div(x, add(x, 10.0)); }},
      {"maximum", [](const Tensor& x) { return maximum(x, x.transpose(0, 1).transpose(0, 1)); }},
      {"affine", [](const Tensor& x) { return affine(x, 2, 1); }},
      {"neg", [](const Tensor& x) { return neg(x); }},
      {"exp", [](const Tensor& x) { return exp(x); }},
      {"log", [](const Tensor& x) { return log(x); }},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }},
      {"pow", [](const Tensor& x) { return pow(x, 2.5); }},
      {"abs", [](const Tensor& x) { return abs(x); }},
      {"tanh", [](const Tensor& x) { return tanh(x); }},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }},
      {"relu", [](const Tensor& x) { return relu(x); }},
      {"gelu", [](const Tensor& x) { return gelu(x); }},
      {"gelu_tanh", [](const Tensor& x) { return gelu(x, true); }},
      {"where", [m](const Tensor& x) { return where(m, x, mul(x, 2.0)); }},
      {"masked_fill", [m](const Tensor& x) { return masked_fill(x, m, 0.0); }},
      {"masked_fill_",
       [m](const Tensor& x) {
         Tensor y = mul(x, 1.0);
         y.masked_fill_(m, 0.0);
         return y;
       }},
      {"sum", [](const Tensor& x) { return sum(x, {1}); }},
      {"sum_keepdim", [](const Tensor& x) { return sum(x, {1}, true); }},
      {"mean", [](const Tensor& x) { return mean(x, {0}, true); }},
      {"amax", [](const Tensor& x) { return amax(x, {1}); }},
      {"amax_keepdim", [](const Tensor& x) { return amax(x, {1}, true); }},
      {"var", [](const Tensor& x) { return var(x, {1}, true); }},
      {"matmul", [](const Tensor& x) { return matmul(x, x.mT()); }},
      {"linear", [](const Tensor& x) { return linear(x, x, x.select(1, 0)); }},
      {"view",
       [](const Tensor& x) {
         return x.view({3, 2});
       }},
      {"reshape_copy", [](const Tensor& x) { return x.mT().reshape({6}); }},
      {"permute",
       [](const Tensor& x) {
         return x.permute({1, 0});
       }},
      {"unsqueeze", [](const Tensor& x) { return x.unsqueeze(0).squeeze(0); }},
      {"expand",
       [](const Tensor& x) {
         return x.unsqueeze(0).expand({4, 2, 3});
       }},
      {"slice", [](const Tensor& x) { return x.slice(1, 0, 3, 2).select(0, 1); }},
      {"contiguous", [](const Tensor& x) { return x.mT().contiguous(); }},
      {"clone", [](const Tensor& x) { return x.clone(); }},
      {"to_dtype", [](const Tensor& x) { return x.to(DType::f32); }},
      {"cat",
       [](const Tensor& x) {
         return cat({x, x}, 0);
       }},
      {"stack",
       [](const Tensor& x) {
         return stack({x, x}, 1);
       }},
      {"split", [](const Tensor& x) { return split(x, 2, 1)[1]; }},
      {"index_select",
       [](const Tensor& x) {
         return index_select(x, 1, i64({2, 0, 2}));
       }},
      {"embedding",
       [](const Tensor& x) {
         return embedding(x, i64({1, 0, 1}, {3}));
       }},
      {"repeat_interleave", [](const Tensor& x) { return repeat_interleave(x, 2, 0); }},
      {"triu", [](const Tensor& x) { return triu(x); }},
      {"softmax", [](const Tensor& x) { return softmax(x, 0); }},
      {"log_softmax", [](const Tensor& x) { return log_softmax(x, 1); }},
      {"masked_softmax", [](const Tensor& x) { return masked_softmax(x.unsqueeze(0), i64({2}, {1})); }},
      {"causal_softmax", [](const Tensor& x) { return causal_softmax(x.narrow(1, 0, 2), 0.5); }},
      {"dropout",
       [](const Tensor& x) {
         Generator g(1);
         return dropout(x, 0.5, true, g);
       }},
      {"layer_norm", [](const Tensor& x) { return layer_norm(x, x.select(0, 0), x.select(0, 1)); }},
      {"cross_entropy",
       [](const Tensor& x) {
         return cross_entropy(x, i64({2, 0}));
       }},
      {"cross_entropy_none",
       [](const Tensor& x) {
         return cross_entropy(x, i64({2, -100}), -100, Reduction::none);
       }},
      {"mse_loss", [](const Tensor& x) { return mse_loss(x, zeros_like(x)); }},
  };
  Tensor x = leaf64({0.5, 1, 1.5, 2, 2.5, 3}, {2, 3});
  const size_t baseline = cpu_backend().bytes_in_use();
  for (const auto& [name, op] : ops) {
    std::weak_ptr<Node> node;
    {
      const Tensor out = op(x);
      node = out.grad_fn();
      ASSERT_FALSE(node.expired()) << name << " recorded no node";
    }
    EXPECT_TRUE(node.expired()) << name << ": its graph outlived its output (a reference cycle)";
    {  // and after a backward that kept the graph
      const Tensor out = op(x);
      node = out.grad_fn();
      sum(out.to(DType::f64)).backward(Tensor(), true);
    }
    EXPECT_TRUE(node.expired()) << name << ": its retained graph outlived its output";
  }
  x.zero_grad();
  EXPECT_EQ(cpu_backend().bytes_in_use(), baseline);
}

namespace {

// Resident set size in bytes, from /proc/self/statm.
int64_t resident_bytes() {
  std::ifstream f("/proc/self/statm");
  int64_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace

// 10,000 forward / backward / SGD steps of a 16-32-1 MLP must not grow memory: every graph,
// gradient and temporary is freed, so the backend's byte count returns exactly to its baseline.
TEST(Autograd, MemoryStaysFlatOverManySteps) {
  Backend& cpu = cpu_backend();
  Generator gen(4);
  const Tensor x = randn({8, 16}, gen), y = randn({8, 1}, gen);
  Tensor w1 = uniform({32, 16}, -0.25, 0.25, gen), b1 = uniform({32}, -0.25, 0.25, gen);
  Tensor w2 = uniform({1, 32}, -0.18, 0.18, gen), b2 = uniform({1}, -0.18, 0.18, gen);
  std::vector<Tensor*> params = {&w1, &b1, &w2, &b2};
  for (Tensor* p : params) p->requires_grad_();
  const size_t baseline = cpu.bytes_in_use();
  double first_loss = 0, last_loss = 0;
  auto step = [&] {
    const Tensor loss = mse_loss(linear(tanh(linear(x, w1, b1)), w2, b2), y);
    loss.backward();
    last_loss = loss.item<double>();
    NoGradGuard no_grad;
    for (Tensor* p : params) {
      p->copy_(sub(*p, mul(p->grad(), 0.05)));
      p->zero_grad();
    }
  };
  step();
  first_loss = last_loss;
  EXPECT_EQ(cpu.bytes_in_use(), baseline);
  for (int i = 1; i < 1000; ++i) step();
  const int64_t rss_1k = resident_bytes();
  EXPECT_EQ(cpu.bytes_in_use(), baseline);
  for (int i = 1000; i < 10000; ++i) step();
  const int64_t rss_10k = resident_bytes();
  EXPECT_EQ(cpu.bytes_in_use(), baseline);
  EXPECT_LT(last_loss, first_loss);  // it did train
  // AddressSanitizer's quarantine holds freed memory back, so RSS says nothing under it.
  if (!headlab::testing::kAddressSanitizer) {
    EXPECT_LT(rss_10k - rss_1k, int64_t{2} << 20) << "RSS grew from " << rss_1k << " to " << rss_10k;
  }
}

// The loop of examples/mlp_regression, shorter: the loss must still fall more than 10x.
TEST(Autograd, MlpRegressionLearnsSine) {
  const size_t before = cpu_backend().bytes_in_use();
  const examples::FitResult r = examples::fit_sine(600);
  EXPECT_GT(r.initial_loss, 0.05);
  EXPECT_GT(r.initial_loss / r.final_loss, 10.0) << r.initial_loss << " -> " << r.final_loss;
  EXPECT_EQ(cpu_backend().bytes_in_use(), before);
}
