// The narrow kernel interface every device implements (CPU: backends/cpu, CUDA: backends/cuda).
// Kernels see raw pointers, sizes and element strides only: no Tensor, no autograd. Outputs come
// first, then inputs, then sizes. Device and dtype agreement are checked once, in ops/.
#pragma once
#include <cstddef>
#include <cstdint>

#include "base/dtype.h"  // DType and Device: backends never see Tensor or the tape
#include "base/error.h"  // kernels report bad input as headlab::Error
#include "base/sizes.h"  // format_bytes in allocation errors

namespace headlab {

constexpr int kMaxDims = 12;

// An elementwise loop over up to 4 operands sharing one (broadcast) shape. Operand 0 is the output.
// Dims are already collapsed by the op layer: a contiguous tensor arrives as 1 dim of stride 1.
struct Loop {
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int nops = 0;
  void* ptr[4] = {};
  int64_t strides[4][kMaxDims] = {};
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= sizes[i];
    return n;
  }
};

enum class UnaryOp : uint8_t {
  neg,
  exp,
  log,
  sqrt,
  rsqrt,
  abs,
  tanh,
  sigmoid,
  relu,
  gelu,
  gelu_tanh,
  pow,
  affine,
  sign,
  gt_zero
};
// out = op(x); pow uses alpha as the exponent; affine is alpha * x + beta.
enum class BinaryOp : uint8_t { add, sub, mul, div, maximum, minimum, eq, ne, lt, le, gt, ge, logical_and };
constexpr bool is_comparison(BinaryOp op) { return op >= BinaryOp::eq; }
enum class ReduceOp : uint8_t { sum, max, min, argmax };
// Which rows of a softmax are valid up to where: all, by a per-row length, or causally.
enum class SoftmaxMask : uint8_t { none, lengths, causal };

// One (B, H, T, C) tensor of the fused attention kernels: element (b, h, t, c) sits at
// p[b * sb + h * sh + t * st + c]. Operands are read, results written.
template <typename Ptr>
struct AttnView {
  Ptr* p = nullptr;
  int64_t sb = 0, sh = 0, st = 0;
};
using AttnOperand = AttnView<const void>;
using AttnResult = AttnView<void>;
// Sizes, scale, mask and dropout of one fused attention call.
struct AttnParams {
  int64_t B = 0, H = 0, Tq = 0, Tk = 0, D = 0, Dv = 0;
  double scale = 1.0;
  SoftmaxMask mask = SoftmaxMask::none;
  const int64_t* lengths = nullptr;  // (B * H * Tq) per-row valid lengths when mask == lengths
  double dropout_p = 0.0;            // 0: no dropout
  uint64_t seed = 0, offset = 0;
  // Grouped-query attention: query head h reads key/value head h / group of k and v, which have H / group
  // heads (multi-query: group = H). Only where has_grouped_attention(); dk and dv stay per query head.
  int64_t group = 1;
  // Backward: every gradient element written by one thread in a fixed order (set_deterministic_attention), or
  // where a kernel is faster with atomics (the CUDA tensor-core path's dQ), summed in whatever order they land.
  bool deterministic = false;
};

struct Backend {
  virtual ~Backend() = default;
  virtual const char* name() const = 0;

  // ---- memory ----
  virtual void* alloc(size_t nbytes) = 0;
  virtual void free(void* p) = 0;
  virtual void copy_from_host(void* dst, const void* src, size_t nbytes) = 0;
  virtual void copy_to_host(void* dst, const void* src, size_t nbytes) = 0;
  virtual void synchronize() = 0;
  virtual size_t bytes_in_use() const = 0;
  virtual size_t peak_bytes() const = 0;
  virtual void reset_peak() = 0;

