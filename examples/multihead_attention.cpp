// Multi-head attention in headlab, as two texts build it: d2l.ai 10.5 (MultiHeadAttention over
// DotProductAttention, cross-attention with valid lengths) and "Build a Large Language Model from
// Scratch" ch. 3 (a wrapper of causal heads, then the fused form), printing what the texts print,
// and then the two causal forms converted into each other and compared on one input.
// B = batch, T = tokens, H = heads, D = head size.
#include <algorithm>
#include <cmath>
#include <iostream>

#include "nn/attention.h"

using namespace headlab;

namespace {

void set(const Tensor& p, const std::vector<float>& v) {
  NoGradGuard no_grad;
  Tensor dst = p.detach();
  dst.copy_(tensor(v, p.shape()));
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  double m = 0;
  for (size_t i = 0; i < va.size(); ++i) m = std::max(m, std::abs(va[i] - vb[i]));
  return m;
}

}  // namespace

int main() {
  try {
    std::cout << "== d2l 10.5: MultiHeadAttention ==\n";
    const int64_t num_hiddens = 100, num_heads = 5;
    nn::MultiHeadAttention attention(num_hiddens, num_hiddens, num_hiddens, num_hiddens, num_heads, 0.5);
    attention.eval();
    std::cout << attention.repr() << "\n";
    const int64_t batch_size = 2, num_queries = 4, num_kvpairs = 6;
    const Tensor valid_lens = tensor(std::vector<int64_t>{3, 2}, {2});
    const Tensor X = ones({batch_size, num_queries, num_hiddens});
    const Tensor Y = ones({batch_size, num_kvpairs, num_hiddens});
    const Tensor out = attention(X, Y, Y, valid_lens);
    std::cout << "attention(X, Y, Y, valid_lens).shape: " << shape_str(out.shape()) << "\n";
    // Exercise 1 of the chapter: each head's weights. (B, H, Q, K); valid_lens applies to every head.
    std::cout << "attention_weights.shape: " << shape_str(attention.attention_weights.shape()) << "\n";
    std::cout << "head 0 of batch entry 1 (valid length 2):\n"
              << attention.attention_weights.select(0, 1).select(0, 0) << "\n\n";

    std::cout << "== Build a LLM from Scratch, ch. 3: MultiHeadAttentionWrapper ==\n";
    const Tensor inputs = tensor(std::vector<float>{0.43f, 0.15f, 0.89f,   // Your     (x^1)
                                                    0.55f, 0.87f, 0.66f,   // journey  (x^2)
                                                    0.57f, 0.85f, 0.64f,   // starts   (x^3)
                                                    0.22f, 0.58f, 0.33f,   // with     (x^4)
                                                    0.77f, 0.25f, 0.10f,   // one      (x^5)
                                                    0.05f, 0.80f, 0.55f},  // step     (x^6)
                                 {6, 3});
    const Tensor batch = stack({inputs, inputs}, 0);
    const int64_t context_length = batch.size(1), d_in = 3, d_out = 2;
    manual_seed(123);
    nn::MultiHeadAttentionWrapper mha(d_in, d_out, context_length, 0.0, /*num_heads=*/2);
    // headlab's generator is not torch's: copy in the weights torch.manual_seed(123) gives, so that
    // the numbers below are the book's.
    auto h0 = mha.heads->at<nn::CausalAttention>(0), h1 = mha.heads->at<nn::CausalAttention>(1);
    set(h0->W_query->weight, {-0.235429645f, 0.0191244762f, -0.286745936f, 0.217726618f, -0.49193421f, 0.423223078f});
    set(h0->W_key->weight, {-0.419641405f, -0.459017664f, -0.364820182f, 0.261478186f, -0.213326395f, 0.216052175f});
    set(h0->W_value->weight, {-0.490014136f, -0.350292057f, -0.211989194f, -0.11346072f, -0.440439373f, 0.378043622f});
    set(h1->W_query->weight, {-0.13615717f, 0.185322329f, 0.408269495f, 0.107563816f, 0.157876849f, 0.557292342f});
    set(h1->W_key->weight, {-0.260390401f, 0.182876408f, -0.256872445f, 0.41260317f, 0.461104512f, -0.532300949f});
    set(h1->W_value->weight, {0.492852628f, 0.275693059f, 0.251590222f, 0.237680584f, 0.479950726f, -0.0762330666f});
    Tensor context_vecs = mha(batch);
    std::cout << context_vecs << "\n";
    std::cout << "context_vecs.shape: " << shape_str(context_vecs.shape()) << "\n\n";

    std::cout << "== The fused MultiHeadAttention ==\n";
    nn::CausalMultiHeadAttention fused(d_in, d_out, context_length, 0.0, /*num_heads=*/2);
    set(fused.W_query->weight, {-0.235429645f, 0.0191244762f, -0.286745936f, 0.217726618f, -0.49193421f, 0.423223078f});
    set(fused.W_key->weight, {-0.419641405f, -0.459017664f, -0.364820182f, 0.261478186f, -0.213326395f, 0.216052175f});
    set(fused.W_value->weight,
        {-0.490014136f, -0.350292057f, -0.211989194f, -0.11346072f, -0.440439373f, 0.378043622f});
    set(fused.out_proj->weight, {-0.166757792f, 0.22697258f, 0.500025988f, 0.131738231f});
    set(fused.out_proj->bias, {0.193358868f, 0.682540953f});
    context_vecs = fused(batch);
    std::cout << context_vecs << "\n";
    std::cout << "context_vecs.shape: " << shape_str(context_vecs.shape()) << "\n\n";

    std::cout << "== Per-head batched matmul: (b, num_heads, num_tokens, head_dim) = (1, 2, 3, 4) ==\n";
    const Tensor a = tensor(std::vector<float>{0.2745f, 0.6584f, 0.2775f, 0.8573f, 0.8993f, 0.0390f, 0.9268f, 0.7388f,
                                               0.7179f, 0.7058f, 0.9156f, 0.4340f, 0.0772f, 0.3565f, 0.1479f, 0.5331f,
                                               0.4066f, 0.2318f, 0.4545f, 0.9737f, 0.4606f, 0.5159f, 0.4220f, 0.5786f},
                            {1, 2, 3, 4});
    std::cout << matmul(a, a.transpose(2, 3)) << "\n";
    const Tensor first_head = a.select(0, 0).select(0, 0), second_head = a.select(0, 0).select(0, 1);
    std::cout << "First head:\n " << matmul(first_head, first_head.mT()) << "\n";
    std::cout << "\nSecond head:\n " << matmul(second_head, second_head.mT()) << "\n\n";

    std::cout << "== Wrapper <-> fused: the same function in two layouts ==\n";
    manual_seed(7);
    nn::MultiHeadAttentionWrapper wrapper(d_in, d_out, context_length, 0.0, 2, /*qkv_bias=*/true, /*out_proj=*/true);
    wrapper.eval();
    auto as_fused = nn::wrapper_to_fused(wrapper);
    std::cout << wrapper.repr() << "\n" << as_fused->repr() << "\n";
    const Tensor x = randn({2, 6, 3});
    const Tensor gates = tensor(std::vector<float>{1.0f, 0.5f}, {2});
    std::cout << "max |wrapper(x) - wrapper_to_fused(wrapper)(x)| = " << max_abs_diff(wrapper(x), (*as_fused)(x))
              << "\n";
    std::cout << "  with head gates [1, 0.5]:                      "
              << max_abs_diff(wrapper.forward(x, gates), as_fused->forward(x, gates)) << "\n";
    auto back = nn::fused_to_wrapper(fused);
    std::cout << "max |fused(batch) - fused_to_wrapper(fused)(batch)| = " << max_abs_diff(fused(batch), (*back)(batch))
              << "\n";
  } catch (const Error& e) {
    std::cerr << "multihead_attention: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
