// Sparse autoencoders: the sparse fast paths against their dense composites, JumpReLU's straight-through estimate
// against the paper's formula, the shuffled buffer, b_dec's geometric median, and training that recovers known
// sparse directions. (The ops' gradients: test_gradcheck's sparse-code cases.)
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "nn/sae.h"
#include "tests/core_test_util.h"
#include "train/sae.h"

namespace headlab {
namespace {

using testing::all_close;

Tensor leaf(const Tensor& t) { return contiguous(t.detach()).requires_grad_(); }

TEST(SparseCodes, TopkMatmulMatchesTheDenseComposite) {
  Generator gen(7);
  const Tensor x = leaf(randn({9, 6}, gen, DType::f64)), w = leaf(randn({6, 13}, gen, DType::f64)),
               b = leaf(randn({13}, gen, DType::f64));
  const Tensor upstream = randn({9, 4}, gen, DType::f64);
  const TopK fast = topk_matmul(x, w, b, 4);
  sum(mul(fast.values, upstream)).backward();
  const std::vector<Tensor> fast_grads = {x.grad(), w.grad(), b.grad()};
  x.zero_grad(), w.zero_grad(), b.zero_grad();

  const TopK slow = topk(add(matmul(x, w), b), 4);
  const Tensor slow_values = relu(slow.values);
  sum(mul(slow_values, upstream)).backward();
  EXPECT_TRUE(all_close(fast.values, slow_values, 1e-12));
  EXPECT_EQ(fast.indices.to_vector<int64_t>(), slow.indices.to_vector<int64_t>());
  EXPECT_TRUE(all_close(fast_grads[0], x.grad(), 1e-12));
  EXPECT_TRUE(all_close(fast_grads[1], w.grad(), 1e-12));
  EXPECT_TRUE(all_close(fast_grads[2], b.grad(), 1e-12));
}

TEST(SparseCodes, TopkOrdersLargestFirstAndTiesByIndex) {
  const TopK t = topk(testing::f32({1, 5, 5, 2, 5, -1}, {1, 6}), 3);
  EXPECT_EQ(t.indices.to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 4}));
  EXPECT_THROW(topk(testing::f32({1, 2}, {1, 2}), 3), Error);
  EXPECT_THROW(sparse_matmul(testing::f32({1}, {1, 1}), testing::i64({4}, {1, 1}), zeros({4, 2})), Error);
}

TEST(SparseCodes, JumpReluThresholdGetsTheStraightThroughEstimate) {
  // d/dtheta_i = -(theta_i / eps) * sum over rows of dout where |x - theta_i| < eps / 2 (Rajamanoharan et al. eq. 11)
  const double eps = 0.1;
  const Tensor x = testing::f64({0.52, 0.28, 0.9, 0.46, 0.7, 0.73}, {2, 3});
  const Tensor theta = leaf(testing::f64({0.5, 0.3, 0.7}));
  const Tensor dout = testing::f64({1.0, 2.0, 3.0, 4.0, 5.0, 6.0}, {2, 3});
  sum(mul(jumprelu(x, theta, eps), dout)).backward();
  EXPECT_TRUE(all_close(theta.grad(), {-(0.5 / eps) * (1.0 + 4.0), -(0.3 / eps) * 2.0, -(0.7 / eps) * 6.0}, 1e-12));
  const Tensor theta2 = leaf(testing::f64({0.5, 0.3, 0.7}));
  sum(mul(threshold_step(x, theta2, eps), dout)).backward();
  EXPECT_TRUE(all_close(theta2.grad(), {-(1 / eps) * 5.0, -(1 / eps) * 2.0, -(1 / eps) * 6.0}, 1e-12));
  EXPECT_TRUE(all_close(threshold_step(x, theta2, eps), {1, 0, 1, 0, 1, 1}));
}

nn::SaeConfig config(nn::SaeArch arch, int64_t d_in, int64_t d_sae, int64_t k = 0) {
  nn::SaeConfig c;
  c.d_in = d_in, c.d_sae = d_sae, c.arch = arch, c.k = k;
  return c;
}

