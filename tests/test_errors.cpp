// Every user-facing error path of the core throws headlab::Error (never aborts or prints) with a
// message that starts with the op's name and states what was expected and what came, with full shapes.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <fstream>

#include "backends/backend.h"
#include "tests/core_test_util.h"
#include "tests/process_util.h"

using namespace headlab;
using namespace headlab::testing;

// The whole message, for the errors whose wording is part of the contract.
#define EXPECT_ERROR_EQ(stmt, text) EXPECT_EQ(::headlab::testing::error_of([&] { stmt; }), std::string(text))

TEST(Errors, MatmulShapes) {
  EXPECT_ERROR_EQ(matmul(zeros({2, 3}), zeros({4, 5})),
                  "matmul: shapes [2, 3] and [4, 5] cannot be multiplied (3 != 4)");
  EXPECT_ERROR_EQ(matmul(zeros({3}), zeros({4})), "matmul: shapes [3] and [4] cannot be multiplied (3 != 4)");
  EXPECT_ERROR_EQ(matmul(zeros({2, 3}), zeros({2})), "matmul: shapes [2, 3] and [2] cannot be multiplied (3 != 2)");
  EXPECT_ERROR_EQ(matmul(zeros({2, 2, 3}), zeros({3, 3, 4})),
                  "matmul: shapes [2, 2, 3] and [3, 3, 4] cannot be broadcast in their batch dims (2 vs 3)");
  EXPECT_ERROR(matmul(scalar_tensor(1), zeros({2})), "matmul: both arguments need at least 1 dimension");
  EXPECT_ERROR(matmul(zeros({2, 2}), zeros({2, 2}, DType::f64)),
               "matmul: expected tensors of the same dtype, got float32 and float64");
  EXPECT_ERROR(matmul(arange(4).view({2, 2}), arange(4).view({2, 2})),
               "matmul: expected a floating-point tensor, got int64");
  EXPECT_ERROR_EQ(linear(zeros({2, 3}), zeros({4, 5})),
                  "linear: input of shape [2, 3] does not match weight of shape [4, 5] (expected last dim 5)");
  EXPECT_ERROR(linear(zeros({2, 3}), zeros({4, 3}), zeros({3})), "linear: bias must have shape [4], got [3]");
  EXPECT_ERROR(linear(zeros({2, 3}), zeros({3})), "linear: weight must be 2-D");
}

TEST(Errors, BroadcastingAndDtypes) {
  EXPECT_ERROR_EQ(add(zeros({2, 3}), zeros({4})), "add: shapes [2, 3] and [4] cannot be broadcast (3 vs 4 at dim 1)");
  EXPECT_ERROR(mul(zeros({3, 1, 2}), zeros({4, 3})), "mul: shapes [3, 1, 2] and [4, 3] cannot be broadcast");
  EXPECT_ERROR(where(tensor_bool({true, false}), zeros({3}), zeros({3})),
               "where: shapes [2] and [3] cannot be broadcast");
  EXPECT_ERROR(masked_fill(zeros({2, 3}), tensor_bool({true, false}), 0.0), "masked_fill: shapes [2, 3] and [2]");
  EXPECT_ERROR_EQ(add(zeros({2}), zeros({2}, DType::f64)),
                  "add: expected tensors of the same dtype, got float32 and float64; convert one with to(dtype)");
  EXPECT_ERROR(sub(arange(2), zeros({2})), "sub: expected tensors of the same dtype, got int64 and float32");
  EXPECT_ERROR(exp(arange(3)), "exp: expected a floating-point tensor, got int64");
  EXPECT_ERROR(mean(arange(3)), "mean: expected a floating-point tensor, got int64");
  EXPECT_ERROR(where(zeros({2}), zeros({2}), zeros({2})), "where: condition must be bool, got float32");
  EXPECT_ERROR(masked_fill(zeros({2}), zeros({2}), 1.0), "masked_fill: mask must be bool, got float32");
  EXPECT_ERROR(logical_and(zeros({2}), tensor_bool({true, true})), "logical_and: expected bool tensors");
  EXPECT_ERROR(sum(tensor_bool({true})), "sum: cannot sum a bool tensor");
  EXPECT_ERROR(add(Tensor(), zeros({1})), "add: first operand is an undefined tensor");
  Tensor x = zeros({2, 3});
  EXPECT_ERROR(x.masked_fill_(tensor_bool({true, false, true, false, true, false, true, false}, {4, 2, 1}), 1.0),
               "masked_fill_: mask of shape [4, 2, 1] does not broadcast to the tensor's shape [2, 3]");
  EXPECT_ERROR(x.copy_(zeros({3, 2})), "copy_: ");
  EXPECT_ERROR(mse_loss(zeros({2}), zeros({3})), "mse_loss: input of shape [2] and target of shape [3] differ");
}

