// Every differentiable op of headlab. Each validates its inputs and infers the output shape,
// calls the backend of the inputs' device, and records its backward (see autograd/engine.h).
// Shapes follow PyTorch: row-major, batch dims first, broadcasting by trailing dims.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "autograd/engine.h"
#include "autograd/generator.h"
#include "autograd/tensor.h"
#include "base/enum_names.h"

namespace headlab {

struct Backend;

// ---- factories ----
Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = kCPU);
Tensor ones(const Shape& shape, DType dtype = DType::f32, Device device = kCPU);
Tensor full(const Shape& shape, double value, DType dtype = DType::f32, Device device = kCPU);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor arange(double start, double end, double step = 1, DType dtype = DType::i64, Device device = kCPU);
Tensor arange(int64_t end, DType dtype = DType::i64, Device device = kCPU);
Tensor eye(int64_t n, DType dtype = DType::f32, Device device = kCPU);
Tensor tensor(const std::vector<float>& values, const Shape& shape = {}, Device device = kCPU);
Tensor tensor(const std::vector<double>& values, const Shape& shape = {}, Device device = kCPU);
Tensor tensor(const std::vector<int64_t>& values, const Shape& shape = {}, Device device = kCPU);
Tensor tensor_bool(const std::vector<bool>& values, const Shape& shape = {}, Device device = kCPU);
Tensor scalar_tensor(double value, DType dtype = DType::f32, Device device = kCPU);
Tensor rand(const Shape& shape, Generator& gen = default_generator(), DType dtype = DType::f32, Device device = kCPU);
Tensor randn(const Shape& shape, Generator& gen = default_generator(), DType dtype = DType::f32, Device device = kCPU);
Tensor uniform(const Shape& shape, double lo, double hi, Generator& gen = default_generator(), DType dtype = DType::f32,
               Device device = kCPU);
Tensor randint(int64_t low, int64_t high, const Shape& shape, Generator& gen = default_generator(),
               Device device = kCPU);

// ---- elementwise (broadcasting) ----
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double s);
Tensor mul(const Tensor& a, double s);
Tensor affine(const Tensor& a, double scale, double shift);  // scale * a + shift
Tensor neg(const Tensor& a);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor sqrt(const Tensor& a);
Tensor rsqrt(const Tensor& a);
Tensor pow(const Tensor& a, double exponent);
Tensor abs(const Tensor& a);
Tensor tanh(const Tensor& a);
Tensor sigmoid(const Tensor& a);
Tensor relu(const Tensor& a);
Tensor gelu(const Tensor& a, bool tanh_approximation = false);
// comparisons (no gradient): bool results
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);
Tensor& masked_fill_(Tensor& x, const Tensor& mask, double value);
// x += b, x -= b in place (b broadcast to x's shape; gradients reach x's old value, so b must not need one)
Tensor& add_(Tensor& x, const Tensor& b);
Tensor& sub_(Tensor& x, const Tensor& b);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a);
Tensor operator+(const Tensor& a, double s);
Tensor operator-(const Tensor& a, double s);
Tensor operator*(const Tensor& a, double s);
Tensor operator/(const Tensor& a, double s);
Tensor operator+(double s, const Tensor& a);
Tensor operator-(double s, const Tensor& a);
Tensor operator*(double s, const Tensor& a);
Tensor operator/(double s, const Tensor& a);

// ---- reductions (dims may be negative; an empty dims list reduces everything) ----
Tensor sum(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
Tensor amax(const Tensor& x, const Shape& dims = {}, bool keepdim = false);  // ties share the gradient
Tensor var(const Tensor& x, const Shape& dims = {}, bool keepdim = false, int64_t correction = 1);
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);  // int64, no gradient
Tensor sum_to(const Tensor& x, const Shape& shape);                 // undo broadcasting by summing

