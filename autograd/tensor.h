// Tensor: shape + strides + offset over shared, device-tagged storage, plus autograd metadata.
// Views (view, transpose, permute, narrow, expand, ...) share storage and copy nothing;
// the differentiable ops that make them live in ops/, the metadata and data access live here.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"

namespace headlab {

// DType, dtype_name, dtype_size, is_floating, Device and kCPU live in base/dtype.h (shared with backends/).

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "[2, 3]"
int64_t shape_numel(const Shape& s);
Shape contiguous_strides(const Shape& s);

// Raw device memory plus the version counter that every view of it shares (in-place safety).
struct Storage {
  void* data = nullptr;
  size_t nbytes = 0;
  Device device;
  uint64_t version = 0;
  // Memory someone else owns (a NumPy array's): kept alive by `owner`, never freed here.
  std::shared_ptr<void> owner;
  Storage(size_t nbytes, Device device);  // allocates through the device's backend
  Storage(void* external, size_t nbytes, Device device, std::shared_ptr<void> owner);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
};

struct Node;
class Tensor;
using TensorHook = std::function<Tensor(const Tensor&)>;  // grad -> new grad (or undefined to keep)

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;       // in elements
  int64_t offset = 0;  // in elements
  DType dtype = DType::f32;
  bool requires_grad = false;  // leaves only; a non-leaf requires grad iff it has grad_fn
  std::shared_ptr<TensorImpl> grad;
  std::shared_ptr<Node> grad_fn;
  std::vector<TensorHook> hooks;  // leaf hooks (non-leaf hooks live on grad_fn)
};

