// The op-test registry (after ggml's test-backend-ops and tinygrad's helper_test_op): every
// differentiable op as named cases, each the op as a function of its inputs, how to build those inputs
// (value ranges, non-contiguous / stepped / expanded variants, int64 indices, bool masks) and its
// tolerances. test_gradcheck runs each case's float64 gradcheck, test_cuda_parity each case on CUDA
// against the CPU in float32, test_cuda_backend the same in float64. Only headlab::core is needed.
#pragma once
#include <gtest/gtest.h>

#include <functional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "ops/ops.h"
#include "tests/core_test_util.h"

namespace headlab::testing {

using OpFn = std::function<Tensor(const std::vector<Tensor>&)>;

// How one input of a case is made. Floating inputs hold the distinct values of seq64 (or `literal`)
// and are leaves that require grad; index (int64) and mask (bool) inputs are constants.
struct InputSpec {
  enum class Kind { floating, index, mask };
  enum class Layout { contiguous, transposed, stepped };
  Kind kind = Kind::floating;
  Shape shape;  // the input's shape (the view's, for transposed and stepped)
  double scale = 0.37, shift = -1.1;
  std::vector<double> literal;  // the values instead of seq64's, row-major (index and mask inputs too)
  Layout layout = Layout::contiguous;
};

// Floating values spread around 0.
inline InputSpec val(const Shape& s, double scale = 0.37, double shift = -1.1) {
  return {InputSpec::Kind::floating, s, scale, shift, {}, InputSpec::Layout::contiguous};
}
// Strictly positive values (log, sqrt, rsqrt, fractional powers, divisors).
inline InputSpec pos(const Shape& s) { return val(s, 0.21, 0.3); }
// A (R, C) leaf stored column-major: the transposed view of a contiguous (C, R) buffer.
inline InputSpec transposed(int64_t R, int64_t C) {
  InputSpec in = val({R, C});
  in.layout = InputSpec::Layout::transposed;
  return in;
}
// A (R, C) leaf whose columns are every second column of a (R, 2C + 1) buffer, at offset 1.
inline InputSpec stepped(int64_t R, int64_t C) {
  InputSpec in = val({R, C}, 0.29, -0.8);
  in.layout = InputSpec::Layout::stepped;
  return in;
}
// Given floating values: ties, for the ops whose gradient splits between them.
inline InputSpec lit(std::vector<double> v, const Shape& s) {
  return {InputSpec::Kind::floating, s, 0, 0, std::move(v), InputSpec::Layout::contiguous};
}
inline InputSpec idx(const std::vector<int64_t>& v, const Shape& s) {
  return {InputSpec::Kind::index, s, 0, 0, std::vector<double>(v.begin(), v.end()), InputSpec::Layout::contiguous};
}
inline InputSpec mask(const std::vector<bool>& v, const Shape& s) {
  return {InputSpec::Kind::mask, s, 0, 0, std::vector<double>(v.begin(), v.end()), InputSpec::Layout::contiguous};
}

// The input on `device`, floating ones in `dtype`; the view (transposed, stepped) is taken on the
// device, so that every backend sees the same strides.
inline Tensor make_input(const InputSpec& in, DType dtype, Device device) {
  switch (in.kind) {
    case InputSpec::Kind::index: {
      return tensor(std::vector<int64_t>(in.literal.begin(), in.literal.end()), in.shape, device);
    }
    case InputSpec::Kind::mask: {
      return tensor_bool(std::vector<bool>(in.literal.begin(), in.literal.end()), in.shape, device);
    }
    case InputSpec::Kind::floating:
      break;
  }
  Tensor t;
  if (!in.literal.empty()) {
    t = tensor(in.literal, in.shape).to(dtype).to(device);
  } else if (in.layout == InputSpec::Layout::transposed) {
    t = seq64({in.shape[1], in.shape[0]}, in.scale, in.shift).to(dtype).to(device).transpose(0, 1);
  } else if (in.layout == InputSpec::Layout::stepped) {
    const int64_t C = in.shape[1];
    t = seq64({in.shape[0], 2 * C + 1}, in.scale, in.shift).to(dtype).to(device).slice(1, 1, 2 * C + 1, 2);
  } else {
    t = seq64(in.shape, in.scale, in.shift).to(dtype).to(device);
  }
  t = t.detach();
  t.requires_grad_();
  return t;
}

struct OpCase {
  std::string name;  // unique; letters, digits and '_' (a gtest parameter name)
  OpFn fn;
  std::vector<InputSpec> inputs;
  double eps = 1e-6, grad_atol = 1e-5, grad_rtol = 1e-3;  // gradcheck, float64
  double cuda_rtol = 1e-5, cuda_atol = 1e-5;              // CUDA vs CPU, float32 (float64: the suite's own)
  bool differentiable = true;                             // false: an integer result, no gradient to check
  bool on_cuda = true;                                    // false: CPU only (the op itself names the CPU)

  OpCase& gradcheck_tol(double e, double atol, double rtol) {
    eps = e, grad_atol = atol, grad_rtol = rtol;
    return *this;
  }
  OpCase& cuda_tol(double rtol, double atol) {
    cuda_rtol = rtol, cuda_atol = atol;
    return *this;
  }
  OpCase& no_gradient() {
    differentiable = false;
    return *this;
  }
  OpCase& cpu_only() {
    on_cuda = false;
    return *this;
  }

