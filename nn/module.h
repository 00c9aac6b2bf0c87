// Module: the PyTorch-style container of parameters, buffers and submodules, with hierarchical
// state_dict names ("heads.0.W_query.weight"), train/eval mode, device moves and a printed tree.
#pragma once
#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ops/ops.h"

namespace headlab {

// Tensors by state_dict name, in order: parameters, optimizer state, checkpoint contents.
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// The entry named `name` of a list of (name, value) pairs, or end().
template <typename List>
auto find_named(List& list, const std::string& name) {
  return std::find_if(list.begin(), list.end(), [&](const auto& entry) { return entry.first == name; });
}

}  // namespace headlab

namespace headlab::nn {

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  virtual std::string type_name() const = 0;             // "Linear"
  virtual std::string extra_repr() const { return ""; }  // "in_features=3, out_features=2, bias=True"

  // Names exactly like PyTorch's state_dict() keys, in registration order. A tensor shared by two
  // modules (tied weights) is listed once, under its first name, as PyTorch's named_parameters().
  NamedTensors named_parameters() const;
  std::vector<Tensor> parameters() const;
  NamedTensors named_buffers() const;
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const { return children_; }
  int64_t num_parameters() const;
  Tensor parameter(const std::string& name) const;  // by state_dict key; throws naming the key

  void zero_grad();
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Moves (or casts) every parameter and buffer in place: tensors held elsewhere see the move.
  void to(Device device);
  void to(DType dtype);
  // Casts in place the parameters `which` picks by state_dict name (nn::to_bfloat16_weights: linear layers' weights).
  void to(DType dtype, const std::function<bool(const std::string& name, const Tensor& t)>& which);
  // Replaces in place each parameter for which `convert` returns a defined tensor (of any shape or dtype:
  // nn::to_quantized_weights' blocks); tensors held elsewhere see the new value.
  void convert_parameters(const std::function<Tensor(const std::string& name, const Tensor& t)>& convert);
  Device device() const;
  // Copies values by name; every key must exist with the same shape (clear error otherwise).
  void load_parameters(const std::vector<std::pair<std::string, Tensor>>& values, const std::string& source = "");
  // As load_parameters, but each parameter takes over the value's storage instead of copying it, where
  // the value is contiguous and of the parameter's dtype and device (a loader's fresh tensors): a model
  // built under SkipInit then holds its weights once.
  void adopt_parameters(NamedTensors&& values, const std::string& source = "");

  std::string repr() const;  // the tree, as PyTorch prints a module

 protected:
  Tensor register_parameter(const std::string& name, Tensor t);  // returns a handle sharing the stored tensor
  Tensor register_buffer(const std::string& name, Tensor t);
  // Makes this module's parameter `name` the tensor `shared` (weight tying); shapes must agree.
  void tie_parameter(const std::string& name, const Tensor& shared);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    children_.emplace_back(name, m);
    return m;
  }

 private:
  void collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out, bool buffers) const;
  void repr_into(std::string& out, int indent) const;
  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

// While one lives, new modules allocate their parameters without initialising them (a loader that
// overwrites every value next skips the random draws: GPT-2 small's 124M would take about a second,
// and the untouched pages cost no memory). Per thread.
class SkipInit {
 public:
  SkipInit();
  ~SkipInit();
  SkipInit(const SkipInit&) = delete;
  SkipInit& operator=(const SkipInit&) = delete;
  static bool active();

 private:
  bool previous_;
};
// The initial value of a new parameter: make() unless a SkipInit lives, then uninitialised memory.
template <typename Make>
Tensor initial_value(const Shape& shape, Make&& make) {
  return SkipInit::active() ? Tensor::empty(shape) : make();
}

// A module with one tensor in and one out, so it can sit in a Sequential.
class UnaryModule : public Module {
 public:
  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x) { return forward(x); }
};

class ModuleList : public Module {
 public:
  std::string type_name() const override { return "ModuleList"; }
  template <typename M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> m) {
    items_.push_back(m);
    return register_module(std::to_string(items_.size() - 1), std::move(m));
  }
  size_t size() const { return items_.size(); }
  template <typename M = Module>
  std::shared_ptr<M> at(size_t i) const {
    HL_CHECK(i < items_.size(), "ModuleList: index ", i, " is out of range for ", items_.size(), " modules");
    return std::dynamic_pointer_cast<M>(items_[i]);
  }

 private:
  std::vector<std::shared_ptr<Module>> items_;
};

class Sequential : public UnaryModule {
 public:
  std::string type_name() const override { return "Sequential"; }
  template <typename M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> m) {
    items_.push_back(m);
    return register_module(std::to_string(items_.size() - 1), std::move(m));
  }
  Tensor forward(const Tensor& x) override;
  size_t size() const { return items_.size(); }
  template <typename M = UnaryModule>
  std::shared_ptr<M> at(size_t i) const {
    HL_CHECK(i < items_.size(), "Sequential: index ", i, " is out of range for ", items_.size(), " modules");
    return std::dynamic_pointer_cast<M>(items_[i]);
  }

 private:
  std::vector<std::shared_ptr<UnaryModule>> items_;
};

}  // namespace headlab::nn