TEST(Errors, RankChecksViaDims) {
  const Tensor x = zeros({2, 3});
  EXPECT_ERROR_EQ(x.dims<3>("MultiHeadAttention"), "MultiHeadAttention: expected a 3-D tensor, got shape [2, 3]");
  EXPECT_ERROR_EQ(zeros({4}).dims<2>("Linear"), "Linear: expected a 2-D tensor, got shape [4]");
  const auto [R, C] = x.dims<2>("test");
  EXPECT_EQ(R, 2);
  EXPECT_EQ(C, 3);
  EXPECT_ERROR(causal_softmax(zeros({2, 3})),
               "causal_softmax: expected square scores of shape (..., T, T), got [2, 3]");
  EXPECT_ERROR(masked_softmax(zeros({3}), Tensor()), "masked_softmax: expected scores of shape (..., queries, keys)");
  EXPECT_ERROR(triu(zeros({3})), "triu: expected a tensor with at least 2 dims, got shape [3]");
  EXPECT_ERROR(embedding(zeros({5}), i64({1})), "embedding: weight must be 2-D");
  EXPECT_ERROR(index_select(zeros({3, 2}), 0, i64({0, 1}, {1, 2})),
               "index_select: index must be 1-D, got shape [1, 2]");
}

TEST(Errors, ViewsAndShapes) {
  const Tensor t = zeros({3, 4}).transpose(0, 1);
  EXPECT_ERROR_EQ(t.view({12}),
                  "view: a tensor of shape [4, 3] with strides [1, 4] cannot be viewed as [12] without a copy; use "
                  "reshape()");
  EXPECT_ERROR_EQ(zeros({2, 3}).view({5}), "view: shape [5] is invalid for input of size 6");
  EXPECT_ERROR(zeros({2, 3}).view({-1, -1}), "view: only one dimension can be -1");
  EXPECT_ERROR(zeros({2, 3}).reshape({4, -1}), "reshape: shape [4, -1] is invalid for input of size 6");
  EXPECT_ERROR(zeros({2, 3}).expand({2, 4}), "expand: the size 3 at dim 1 must match the expanded size 4 or be 1");
  EXPECT_ERROR(zeros({2, 3}).expand({3}), "expand: cannot expand shape [2, 3] to fewer dims [3]");
  EXPECT_ERROR(zeros({2, 3}).permute({0}), "permute: expected 2 dims for shape [2, 3], got [0]");
  EXPECT_ERROR(zeros({2, 3}).permute({1, 1}), "permute: dimension 1 repeats in [1, 1]");
  EXPECT_ERROR(cat({zeros({2, 3}), zeros({2, 4})}, 0),
               "cat: tensor 1 has shape [2, 4], which differs from tensor 0 [2, 3] outside dim 0");
  EXPECT_ERROR(cat({zeros({2, 3}), zeros({3})}, 0), "cat: tensor 1 has shape [3], expected rank 2");
  EXPECT_ERROR(cat({}, 0), "cat: expected a non-empty list of tensors");
  EXPECT_ERROR(stack({zeros({2}), zeros({3})}, 0), "stack: tensor 1 has shape [3], expected [2] like tensor 0");
  EXPECT_ERROR(split(zeros({5}), std::vector<int64_t>{2, 2}, 0), "split: sizes add up to 4 but dim 0 has size 5");
  EXPECT_ERROR(split(zeros({5}), 0, 0), "split: split_size must be positive, got 0");
  EXPECT_ERROR(chunk(zeros({5}), 0, 0), "chunk: chunks must be positive, got 0");
  EXPECT_ERROR(zeros({3}).narrow(0, 2, 2), "narrow: range [2, 4) is out of bounds for dim 0 of size 3");
  EXPECT_ERROR(zeros({3}).slice(0, 0, 3, 0), "slice: step must be positive, got 0");
  EXPECT_ERROR(Tensor::empty({2, -1}), "tensor: negative dimension in shape [2, -1]");
  EXPECT_ERROR(zeros(Shape(13, 1)), "tensor: at most 12 dimensions are supported, got 13");
}