// ---- linear algebra ----
// a: (..., M, K), b: (..., K, N) -> (..., M, N); 1-D operands as in torch.matmul
Tensor matmul(const Tensor& a, const Tensor& b);
// x: (..., in), weight: (out, in), bias: (out) or undefined -> (..., out). One GEMM, bias fused as beta. A weight
// stored narrower (bfloat16; q8_0 or q4_k blocks, (out, in / dtype_block)) takes a float32 x, without gradients.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());
// w: (out, in) floating -> (out, in / dtype_block(block)) of ggml's blocks (block: q8_0 or q4_k; in a multiple of
// its block); on the CPU, no gradient. dequantize: back to (out, in) float32, as the linear layer widens them.
Tensor quantize(const Tensor& w, DType block);
Tensor dequantize(const Tensor& q);
// pre = linear(x, weight, bias) and post = gelu(pre, tanh_approximation), from one pass over the rows where the
// backend has one (the CPU's libxsmm products: GELU applied while a few rows sit in L1), else the two ops; the
// autograd graph is the two ops' either way. An MLP's first half.
struct LinearGelu {
  Tensor pre, post;
};
LinearGelu linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias, bool tanh_approximation);

// ---- shape and views ----
Tensor view(const Tensor& x, const Shape& shape);     // -1 infers one dim; must be expressible as a view
Tensor reshape(const Tensor& x, const Shape& shape);  // a view when possible, a copy otherwise
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
Tensor permute(const Tensor& x, const Shape& dims);
Tensor unsqueeze(const Tensor& x, int64_t d);
Tensor squeeze(const Tensor& x, int64_t d);
Tensor squeeze(const Tensor& x);
Tensor expand(const Tensor& x, const Shape& shape);  // -1 keeps a dim
Tensor narrow(const Tensor& x, int64_t d, int64_t start, int64_t length);
Tensor slice(const Tensor& x, int64_t d, int64_t start, int64_t end, int64_t step = 1);
Tensor select(const Tensor& x, int64_t d, int64_t index);
Tensor contiguous(const Tensor& x);
Tensor clone(const Tensor& x);
Tensor to_device(const Tensor& x, Device device);
Tensor to_dtype(const Tensor& x, DType dtype);
Tensor cat(const std::vector<Tensor>& xs, int64_t d);
Tensor stack(const std::vector<Tensor>& xs, int64_t d);
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t d);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t d);
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t d);
Tensor index_select(const Tensor& x, int64_t d, const Tensor& index);
Tensor repeat_interleave(const Tensor& x, int64_t repeats, int64_t d);
Tensor triu(const Tensor& x, int64_t diagonal = 0);
Tensor tril(const Tensor& x, int64_t diagonal = 0);

// ---- neural-network ops ----
Tensor softmax(const Tensor& x, int64_t d);
Tensor log_softmax(const Tensor& x, int64_t d);
// scores: (..., Q, K); valid_lens: undefined, (B,) or (B, Q) int64 where B = product of the leading dims
// (or any shape whose numel equals the number of leading rows / Q). Positions >= valid length get 0;
// a row with valid length 0 is all zeros, with zero gradient.
Tensor masked_softmax(const Tensor& scores, const Tensor& valid_lens, double scale = 1.0);
// scores: (..., T, T): row i attends to keys <= i (+ (K - Q) when K > Q is not supported: Q == K <= K).
Tensor causal_softmax(const Tensor& scores, double scale = 1.0);
Tensor dropout(const Tensor& x, double p, bool training, Generator& gen = default_generator());
// Which keys each query of scaled_dot_product_attention sees: all, keys <= its own position
// (causal, Tq == Tk), or the first valid_lens of them (int64 (B,) or (B, Tq), the same for every
// head; a length of 0 gives a zero output row and zero gradients, as in masked_softmax). A window w > 0
// (sliding-window attention: Mistral, Qwen2's, GPT-Neo's local layers) also hides every key more than w - 1
// before the row's last visible one: row i of a causal mask sees keys (i - w, i].
struct AttentionMask {
  enum class Kind : uint8_t { none, causal, lengths };
  Kind kind = Kind::none;
  Tensor valid_lens;
  int64_t window = 0;
  static AttentionMask none() { return {}; }
  static AttentionMask causal() { return {Kind::causal, Tensor()}; }
  static AttentionMask lengths(const Tensor& valid_lens);  // undefined valid_lens: none
  AttentionMask within(int64_t w) const {                  // this mask with a window of w keys (0: none)
    AttentionMask m = *this;
    m.window = w;
    return m;
  }
};
// The weights of scores (B, H, Tq, Tk), or (B, Tq, Tk) as one head, under mask: softmax(scale * scores) over
// the keys each row sees (causal_softmax / masked_softmax; a window's hidden keys set to -inf first).
// softcap > 0: the scaled scores soft-capped first, softcap * tanh(scale * scores / softcap) (Gemma 2's).
Tensor attention_softmax(const Tensor& scores, const AttentionMask& mask, double scale, double softcap = 0.0);
// q: (B, H, Tq, D), k: (B, H, Tk, D), v: (B, H, Tk, Dv) -> (B, H, Tq, Dv); 3-D (B, T, *) inputs run
// as one head. softmax(scale * q k^T, masked), dropped out with p when training (the dropout op's
// Philox mask over the (B, H, Tq, Tk) weights, advancing gen as it would), @ v. scale defaults to
// 1/sqrt(D). Fused where the backend has a kernel for the head sizes (FlashAttention's algorithm:
// saves one log-sum-exp per query row, never the weights), else the composite path below; which one
// runs is set by set_fused_attention. softcap > 0 (attention_softmax's) runs the composite path.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionMask& mask = {},
                                    double dropout_p = 0.0, bool training = false, Generator& gen = default_generator(),
                                    std::optional<double> scale = std::nullopt, double softcap = 0.0);