  // ---- fill, copy, elementwise ----
  virtual void fill(DType dt, const Loop& l, double value) = 0;  // op 0
  virtual void arange(DType dt, void* out, int64_t n, double start, double step) = 0;
  virtual void copy(DType dst_dt, DType src_dt, const Loop& l) = 0;  // 0 <- 1, casting
  virtual void unary(UnaryOp op, DType dt, const Loop& l, double alpha, double beta) = 0;
  // din = dout * op'(x), with y = op(x) available for ops whose derivative is cheaper from y.
  // Contiguous, n elements. Ops: exp, log, sqrt, rsqrt, abs, tanh, sigmoid, relu, gelu, gelu_tanh, pow.
  virtual void unary_backward(UnaryOp op, DType dt, void* din, const void* dout, const void* x, const void* y,
                              int64_t n, double alpha) = 0;
  virtual void binary(BinaryOp op, DType dt, const Loop& l) = 0;  // 0 = 1 op 2; comparisons write bool
  virtual void where(DType dt, const Loop& l) = 0;                // 0 = (bool)1 ? 2 : 3
  // Reduce `in` over the inner dims for each outer index; out is contiguous over the outer dims.
  virtual void reduce(ReduceOp op, DType dt, void* out, const void* in, int n_outer, const int64_t* outer_sizes,
                      const int64_t* outer_strides, int n_inner, const int64_t* inner_sizes,
                      const int64_t* inner_strides) = 0;
  virtual bool all_finite(DType dt, const void* p, int64_t n) = 0;  // anomaly mode
  // Range check for index tensors: returns true iff every idx in [lo, hi) (waits for the device).
  virtual bool indices_in_range(const int64_t* idx, int64_t n, int64_t lo, int64_t hi) = 0;
  // The check the indexing ops make: throws "<op>: index v is out of range for size n (expected 0..n-1)".
  // The CPU throws at once. CUDA checks on the device without waiting (an embedding lookup per decoded token
  // must not stall the stream) and throws at the next call that waits for the device (a copy to the host,
  // synchronize); meanwhile its kernels read a bad index as a zero row and add nothing through it.
  // `op` is a string literal (kept until the check is read).
  virtual void check_indices(const char* op, const int64_t* idx, int64_t n, int64_t size) = 0;

  // ---- GEMM: C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b], row-major, b < batch ----
  virtual void gemm(DType dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha, const void* A,
                    int64_t lda, int64_t stride_a, const void* B, int64_t ldb, int64_t stride_b, double beta, void* C,
                    int64_t ldc, int64_t stride_c, int64_t batch) = 0;

  // ---- a linear layer in one kernel: out (rows, N) = x (rows, K) @ w^T + bias ----
  // CUDA's for a few rows (decoding), the CPU's where libxsmm serves the sizes (training's small products).
  // w: (N, K) contiguous; x's rows ldx apart; bias (N) contiguous or null; out contiguous. Returns false where the
  // backend has no kernel for these sizes, and the op runs gemm instead (the bias first copied into out).
  virtual bool linear_rows(DType dt, void* out, const void* x, int64_t ldx, const void* w, const void* bias,
                           int64_t rows, int64_t N, int64_t K) {
    (void)dt, (void)out, (void)x, (void)ldx, (void)w, (void)bias, (void)rows, (void)N, (void)K;
    return false;
  }
  // ---- a linear layer whose weight is stored narrower than float32 (bfloat16: nn::to_bfloat16_weights; ggml's
  // Q8_0 or Q4_K blocks: nn::to_quantized_weights): out (rows, N) float32 = x (rows, K) float32 @ w^T + bias, each
  // weight widened to float32 as it is read (exactly: backends/quant_blocks.h's values) ----
  // w: (N, K) bfloat16 contiguous, or N rows of K / dtype_block(wdt) blocks; x's rows ldx apart; bias (N) float32
  // contiguous or null; out contiguous. Returns false where the backend has no such kernel (the op then says so).
  virtual bool linear_stored(DType wdt, void* out, const void* x, int64_t ldx, const void* w, const void* bias,
                             int64_t rows, int64_t N, int64_t K) {
    (void)wdt, (void)out, (void)x, (void)ldx, (void)w, (void)bias, (void)rows, (void)N, (void)K;
    return false;
  }
  // ---- the same with GELU in the same pass: pre = x @ w^T + bias, post = GELU(pre) (tanh form or exact) ----
  // As linear_rows, bias required, post (rows, N) contiguous. False where the backend has no kernel for these
  // sizes, and the op runs the linear layer, then gelu.
  virtual bool linear_gelu_rows(DType dt, void* pre, void* post, const void* x, int64_t ldx, const void* w,
                                const void* bias, int64_t rows, int64_t N, int64_t K, bool tanh_approximation) {
    (void)dt, (void)pre, (void)post, (void)x, (void)ldx, (void)w, (void)bias, (void)rows, (void)N, (void)K;
    (void)tanh_approximation;
    return false;
  }