TEST(Errors, OutOfRangeDims) {
  const Tensor x = zeros({2, 3});
  EXPECT_ERROR_EQ(sum(x, {2}), "sum: dimension 2 is out of range for a 2-D tensor (expected in [-2, 1])");
  EXPECT_ERROR(sum(x, {-3}), "sum: dimension -3 is out of range for a 2-D tensor");
  EXPECT_ERROR(sum(x, {1, -1}), "sum: dimension -1 appears more than once in the list of dims");
  EXPECT_ERROR(amax(x, {5}), "amax: dimension 5 is out of range");
  EXPECT_ERROR(argmax(x, 2), "argmax: dimension 2 is out of range");
  EXPECT_ERROR(var(x, {3}), "var: dimension 3 is out of range");
  EXPECT_ERROR(x.transpose(0, 2), "transpose: dimension 2 is out of range for a 2-D tensor");
  EXPECT_ERROR(x.unsqueeze(4), "unsqueeze: dimension 4 is out of range for a 3-D tensor");
  EXPECT_ERROR(x.squeeze(2), "squeeze: dimension 2 is out of range");
  EXPECT_ERROR(softmax(x, 2), "softmax: dimension 2 is out of range");
  EXPECT_ERROR(log_softmax(x, -3), "log_softmax: dimension -3 is out of range");
  EXPECT_ERROR(cat({x, x}, 2), "cat: dimension 2 is out of range");
  EXPECT_ERROR(stack({x, x}, 4), "stack: dimension 4 is out of range for a 3-D tensor");
  EXPECT_ERROR(x.select(0, 2), "select: index 2 is out of range for dim 0 of size 2");
  EXPECT_ERROR(x.select(1, -4), "select: index -4 is out of range for dim 1 of size 3");
  EXPECT_ERROR(x.size(2), "size: dimension 2 is out of range for a 2-D tensor");
  // A 0-d tensor has no dims: asking for one is an error, not a read past the shape.
  const Tensor s = scalar_tensor(1);
  EXPECT_ERROR_EQ(s.size(0), "size: dimension 0 is out of range for a 0-D tensor");
  EXPECT_ERROR(s.stride(-1), "stride: dimension -1 is out of range for a 0-D tensor");
  EXPECT_ERROR(s.narrow(0, 0, 1), "out of range for a 0-D tensor");
  EXPECT_ERROR(s.select(0, 0), "out of range for a 0-D tensor");
  EXPECT_ERROR(split(s, 1, 0), "out of range for a 0-D tensor");
  EXPECT_ERROR(cat({s, s}, 0), "out of range for a 0-D tensor");
  EXPECT_ERROR(x.stride(-3), "stride: dimension -3 is out of range for a 2-D tensor");
  EXPECT_ERROR(index_select(x, 2, i64({0}, {1})), "index_select: dimension 2 is out of range");
  EXPECT_ERROR(repeat_interleave(x, 2, 3), "repeat_interleave: dimension 3 is out of range");
  EXPECT_ERROR(var(zeros({1, 3}), {0}), "var: 1 elements with correction 1 leave no degrees of freedom");
  EXPECT_ERROR(amax(zeros({0, 3}), {0}), "amax: cannot reduce over an empty dimension of shape [0, 3]");
  EXPECT_ERROR(mean(zeros({0})), "mean: cannot take the mean over an empty dimension of shape [0]");
}

TEST(Errors, OutOfRangeIndices) {
  const Tensor w = zeros({5, 3});
  EXPECT_ERROR_EQ(embedding(w, i64({1, 7, 2})), "embedding: index 7 is out of range for size 5 (expected 0..4)");
  EXPECT_ERROR_EQ(embedding(w, i64({-1}, {1})), "embedding: index -1 is out of range for size 5 (expected 0..4)");
  EXPECT_ERROR_EQ(index_select(zeros({3, 2}), 0, i64({0, 3})),
                  "index_select: index 3 is out of range for size 3 (expected 0..2)");
  EXPECT_ERROR(index_select(zeros({3, 2}), 1, i64({2}, {1})), "index_select: index 2 is out of range for size 2");
  EXPECT_ERROR(embedding(w, f32({1})), "embedding: indices must be int64, got float32");
  EXPECT_ERROR(index_select(w, 0, i64({}, {0}).to(DType::f32)), "index_select: index must be int64, got float32");
}