  std::vector<Tensor> make_inputs(DType dtype, Device device) const {
    std::vector<Tensor> out;
    for (const InputSpec& in : inputs) out.push_back(make_input(in, dtype, device));
    return out;
  }
};

// gtest prints a parameter with this (instead of its bytes).
inline void PrintTo(const OpCase& c, std::ostream* os) { *os << c.name; }
inline std::string op_case_name(const ::testing::TestParamInfo<OpCase>& info) { return info.param.name; }

namespace op_cases_detail {

inline std::string dims(const Shape& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += 'x';
    out += std::to_string(s[i]);
  }
  return out;
}

// t times fixed, distinct weights of its dtype and device: a view's gradient that is not all ones.
inline Tensor weighted(const Tensor& t) { return mul(t, seq64(t.shape(), 0.5, 0.2).to(t.dtype()).to(t.device())); }

inline std::vector<OpCase> build() {
  using M = AttentionMask;
  std::vector<OpCase> r;
  auto def = [&r](std::string name, OpFn fn, std::vector<InputSpec> inputs) -> OpCase& {
    r.push_back(OpCase{std::move(name), std::move(fn), std::move(inputs)});
    return r.back();
  };
  // The operands of the 3-D elementwise cases: a (3, 4, 5) and a (4, 5) that broadcasts against it.
  const InputSpec a3 = val({3, 4, 5}), b2 = val({4, 5}, 0.23, -0.6), p3 = pos({3, 4, 5});
  const InputSpec x4 = val({2, 3, 4, 5});  // (B, H, T, D)-like

  // ---- binary elementwise, broadcasting ----
  def("add_broadcast", [](const auto& v) { return add(v[0], v[1]); }, {val({3, 1, 4}), val({2, 4})});
  def("add_3d_by_2d", [](const auto& v) { return add(v[0], v[1]); }, {a3, b2});
  def("sub_broadcast", [](const auto& v) { return sub(v[0], v[1]); }, {val({2, 3}), val({3})});
  def("sub_reversed_broadcast", [](const auto& v) { return sub(v[1], v[0]); }, {val({2, 1}), val({1, 3})});
  def("sub_3d_by_2d", [](const auto& v) { return sub(v[0], v[1]); }, {a3, b2});
  def("mul_outer_broadcast", [](const auto& v) { return mul(v[0], v[1]); }, {val({3, 1}), val({1, 4})});
  def("mul_0d_operand", [](const auto& v) { return mul(v[0], v[1]); }, {val({2, 3}), val({})});
  def("mul_3d_by_2d", [](const auto& v) { return mul(v[0], v[1]); }, {a3, b2});
  // The same leaf on both sides: contributions add.
  def("mul_same_leaf", [](const auto& v) { return mul(v[0], v[0]); }, {val({4})});
  def("div_broadcast", [](const auto& v) { return div(v[0], v[1]); }, {val({2, 3}), pos({3})});
  def("div_reversed_broadcast", [](const auto& v) { return div(v[1], v[0]); }, {pos({2, 1, 3}), val({4, 1})});
  def("div_3d_by_positive", [](const auto& v) { return div(v[0], v[1]); }, {a3, p3});
  def("div_by_shifted_self", [](const auto& v) { return div(v[0], add(v[0], 3.0)); }, {pos({4})});
  // Ties at elements 0 and 3 share the gradient.
  def("maximum_ties", [](const auto& v) { return maximum(v[0], v[1]); },
      {lit({1, 2, 3, -1}, {4}), lit({1, 0, 5, -1}, {4})});
  def("maximum_broadcast", [](const auto& v) { return maximum(v[0], v[1]); }, {val({2, 3}), val({3}, 0.2, -0.3)});
  def("maximum_3d_by_2d", [](const auto& v) { return maximum(v[0], v[1]); }, {a3, b2});

  // ---- scalar forms ----
  def("affine", [](const auto& v) { return affine(v[0], -2.5, 1.0); }, {val({5})});
  def("affine_3d", [](const auto& v) { return affine(v[0], 2.5, -1.0); }, {a3});
  def("scalar_mul_add", [](const auto& v) { return add(mul(v[0], 3.0), 2.0); }, {val({5})});
  def("scalar_rsub_div", [](const auto& v) { return 2.0 - v[0] / 4.0; }, {val({5})});
  def("scalar_rdiv_sub_mul", [](const auto& v) { return 3.0 / v[0] + (v[0] - 1.0) * 2.0; }, {pos({5})});
  def("unary_minus", [](const auto& v) { return -v[0]; }, {val({2, 2})});
  def("neg", [](const auto& v) { return neg(v[0]); }, {val({2, 2})});

  // ---- unary maths: (3, 4, 5), whose first values are those of a (2, 5) ----
  def("exp", [](const auto& v) { return exp(v[0]); }, {a3});
  def("log", [](const auto& v) { return log(v[0]); }, {p3});
  def("sqrt", [](const auto& v) { return sqrt(v[0]); }, {p3});
  def("rsqrt", [](const auto& v) { return rsqrt(v[0]); }, {p3});
  def("pow_3", [](const auto& v) { return pow(v[0], 3); }, {a3});
  def("pow_half", [](const auto& v) { return pow(v[0], 0.5); }, {p3});
  def("pow_minus_1_5", [](const auto& v) { return pow(v[0], -1.5); }, {p3});
  def("abs", [](const auto& v) { return abs(v[0]); }, {a3});  // no element sits at the kink
  def("tanh", [](const auto& v) { return tanh(v[0]); }, {a3});
  def("sigmoid", [](const auto& v) { return sigmoid(v[0]); }, {a3});
  def("relu", [](const auto& v) { return relu(v[0]); }, {a3});
  def("gelu", [](const auto& v) { return gelu(v[0]); }, {a3});
  def("gelu_tanh", [](const auto& v) { return gelu(v[0], true); }, {a3});
  def("exp_transposed", [](const auto& v) { return exp(v[0]); }, {transposed(3, 4)});
  def("tanh_stepped", [](const auto& v) { return tanh(v[0]); }, {stepped(3, 4)});
  def("gelu_tanh_mul_transposed_by_stepped", [](const auto& v) { return mul(gelu(v[0], true), v[1]); },
      {transposed(3, 4), stepped(3, 4)});

  // ---- where, masked_fill, triangles ----
  def("where_broadcast", [](const auto& v) { return where(v[0], v[1], v[2]); },
      {mask({true, false, false, true, true, false}, {2, 3}), val({2, 3}), val({3}, 0.5, 0.1)});
  def("where_column_mask", [](const auto& v) { return where(v[0], v[1], v[2]); },
      {mask({true, false}, {2, 1}), val({1, 3}), val({2, 3})});
  def("where_from_comparison", [](const auto& v) { return where(gt(v[0], v[1]), v[0], v[1]); }, {a3, b2});
  def("masked_fill_row_mask", [](const auto& v) { return masked_fill(v[0], v[1], -3.0); },
      {val({3, 4}), mask({false, true, true, false}, {4})});
  def("masked_fill_transposed", [](const auto& v) { return masked_fill(v[0], v[1], 0.0); },
      {transposed(2, 3), mask({true, false}, {2, 1})});
  def("masked_fill_from_comparison",
      [](const auto& v) { return masked_fill(v[0], lt(v[1], zeros({}, v[1].dtype(), v[1].device())), 9.0); }, {a3, b2});
  // In place on a non-leaf: the filled positions get no gradient, the others flow through.
  def("masked_fill_in_place_on_a_non_leaf",
      [](const auto& v) {
        Tensor y = mul(v[0], v[0]);
        y.masked_fill_(v[1], 1.5);
        return mul(y, v[0]);
      },
      {val({3, 4}), mask({false, true, true, false}, {4})});
  def("triu", [](const auto& v) { return triu(v[0]); }, {val({3, 4})});
  def("triu_batched_k1", [](const auto& v) { return triu(v[0], 1); }, {val({2, 3, 3})});
  def("triu_3d_k1", [](const auto& v) { return triu(v[0], 1); }, {a3});
  def("tril_k_minus_1", [](const auto& v) { return tril(v[0], -1); }, {val({4, 3})});

  // ---- reductions ----
  const InputSpec r3 = val({2, 3, 4});
  def("sum_all", [](const auto& v) { return sum(v[0]); }, {r3});
  def("sum_dims_0_2", [](const auto& v) { return sum(v[0], {0, 2}); }, {r3});
  def("sum_dims_last_0_keepdim", [](const auto& v) { return sum(v[0], {-1, 0}, true); }, {r3});
  def("sum_dims_0_2_keepdim_3d", [](const auto& v) { return sum(v[0], {0, 2}, true); }, {a3});
  def("sum_dim0_transposed", [](const auto& v) { return sum(v[0], {0}); }, {transposed(4, 3)});
  def("sum_to", [](const auto& v) { return sum_to(v[0], {3, 1}); }, {r3});
  def("mean_all", [](const auto& v) { return v[0].mean(); }, {r3});
  def("mean_dims_1_2", [](const auto& v) { return mean(v[0], {1, 2}); }, {r3});
  def("mean_dim1_keepdim", [](const auto& v) { return mean(v[0], {1}, true); }, {r3});
  def("mean_dim1_3d", [](const auto& v) { return mean(v[0], {1}); }, {a3});
  def("mean_dim1_stepped", [](const auto& v) { return mean(v[0], {1}); }, {stepped(3, 4)});
  def("var_all", [](const auto& v) { return var(v[0]); }, {r3});
  def("var_dims_0_2", [](const auto& v) { return var(v[0], {0, 2}); }, {r3});
  def("var_dim1_keepdim_biased", [](const auto& v) { return var(v[0], {1}, true, 0); }, {r3});
  def("var_dims_0_1_3d", [](const auto& v) { return var(v[0], {0, 1}); }, {a3});
  def("amax_dims_0_2", [](const auto& v) { return amax(v[0], {0, 2}); }, {r3});
  def("amax_dim1_keepdim", [](const auto& v) { return amax(v[0], {1}, true); }, {r3});
  def("amax_dim2_3d", [](const auto& v) { return amax(v[0], {2}); }, {a3});
  // Row 0 ties at 3, row 1 at 2: the tied elements share the gradient.
  def("amax_ties_dim1", [](const auto& v) { return amax(v[0], {1}); }, {lit({1, 3, 3, 2, 2, 0}, {2, 3})});
  def("amax_ties_all", [](const auto& v) { return amax(v[0]); }, {lit({1, 3, 3, 2, 2, 0}, {2, 3})});
  def("argmax_dim1", [](const auto& v) { return argmax(v[0], 1); }, {a3}).no_gradient();

  // ---- matmul in every rank combination, non-contiguous operands, linear ----
  const std::vector<std::pair<Shape, Shape>> ranks = {
      {{3}, {3}},
      {{3}, {3, 2}},
      {{2, 3}, {3}},
      {{2, 3}, {3, 4}},
      {{2, 2, 3}, {2, 3, 2}},
      {{2, 2, 3}, {3, 2}},
      {{2, 3}, {2, 3, 2}},
      {{3}, {2, 3, 2}},
      {{2, 2, 3}, {3}},
      {{2, 1, 2, 3}, {3, 3, 2}},
      {{2, 1, 1, 3}, {1, 2, 3, 2}},
      {{2, 3, 4, 5}, {5, 6}},
  };
  for (const auto& [sa, sb] : ranks)
    def("matmul_" + dims(sa) + "_by_" + dims(sb), [](const auto& v) { return matmul(v[0], v[1]); },
        {val(sa), val(sb, 0.23, -0.6)});
  def("matmul_transposed_operands", [](const auto& v) { return matmul(v[0], v[1]); },
      {transposed(2, 3), transposed(3, 4)});
  def("matmul_stepped_operands", [](const auto& v) { return matmul(v[0], v[1]); }, {stepped(2, 3), stepped(3, 2)});
  def("matmul_expanded_by_mT",
      [](const auto& v) {
        return matmul(v[0].expand({2, 2, 3}), v[1].mT());
      },
      {val({2, 3}), val({2, 4, 3})});
  def("matmul_by_own_mT", [](const auto& v) { return matmul(v[0], v[0].mT()); }, {x4});
  // Heads split out of a projection: (B, T, H*D) -> (B, H, T, D).
  def("matmul_heads_split_from_projection",
      [](const auto& v) {
        const Tensor q = v[0].view({2, 3, 2, 2}).transpose(1, 2);
        return matmul(q, q.mT());
      },
      {val({2, 3, 4})});
  def("matmul_heads_view", [](const auto& v) { return matmul(v[0].transpose(1, 2), v[0].transpose(1, 2).mT()); }, {x4});
  def("linear", [](const auto& v) { return linear(v[0], v[1], v[2]); }, {val({3, 4}), val({2, 4}, 0.3), val({2}, 0.5)});
  def("linear_no_bias", [](const auto& v) { return linear(v[0], v[1]); }, {val({3, 4}), val({2, 4}, 0.3)});
  def("linear_3d_input", [](const auto& v) { return linear(v[0], v[1], v[2]); },
      {val({2, 2, 3}), val({4, 3}, 0.3), val({4})});
  def("linear_4d_input", [](const auto& v) { return linear(v[0], v[1], v[2]); }, {x4, val({7, 5}, 0.3), val({7}, 0.5)});
  def("linear_1d_input_transposed_weight", [](const auto& v) { return linear(v[0], v[1], v[2]); },
      {val({3}), transposed(2, 3), val({2})});
  def("linear_stepped_input_no_bias", [](const auto& v) { return linear(v[0], v[1]); }, {stepped(3, 2), val({2, 2})});

  // ---- views and copies ----
  def("view", [](const auto& v) { return weighted(v[0].view({6, 4})); }, {r3});
  def("reshape_of_a_transpose", [](const auto& v) { return weighted(v[0].transpose(0, 2).reshape({-1})); }, {r3});
  def("flatten", [](const auto& v) { return weighted(v[0].flatten(1)); }, {r3});
  def("permute", [](const auto& v) { return weighted(v[0].permute({2, 0, 1})); }, {r3});
  def("permute_contiguous_4d", [](const auto& v) { return v[0].permute({3, 1, 0, 2}).contiguous(); }, {x4});
  def("unsqueeze_squeeze_dim", [](const auto& v) { return weighted(v[0].unsqueeze(1).squeeze(1)); }, {r3});
  def("unsqueeze_squeeze_all", [](const auto& v) { return weighted(v[0].unsqueeze(0).squeeze()); }, {r3});
  def("narrow", [](const auto& v) { return weighted(v[0].narrow(1, 1, 2)); }, {r3});
  def("slice_step_3", [](const auto& v) { return weighted(v[0].slice(2, 0, 4, 3)); }, {r3});
  def("slice_step_2_4d", [](const auto& v) { return v[0].slice(3, 1, 5, 2); }, {x4});
  def("select_last", [](const auto& v) { return weighted(v[0].select(1, -1)); }, {r3});
  def("contiguous_of_transposed", [](const auto& v) { return weighted(v[0].contiguous()); }, {transposed(3, 2)});
  def("clone", [](const auto& v) { return weighted(v[0].clone()); }, {r3});
  def("expand_leading_dim", [](const auto& v) { return weighted(v[0].expand({3, 2, 4})); }, {val({2, 1})});
  def("expand_keeping_a_dim", [](const auto& v) { return weighted(v[0].expand({2, -1, 3})); }, {val({4, 1})});
  def("expand_of_narrow_times_input",
      [](const auto& v) {
        return mul(v[0].narrow(0, 0, 1).expand({2, 3, 4, 5}), v[0]);
      },
      {x4});
  // float32 in the middle: a larger step keeps rounding error out of the difference quotient.
  def("to_f32_and_back", [](const auto& v) { return mul(v[0].to(DType::f32).to(DType::f64), 3.0); }, {val({4})})
      .gradcheck_tol(1e-2, 1e-4, 1e-3);
  def("to_cpu", [](const auto& v) { return v[0].to(kCPU); }, {val({2})}).cpu_only();

  // ---- cat, stack, split, chunk ----
  def("cat_three_dim1",
      [](const auto& v) {
        return cat({v[0], exp(v[1]), v[2]}, 1);
      },
      {val({2, 1}), val({2, 3}), val({2, 2})});
  def("cat_transposed_dim0", [](const auto& v) { return cat({v[0], v[1]}, 0); }, {transposed(2, 3), val({1, 3})});
  def("cat_with_own_narrow_4d", [](const auto& v) { return cat({v[0], v[0].narrow(1, 0, 2)}, 1); }, {x4});
  def("stack_dim1", [](const auto& v) { return stack({v[0], mul(v[1], v[1])}, 1); }, {val({2, 3}), val({2, 3}, 0.4)});
  def("stack_dim0_4d", [](const auto& v) { return stack({v[0], mul(v[0], 2.0)}, 0); }, {x4});
  def("split_by_size",
      [](const auto& v) {
        const std::vector<Tensor> parts = split(v[0], 2, 1);  // widths 2, 2, 1
        return cat({mul(parts[0], 2.0), parts[2], exp(parts[1])}, 1);
      },
      {val({2, 5})});
  def("split_by_sizes",
      [](const auto& v) {
        const std::vector<Tensor> parts = split(v[0], std::vector<int64_t>{1, 3}, 0);
        return add(parts[0], mul(parts[1], parts[1]));  // (1, 2) + (3, 2) broadcasts
      },
      {val({4, 2})});
  def("chunk",
      [](const auto& v) {
        const std::vector<Tensor> c = chunk(v[0], 2, -1);
        return mul(c[0], c[1]);
      },
      {val({3, 4})});

  // ---- indexing ----
  def("index_select_dim0_repeats", [](const auto& v) { return index_select(v[0], 0, v[1]); },
      {val({3, 4}), idx({2, 0, 2, 2}, {4})});
  def("index_select_dim1_transposed", [](const auto& v) { return index_select(v[0], 1, v[1]); },
      {transposed(2, 4), idx({3, 3, 1}, {3})});
  def("index_select_dim2_4d", [](const auto& v) { return index_select(v[0], 2, v[1]); }, {x4, idx({3, 0, 3}, {3})});
  def("embedding", [](const auto& v) { return embedding(v[0], v[1]); }, {val({4, 3}), idx({1, 3, 1, 0, 1, 1}, {2, 3})});
  def("embedding_2x2_ids", [](const auto& v) { return embedding(v[0], v[1]); },
      {val({7, 5}, 0.3), idx({1, 4, 1, 6}, {2, 2})});
  def("repeat_interleave", [](const auto& v) { return repeat_interleave(v[0], 3, 1); }, {val({2, 2})});
  def("repeat_interleave_4d", [](const auto& v) { return repeat_interleave(v[0], 2, 1); }, {x4});

  // ---- sparse codes (ops/sparse.cpp; the CPU's kernels only for now) ----
  def("topk_k2_rows", [](const auto& v) { return topk(v[0], 2).values; }, {val({3, 5})}).cpu_only();
  def("topk_transposed", [](const auto& v) { return topk(v[0], 3).values; }, {transposed(3, 4)}).cpu_only();
  def("sparse_to_dense_repeats", [](const auto& v) { return sparse_to_dense(v[0], v[1], 5); },
      {val({3, 2}), idx({4, 4, 0, 2, 1, 0}, {3, 2})})
      .cpu_only();
  def("sparse_matmul", [](const auto& v) { return sparse_matmul(v[0], v[1], v[2]); },
      {val({3, 2}), idx({3, 0, 0, 0, 1, 3}, {3, 2}), val({4, 5}, 0.29, -0.6)})
      .cpu_only();
  def("sparse_outer", [](const auto& v) { return sparse_outer(v[0], v[1], v[2], 5); },
      {val({3, 2}), idx({3, 0, 0, 0, 1, 3}, {3, 2}), stepped(3, 4)})
      .cpu_only();
  // some of the kept pre-activations negative (ReLU's gate) and some rows' top k straddling zero
  def("topk_matmul", [](const auto& v) { return topk_matmul(v[0], v[1], v[2], 2).values; },
      {val({4, 3}), val({3, 6}, 0.41, -0.9), val({6}, 0.3, -0.2)})
      .cpu_only();
  def("topk_matmul_no_bias", [](const auto& v) { return topk_matmul(v[0], v[1], Tensor(), 3).values; },
      {val({2, 3}), transposed(3, 5)})
      .cpu_only();
  // the threshold a constant: its gradient is the straight-through estimate (test_sae.cpp), not a derivative
  def("jumprelu_x",
      [](const auto& v) {
        return jumprelu(v[0], to_dtype(tensor(std::vector<double>{-0.513, 0.0271, 0.733, -1.37}), v[0].dtype()), 0.01);
      },
      {val({3, 4})})
      .cpu_only();
  def("threshold_step_x",
      [](const auto& v) {
        return mul(
            threshold_step(v[0], to_dtype(tensor(std::vector<double>{-0.513, 0.0271, 0.733}), v[0].dtype()), 0.01),
            v[0]);
      },
      {val({4, 3})})
      .cpu_only();

  // ---- softmax family ----
  for (int64_t d : {0, 1, 2}) {
    def("softmax_dim" + std::to_string(d), [d](const auto& v) { return softmax(v[0], d); }, {r3});
    def("log_softmax_dim" + std::to_string(d), [d](const auto& v) { return log_softmax(v[0], d); }, {r3});
  }
  const InputSpec s4 = val({2, 3, 4, 4});  // (B, H, T, T) scores
  def("softmax_dim1_4d", [](const auto& v) { return softmax(v[0], 1); }, {s4});
  def("log_softmax_last_dim_4d", [](const auto& v) { return log_softmax(v[0], -1); }, {s4});
  def("softmax_transposed_dim0", [](const auto& v) { return softmax(v[0], 0); }, {transposed(3, 2)});
  def("log_softmax_stepped", [](const auto& v) { return log_softmax(v[0], -1); }, {stepped(2, 3)});
  // masked_softmax: 1-D and 2-D valid_lens with zero lengths, a scale, and no lengths.
  def("masked_softmax_1d_lens", [](const auto& v) { return masked_softmax(v[0], v[1]); }, {r3, idx({0, 3}, {2})});
  def("masked_softmax_2d_lens_scaled", [](const auto& v) { return masked_softmax(v[0], v[1], 0.5); },
      {r3, idx({1, 0, 4, 2, 3, 0}, {2, 3})});
  def("masked_softmax_no_lens_scaled", [](const auto& v) { return masked_softmax(v[0], Tensor(), 2.0); }, {r3});
  def("masked_softmax_of_a_reshape",
      [](const auto& v) {
        return masked_softmax(v[0].reshape({6, 4, 4}), v[1], 0.7);
      },
      {s4, idx({0, 1, 2, 3, 4, 2}, {6})});
  def("causal_softmax_scaled", [](const auto& v) { return causal_softmax(v[0], 0.7); }, {val({2, 3, 3})});
  def("causal_softmax_4d", [](const auto& v) { return causal_softmax(v[0], 0.5); }, {s4});
  def("causal_softmax_transposed_4d", [](const auto& v) { return causal_softmax(v[0].transpose(-1, -2), 1.3); },
      {val({2, 1, 3, 3})});

  // ---- dropout: a Generator rebuilt in the same state on each call replays its mask (and the
  // mask is a function of (seed, offset) only: the same on every device) ----
  def("dropout_replays_its_mask",
      [](const auto& v) {
        Generator g(3);
        return dropout(v[0], 0.4, true, g);
      },
      {val({3, 5})});
  def("dropout_times_input_transposed",
      [](const auto& v) {
        Generator g(8);
        return mul(dropout(v[0], 0.5, true, g), v[0]);
      },
      {transposed(3, 4)});
  def("dropout_p03_rows",
      [](const auto& v) {
        Generator g(3);
        return dropout(v[0], 0.3, true, g);
      },
      {val({6, 10})});
  def("dropout_eval", [](const auto& v) { return dropout(v[0], 0.4, false); }, {val({3})});

  // ---- fused attention: every mask (zero valid lengths included), Tq != Tk, (B, H, T, D) views of
  // (B, T, H, D) leaves as the multi-head modules pass them, 3-D inputs, replayed dropout. CUDA runs
  // the composite form against the CPU's fused kernel: a looser float32 tolerance. ----
  auto heads = [](const Tensor& t) { return t.transpose(1, 2); };
  const InputSpec q = val({2, 2, 3, 4}, 0.21, -0.7), k = val({2, 2, 5, 4}, 0.17, -0.5), vv = val({2, 2, 5, 3});
  const InputSpec qt = val({2, 4, 2, 3}, 0.23, -0.6), kt = val({2, 4, 2, 3}, 0.19, -0.4), vt = val({2, 4, 2, 2});
  def("sdpa_no_mask", [](const auto& x) { return scaled_dot_product_attention(x[0], x[1], x[2]); }, {q, k, vv})
      .cuda_tol(1e-4, 1e-5);
  def("sdpa_1d_lens_with_a_zero",
      [](const auto& x) { return scaled_dot_product_attention(x[0], x[1], x[2], M::lengths(x[3])); },
      {q, k, vv, idx({0, 4}, {2})})
      .cuda_tol(1e-4, 1e-5);
  def("sdpa_2d_lens_scaled",
      [](const auto& x) {
        return scaled_dot_product_attention(x[0], x[1], x[2], M::lengths(x[3]), 0.0, false, default_generator(), 0.6);
      },
      {q, k, vv, idx({1, 0, 5, 2, 3, 4}, {2, 3})})
      .cuda_tol(1e-4, 1e-5);
  def("sdpa_causal_heads_view",
      [heads](const auto& x) {
        return scaled_dot_product_attention(heads(x[0]), heads(x[1]), heads(x[2]), M::causal());
      },
      {qt, kt, vt})
      .cuda_tol(1e-4, 1e-5);
  // q and k from one leaf, as self-attention on a shared projection.
  def("sdpa_causal_shared_qk",
      [heads](const auto& x) {
        return scaled_dot_product_attention(heads(x[0]), heads(x[0]), heads(x[1]), M::causal());
      },
      {qt, vt})
      .cuda_tol(1e-4, 1e-5);
  def("sdpa_3d_one_head_lens",
      [](const auto& x) { return scaled_dot_product_attention(x[0], x[1], x[2], M::lengths(x[3])); },
      {val({2, 3, 4}), val({2, 5, 4}, 0.2), val({2, 5, 2}), idx({2, 5}, {2})})
      .cuda_tol(1e-4, 1e-5);
  def("sdpa_causal_dropout",
      [](const auto& x) {
        Generator g(3);
        return scaled_dot_product_attention(x[0], x[1], x[2], M::causal(), 0.4, true, g);
      },
      {val({1, 2, 4, 3}, 0.3), val({1, 2, 4, 3}, 0.2), val({1, 2, 4, 2})})
      .cuda_tol(1e-4, 1e-5);
  def("sdpa_lens_dropout_heads_view",
      [heads](const auto& x) {
        Generator g(8);
        return scaled_dot_product_attention(heads(x[0]), heads(x[1]), heads(x[2]), M::lengths(x[3]), 0.5, true, g);
      },
      {val({2, 3, 2, 3}, 0.3), val({2, 4, 2, 3}, 0.2), val({2, 4, 2, 2}), idx({3, 1}, {2})})
      .cuda_tol(1e-4, 1e-5);

  // Grouped-query attention: k and v with fewer heads than q (read in place by the CPU kernel, repeated by the
  // composite path and on CUDA); multi-query at one key/value head; the cache's decode step (Tq 1, no mask).
  def("sdpa_gqa_causal_heads_view",
      [heads](const auto& x) {
        return scaled_dot_product_attention(heads(x[0]), heads(x[1]), heads(x[2]), M::causal());
      },
      {val({2, 4, 4, 3}, 0.23, -0.6), val({2, 4, 2, 3}, 0.19, -0.4), val({2, 4, 2, 2})})
      .cuda_tol(1e-4, 1e-5);
  def("sdpa_mqa_causal", [](const auto& x) { return scaled_dot_product_attention(x[0], x[1], x[2], M::causal()); },
      {val({1, 3, 4, 2}, 0.3), val({1, 1, 4, 2}, 0.2), val({1, 1, 4, 3})})
      .cuda_tol(1e-4, 1e-5);
  def("sdpa_gqa_decode_step", [](const auto& x) { return scaled_dot_product_attention(x[0], x[1], x[2]); },
      {val({2, 4, 1, 3}, 0.3), val({2, 2, 5, 3}, 0.2), val({2, 2, 5, 2})})
      .cuda_tol(1e-4, 1e-5);
  def("sdpa_gqa_lens_dropout",
      [](const auto& x) {
        Generator g(5);
        return scaled_dot_product_attention(x[0], x[1], x[2], M::lengths(x[3]), 0.3, true, g);
      },
      {val({2, 4, 3, 2}, 0.3), val({2, 2, 4, 2}, 0.2), val({2, 2, 4, 2}), idx({3, 1}, {2})})
      .cuda_tol(1e-4, 1e-5);
  def("sdpa_gqa_composite",
      [heads](const auto& x) {
        return scaled_dot_product_attention_composite(heads(x[0]), heads(x[1]), heads(x[2]), M::causal());
      },
      {val({1, 3, 4, 2}, 0.23, -0.6), val({1, 3, 2, 2}, 0.19, -0.4), val({1, 3, 2, 2})});

  // Sliding windows (Mistral, Qwen2's, GPT-Neo's local layers): causal within 2 keys of 5, a cached chunk's per-row
  // lengths within 3, grouped-query within 2.
  def("sdpa_causal_window",
      [heads](const auto& x) {
        return scaled_dot_product_attention(heads(x[0]), heads(x[1]), heads(x[2]), M::causal().within(2));
      },
      {val({2, 5, 2, 3}, 0.23, -0.6), val({2, 5, 2, 3}, 0.19, -0.4), val({2, 5, 2, 2})})
      .cuda_tol(1e-4, 1e-5);
  def("sdpa_lens_window",
      [](const auto& x) { return scaled_dot_product_attention(x[0], x[1], x[2], M::lengths(x[3]).within(3)); },
      {q, k, vv, idx({3, 4, 5, 1, 2, 5}, {2, 3})})
      .cuda_tol(1e-4, 1e-5);
  def("sdpa_gqa_causal_window_dropout",
      [](const auto& x) {
        Generator g(4);
        return scaled_dot_product_attention(x[0], x[1], x[2], M::causal().within(2), 0.3, true, g);
      },
      {val({1, 4, 5, 2}, 0.3), val({1, 2, 5, 2}, 0.2), val({1, 2, 5, 3})})
      .cuda_tol(1e-4, 1e-5);

  // Soft-capped scores (Gemma 2's: softcap * tanh(scale * s / softcap) before the mask) that bind (0.3), causal with
  // a window and grouped-query; and with per-row lengths at a given scale.
  def("sdpa_gqa_causal_window_softcap",
      [](const auto& x) {
        return scaled_dot_product_attention(x[0], x[1], x[2], M::causal().within(3), 0.0, false, default_generator(),
                                            std::nullopt, 0.3);
      },
      {val({1, 4, 5, 2}, 0.5), val({1, 2, 5, 2}, 0.6), val({1, 2, 5, 3})})
      .cuda_tol(1e-4, 1e-5);
  def("sdpa_lens_softcap",
      [](const auto& x) {
        return scaled_dot_product_attention(x[0], x[1], x[2], M::lengths(x[3]), 0.0, false, default_generator(), 0.8,
                                            0.5);
      },
      {q, k, vv, idx({3, 4, 5, 1, 2, 5}, {2, 3})})
      .cuda_tol(1e-4, 1e-5);

  // ---- LLaMA's parts: RMSNorm (fused; its composite), SiLU, rotary embeddings in both layouts, whole and
  // partial, at a position offset ----
  def("rms_norm", [](const auto& v) { return rms_norm(v[0], v[1], 1e-5); }, {val({3, 4}), val({4}, 0.4, 0.5)});
  def("rms_norm_rows_transposed", [](const auto& v) { return rms_norm(v[0], v[1]); },
      {transposed(6, 10), val({10}, 0.4, 0.5)});
  def("rms_norm_no_weight", [](const auto& v) { return rms_norm(v[0], Tensor(), 1e-3); }, {val({2, 3, 5})});
  def("rms_norm_composite", [](const auto& v) { return rms_norm_composite(v[0], v[1], 1e-5); },
      {val({3, 4}), val({4}, 0.4, 0.5)});
  def("silu", [](const auto& v) { return silu(v[0]); }, {val({3, 5}, 0.9, -6)});
  const auto rotary = [](int64_t offset, int64_t T, int64_t R, bool interleaved) {
    return [=](const auto& v) {
      const auto [c, s] = rotary_angles(offset, T, R, 500.0, v[0].dtype(), v[0].device());
      return rotary_embedding(v[0], c, s, interleaved);
    };
  };
  def("rotary_halves", rotary(0, 3, 4, false), {val({2, 3, 2, 4})});
  def("rotary_interleaved_offset", rotary(5, 3, 4, true), {val({2, 3, 2, 4})});
  def("rotary_partial_halves", rotary(2, 3, 2, false), {val({1, 3, 2, 6})});
  def("rotary_partial_interleaved_view",  // (B, T, H, D) as a view of a (B, H, T, D) leaf
      [rotary](const auto& v) { return rotary(1, 3, 4, true)(std::vector<Tensor>{v[0].transpose(1, 2)}); },
      {val({1, 2, 3, 6})});

  // ---- layer norm ----
  def("layer_norm", [](const auto& v) { return layer_norm(v[0], v[1], v[2]); },
      {val({3, 4}), val({4}, 0.4, 0.5), val({4})});
  def("layer_norm_rows", [](const auto& v) { return layer_norm(v[0], v[1], v[2]); },
      {val({6, 10}), val({10}, 0.4, 0.5), val({10})});
  def("layer_norm_no_affine", [](const auto& v) { return layer_norm(v[0], Tensor(), Tensor()); }, {r3});
  def("layer_norm_weight_only", [](const auto& v) { return layer_norm(v[0], v[1], Tensor()); },
      {val({2, 5}), val({5})});
  def("layer_norm_bias_only", [](const auto& v) { return layer_norm(v[0], Tensor(), v[1]); }, {val({2, 5}), val({5})});
  def("layer_norm_transposed_eps", [](const auto& v) { return layer_norm(v[0], v[1], v[2], 1e-3); },
      {transposed(3, 4), val({4}, 0.4, 0.5), val({4})});

  // ---- losses ----
  const InputSpec targets = idx({2, -100, 0, 1}, {4});
  def("cross_entropy_ignored_target", [](const auto& v) { return cross_entropy(v[0], v[1]); }, {val({4, 3}), targets});
  def("cross_entropy_sum", [](const auto& v) { return cross_entropy(v[0], v[1], -100, Reduction::sum); },
      {val({4, 3}), targets});
  def("cross_entropy_none", [](const auto& v) { return cross_entropy(v[0], v[1], -100, Reduction::none); },
      {val({4, 3}), targets});
  def("cross_entropy_3d_ignore_index_1", [](const auto& v) { return cross_entropy(v[0], v[1], 1); },
      {val({2, 2, 3}), idx({1, 1, 0, 2}, {2, 2})});
  def("cross_entropy_transposed", [](const auto& v) { return cross_entropy(v[0], v[1]); }, {transposed(4, 3), targets});
  def("cross_entropy_rows", [](const auto& v) { return cross_entropy(v[0], v[1]); },
      {val({6, 10}), idx({1, -100, 9, 0, 3, 3}, {6})});
  def("mse_loss", [](const auto& v) { return mse_loss(v[0], v[1]); }, {val({2, 3}), val({2, 3}, 0.2)});
  def("mse_loss_none", [](const auto& v) { return mse_loss(v[0], v[1], Reduction::none); }, {val({4}), val({4}, 0.2)});
  def("mse_loss_sum", [](const auto& v) { return mse_loss(v[0], v[1], Reduction::sum); }, {val({4}), val({4}, 0.2)});
  def("mse_loss_rows", [](const auto& v) { return mse_loss(v[0], v[1]); }, {val({6, 10}), val({6, 10}, 0.18, -0.5)});

  // ---- a small MLP end to end: x (5, 3) -> tanh(linear 4) -> linear 2, against y (5, 2) ----
  def("mlp_tanh_mse",
      [](const auto& v) {
        const Tensor h = tanh(linear(v[0], v[2], v[3]));
        return mse_loss(linear(h, v[4], v[5]), v[1]);
      },
      {val({5, 3}), val({5, 2}, 0.1), val({4, 3}, 0.3, -0.5), val({4}, 0.1), val({2, 4}, 0.2, -0.4), val({2}, 0.1)});
  return r;
}

}  // namespace op_cases_detail