// Keys or values (B, Hkv, T, C) repeated to (B, H, T, C) for H query heads (Hkv dividing H): key/value head j
// once per query head that reads it (h / (H / Hkv) == j). The composite path's grouped-query attention.
Tensor repeat_kv(const Tensor& t, int64_t H);
// The same through matmul, causal_softmax / masked_softmax, dropout and matmul (the reference).
Tensor scaled_dot_product_attention_composite(const Tensor& q, const Tensor& k, const Tensor& v,
                                              const AttentionMask& mask = {}, double dropout_p = 0.0,
                                              bool training = false, Generator& gen = default_generator(),
                                              std::optional<double> scale = std::nullopt, double softcap = 0.0);
// Where scaled_dot_product_attention runs the fused kernel (process-wide, like torch.backends.cuda's
// SDP switches): automatic (where the backend's measurements say it is faster: always on the CPU; on a GPU
// float32 without dropout at every size for a forward alone and up to head size 64 with a backward, else
// short sequences of small heads), always (least memory: O(T) saved state instead of the O(T^2)
// weights), or never (the composite path).
enum class FusedAttention : uint8_t { automatic, always, never };
void set_fused_attention(FusedAttention when);
FusedAttention fused_attention();
// Whether the fused attention's backward gives the same bits on every run (process-wide, like
// torch.use_deterministic_algorithms for it): off by default, where a GPU kernel sums dQ with atomics (the CUDA
// tensor-core path, as PyTorch's memory-efficient attention does by default); on, it computes dQ in a second
// pass, each element with one writer. The CPU's kernels are deterministic either way.
void set_deterministic_attention(bool on);
bool deterministic_attention();
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
// LLaMA's RMSNorm of the last dim: x / sqrt(mean(x^2) + eps) * weight (weight (C) or undefined). Fused where
// the backend has the kernel (the CPU), else rms_norm_composite, the reference it is tested against.
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-6);
Tensor rms_norm_composite(const Tensor& x, const Tensor& weight, double eps = 1e-6);
// x * sigmoid(x) (PyTorch's silu), the gate of LLaMA's SwiGLU feed-forward.
Tensor silu(const Tensor& x);
// Rotary position embedding (Su et al.) of x (B, T, H, D): the first R = 2 * cos.size(1) dims of each head
// rotate by position, the rest pass through. cos, sin: (T, R/2), the angles of the positions x holds
// (rotary_angles). interleaved: dims (2i, 2i+1) rotate together (Meta's and llama2.c's layout); else (i, i + R/2)
// (Hugging Face's rotate_half). Its backward is the inverse rotation.
Tensor rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin, bool interleaved);
// How rotary frequencies are rescaled for a context longer than the one a model was first trained on
// (transformers' rope_scaling): linear divides every frequency by factor; llama3 (Llama 3.1 and 3.2) divides
// the low ones (wavelengths above original_context / low_freq_factor), keeps the high ones (below
// original_context / high_freq_factor) and blends the band between.
enum class RopeScalingKind { none, linear, llama3 };
constexpr auto enum_table(RopeScalingKind) {  // enum_name, parse_enum (base/enum_names.h): transformers' rope_type
  return std::to_array<EnumName<RopeScalingKind>>(
      {{RopeScalingKind::none, "none"}, {RopeScalingKind::linear, "linear"}, {RopeScalingKind::llama3, "llama3"}});
}
struct RopeScaling {
  RopeScalingKind kind = RopeScalingKind::none;
  double factor = 1.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3's
  int64_t original_context = 0;                          // llama3's original_max_position_embeddings
  bool operator==(const RopeScaling&) const = default;
};
// The R/2 frequencies theta^(-2i/R), i < R/2, rescaled as `scaling` says (transformers' inv_freq), in float64.
std::vector<double> rotary_frequencies(int64_t R, double theta, const RopeScaling& scaling = {});
// cos and sin (T, R/2) of positions [offset, offset + T) at rotary_frequencies(R, theta, scaling), computed in
// float64 and cast to dtype.
std::pair<Tensor, Tensor> rotary_angles(int64_t offset, int64_t T, int64_t R, double theta, DType dtype, Device device,
                                        const RopeScaling& scaling = {});
