// The residual stream's views over a Python cache (analysis/residual.h), which headlab.ActivationCache's
// accumulated_resid, decompose_resid, stack_head_results and apply_ln_to_stack call, and the logit lens.
#include <string>
#include <vector>

#include "python/model.h"

namespace headlab::python {

namespace {

// The cache's arrays as tensors over their memory.
analysis::Activations activations(const py::dict& cache) {
  analysis::Activations acts;
  for (const auto& [name, value] : cache) acts[name.cast<std::string>()] = from_numpy(value.cast<py::array>());
  return acts;
}

// view: "accumulated", "decomposed" or "heads"; the options are TransformerLens's (analysis::StackOptions).
py::tuple residual(PyModel& m, const std::string& view, const py::dict& cache, const analysis::StackOptions& o) {
  HL_CHECK(view == "accumulated" || view == "decomposed" || view == "heads", "headlab: no residual view '", view, "'");
  const analysis::Activations acts = activations(cache);
  nn::DecoderModel& model = m.decoder();
  const analysis::ResidualStack r = view == "accumulated"  ? analysis::accumulated_resid(model, acts, o)
                                    : view == "decomposed" ? analysis::decompose_resid(model, acts, o)
                                                           : analysis::stack_head_results(model, acts, o);
  return py::make_tuple(to_numpy(r.stack), r.labels);
}

analysis::StackOptions options(int64_t layer, bool apply_ln, std::optional<int64_t> pos, bool mlp_input) {
  analysis::StackOptions o;
  o.layer = layer, o.apply_ln = apply_ln, o.pos = pos, o.mlp_input = mlp_input;
  return o;
}

// The logit lens on one prompt (analysis::logit_lens): rows x (T - 1) arrays of the next token's probability and
// rank, the rows' labels and the prompt's tokens as text.
py::dict logit_lens(PyModel& m, const py::object& in, std::optional<bool> prepend_bos) {
  const Tensor t = m.input(in, prepend_bos).tokens;
  HL_CHECK(t.size(0) == 1, "headlab.logit_lens: one prompt at a time, got ", t.size(0), " rows");
  const std::vector<int64_t> ids = t.to(kCPU).to_vector<int64_t>();
  analysis::LogitLens lens;
  {
    const py::gil_scoped_release no_gil;
    lens = analysis::logit_lens(m.decoder(), ids);
  }
  const auto R = static_cast<int64_t>(lens.rows.size());
  py::dict d;
  d["rows"] = lens.rows;
  d["tokens"] = m.to_str_tokens(to_numpy(t));
  d["prob"] = to_numpy(tensor(lens.prob, {R, lens.T - 1}));
  d["rank"] = to_numpy(tensor(lens.rank, {R, lens.T - 1}).to(DType::i64));
  return d;
}

}  // namespace

void bind_cache(py::module_& m) {
  m.def(
      "_residual",
      [](PyModel& model, const std::string& view, const py::dict& cache, int64_t layer, bool apply_ln,
         std::optional<int64_t> pos, bool mlp_input, bool incl_mid, bool incl_embeds, const std::string& mode,
         bool incl_remainder) {
        analysis::StackOptions o = options(layer, apply_ln, pos, mlp_input);
        o.incl_mid = incl_mid, o.incl_embeds = incl_embeds, o.mode = mode, o.incl_remainder = incl_remainder;
        return residual(model, view, cache, o);
      },
      py::arg("model"), py::arg("view"), py::arg("cache"), py::arg("layer"), py::arg("apply_ln"), py::arg("pos"),
      py::arg("mlp_input"), py::arg("incl_mid"), py::arg("incl_embeds"), py::arg("mode"), py::arg("incl_remainder"));
  m.def(
      "_apply_ln_to_stack",
      [](PyModel& model, const py::dict& cache, const py::array& stack, int64_t layer, bool mlp_input,
         std::optional<int64_t> pos) {
        return to_numpy(analysis::apply_ln_to_stack(model.decoder(), activations(cache), from_numpy(stack),
                                                    options(layer, true, pos, mlp_input)));
      },
      py::arg("model"), py::arg("cache"), py::arg("stack"), py::arg("layer"), py::arg("mlp_input"), py::arg("pos"));
  m.def("logit_lens", &logit_lens, py::arg("model"), py::arg("input"), py::arg("prepend_bos") = py::none(),
        "the logit lens on one prompt: each stream entering a layer, and the final one, through ln_final (its own "
        "scale) and W_U; 'prob' and 'rank' (0: the top token) of the next token, (rows, T - 1), 'rows' their labels "
        "(accumulated_resid's), 'tokens' the prompt's");
}

}  // namespace headlab::python