// The TopK SAE's sparse loss against the same maths through dense (R, d_sae) features.
TEST(SparseAutoencoder, TopkSparsePathMatchesTheDenseComposite) {
  manual_seed(3);
  nn::SparseAutoencoder sae(config(nn::SaeArch::topk, 6, 20, 3));
  sae.to(DType::f64);
  {
    const NoGradGuard no_grad;
    sae.b_dec.copy_(mul(randn({6}, default_generator(), DType::f64), 0.1));
    sae.b_enc.copy_(mul(randn({20}, default_generator(), DType::f64), 0.1));
  }
  const Tensor x = randn({11, 6}, default_generator(), DType::f64);
  nn::SaeLossOptions opts;
  opts.dead = testing::i64({1, 4, 7, 12, 19}, {5});
  opts.k_aux = 2;
  const nn::SaeLoss l = sae.loss(x, x, opts);
  l.total.backward();
  std::vector<Tensor> fast;
  for (const Tensor& p : sae.parameters()) fast.push_back(p.grad());
  sae.zero_grad();

  const Tensor in = sub(x, sae.b_dec);
  const Tensor pre = add(matmul(in, sae.W_enc), sae.b_enc);
  const TopK top = topk(pre, 3);
  const Tensor f = sparse_to_dense(relu(top.values), top.indices, 20);
  const Tensor x_hat = add(matmul(f, sae.W_dec), sae.b_dec);
  const Tensor mse = mean(sum(pow(sub(x_hat, x), 2), {1}));
  const Tensor err = sub(x, x_hat.detach());
  const Tensor pre_dead = index_select(pre, 1, opts.dead);
  const TopK aux_top = topk(pre_dead, 2);
  const Tensor err_hat =
      matmul(sparse_to_dense(relu(aux_top.values), aux_top.indices, 5), index_select(sae.W_dec, 0, opts.dead));
  const Tensor total = add(mse, mul(mean(sum(pow(sub(err_hat, err), 2), {1})), 1.0 / 32));
  total.backward();
  EXPECT_NEAR(l.total.item<double>(), total.item<double>(), 1e-12);
  const std::vector<Tensor> slow = sae.parameters();
  for (size_t i = 0; i < slow.size(); ++i) EXPECT_TRUE(all_close(fast[i], slow[i].grad(), 1e-12)) << i;
}

TEST(SparseAutoencoder, EncodeDecodeShapesAndErrors) {
  nn::SparseAutoencoder relu_sae(config(nn::SaeArch::relu, 4, 8));
  const Tensor x = randn({2, 3, 4});
  EXPECT_EQ(relu_sae.encode(x).shape(), (Shape{2, 3, 8}));
  EXPECT_EQ(relu_sae.forward(x).shape(), (Shape{2, 3, 4}));
  nn::SparseAutoencoder topk_sae(config(nn::SaeArch::topk, 4, 8, 2));
  const Tensor f = topk_sae.encode(x);
  EXPECT_TRUE(all_close(sum(gt(f, scalar_tensor(0.0)).to(DType::f32), {-1}), std::vector<double>(6, 2.0), 0));
  EXPECT_THROW(relu_sae.encode(randn({2, 5})), Error);
  EXPECT_THROW(nn::SparseAutoencoder(config(nn::SaeArch::topk, 4, 8, 9)), Error);
}

TEST(ShuffledBuffer, HandsOutEveryRowOnceInBoundedMemory) {
  const int64_t N = 1000;
  train::MatrixSource source(reshape(arange(0, double(N), 1, DType::f32), {N, 1}));
  train::ShuffledBuffer buffer(source, 128, 5);
  std::multiset<int64_t> seen;
  bool shuffled = false;
  int64_t previous = -1;
  for (Tensor b; (b = buffer.next_batch(48)).defined();) {
    EXPECT_LE(b.size(0), 48);
    for (float v : b.to_vector<float>()) {
      seen.insert(static_cast<int64_t>(v));
      shuffled |= static_cast<int64_t>(v) < previous;
      previous = static_cast<int64_t>(v);
    }
  }
  EXPECT_EQ(static_cast<int64_t>(seen.size()), N);
  EXPECT_EQ(*seen.begin(), 0);
  EXPECT_EQ(*seen.rbegin(), N - 1);
  EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), seen.size());
  EXPECT_TRUE(shuffled);
}

