// Module bookkeeping: hierarchical names, mode flags, device moves, parameter loading and printing.
#include "nn/module.h"

#include <algorithm>

namespace headlab::nn {

Tensor Module::register_parameter(const std::string& name, Tensor t) {
  if (t.defined() && !t.requires_grad()) t.requires_grad_(true);
  params_.emplace_back(name, std::move(t));
  return params_.back().second;
}

Tensor Module::register_buffer(const std::string& name, Tensor t) {
  buffers_.emplace_back(name, std::move(t));
  return buffers_.back().second;
}

namespace {
thread_local bool skip_init = false;
}  // namespace

SkipInit::SkipInit() : previous_(skip_init) { skip_init = true; }
SkipInit::~SkipInit() { skip_init = previous_; }
bool SkipInit::active() { return skip_init; }

void Module::tie_parameter(const std::string& name, const Tensor& shared) {
  auto it = find_named(params_, name);
  HL_CHECK(it != params_.end(), type_name(), ": no parameter '", name, "' to tie");
  HL_CHECK(it->second.shape() == shared.shape(), type_name(), ": cannot tie parameter '", name, "' of shape ",
           shape_str(it->second.shape()), " to a tensor of shape ", shape_str(shared.shape()));
  it->second = shared;
}

void Module::collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out, bool buffers) const {
  for (const auto& [name, t] : buffers ? buffers_ : params_)
    if (t.defined()) out.emplace_back(prefix + name, t);
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", out, buffers);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> all, out;
  collect("", all, false);
  out.reserve(all.size());
  for (auto& entry : all)  // tied weights once (a model has a few hundred parameters at most)
    if (std::none_of(out.begin(), out.end(),
                     [&](const auto& seen) { return seen.second.impl() == entry.second.impl(); }))
      out.push_back(std::move(entry));
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers() const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", out, true);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters()) out.push_back(t);
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const Tensor& t : parameters()) n += t.numel() * dtype_block(t.dtype());  // weights, not a block type's blocks
  return n;
}

Tensor Module::parameter(const std::string& name) const {
  std::vector<std::pair<std::string, Tensor>> all;  // a tied weight answers to each of its names
  collect("", all, false);
  for (auto& [n, t] : all)
    if (n == name) return t;
  HL_FAIL(type_name(), ": no parameter named '", name, "'");
}

