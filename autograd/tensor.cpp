// Tensor metadata, storage and data access, and PyTorch-style printing.
#include "autograd/tensor.h"

#include <cmath>
#include <cstring>
#include <iomanip>
#include <ostream>
#include <sstream>

#include "autograd/engine.h"
#include "backends/backend.h"
#include "base/bfloat16.h"

namespace headlab {

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Shape contiguous_strides(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= std::max<int64_t>(s[i], 1);
  }
  return st;
}

Storage::Storage(size_t n, Device dev) : nbytes(n), device(dev) { data = backend_for(dev).alloc(n); }
Storage::Storage(void* external, size_t n, Device dev, std::shared_ptr<void> keep)
    : data(external), nbytes(n), device(dev), owner(std::move(keep)) {}
Storage::~Storage() {
  if (!owner) backend_for(device).free(data);
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  return empty_strided(shape, contiguous_strides(shape), dtype, device);
}

Tensor Tensor::empty_strided(const Shape& shape, const Shape& strides, DType dtype, Device device) {
  HL_CHECK(static_cast<int>(shape.size()) <= kMaxDims, "tensor: at most ", kMaxDims, " dimensions are supported, got ",
           shape.size());
  int64_t extent = 1;  // elements the strided layout can reach
  for (size_t i = 0; i < shape.size(); ++i) {
    HL_CHECK(shape[i] >= 0, "tensor: negative dimension in shape ", shape_str(shape));
    if (shape[i] == 0)
      extent = 0;
    else if (extent)
      extent += (shape[i] - 1) * strides[i];
  }
  HL_CHECK(extent <= (int64_t{1} << 40), "tensor: shape ", shape_str(shape), " is too large");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(static_cast<size_t>(extent) * dtype_size(dtype), device);
  impl->shape = shape;
  impl->strides = strides;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::from_blob(void* data, const Shape& shape, const Shape& strides, DType dtype, Device device,
                         std::shared_ptr<void> owner) {
  HL_CHECK(shape.size() == strides.size() && static_cast<int>(shape.size()) <= kMaxDims, "tensor: from_blob of shape ",
           shape_str(shape), " with strides ", shape_str(strides));
  HL_CHECK(owner != nullptr, "tensor: from_blob needs an owner of the memory");
  int64_t extent = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    HL_CHECK(shape[i] >= 0 && strides[i] >= 0, "tensor: from_blob takes non-negative sizes and strides, got shape ",
             shape_str(shape), " strides ", shape_str(strides));
    if (shape[i] == 0)
      extent = 0;
    else if (extent)
      extent += (shape[i] - 1) * strides[i];
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage =
      std::make_shared<Storage>(data, static_cast<size_t>(extent) * dtype_size(dtype), device, std::move(owner));
  impl->shape = shape;
  impl->strides = strides;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

static int64_t wrap_dim(int64_t d, int64_t rank, const char* who) {
  // A 0-d tensor has no dims at all (size(0) would read past the shape).
  HL_CHECK(d >= -rank && d < rank, who, ": dimension ", d, " is out of range for a ", rank, "-D tensor");
  return d < 0 ? d + rank : d;
}

int64_t Tensor::size(int64_t d) const { return impl_->shape[wrap_dim(d, dim(), "size")]; }
int64_t Tensor::stride(int64_t d) const { return impl_->strides[wrap_dim(d, dim(), "stride")]; }

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (size_t i = impl_->shape.size(); i-- > 0;) {
    if (impl_->shape[i] == 1) continue;
    if (impl_->strides[i] != expected) return false;
    expected *= impl_->shape[i];
  }
  return true;
}

bool Tensor::all_finite() const {
  if (!defined() || !is_floating(dtype()) || numel() == 0) return true;
  const Tensor c = contiguous();
  return backend_for(c.device()).all_finite(c.dtype(), c.raw_data(), c.numel());
}

void* Tensor::raw_data() const {
  return static_cast<char*>(impl_->storage->data) + impl_->offset * static_cast<int64_t>(dtype_size(dtype()));
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  HL_CHECK(defined(), "to_vector: the tensor is undefined");
  Tensor host = device().is_cuda() ? to(kCPU) : *this;
  host = host.contiguous();
  std::vector<T> out(static_cast<size_t>(host.numel()));
  const int64_t n = host.numel();
  switch (host.dtype()) {
    case DType::f32: {
      const float* p = host.data<float>();
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(p[i]);
      break;
    }
    case DType::f64: {
      const double* p = host.data<double>();
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(p[i]);
      break;
    }
    case DType::i64: {
      const int64_t* p = host.data<int64_t>();
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(p[i]);
      break;
    }
    case DType::b8: {
      const uint8_t* p = host.data<uint8_t>();
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(p[i]);
      break;
    }
    case DType::bf16: {
      const uint16_t* p = host.data<uint16_t>();
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(float_from_bf16(p[i]));
      break;
    }
    case DType::q8_0:
    case DType::q4_k:
      HL_FAIL("to_vector: ", dtype_name(host.dtype()), " blocks hold no single values; dequantize() them first");
  }
  return out;
}

template <typename T>
T Tensor::item() const {
  HL_CHECK(defined() && numel() == 1, "item: expected a tensor with one element, got shape ",
           defined() ? shape_str(shape()) : std::string("(undefined)"));
  return to_vector<T>()[0];
}

template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<int> Tensor::to_vector<int>() const;
template std::vector<uint8_t> Tensor::to_vector<uint8_t>() const;
template float Tensor::item<float>() const;
template double Tensor::item<double>() const;
template int64_t Tensor::item<int64_t>() const;
template bool Tensor::item<bool>() const;

Tensor& Tensor::requires_grad_(bool on) {
  HL_CHECK(is_leaf(), "requires_grad_: can only change requires_grad of leaf tensors (this one comes from ",
           grad_fn_name(), "); use detach() first");
  HL_CHECK(!on || is_floating(dtype()), "requires_grad_: only floating-point tensors can require gradients, got ",
           dtype_name(dtype()));
  impl_->requires_grad = on;
  return *this;
}

std::string Tensor::grad_fn_name() const { return impl_->grad_fn ? impl_->grad_fn->name : std::string(); }

Tensor Tensor::detach() const { return as_strided_raw(shape(), strides(), offset()); }

Tensor Tensor::as_strided_raw(const Shape& shape, const Shape& strides, int64_t offset) const {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = impl_->dtype;
  return Tensor(std::move(impl));
}

void Tensor::backward(const Tensor& grad, bool retain_graph) const { headlab::backward({*this}, {grad}, retain_graph); }

void Tensor::register_hook(TensorHook hook) const {
  HL_CHECK(requires_grad(), "register_hook: cannot register a hook on a tensor that does not require grad");
  if (impl_->grad_fn)
    impl_->grad_fn->hooks.push_back(std::move(hook));
  else
    impl_->hooks.push_back(std::move(hook));
}

// ---- printing, in PyTorch's format: tensor([[1.0000, 2.0000]], grad_fn=<MatmulBackward>) ----
namespace {

void print_values(std::ostream& os, const std::vector<double>& v, const Shape& shape, size_t dim, int64_t& pos,
                  int indent, DType dt, int width, bool sci) {
  const int64_t n = shape.empty() ? 1 : shape[dim];
  const bool last = dim + 1 >= shape.size();
  const int64_t edge = 3;
  const bool summarise = n > 2 * edge && v.size() > 1000;
  auto skip = [&](int64_t count) {  // advance pos past `count` sub-blocks of this dim
    int64_t block = 1;
    for (size_t d = dim + 1; d < shape.size(); ++d) block *= shape[d];
    pos += count * block;
  };
  if (shape.empty()) {
    std::ostringstream e;
    const double x = v[static_cast<size_t>(pos)];
    if (dt == DType::b8)
      e << (x != 0 ? "True" : "False");
    else if (dt == DType::i64)
      e << static_cast<int64_t>(x);
    else if (sci)
      e << std::scientific << std::setprecision(4) << x;
    else
      e << std::fixed << std::setprecision(4) << x;
    os << std::setw(width) << e.str();
    ++pos;
    return;
  }
  os << "[";
  for (int64_t i = 0; i < n; ++i) {
    if (summarise && i == edge) {
      if (last)
        os << "..., ";
      else
        os << "...,\n" << std::string(indent + 1, ' ');
      skip(n - 2 * edge);
      i = n - edge;
    }
    if (last) {
      print_values(os, v, {}, 0, pos, 0, dt, width, sci);
    } else {
      print_values(os, v, shape, dim + 1, pos, indent + 1, dt, width, sci);
    }
    if (i + 1 < n) {
      if (last)
        os << ", ";
      else
        os << ',' << std::string(shape.size() - dim - 1, '\n') << std::string(indent + 1, ' ');
    }
  }
  os << "]";
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "tensor(undefined)";
  const std::vector<double> v = t.to_vector<double>();
  bool sci = false;
  int width = 1;
  if (is_floating(t.dtype())) {
    double mx = 0, mn = INFINITY;
    for (double x : v)
      if (std::isfinite(x) && x != 0) {
        mx = std::max(mx, std::abs(x));
        mn = std::min(mn, std::abs(x));
      }
    sci = mx >= 1e8 || (mn < 1e-4 && mx > 0);
  }
  for (double x : v) {  // width of the widest element so columns line up
    std::ostringstream e;
    if (t.dtype() == DType::i64)
      e << static_cast<int64_t>(x);
    else if (t.dtype() == DType::b8)
      e << (x != 0 ? "True" : "False");
    else if (sci)
      e << std::scientific << std::setprecision(4) << x;
    else
      e << std::fixed << std::setprecision(4) << x;
    width = std::max(width, static_cast<int>(e.str().size()));
  }
  os << "tensor(";
  int64_t pos = 0;
  if (t.numel() == 0)
    os << "[]";
  else
    print_values(os, v, t.shape(), 0, pos, 7, t.dtype(), width, sci);
  if (t.numel() == 0 && t.dim() != 1) {  // PyTorch shows the size of empty tensors unless 1-D
    const std::string s = shape_str(t.shape());
    os << ", size=(" << s.substr(1, s.size() - 2) << ")";
  }
  if (t.device().is_cuda()) os << ", device='" << t.device().str() << "'";
  if (t.dtype() == DType::f64) os << ", dtype=torch.float64";
  if (t.grad_fn())
    os << ", grad_fn=<" << t.grad_fn_name() << ">";
  else if (t.requires_grad())
    os << ", requires_grad=True";
  return os << ")";
}

std::string to_string(const Tensor& t) {
  std::ostringstream os;
  os << t;
  return os.str();
}

}  // namespace headlab