TEST(SaeTrainer, GeometricMedianIsTheFermatPoint) {
  // three points whose angles are all under 120 degrees: the median is where each pair is seen at 120 degrees,
  // (0, tan 30) for (-1, 0), (1, 0), (0, 3); the mean is (0, 1)
  const Tensor m = train::geometric_median(testing::f64({-1, 0, 1, 0, 0, 3}, {3, 2}));
  EXPECT_TRUE(all_close(m, {0.0, 1.0 / std::sqrt(3.0)}, 1e-5));
}

// Rows that are sums of a few of `n` known unit directions with positive magnitudes: an SAE should find them.
struct Mixture {
  Tensor directions, rows;
};
Mixture sparse_mixture(int64_t n, int64_t d, int64_t rows, int64_t active, uint64_t seed) {
  Generator gen(seed);
  Tensor dirs = randn({n, d}, gen);
  dirs = div(dirs, sqrt(sum(mul(dirs, dirs), {1}, true)));
  std::mt19937_64 rng(seed);
  std::vector<float> codes(static_cast<size_t>(rows * n), 0.0f);
  std::uniform_int_distribution<int64_t> pick(0, n - 1);
  std::uniform_real_distribution<float> magnitude(0.5f, 1.5f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t a = 0; a < active; ++a) codes[static_cast<size_t>(r * n + pick(rng))] = magnitude(rng);
  return {dirs, matmul(tensor(codes, {rows, n}), dirs)};
}

// The share of true directions some decoder row points along with cosine >= 0.95.
double recovered(const nn::SparseAutoencoder& sae, const Tensor& directions) {
  const Tensor dec = div(sae.W_dec, unsqueeze(sae.decoder_norms(), 1));
  const Tensor best = amax(matmul(directions, dec.mT()), {1});
  return mean(to_dtype(ge(best, scalar_tensor(0.95)), DType::f32)).item<double>();
}

double train_on_mixture(nn::SaeArch arch, int64_t k, double l1, int epochs) {
  const Mixture m = sparse_mixture(48, 24, 16384, 3, 11);
  manual_seed(12);
  nn::SparseAutoencoder sae(config(arch, 24, 96, k));
  train::SaeTrainOptions opts;
  opts.adam.lr = 3e-3;
  opts.loss.l1 = l1;
  train::SaeTrainer trainer(sae, opts);
  trainer.init_b_dec(narrow(m.rows, 0, 0, 1024), train::BdecInit::geometric_median);
  for (int epoch = 0; epoch < epochs; ++epoch) {
    train::MatrixSource pass(m.rows);
    train::ShuffledBuffer buffer(pass, 4096, static_cast<uint64_t>(epoch));
    for (Tensor b; (b = buffer.next_batch(256)).defined();) trainer.step(b, b);
  }
  return recovered(sae, m.directions);
}

TEST(SaeTrainer, TopkRecoversKnownSparseDirections) {
  const double share = train_on_mixture(nn::SaeArch::topk, 3, 0, 6);
  EXPECT_GE(share, 0.9) << share;
}