TEST(Errors, MaskedSoftmaxValidLens) {
  const Tensor s = zeros({2, 3, 4});
  EXPECT_ERROR_EQ(masked_softmax(s, i64({1, 2, 3})),
                  "masked_softmax: valid_lens of shape [3] does not match scores of shape [2, 3, 4]; expected [2] or "
                  "[2, 3]");
  EXPECT_ERROR(masked_softmax(s, i64({1, 2, 3, 4}, {2, 2})), "valid_lens of shape [2, 2] does not match");
  EXPECT_ERROR_EQ(masked_softmax(s, i64({1, 5})),
                  "masked_softmax: valid length 5 is out of range for 4 keys (expected 0..4)");
  EXPECT_ERROR(masked_softmax(s, i64({1, 2, 3, -1, 0, 0}, {2, 3})), "masked_softmax: valid length -1 is out of range");
  EXPECT_ERROR(masked_softmax(s, f32({1, 2})), "masked_softmax: valid_lens must be int64, got float32");
}

TEST(Errors, CrossEntropyTargets) {
  const Tensor logits = zeros({2, 3});
  EXPECT_ERROR_EQ(cross_entropy(logits, i64({0, 5})), "cross_entropy: target 5 is out of range for 3 classes");
  EXPECT_ERROR(cross_entropy(logits, i64({-1, 0})), "cross_entropy: target -1 is out of range for 3 classes");
  EXPECT_ERROR_EQ(cross_entropy(logits, i64({0, 1, 2})),
                  "cross_entropy: logits of shape [2, 3] need targets of shape [2], got [3]");
  EXPECT_ERROR(cross_entropy(logits, f32({0, 1})), "cross_entropy: targets must be int64, got float32");
  EXPECT_ERROR(cross_entropy(arange(6).view({2, 3}), i64({0, 1})), "cross_entropy: expected a floating-point tensor");
}

TEST(Errors, DropoutProbability) {
  EXPECT_ERROR_EQ(dropout(zeros({3}), 1.5, true), "dropout: probability must be in [0, 1], got 1.5");
  EXPECT_ERROR(dropout(zeros({3}), -0.1, true), "dropout: probability must be in [0, 1], got -0.1");
  EXPECT_ERROR(dropout(zeros({3}), 2.0, false), "dropout: probability must be in [0, 1]");  // checked in eval too
  EXPECT_ERROR(dropout(zeros({3}), std::nan(""), true), "dropout: probability must be in [0, 1]");
}

TEST(Errors, FactoriesAndData) {
  EXPECT_ERROR_EQ(tensor(std::vector<float>{1, 2, 3}, {2, 2}),
                  "tensor: 3 values cannot fill shape [2, 2] (4 elements)");
  EXPECT_ERROR(tensor(std::vector<int64_t>{}, {1}), "tensor: 0 values cannot fill shape [1] (1 elements)");
  EXPECT_ERROR(tensor_bool({true, false}, {3}), "tensor: 2 values cannot fill shape [3]");
  EXPECT_ERROR_EQ(zeros({2, 2}).item<float>(), "item: expected a tensor with one element, got shape [2, 2]");
  EXPECT_ERROR(zeros({0}).item<float>(), "item: expected a tensor with one element, got shape [0]");
  EXPECT_ERROR(Tensor().item<float>(), "item: expected a tensor with one element, got shape (undefined)");
  EXPECT_ERROR(arange(0, 5, 0), "arange: step must be non-zero");
  EXPECT_ERROR(arange(5, 0, 1), "arange: the range [5, 0) with step 1 is empty in the wrong direction");
  EXPECT_ERROR(eye(-1), "eye: n must be >= 0, got -1");
  EXPECT_ERROR(randint(3, 3, {2}), "randint: expected low < high, got [3, 3)");
  EXPECT_ERROR(rand({2}, default_generator(), DType::i64), "uniform: dtype must be floating, got int64");
  EXPECT_ERROR(randn({2}, default_generator(), DType::b8), "randn: dtype must be floating, got bool");
  EXPECT_ERROR(arange(3).requires_grad_(), "requires_grad_: only floating-point tensors can require gradients");
  EXPECT_ERROR(layer_norm(zeros({2, 4}), zeros({3}), Tensor()),
               "layer_norm: weight and bias must have shape [4], got [3]");
  EXPECT_ERROR(repeat_interleave(zeros({2}), -1, 0), "repeat_interleave: repeats must be >= 0, got -1");
}

