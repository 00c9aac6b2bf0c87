// d2l.ai 10.3, "Attention Scoring Functions", in headlab: the masked softmax, additive attention and
// scaled dot-product attention on the chapter's toy data, printing what the chapter prints.
// B = batch, Q = queries, K = key-value pairs.
#include <iostream>

#include "nn/attention.h"

using namespace headlab;

int main() {
  try {
    manual_seed(0);
    std::cout << "== Masked softmax ==\n";
    // masked_softmax(torch.rand(2, 2, 4), torch.tensor([2, 3])): one valid length per batch entry
    std::cout << masked_softmax(rand({2, 2, 4}), tensor(std::vector<int64_t>{2, 3}, {2})) << "\n\n";
    // masked_softmax(torch.rand(2, 2, 4), torch.tensor([[1, 3], [2, 4]])): one per query row
    const Tensor X = rand({2, 2, 4});
    std::cout << masked_softmax(X, tensor(std::vector<int64_t>{1, 3, 2, 4}, {2, 2})) << "\n\n";
    // headlab's one deliberate difference from d2l: a row with valid length 0 is all zeros (with zero
    // gradient), where d2l's -1e6 fill would give it uniform weights 1/4.
    std::cout << "valid_lens [[0, 3], [2, 4]] (a zero length):\n"
              << masked_softmax(X, tensor(std::vector<int64_t>{0, 3, 2, 4}, {2, 2})) << "\n\n";

    // The toy data: two identical value matrices, keys all ones, valid lengths 2 and 6.
    Tensor queries = randn({2, 1, 20});  // torch.normal(0, 1, (2, 1, 20))
    const Tensor keys = ones({2, 10, 2});
    const Tensor values = arange(0, 40, 1, DType::f32).reshape({1, 10, 4}).expand({2, 10, 4}).contiguous();
    const Tensor valid_lens = tensor(std::vector<int64_t>{2, 6}, {2});

    std::cout << "== Additive attention ==\n";
    nn::AdditiveAttention attention(/*key_size=*/2, /*query_size=*/20, /*num_hiddens=*/8, /*dropout=*/0.1);
    attention.eval();
    std::cout << attention(queries, keys, values, valid_lens) << "\n";
    // the data behind d2l.show_heatmaps(attention.attention_weights.reshape((1, 1, 2, 10)))
    std::cout << "attention_weights, as (1, 1, 2, 10):\n"
              << attention.attention_weights.reshape({1, 1, 2, 10}) << "\n\n";

    std::cout << "== Scaled dot-product attention ==\n";
    queries = randn({2, 1, 2});  // torch.normal(0, 1, (2, 1, 2))
    nn::DotProductAttention dot(/*dropout=*/0.5);
    dot.eval();
    std::cout << dot(queries, keys, values, valid_lens) << "\n";
    std::cout << "attention_weights, as (1, 1, 2, 10):\n" << dot.attention_weights.reshape({1, 1, 2, 10}) << "\n\n";

    std::cout << attention.repr() << "\n" << dot.repr() << "\n";
  } catch (const Error& e) {
    std::cerr << "attention_scoring: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