// Every case, built once.
inline const std::vector<OpCase>& op_cases() {
  static const std::vector<OpCase> cases = op_cases_detail::build();
  return cases;
}

// The cases that run on CUDA, and those with a gradient to check.
inline std::vector<OpCase> cuda_op_cases() {
  std::vector<OpCase> out;
  for (const OpCase& c : op_cases())
    if (c.on_cuda) out.push_back(c);
  return out;
}
inline std::vector<OpCase> differentiable_op_cases() {
  std::vector<OpCase> out;
  for (const OpCase& c : op_cases())
    if (c.differentiable) out.push_back(c);
  return out;
}

// |got - cpu| <= atol + rtol * |cpu| elementwise (NaNs and infinities must match); reports the worst element.
inline void expect_close_on_devices(const Tensor& got, const Tensor& cpu, const std::string& what, double rtol,
                                    double atol) {
  ASSERT_EQ(got.shape(), cpu.shape()) << what;
  ASSERT_EQ(got.dtype(), cpu.dtype()) << what;
  const std::vector<double> vg = got.to_vector<double>(), vc = cpu.to_vector<double>();
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < vg.size(); ++i) {
    if (vg[i] == vc[i] || (std::isnan(vg[i]) && std::isnan(vc[i]))) continue;
    const double excess = std::isfinite(vg[i]) && std::isfinite(vc[i])
                              ? std::abs(vg[i] - vc[i]) - (atol + rtol * std::abs(vc[i]))
                              : INFINITY;
    if (excess > worst) worst = excess, at = i;
  }
  EXPECT_LE(worst, 0.0) << what << ": element " << at << " device " << vg[at] << " vs cpu " << vc[at];
}