// JumpReLU from thresholds near the codes' scale (0.3 under magnitudes of 0.5 to 1.5): the L0 term's straight-through
// gradient raises them until noise no longer fires, and the decoder finds the directions. From SAELens's 0.001 the
// thresholds climb at Adam's rate in log space, which takes thousands of steps.
TEST(SaeTrainer, JumpReluRaisesItsThresholdsAndRecoversKnownSparseDirections) {
  const Mixture m = sparse_mixture(48, 24, 16384, 3, 11);
  manual_seed(12);
  nn::SparseAutoencoder sae(config(nn::SaeArch::jumprelu, 24, 96, 0));
  train::SaeTrainOptions opts;
  opts.adam.lr = 3e-3;
  opts.loss.l0 = 0.1, opts.loss.bandwidth = 0.05, opts.init_threshold = 0.3;
  train::SaeTrainer trainer(sae, opts);
  trainer.init_b_dec(narrow(m.rows, 0, 0, 1024), train::BdecInit::geometric_median);
  train::SaeStepStats first, last;
  for (int epoch = 0; epoch < 10; ++epoch) {
    train::MatrixSource pass(m.rows);
    train::ShuffledBuffer buffer(pass, 4096, static_cast<uint64_t>(epoch));
    for (Tensor b; (b = buffer.next_batch(256)).defined();) {
      last = trainer.step(b, b);
      if (trainer.tokens_seen() == 256) first = last;
    }
  }
  EXPECT_LT(amax(neg(sae.threshold)).item<double>(), -0.3);  // every threshold rose
  EXPECT_LT(last.l0, 3.0);                                   // three directions a row (fewer where picks coincide)
  EXPECT_GT(first.l0, 2.0 * last.l0);
  EXPECT_GE(recovered(sae, m.directions), 0.9);
}

TEST(SaeTrainer, ReluRecoversKnownSparseDirections) {
  const double share = train_on_mixture(nn::SaeArch::relu, 0, 0.3, 40);
  EXPECT_GE(share, 0.9) << share;
}

}  // namespace
}  // namespace headlab

namespace headlab {
namespace {

// A trainer restored from another's state and a copy of its SAE's weights steps exactly as the original goes on to.
TEST(SaeTrainer, ResumesFromItsStateBitwise) {
  for (nn::SaeArch arch : {nn::SaeArch::relu, nn::SaeArch::topk, nn::SaeArch::jumprelu}) {
    SCOPED_TRACE(enum_name(arch));
    const Mixture m = sparse_mixture(16, 8, 512, 2, 3);
    manual_seed(4);
    nn::SparseAutoencoder a(config(arch, 8, 32, 4));
    train::SaeTrainOptions opts;
    opts.adam.lr = 1e-2, opts.dead_after = 64, opts.init_threshold = 0.2, opts.loss.bandwidth = 0.05;
    train::SaeTrainer ta(a, opts);
    const auto batch = [&](int64_t i) { return narrow(m.rows, 0, (i * 64) % 512, 64); };
    for (int64_t i = 0; i < 5; ++i) ta.step(batch(i), batch(i));
    const train::SaeTrainerState saved = ta.state();

    nn::SparseAutoencoder b(config(arch, 8, 32, 4));
    NamedTensors copies;  // the weights as a checkpoint's folder holds them
    for (const auto& [name, t] : a.named_parameters()) copies.emplace_back(name, t.detach().clone());
    b.adopt_parameters(std::move(copies), "test");
    train::SaeTrainOptions resumed = opts;
    resumed.init_threshold.reset();
    train::SaeTrainer tb(b, resumed);
    tb.load_state(saved, "checkpoint");
    EXPECT_EQ(tb.tokens_seen(), ta.tokens_seen());
    for (int64_t i = 5; i < 9; ++i) {
      const train::SaeStepStats sa = ta.step(batch(i), batch(i)), sb = tb.step(batch(i), batch(i));
      EXPECT_EQ(sa.loss, sb.loss) << i;
      EXPECT_EQ(sa.dead, sb.dead) << i;
    }
    const NamedTensors pa = a.named_parameters(), pb = b.named_parameters();
    for (size_t i = 0; i < pa.size(); ++i)
      EXPECT_EQ(pa[i].second.to_vector<float>(), pb[i].second.to_vector<float>()) << pa[i].first;
    train::SaeTrainerState wrong = saved;
    wrong.last_fired.pop_back();
    EXPECT_ERROR(tb.load_state(wrong, "checkpoint"),
                 "checkpoint: 'last_fired' must hold one count a latent (32), got 31");
  }
}

}  // namespace
}  // namespace headlab