TEST(Errors, DeviceParsing) {
  for (const char* bad : {"gpu", "CPU", "cuda:", "cuda:x", "cuda:-1", "cuda:0:1", "", "cuda 0", "cuda:99999"})
    EXPECT_ERROR_EQ(Device::parse(bad), std::string("device: expected 'cpu', 'cuda' or 'cuda:N', got '") + bad + "'");
}

TEST(Errors, CudaRequestedWithoutCuda) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is visible: CUDA requests succeed here (tested by the CUDA suites)";
  const Device cuda = Device::parse("cuda");
  const std::string msg = error_of([&] { (void)zeros({2}, DType::f32, cuda); });
  if (!cuda_built()) {
    EXPECT_EQ(msg, "headlab was built without CUDA (HEADLAB_CUDA=OFF); cannot use device cuda:0");
  } else {  // built with CUDA, no GPU: a clear headlab::Error that names CUDA, not a crash
    EXPECT_EQ(msg.find("<"), std::string::npos) << msg;
    EXPECT_NE(msg.find("CUDA"), std::string::npos) << msg;
  }
  // Moving a tensor there fails the same way, before allocating anything on the CPU side.
  EXPECT_EQ(error_of([&] { (void)ones({3}).to(cuda); }), msg);
  EXPECT_EQ(error_of([&] { (void)randn({3}, default_generator(), DType::f32, cuda); }), msg);
}

TEST(Errors, AutogradMisuse) {
  EXPECT_ERROR(zeros({2}).backward(), "backward: tensor 0 does not require grad and has no grad_fn");
  Tensor x = zeros({2}, DType::f64);
  x.requires_grad_();
  EXPECT_ERROR(mul(x, 2.0).requires_grad_(false), "requires_grad_: can only change requires_grad of leaf tensors");
  EXPECT_ERROR(x.fill_(1), "fill_: a leaf tensor that requires grad cannot be modified in place");
  EXPECT_ERROR(grad({sum(x)}, {zeros({1})}), "grad: input 0 does not require grad");
}

#if defined(__SANITIZE_ADDRESS__)
#define HEADLAB_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HEADLAB_ASAN 1
#endif
#endif

// An allocation the machine refuses is an Error that names the op that asked and the bytes, never
// an abort. Run in a child under an address-space limit 1 GiB above what it uses (not under ASan,
// whose shadow memory needs the address space).
TEST(Errors, AllocationFailureNamesTheOpAndTheBytes) {
#ifdef HEADLAB_ASAN
  GTEST_SKIP() << "an address-space limit and AddressSanitizer do not mix";
#endif
  const auto under_limit = [](const std::function<void()>& f) {
    return run_in_child([&] {
      size_t pages = 0;
      std::ifstream("/proc/self/statm") >> pages;
      const rlim_t limit = pages * static_cast<size_t>(::sysconf(_SC_PAGESIZE)) + (rlim_t{1} << 30);
      const rlimit r{limit, limit};
      if (::setrlimit(RLIMIT_AS, &r) != 0) throw std::runtime_error("setrlimit failed");
      f();
    });
  };
  ChildOutcome o = under_limit([] { matmul(zeros({1 << 16, 1}), zeros({1, 1 << 16})); });  // (65536, 65536) f32
  EXPECT_TRUE(o.error) << o.abnormal;
  EXPECT_EQ(o.message, "matmul: out of memory allocating 16.0 GiB (17179869184 bytes) on cpu");
  o = under_limit([] { sum(zeros({1 << 17, 1 << 15})); });  // zeros is full(): 16 GiB again
  EXPECT_EQ(o.message, "full: out of memory allocating 16.0 GiB (17179869184 bytes) on cpu");
  o = under_limit([] { cpu_backend().alloc(size_t{1} << 34); });  // outside every op
  EXPECT_EQ(o.message, "cpu alloc: out of memory allocating 16.0 GiB (17179869184 bytes) on cpu");
}
