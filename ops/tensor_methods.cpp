// Tensor's method forms of the ops (x.view(...), x.sum(...), ...), and the in-place helpers used
// for parameter loading and optimizer updates.
#include "ops/internal.h"

namespace headlab {

Tensor Tensor::view(const Shape& s) const { return headlab::view(*this, s); }
Tensor Tensor::reshape(const Shape& s) const { return headlab::reshape(*this, s); }
Tensor Tensor::flatten(int64_t a, int64_t b) const { return headlab::flatten(*this, a, b); }
Tensor Tensor::transpose(int64_t a, int64_t b) const { return headlab::transpose(*this, a, b); }
Tensor Tensor::permute(const Shape& d) const { return headlab::permute(*this, d); }
Tensor Tensor::mT() const { return headlab::transpose(*this, -2, -1); }
Tensor Tensor::unsqueeze(int64_t d) const { return headlab::unsqueeze(*this, d); }
Tensor Tensor::squeeze(int64_t d) const { return headlab::squeeze(*this, d); }
Tensor Tensor::squeeze() const { return headlab::squeeze(*this); }
Tensor Tensor::expand(const Shape& s) const { return headlab::expand(*this, s); }
Tensor Tensor::narrow(int64_t d, int64_t s, int64_t n) const { return headlab::narrow(*this, d, s, n); }
Tensor Tensor::select(int64_t d, int64_t i) const { return headlab::select(*this, d, i); }
Tensor Tensor::slice(int64_t d, int64_t s, int64_t e, int64_t st) const { return headlab::slice(*this, d, s, e, st); }
Tensor Tensor::contiguous() const { return headlab::contiguous(*this); }
Tensor Tensor::to(Device d) const { return headlab::to_device(*this, d); }
Tensor Tensor::to(DType t) const { return headlab::to_dtype(*this, t); }
Tensor Tensor::clone() const { return headlab::clone(*this); }

Tensor Tensor::sum() const { return headlab::sum(*this); }
Tensor Tensor::add(const Tensor& other) const { return headlab::add(*this, other); }
Tensor Tensor::sum_to(const Shape& shape) const { return headlab::sum_to(*this, shape); }
Tensor Tensor::sum(const Shape& d, bool k) const { return headlab::sum(*this, d, k); }
Tensor Tensor::mean() const { return headlab::mean(*this); }
Tensor Tensor::mean(const Shape& d, bool k) const { return headlab::mean(*this, d, k); }
Tensor Tensor::max() const { return headlab::amax(*this); }
Tensor Tensor::max(const Shape& d, bool k) const { return headlab::amax(*this, d, k); }
Tensor Tensor::var(const Shape& d, bool k, int64_t c) const { return headlab::var(*this, d, k, c); }
Tensor Tensor::argmax(int64_t d, bool k) const { return headlab::argmax(*this, d, k); }

Tensor Tensor::matmul(const Tensor& o) const { return headlab::matmul(*this, o); }
Tensor Tensor::exp() const { return headlab::exp(*this); }
Tensor Tensor::log() const { return headlab::log(*this); }
Tensor Tensor::sqrt() const { return headlab::sqrt(*this); }
Tensor Tensor::rsqrt() const { return headlab::rsqrt(*this); }
Tensor Tensor::abs() const { return headlab::abs(*this); }
Tensor Tensor::tanh() const { return headlab::tanh(*this); }
Tensor Tensor::sigmoid() const { return headlab::sigmoid(*this); }
Tensor Tensor::relu() const { return headlab::relu(*this); }
Tensor Tensor::pow(double e) const { return headlab::pow(*this, e); }
Tensor Tensor::softmax(int64_t d) const { return headlab::softmax(*this, d); }
Tensor Tensor::log_softmax(int64_t d) const { return headlab::log_softmax(*this, d); }
Tensor Tensor::masked_fill(const Tensor& m, double v) const { return headlab::masked_fill(*this, m, v); }
Tensor& Tensor::masked_fill_(const Tensor& m, double v) { return headlab::masked_fill_(*this, m, v); }
Tensor& Tensor::add_(const Tensor& o) { return headlab::add_(*this, o); }
Tensor& Tensor::sub_(const Tensor& o) { return headlab::sub_(*this, o); }

Tensor& Tensor::fill_(double value) {
  check_inplace("fill_", *this);
  if (numel()) backend_of(*this).fill(dtype(), detail::make_loop(shape(), {this}), value);
  bump_version();
  return *this;
}

Tensor& Tensor::zero_() { return fill_(0.0); }

Tensor& Tensor::copy_(const Tensor& src) {
  detail::check_defined("copy_", src, "source");
  check_inplace("copy_", *this);
  HL_CHECK(detail::broadcast_shapes("copy_", shape(), src.shape()) == shape(), "copy_: source of shape ",
           shape_str(src.shape()), " does not broadcast to ", shape_str(shape()));
  Tensor s = src.detach();
  if (s.device() != device()) s = to_device(s, device());
  if (numel()) {
    const Tensor se = s.as_strided_raw(shape(), detail::broadcast_strides(s, shape()), s.offset());
    detail::copy_into(*this, se);
  }
  bump_version();
  return *this;
}

}  // namespace headlab
