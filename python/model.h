// What the Python module's files share (python/module.cpp, python/cache.cpp): tensors as NumPy arrays and back
// without copies, and a loaded model with its tokenizer, its inputs (text, texts, token ids) and its forwards.
//
// Tensors cross without copies: a headlab tensor becomes a NumPy array over the same memory (the array
// keeps the tensor's storage alive), and a C-contiguous NumPy array of a supported dtype becomes a headlab
// tensor over the array's memory (the tensor keeps the array alive). A copy happens only for an array
// that is not C-contiguous or not float32/float64/int64, and for a tensor on another device.
#pragma once
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "analysis/hooked_run.h"
#include "analysis/residual.h"
#include "autograd/engine.h"
#include "loader/load.h"
#include "nn/generate.h"
#include "train/memory.h"

namespace headlab::python {

namespace py = pybind11;

inline py::dtype numpy_dtype(DType d) {
  switch (d) {
    case DType::f32:
      return py::dtype::of<float>();
    case DType::f64:
      return py::dtype::of<double>();
    case DType::i64:
      return py::dtype::of<int64_t>();
    case DType::b8:
      return py::dtype::of<bool>();
    case DType::bf16:
    case DType::q8_0:
    case DType::q4_k:
      break;
  }
  HL_FAIL("numpy has no ", dtype_name(d), is_block_quantized(d) ? "; dequantize() its blocks first" : "; convert the tensor with .to(float32) first");
}

// The tensor as an array over its memory (on the CPU; another device's tensor is copied there first).
inline py::array to_numpy(const Tensor& t) {
  const Tensor c = t.device() == kCPU ? t : t.to(kCPU);
  const auto item = static_cast<py::ssize_t>(dtype_size(c.dtype()));
  std::vector<py::ssize_t> shape(c.shape().begin(), c.shape().end()), strides;
  for (int64_t s : c.strides()) strides.push_back(static_cast<py::ssize_t>(s) * item);
  auto* keep = new std::shared_ptr<TensorImpl>(c.impl_ptr());
  const py::capsule base(keep, [](void* p) { delete static_cast<std::shared_ptr<TensorImpl>*>(p); });
  return py::array(numpy_dtype(c.dtype()), shape, strides, c.raw_data(), base);
}

// The array as a tensor over its memory when it is C-contiguous float32, float64 or int64; else a copy
// (NumPy's, to the nearest of those dtypes) that the tensor then owns.
inline Tensor from_numpy(const py::array& given) {
  py::array a = given;
  const bool supported = a.dtype().is(py::dtype::of<float>()) || a.dtype().is(py::dtype::of<double>()) ||
                         a.dtype().is(py::dtype::of<int64_t>());
  if (!supported) {
    const char kind = a.dtype().kind();
    a = kind == 'f' ? py::array(py::array_t<double>::ensure(a)) : py::array(py::array_t<int64_t>::ensure(a));
    HL_CHECK(a, "headlab: cannot take an array of dtype ", std::string(py::str(given.dtype())),
             " (float32, float64 or integers)");
  }
  if (!(a.flags() & py::array::c_style)) a = py::array::ensure(a, py::array::c_style);
  const DType dt = a.dtype().is(py::dtype::of<float>())    ? DType::f32
                   : a.dtype().is(py::dtype::of<double>()) ? DType::f64
                                                           : DType::i64;
  Shape shape(a.shape(), a.shape() + a.ndim());
  auto* keep = new py::object(a);  // the tensor's storage holds the array (deleted with the GIL held)
  const std::shared_ptr<void> owner(keep, [](py::object* o) {
    const py::gil_scoped_acquire gil;
    delete o;
  });
  // Read-only arrays (NumPy's imports of DLPack are) are taken too: headlab never writes into its inputs.
  return Tensor::from_blob(const_cast<void*>(a.data()), shape, contiguous_strides(shape), dt, kCPU, owner);
}

// A loaded model with its task and tokenizer.
struct PyModel {
  std::shared_ptr<loader::Loaded> loaded;
  std::string path;

  nn::DecoderModel& decoder() const { return loaded->decoder("headlab"); }