namespace detail {
// The capture watch. While record() copies a backward closure into its node this names the op, and
// copying a Tensor then throws: a closure must reach tensors through its node, where the saved ones
// are version-checked, so a Tensor captured in it would escape the in-place check.
inline constinit thread_local const char* t_closure_op = nullptr;
[[noreturn]] void throw_tensor_in_closure();  // engine.cpp
}  // namespace detail

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}
  Tensor(const Tensor& other) : impl_(other.impl_) {
    if (detail::t_closure_op) [[unlikely]]
      detail::throw_tensor_in_closure();
  }
  Tensor(Tensor&&) noexcept = default;
  Tensor& operator=(const Tensor&) = default;
  Tensor& operator=(Tensor&&) noexcept = default;
  ~Tensor() = default;

  // ---- factories (seeded random ones take a Generator, default the global one) ----
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = kCPU);
  static Tensor empty_strided(const Shape& shape, const Shape& strides, DType dtype, Device device);
  // A tensor over memory it does not own (strides in elements, non-negative): no copy; `owner` keeps
  // the memory alive as long as any view of it lives (the Python module's NumPy arrays).
  static Tensor from_blob(void* data, const Shape& shape, const Shape& strides, DType dtype, Device device,
                          std::shared_ptr<void> owner);

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

  // ---- metadata ----
  const Shape& shape() const { return impl_->shape; }
  const Shape& strides() const { return impl_->strides; }
  int64_t offset() const { return impl_->offset; }
  int64_t dim() const { return static_cast<int64_t>(impl_->shape.size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t stride(int64_t d) const;
  int64_t numel() const { return shape_numel(impl_->shape); }
  DType dtype() const { return impl_->dtype; }
  Device device() const { return impl_->storage->device; }
  bool is_contiguous() const;
  bool shares_storage(const Tensor& other) const { return impl_->storage == other.impl_->storage; }
  uint64_t version() const { return impl_->storage->version; }
  void bump_version() const { ++impl_->storage->version; }
  // Destructure with a rank check: auto [B, T, C] = x.dims<3>("MultiHeadAttention");
  template <size_t N>
  std::array<int64_t, N> dims(const char* who) const {
    HL_CHECK(dim() == static_cast<int64_t>(N), who, ": expected a ", N, "-D tensor, got shape ", shape_str(shape()));
    std::array<int64_t, N> a{};
    for (size_t i = 0; i < N; ++i) a[i] = impl_->shape[i];
    return a;
  }

  // ---- raw data (host tensors; device tensors must be copied with to(kCPU) first) ----
  void* raw_data() const;  // storage base + offset, on the tensor's device
  template <typename T>
  T* data() const {
    return static_cast<T*>(raw_data());
  }
  template <typename T>
  T item() const;
  template <typename T>
  std::vector<T> to_vector() const;  // any layout, any device, cast to T
  bool all_finite() const;           // no NaN or +-inf anywhere (true for integer and empty tensors)

  // ---- autograd ----
  bool requires_grad() const { return impl_->requires_grad || impl_->grad_fn != nullptr; }
  Tensor& requires_grad_(bool on = true);
  bool is_leaf() const { return impl_->grad_fn == nullptr; }
  Tensor grad() const { return impl_->grad ? Tensor(impl_->grad) : Tensor(); }
  void set_grad(const Tensor& g) const { impl_->grad = g.impl_; }
  void zero_grad() const { impl_->grad.reset(); }
  const std::shared_ptr<Node>& grad_fn() const { return impl_->grad_fn; }
  std::string grad_fn_name() const;
  Tensor detach() const;  // shares storage, no history
  void backward(const Tensor& grad = Tensor(), bool retain_graph = false) const;
  void register_hook(TensorHook hook) const;

  // A view of this tensor's storage with new geometry and no autograd history (ops/ records it).
  Tensor as_strided_raw(const Shape& shape, const Shape& strides, int64_t offset) const;

  // ---- differentiable methods: thin forwards to ops/ (see ops/ops.h for their contracts) ----
  Tensor view(const Shape& shape) const;
  Tensor reshape(const Shape& shape) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor permute(const Shape& dims) const;
  Tensor mT() const;  // transpose of the last two dims
  Tensor unsqueeze(int64_t d) const;
  Tensor squeeze(int64_t d) const;
  Tensor squeeze() const;
  Tensor expand(const Shape& shape) const;
  Tensor narrow(int64_t d, int64_t start, int64_t length) const;
  Tensor select(int64_t d, int64_t index) const;
  Tensor slice(int64_t d, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor contiguous() const;
  Tensor to(Device device) const;
  Tensor to(DType dtype) const;
  Tensor clone() const;

  Tensor sum() const;
  Tensor sum(const Shape& dims, bool keepdim = false) const;
  Tensor mean() const;
  Tensor mean(const Shape& dims, bool keepdim = false) const;
  Tensor max() const;
  Tensor max(const Shape& dims, bool keepdim = false) const;
  Tensor var(const Shape& dims, bool keepdim = false, int64_t correction = 1) const;
  Tensor argmax(int64_t dim, bool keepdim = false) const;

  Tensor matmul(const Tensor& other) const;
  Tensor add(const Tensor& other) const;    // broadcasting, as headlab::add
  Tensor sum_to(const Shape& shape) const;  // undo broadcasting by summing, as headlab::sum_to
  Tensor exp() const;
  Tensor log() const;
  Tensor sqrt() const;
  Tensor rsqrt() const;
  Tensor abs() const;
  Tensor tanh() const;
  Tensor sigmoid() const;
  Tensor relu() const;
  Tensor pow(double exponent) const;
  Tensor softmax(int64_t dim) const;
  Tensor log_softmax(int64_t dim) const;
  Tensor masked_fill(const Tensor& mask, double value) const;
  Tensor& masked_fill_(const Tensor& mask, double value);
  Tensor& add_(const Tensor& other);
  Tensor& sub_(const Tensor& other);
  Tensor& zero_();
  Tensor& fill_(double value);
  Tensor& copy_(const Tensor& src);  // no autograd: for parameter loading and optimizers

 private:
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);
std::string to_string(const Tensor& t);

}  // namespace headlab