// The case on `device` against the CPU, floating inputs in `dtype`: the output, then (for a
// differentiable case) every floating input's gradient from the same upstream gradient.
inline void check_case_against_cpu(const OpCase& c, Device device, DType dtype, double rtol, double atol) {
  const std::vector<Tensor> cpu_in = c.make_inputs(dtype, kCPU), gpu_in = c.make_inputs(dtype, device);
  const Tensor out_cpu = c.fn(cpu_in), out_gpu = c.fn(gpu_in);
  ASSERT_EQ(out_gpu.device(), device) << c.name;
  expect_close_on_devices(out_gpu, out_cpu, c.name + " forward", rtol, atol);
  if (!c.differentiable) return;
  ASSERT_TRUE(out_cpu.requires_grad()) << c.name << ": a differentiable case whose output has no history";
  Generator gen(7);
  const Tensor dout = randn(out_cpu.shape(), gen, out_cpu.dtype());
  out_cpu.backward(dout);
  out_gpu.backward(dout.to(device));
  for (size_t i = 0; i < cpu_in.size(); ++i) {
    if (!is_floating(cpu_in[i].dtype())) continue;
    ASSERT_EQ(cpu_in[i].grad().defined(), gpu_in[i].grad().defined()) << c.name << " grad of input " << i;
    if (cpu_in[i].grad().defined())
      expect_close_on_devices(gpu_in[i].grad(), cpu_in[i].grad(), c.name + " grad of input " + std::to_string(i), rtol,
                              atol);
  }
}

}  // namespace headlab::testing