  // ---- softmax over the last dim of contiguous (rows, cols); y = softmax(scale * x) ----
  // mask: lengths -> row r keeps columns < lengths[r]; causal -> row r keeps columns <= r % q_len.
  // A row with nothing valid is all zeros.
  virtual void softmax_forward(DType dt, void* y, const void* x, int64_t rows, int64_t cols, double scale,
                               SoftmaxMask mask, const int64_t* lengths, int64_t q_len) = 0;
  // dx = scale * y * (dy - sum(dy * y))
  virtual void softmax_backward(DType dt, void* dx, const void* dy, const void* y, int64_t rows, int64_t cols,
                                double scale) = 0;
  virtual void log_softmax_forward(DType dt, void* y, const void* x, int64_t rows, int64_t cols) = 0;
  // dx = dy - exp(y) * sum(dy)
  virtual void log_softmax_backward(DType dt, void* dx, const void* dy, const void* y, int64_t rows, int64_t cols) = 0;

  // ---- layer norm over the last dim of contiguous (rows, cols); weight/bias may be null ----
  virtual void layernorm_forward(DType dt, void* y, void* mean, void* rstd, const void* x, const void* w, const void* b,
                                 int64_t rows, int64_t cols, double eps) = 0;
  // dx is written; dw and db (when not null) are written (not accumulated).
  virtual void layernorm_backward(DType dt, void* dx, void* dw, void* db, const void* dy, const void* x,
                                  const void* mean, const void* rstd, const void* w, int64_t rows, int64_t cols) = 0;

  // ---- RMS norm over the last dim of contiguous (rows, cols): y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps) ----
  // Where has_rms_norm() is false the op runs its composite (ops/nn_ops.cpp).
  virtual bool has_rms_norm() const { return false; }
  virtual void rmsnorm_forward(DType dt, void* y, void* rstd, const void* x, const void* w, int64_t rows, int64_t cols,
                               double eps) {
    (void)dt, (void)y, (void)rstd, (void)x, (void)w, (void)rows, (void)cols, (void)eps;
    HL_FAIL(name(), ": rmsnorm_forward is not implemented");
  }
  // dx is written; dw (when not null) is written (not accumulated).
  virtual void rmsnorm_backward(DType dt, void* dx, void* dw, const void* dy, const void* x, const void* rstd,
                                const void* w, int64_t rows, int64_t cols) {
    (void)dt, (void)dx, (void)dw, (void)dy, (void)x, (void)rstd, (void)w, (void)rows, (void)cols;
    HL_FAIL(name(), ": rmsnorm_backward is not implemented");
  }