  py::object config() const { return py::module_::import("json").attr("loads")(loaded->model->config_json().dump()); }
  // A text's ids: the prompt rule of the commands (TextTokenizer::encode_prompt: BOS first where the tokenizer
  // has one and prepend_bos), or a task's own tokenizer (characters: no BOS).
  std::vector<int64_t> encode(const std::string& text, bool prepend_bos) const {
    if (const tasks::TextTokenizer* sub = loaded->subword()) return sub->encode_prompt(text, prepend_bos);
    return loaded->task->encode_prompt(text).ids;
  }
  // What a batch of texts is padded with on the right: the tokenizer's EOS (TransformerLens's pad where a
  // tokenizer has none), else 0.
  int64_t pad_id() const {
    const tasks::TextTokenizer* sub = loaded->subword();
    return sub && sub->eos() ? *sub->eos() : 0;
  }
  // A model's input as (B, T) tokens on its device: a text, a list of texts (padded on the right), or token ids
  // (T) or (B, T). lengths: each row's tokens before its padding.
  struct Input {
    Tensor tokens;
    std::vector<int64_t> lengths;
    // What an encoder's attention must not see: a list of texts' padding (each row's length); else none.
    Tensor padding(const nn::DecoderModel& m) const {
      if (m.shape().causal) return {};
      for (int64_t n : lengths)
        if (n < tokens.size(1)) return tensor(lengths, {static_cast<int64_t>(lengths.size())}).to(tokens.device());
      return {};
    }
  };
  // attention_mask: with token ids, Hugging Face's (B, T) ones then zeros a row (right padding): each row's length.
  Input input(const py::object& in, std::optional<bool> prepend_bos,
              const py::object& attention_mask = py::none()) const {
    const bool bos = prepend_bos.value_or(true);
    Input x;
    const bool texts = py::isinstance<py::str>(in) || py::isinstance<py::list>(in) || py::isinstance<py::tuple>(in);
    HL_CHECK(attention_mask.is_none() || !texts,
             "headlab: attention_mask goes with token ids; texts are padded and masked as they are read");
    if (texts) {
      std::vector<std::vector<int64_t>> rows;
      if (py::isinstance<py::str>(in)) {
        rows.push_back(encode(in.cast<std::string>(), bos));
      } else {
        for (const py::handle& t : in) {
          HL_CHECK(py::isinstance<py::str>(t), "headlab: a list of inputs must hold texts, got ",
                   std::string(py::str(py::type::of(t).attr("__name__"))));
          rows.push_back(encode(t.cast<std::string>(), bos));
        }
        HL_CHECK(!rows.empty(), "headlab: the list of texts is empty");
      }
      size_t T = 0;
      for (const auto& r : rows) T = std::max(T, r.size());
      std::vector<int64_t> ids;
      for (const auto& r : rows) {
        ids.insert(ids.end(), r.begin(), r.end());
        ids.insert(ids.end(), T - r.size(), pad_id());
        x.lengths.push_back(static_cast<int64_t>(r.size()));
      }
      x.tokens = tensor(ids, {static_cast<int64_t>(rows.size()), static_cast<int64_t>(T)}).to(loaded->model->device());
      return x;
    }
    x.tokens = tokens(in.cast<py::array>());
    x.lengths.assign(static_cast<size_t>(x.tokens.size(0)), x.tokens.size(1));
    if (!attention_mask.is_none()) x.lengths = mask_lengths(attention_mask, x.tokens.size(0), x.tokens.size(1));
    return x;
  }
  // Each row's ones before its zeros, of a (B, T) or (T) mask of 0 / 1 (or bools).
  static std::vector<int64_t> mask_lengths(const py::object& mask, int64_t B, int64_t T) {
    const auto m = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(mask);
    HL_CHECK(m && m.size() == B * T && (m.ndim() == 2 || (m.ndim() == 1 && B == 1)),
             "headlab: attention_mask must have the tokens' shape (", B, ", ", T, ")");
    std::vector<int64_t> lengths;
    const int64_t* v = m.data();
    for (int64_t b = 0; b < B; ++b) {
      int64_t n = 0;
      while (n < T && v[b * T + n] == 1) ++n;
      for (int64_t t = n; t < T; ++t)
        HL_CHECK(v[b * T + t] == 0, "headlab: attention_mask row ", b,
                 " must be ones then zeros (right padding, as a tokenizer pads), got ", v[b * T + t], " at ", t);
      HL_CHECK(n >= 1, "headlab: attention_mask row ", b, " hides every token");
      lengths.push_back(n);
    }
    return lengths;
  }
  // One text -> (1, T), a list of texts -> (B, T) padded on the right.
  py::array to_tokens(const py::object& text, bool prepend_bos) const {
    HL_CHECK(!py::isinstance<py::array>(text), "headlab.to_tokens: expected a text or a list of texts, got an array");
    return to_numpy(input(text, prepend_bos).tokens);
  }
  std::vector<int64_t> ids_of(const py::array& tokens) const {
    const Tensor t = from_numpy(tokens);
    HL_CHECK(t.dtype() == DType::i64, "headlab: tokens must be integers, got ", dtype_name(t.dtype()));
    return t.to_vector<int64_t>();
  }
  std::string to_string(const py::array& tokens) const {
    const std::vector<int64_t> ids = ids_of(tokens);
    if (loaded->subword()) return loaded->subword()->decode(ids);
    std::string s;
    for (int64_t id : ids) s += loaded->task->token_text(id);
    return s;
  }
  std::vector<std::string> to_str_tokens(const py::object& text_or_tokens) const {
    const py::array tokens =
        py::isinstance<py::str>(text_or_tokens) ? to_tokens(text_or_tokens, true) : text_or_tokens.cast<py::array>();
    std::vector<std::string> out;
    for (int64_t id : ids_of(tokens)) out.push_back(loaded->task->token_text(id));
    return out;
  }
  py::dict state_dict() const {
    py::dict d;
    for (const auto& [name, t] : loaded->model->named_parameters()) d[py::str(name)] = to_numpy(t.detach());
    return d;
  }
  // (B, T) tokens from an array of shape (T) or (B, T).
  Tensor tokens(const py::array& a) const {
    Tensor t = from_numpy(a);
    HL_CHECK(t.dtype() == DType::i64, "headlab: tokens must be integers, got ", dtype_name(t.dtype()));
    if (t.dim() == 1) t = t.reshape({1, t.size(0)});
    return t.to(loaded->model->device());
  }
  // return_type: "logits", "loss" (the mean next-token cross-entropy over every row's own tokens), "both" or None.
  py::object forward(const py::object& in, const std::optional<std::string>& return_type,
                     std::optional<bool> prepend_bos, const py::object& attention_mask) const {
    const std::string type = return_type.value_or("none");
    HL_CHECK(type == "logits" || type == "loss" || type == "both" || type == "none",
             "headlab.Model: return_type is 'logits', 'loss', 'both' or None, not '", type, "'");
    const Input x = input(in, prepend_bos, attention_mask);
    Tensor logits;
    {
      const py::gil_scoped_release no_gil;
      logits = analysis::run_hooked(decoder(), x.tokens, {}, {}, false, x.padding(decoder())).logits;
    }
    if (type == "none") return py::none();
    if (type == "logits") return to_numpy(logits);
    HL_CHECK(decoder().shape().causal, "headlab.Model: return_type '", type, "' is the next-token loss; ",
             decoder().type_name(),
             " is an encoder, whose positions predict themselves (headlab eval scores its "
             "masked tokens)");
    const double loss = next_token_loss(logits, x);
    return type == "loss" ? py::object(py::float_(loss)) : py::make_tuple(to_numpy(logits), loss);
  }
  // Mean cross-entropy of each position's next token, a row's padding left out.
  static double next_token_loss(const Tensor& logits, const Input& x) {
    const int64_t B = x.tokens.size(0), T = x.tokens.size(1);
    HL_CHECK(T >= 2, "headlab.Model: the loss needs at least 2 tokens (a position and the token after it), got ", T);
    std::vector<int64_t> ids = x.tokens.to(kCPU).to_vector<int64_t>(), next;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 1; t < T; ++t)
        next.push_back(t < x.lengths[static_cast<size_t>(b)] ? ids[static_cast<size_t>(b * T + t)] : kIgnoreIndex);
    const NoGradGuard no_grad;
    const Tensor targets = tensor(next, {B, T - 1}).to(logits.device());
    return cross_entropy(logits.narrow(1, 0, T - 1), targets).to(DType::f64).item<double>();
  }
  py::tuple run_with_cache(const py::object& in, const std::optional<std::vector<std::string>>& names,
                           std::optional<bool> prepend_bos, const py::object& attention_mask) const {
    const Input x = input(in, prepend_bos, attention_mask);
    const std::vector<std::string> all = names ? *names : analysis::hook_names(decoder());
    analysis::HookedRun r;
    {
      const py::gil_scoped_release no_gil;
      r = analysis::run_hooked(decoder(), x.tokens, std::set<std::string>(all.begin(), all.end()), {}, false,
                               x.padding(decoder()));
    }
    return py::make_tuple(to_numpy(r.logits), as_dict(r.cache));
  }
  // (logits, cache, gradients): d metric / d activation at `gradients` (default: `names`), dlogits(logits) giving
  // d metric / d logits as an array (the GIL held throughout: dlogits is Python's).
  py::tuple run_with_backward(const py::object& in, const std::optional<std::vector<std::string>>& names,
                              const std::optional<std::vector<std::string>>& gradients, const py::function& dlogits,
                              std::optional<bool> prepend_bos) const {
    const Tensor t = input(in, prepend_bos).tokens;
    const std::vector<std::string> all = names ? *names : analysis::hook_names(decoder());
    const std::vector<std::string> at = gradients ? *gradients : all;
    const analysis::HookedBackward r = analysis::run_hooked_backward(
        decoder(), t, std::set<std::string>(all.begin(), all.end()), std::set<std::string>(at.begin(), at.end()),
        [&](const Tensor& logits) { return from_numpy(dlogits(to_numpy(logits)).cast<py::array>()); });
    return py::make_tuple(to_numpy(r.logits), as_dict(r.cache), as_dict(r.gradients));
  }
  static py::dict as_dict(const analysis::Activations& acts) {
    py::dict d;
    for (const auto& [name, x] : acts) d[py::str(name)] = to_numpy(x);
    return d;
  }
  // nn::generate, as `headlab generate` calls it: text in, the prompt and its continuation out as the command
  // prints them; token ids (T) or (B, T) in, each row and its new tokens out (rows that stop early padded).
  py::object generate(const py::object& in, int64_t max_new_tokens, double temperature, std::optional<int64_t> top_k,
                      bool stop_at_eos, std::optional<bool> prepend_bos, uint64_t seed) const {
    nn::GenerateOptions o;
    o.max_new_tokens = max_new_tokens, o.temperature = temperature, o.top_k = top_k.value_or(0), o.seed = seed;
    o.end_id = stop_at_eos ? loaded->task->end_id() : -1;
    nn::DecoderModel& model = decoder();
    const auto fits = [&](size_t n) {
      train::check_generation_fits(loaded->config.model, model.device().is_cuda(), static_cast<int64_t>(n),
                                   o.max_new_tokens, o.prefill_chunk, "headlab.generate");
    };
    if (py::isinstance<py::str>(in)) {
      const std::string text = in.cast<std::string>();
      tasks::Prompt p =
          prepend_bos.value_or(true) ? loaded->task->encode_prompt(text) : tasks::Prompt{encode(text, false), -1, text};
      if (p.answer_length >= 0) o.max_new_tokens = std::min<int64_t>(max_new_tokens, p.answer_length + 1);
      fits(p.ids.size());
      std::vector<int64_t> generated;
      {
        const py::gil_scoped_release no_gil;
        generated = nn::generate(model, p.ids, o);
      }
      return py::str(loaded->task->format_continuation(p, generated));
    }
    const Tensor t = tokens(in.cast<py::array>());
    const int64_t B = t.size(0), T = t.size(1);
    const std::vector<int64_t> ids = t.to(kCPU).to_vector<int64_t>();
    o.keep_end = true;  // TransformerLens's tokens keep the EOS they stopped at
    std::vector<std::vector<int64_t>> rows;
    for (int64_t b = 0; b < B; ++b) {
      std::vector<int64_t> row(ids.begin() + b * T, ids.begin() + (b + 1) * T);
      fits(row.size());
      const py::gil_scoped_release no_gil;
      for (int64_t id : nn::generate(model, row, o)) row.push_back(id);
      rows.push_back(std::move(row));
    }
    size_t n = 0;
    for (const auto& r : rows) n = std::max(n, r.size());
    std::vector<int64_t> out;
    for (auto& r : rows) out.insert(out.end(), r.begin(), r.end()), out.insert(out.end(), n - r.size(), pad_id());
    return to_numpy(tensor(out, {B, static_cast<int64_t>(n)}));
  }
  // Seconds per call of the C++ forward that model(tokens) makes, timed in C++ (the overhead benchmark).
  double time_forward(const py::array& tokens_in, int64_t repeats) const {
    HL_CHECK(repeats > 0, "headlab: repeats must be positive, got ", repeats);
    const Tensor t = tokens(tokens_in);
    const py::gil_scoped_release no_gil;
    const auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < repeats; ++i) analysis::run_hooked(decoder(), t);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
           static_cast<double>(repeats);
  }
  // Each hook: fn(activation, name) -> None (it may have edited the array in place) or an array.
  py::array run_with_hooks(const py::object& in, const std::map<std::string, py::function>& fns,
                           std::optional<bool> prepend_bos, const py::object& attention_mask) const {
    const Input x = input(in, prepend_bos, attention_mask);
    std::map<std::string, analysis::Hook> hooks;
    for (const auto& entry : fns)
      hooks[entry.first] = [fn = entry.second](const std::string& n, const Tensor& x) -> Tensor {
        const py::object y = fn(to_numpy(x), n);
        return y.is_none() ? Tensor() : from_numpy(y.cast<py::array>());
      };
    return to_numpy(analysis::run_hooked(decoder(), x.tokens, {}, hooks, false, x.padding(decoder())).logits);
  }
};

// The residual stream's views over a cache, the logit lens (analysis/residual.h): python/cache.cpp.
void bind_cache(py::module_& m);

}  // namespace headlab::python
