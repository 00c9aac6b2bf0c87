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

void Module::collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out, bool buffers) const {
  for (const auto& [name, t] : buffers ? buffers_ : params_)
    if (t.defined()) out.emplace_back(prefix + name, t);
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", out, buffers);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", out, false);
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
  for (const Tensor& t : parameters()) n += t.numel();
  return n;
}

Tensor Module::parameter(const std::string& name) const {
  for (auto& [n, t] : named_parameters())
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
  NoGradGuard no_grad;
  for (auto& [name, t] : named_parameters()) move_in_place(t, t.detach().to(dtype));
  for (auto& [name, t] : named_buffers())
    if (is_floating(t.dtype())) move_in_place(t, t.detach().to(dtype));
}

Device Module::device() const {
  for (const Tensor& t : parameters()) return t.device();
  return kCPU;
}

void Module::load_parameters(const std::vector<std::pair<std::string, Tensor>>& values, const std::string& source) {
  const std::string who = source.empty() ? type_name() : source;
  auto params = named_parameters();
  for (const auto& [name, value] : values) {
    auto it = find_named(params, name);
    HL_CHECK(it != params.end(), who, ": parameter ", name, " does not exist in the model");
    HL_CHECK(it->second.shape() == value.shape(), who, ": parameter ", name, " has shape ", shape_str(value.shape()),
             ", model expects ", shape_str(it->second.shape()));
  }
  for (const auto& [name, t] : params) {
    auto it = find_named(values, name);
    HL_CHECK(it != values.end(), who, ": parameter ", name, " is missing");
  }
  NoGradGuard no_grad;
  for (auto& [name, t] : params) {
    auto it = find_named(values, name);
    Tensor dst = t.detach();
    dst.copy_(it->second.to(t.dtype()));
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