  // ---- fused scaled-dot-product attention (FlashAttention-style): O(B*H*Tq) saved state ----
  // Every tensor is (B, H, T, *) with a contiguous last dim; AttnView gives the other strides.
  // Row (b, h, i) sees keys j < valid where valid = Tk (none), i + 1 (causal, Tq == Tk) or
  // lengths[(b * H + h) * Tq + i] (lengths); a row with nothing valid gives 0 and gets 0 gradient.
  // Dropout (p > 0) keeps weight element e = ((b * H + h) * Tq + i) * Tk + j iff
  // philox::uniform(seed, offset, e) >= p, as the dropout kernel would on the (B, H, Tq, Tk) weights.
  // Whether attention_forward / attention_backward take these head sizes (q/k D, v Dv); if not, the op
  // runs the composite path.
  virtual bool has_fused_attention(int64_t D, int64_t Dv) const {
    (void)D, (void)Dv;
    return false;
  }
  // Whether the kernels read grouped keys and values (AttnParams::group > 1); if not, the op repeats them.
  virtual bool has_grouped_attention() const { return false; }
  // Whether the fused kernel beats the composite path at Tq queries and Tk keys, in dtype dt, with or without
  // dropout, for a forward alone or one a backward will follow (FusedAttention::automatic asks).
  virtual bool fused_attention_is_faster(DType dt, int64_t Tq, int64_t Tk, int64_t D, int64_t Dv, bool dropout,
                                         bool backward) const {
    (void)dt, (void)Tq, (void)Tk, (void)D, (void)Dv, (void)dropout, (void)backward;
    return true;
  }
  // out: (B, H, Tq, Dv); lse: (B, H, Tq) contiguous, log-sum-exp of the scaled scores (+inf for an
  // empty row). q: (B, H, Tq, D), k: (B, H, Tk, D), v: (B, H, Tk, Dv).
  virtual void attention_forward(DType dt, const AttnResult& out, void* lse, const AttnOperand& q, const AttnOperand& k,
                                 const AttnOperand& v, const AttnParams& a) {
    (void)dt, (void)out, (void)lse, (void)q, (void)k, (void)v, (void)a;
    HL_FAIL(name(), ": attention_forward is not implemented");
  }
  // dq, dk, dv: written (not accumulated); dout: (B, H, Tq, Dv); out and lse as forward gave them.
  virtual void attention_backward(DType dt, const AttnResult& dq, const AttnResult& dk, const AttnResult& dv,
                                  const AttnOperand& dout, const AttnOperand& q, const AttnOperand& k,
                                  const AttnOperand& v, const AttnOperand& out, const void* lse, const AttnParams& a) {
    (void)dt, (void)dq, (void)dk, (void)dv, (void)dout, (void)q, (void)k, (void)v, (void)out, (void)lse, (void)a;
    HL_FAIL(name(), ": attention_backward is not implemented");
  }

  // ---- randomness: Philox4x32-10 keyed by seed, counter = offset + i / 4 (same on every device) ----
  virtual void random_uniform(DType dt, void* out, int64_t n, uint64_t seed, uint64_t offset, double lo, double hi) = 0;
  virtual void random_normal(DType dt, void* out, int64_t n, uint64_t seed, uint64_t offset, double mean,
                             double std) = 0;
  virtual void random_int(void* out, int64_t n, uint64_t seed, uint64_t offset, int64_t lo, int64_t hi) = 0;
  // out = keep ? x / (1 - p) : 0 where keep = uniform(seed, offset)[i] >= p. Applied to dout in backward.
  virtual void dropout(DType dt, void* out, const void* x, int64_t n, double p, uint64_t seed, uint64_t offset) = 0;

  // ---- gather / scatter along one dim of contiguous (outer, dim, inner) ----
  // out[o, i, :] = in[o, idx[i], :]
  virtual void index_select(DType dt, void* out, const void* in, const int64_t* idx, int64_t outer, int64_t in_dim,
                            int64_t inner, int64_t n_idx) = 0;
  // dst[o, idx[i], :] += src[o, i, :]
  virtual void index_add(DType dt, void* dst, const void* src, const int64_t* idx, int64_t outer, int64_t dst_dim,
                         int64_t inner, int64_t n_idx) = 0;

