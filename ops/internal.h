// Helpers shared by the op implementations (not part of the public API): dimension wrapping,
// broadcasting, and building collapsed strided Loops for the backend.
#pragma once
#include <vector>

#include "backends/backend.h"
#include "ops/ops.h"

namespace headlab::detail {

int64_t wrap_dim(const char* op, int64_t d, int64_t rank);
Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b);
// Strides that read `t` as if it had shape `out` (stride 0 on broadcast dims).
Shape broadcast_strides(const Tensor& t, const Shape& out);
// A loop over `shape` with operands (output first) given as tensors viewed at that shape;
// dims of size 1 are dropped and adjacent dims merged where every operand allows it.
Loop make_loop(const Shape& shape, const std::vector<const Tensor*>& operands);
void check_defined(const char* op, const Tensor& t, const char* name = "input");
void check_floating(const char* op, const Tensor& t);
void check_same_dtype(const char* op, const Tensor& a, const Tensor& b);
void check_index_tensor(const char* op, const Tensor& idx, const char* name = "index");
// Throws naming an index outside [0, size) (on CUDA at the next synchronisation: Backend::check_indices).
void check_indices(const char* op, const Tensor& idx, int64_t size);
// Copies src into dst (same shape; any strides, dtypes may differ) on dst's device.
void copy_into(const Tensor& dst, const Tensor& src);
// Records out = uop(x) (computed by the caller) as the unary op `op` records it (elementwise.cpp).
void record_unary(const char* op, UnaryOp uop, Tensor& out, const Tensor& x, double alpha = 0);

}  // namespace headlab::detail