Tensor embedding(const Tensor& weight, const Tensor& indices);  // weight: (V, C), indices: any int64 shape
enum class Reduction { mean, sum, none };
// PyTorch's cross_entropy ignore_index: targets equal to it carry no loss and no score.
inline constexpr int64_t kIgnoreIndex = -100;
// logits: (N, C) or (..., C) with targets of the leading shape; targets int64, ignore_index skipped.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = kIgnoreIndex,
                     Reduction reduction = Reduction::mean);
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::mean);

// ---- sparse codes: k (value, index) pairs a row (sparse autoencoders' features; ops/sparse.cpp) ----
// The k largest entries along the last dim, largest first (ties to the lower index): values (..., k), the gradient
// scattered back to their places; indices (..., k) int64, without gradient.
struct TopK {
  Tensor values, indices;
};
TopK topk(const Tensor& x, int64_t k);
// values, indices: (R, k) -> (R, E): values at their indices, the rest 0 (repeated indices add). Gradient to values.
Tensor sparse_to_dense(const Tensor& values, const Tensor& indices, int64_t E);
// values, indices: (R, k); table: (E, N) -> (R, N), row r = sum_j values[r, j] * table[indices[r, j]]: the product of
// the dense (R, E) matrix the pairs stand for and table, at R k N multiply-adds. Gradients to values and table.
Tensor sparse_matmul(const Tensor& values, const Tensor& indices, const Tensor& table);
// values, indices: (R, k); src: (R, N) -> (E, N), row e = sum over the pairs (r, j) naming e of values[r, j] * src[r]:
// the dense matrix's transpose times src (sparse_matmul's gradient to its table). Gradients to values and src.
Tensor sparse_outer(const Tensor& values, const Tensor& indices, const Tensor& src, int64_t E);
// x: (R, I), w: (I, E), bias: (E) or undefined -> the k largest of x @ w + bias a row, through ReLU (values >= 0) as a
// TopK sparse autoencoder encodes (Gao et al. 2024): the composite topk(matmul(x, w) + bias) then relu, whose backward
// would be two dense (R, E) products; this one's touches only the k columns a row kept (R k (I + 1) each way).
TopK topk_matmul(const Tensor& x, const Tensor& w, const Tensor& bias, int64_t k);
// JumpReLU (Rajamanoharan et al. 2024): x where x > threshold, else 0, threshold (N) over the last dim. The gradient to
// x is exact; to threshold, the paper's straight-through estimate with a rectangle kernel of width `bandwidth`:
// d/dthreshold = -(threshold / bandwidth) [|x - threshold| < bandwidth / 2].
Tensor jumprelu(const Tensor& x, const Tensor& threshold, double bandwidth);
// The step (x > threshold) in x's dtype, its L0 penalty: no gradient to x; to threshold, -(1 / bandwidth)
// [|x - threshold| < bandwidth / 2] (the same estimate).
Tensor threshold_step(const Tensor& x, const Tensor& threshold, double bandwidth);

// ---- non-differentiable helpers used across the library ----
void check_same_device(const char* op, const Tensor& a, const Tensor& b);
Backend& backend_of(const Tensor& t);

}  // namespace headlab