  // ---- sparse rows: k (index, value) pairs a row, as a TopK sparse autoencoder's codes; idx (rows, k) in [0, entries)
  // ---- A backend without them (CUDA, for now) throws naming the op. values, idx: (rows, k) <- the k largest of each
  // row of x (rows, cols), largest first, ties to the lower index.
  virtual void topk_rows(DType, void*, int64_t*, const void*, int64_t, int64_t, int64_t) { missing("topk"); }
  // out (rows, n) = sum_j values[r, j] * table[idx[r, j], :], table (entries, n).
  virtual void sparse_rows_gather(DType /*dt*/, void* /*out*/, const void* /*values*/, const int64_t* /*idx*/,
                                  const void* /*table*/, int64_t /*rows*/, int64_t /*k*/, int64_t /*n*/) {
    missing("sparse_matmul");
  }
  // dots (rows, k) = a[r, :] . table[idx[r, j], :], a (rows, n).
  virtual void sparse_rows_dot(DType /*dt*/, void* /*dots*/, const void* /*a*/, const int64_t* /*idx*/,
                               const void* /*table*/, int64_t /*rows*/, int64_t /*k*/, int64_t /*n*/) {
    missing("sparse_matmul");
  }
  // out (entries, n) = the sum over (r, j) with idx[r, j] == e of values[r, j] * src[r, :] (overwritten; rows of
  // entries no pair names are zero), src (rows, n).
  virtual void sparse_rows_scatter(DType /*dt*/, void* /*out*/, const void* /*values*/, const int64_t* /*idx*/,
                                   const void* /*src*/, int64_t /*rows*/, int64_t /*k*/, int64_t /*n*/,
                                   int64_t /*entries*/) {
    missing("sparse_outer");
  }

  // ---- cross entropy over contiguous logits (rows, classes) ----
  // loss[r] = logsumexp(logits[r]) - logits[r, target[r]]; 0 where target == ignore_index.
  virtual void cross_entropy_forward(DType dt, void* loss, const void* logits, const int64_t* targets, int64_t rows,
                                     int64_t classes, int64_t ignore_index) = 0;
  // dlogits[r] = dloss[r * dloss_stride] * scale * (softmax(logits[r]) - onehot(target[r])); 0 if ignored.
  virtual void cross_entropy_backward(DType dt, void* dlogits, const void* dloss, int64_t dloss_stride, double scale,
                                      const void* logits, const int64_t* targets, int64_t rows, int64_t classes,
                                      int64_t ignore_index) = 0;

  // ---- optimizer updates, in place over n contiguous elements (PyTorch's formulas) ----
  virtual void sgd_step(DType dt, void* param, const void* grad, void* momentum_buf, int64_t n, double lr,
                        double momentum, double dampening, double weight_decay, bool nesterov, bool first_step) = 0;
  // decoupled: AdamW (param *= 1 - lr * wd) else Adam (grad += wd * param).
  virtual void adam_step(DType dt, void* param, const void* grad, void* exp_avg, void* exp_avg_sq, int64_t n, double lr,
                         double beta1, double beta2, double eps, double weight_decay, int64_t step, bool decoupled) = 0;

 private:
  [[noreturn]] void missing(const char* op) const {
    HL_FAIL(op, ": not implemented on the ", name(), " backend yet (it runs on the CPU)");
  }
};

// The backend that owns memory on `device`. CUDA without a build or without a GPU throws a clear error.
Backend& backend_for(Device device);

// "<op>: out of memory allocating 3.0 GiB (3221225472 bytes) on <device>", where op is the
// innermost OpScope (base/error.h), or "<device> alloc" outside every op.
std::string out_of_memory_message(size_t nbytes, const std::string& device);
Backend& cpu_backend();
// Call in main() before the program's work: applies the CPU backend's threading policy, which must be
// in place before the OpenMP runtime starts (backends/cpu/omp_policy.h: it may re-execute the program,
// so nothing before it may have effects that a second start would repeat).
void prepare_process(char** argv);
bool cuda_available();  // built with CUDA and a GPU is visible
bool cuda_built();
// Which kernels the CPU's float GEMMs take here: "libxsmm" (built, and the CPU has AVX-512) or "OpenBLAS".
const char* cpu_gemm_kernels();

}  // namespace headlab