void Module::zero_grad() {
  for (const Tensor& t : parameters()) t.zero_grad();
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

namespace {
// Re-points t's TensorImpl at `moved`'s storage, so every handle to t sees the new data.
void move_in_place(const Tensor& t, const Tensor& moved) {
  TensorImpl* impl = t.impl();
  impl->storage = moved.impl()->storage;
  impl->shape = moved.shape();
  impl->strides = moved.strides();
  impl->offset = moved.offset();
  impl->dtype = moved.dtype();
  impl->grad.reset();
}
}  // namespace

void Module::to(Device device) {
  NoGradGuard no_grad;
  for (auto& [name, t] : named_parameters()) move_in_place(t, t.detach().to(device));
  for (auto& [name, t] : named_buffers()) move_in_place(t, t.detach().to(device));
}

void Module::to(DType dtype) {
  to(dtype, [](const std::string&, const Tensor&) { return true; });
  NoGradGuard no_grad;
  for (auto& [name, t] : named_buffers())
    if (is_floating(t.dtype())) move_in_place(t, t.detach().to(dtype));
}

void Module::to(DType dtype, const std::function<bool(const std::string& name, const Tensor& t)>& which) {
  convert_parameters([&](const std::string& name, const Tensor& t) {
    return which(name, t) ? t.detach().to(dtype) : Tensor();
  });
}

void Module::convert_parameters(const std::function<Tensor(const std::string& name, const Tensor& t)>& convert) {
  NoGradGuard no_grad;
  for (auto& [name, t] : named_parameters())
    if (const Tensor moved = convert(name, t); moved.defined()) move_in_place(t, moved);
}

Device Module::device() const {
  for (const Tensor& t : parameters()) return t.device();
  return kCPU;
}

namespace {
// The shape a tensor has in weights: a block type's (rows, blocks) is (rows, blocks * dtype_block).
Shape weights_shape(const Tensor& t) {
  Shape s = t.shape();
  if (is_block_quantized(t.dtype())) s.back() *= dtype_block(t.dtype());
  return s;
}

// Every value names a parameter of the same shape (in weights: blocks fill a float parameter), and every parameter
// has a value.
void load_parameters_check(const NamedTensors& params, const NamedTensors& values, const std::string& who) {
  for (const auto& [name, value] : values) {
    auto it = find_named(params, name);
    HL_CHECK(it != params.end(), who, ": parameter ", name, " does not exist in the model");
    HL_CHECK(weights_shape(it->second) == weights_shape(value), who, ": parameter ", name, " has shape ",
             shape_str(weights_shape(value)), ", model expects ", shape_str(weights_shape(it->second)));
  }
  for (const auto& [name, t] : params) {
    auto it = find_named(values, name);
    HL_CHECK(it != values.end(), who, ": parameter ", name, " is missing");
  }
}

// A parameter given blocks (a quantized file's weight) holds them as they are, read-only (blocks are never written
// in place); a parameter of blocks given floats quantizes them to its block type.
void adopt_blocks(const Tensor& param, const Tensor& value) {
  if (is_block_quantized(value.dtype()))
    move_in_place(param, value.to(param.device()));
  else
    move_in_place(param, quantize(value.detach().to(kCPU), param.dtype()).to(param.device()));
  param.impl()->requires_grad = false;
}
}  // namespace

void Module::load_parameters(const std::vector<std::pair<std::string, Tensor>>& values, const std::string& source) {
  const std::string who = source.empty() ? type_name() : source;
  auto params = named_parameters();
  load_parameters_check(params, values, who);
  NoGradGuard no_grad;
  for (auto& [name, t] : params) {
    const Tensor& value = find_named(values, name)->second;
    if (is_block_quantized(value.dtype()) || is_block_quantized(t.dtype()))
      adopt_blocks(t, value);
    else
      t.detach().copy_(value.to(t.dtype()));
  }
}

void Module::adopt_parameters(NamedTensors&& values, const std::string& source) {
  const auto params = named_parameters();
  {
    const NamedTensors checked = values;  // handles only: the names and shapes are checked once
    load_parameters_check(params, checked, source.empty() ? type_name() : source);
  }
  NoGradGuard no_grad;
  for (auto& [name, t] : params) {
    Tensor& value = find_named(values, name)->second;
    if (is_block_quantized(value.dtype()) || is_block_quantized(t.dtype()))
      adopt_blocks(t, value);
    else if (value.is_contiguous() && value.dtype() == t.dtype() && value.device() == t.device() && !value.requires_grad())
      move_in_place(t, value);
    else
      t.detach().copy_(value.to(t.dtype()));
    value = Tensor();  // the parameter holds it now
  }
}

void Module::repr_into(std::string& out, int indent) const {
  // As torch's Module.__repr__: extra_repr inline when there are no children, else on its own line.
  const std::string extra = extra_repr();
  out += type_name() + "(";
  if (children_.empty()) {
    out += extra;
  } else {
    out += "\n";
    if (!extra.empty()) out += std::string(indent + 2, ' ') + extra + "\n";
    for (const auto& [name, child] : children_) {
      out += std::string(indent + 2, ' ') + "(" + name + "): ";
      child->repr_into(out, indent + 2);
      out += "\n";
    }
    out += std::string(indent, ' ');
  }
  out += ")";
}

std::string Module::repr() const {
  std::string out;
  repr_into(out, 0);
  return out;
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  for (auto& m : items_) h = m->forward(h);
  return h;
}

}  // namespace headlab::nn
