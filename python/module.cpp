// headlab's Python module, _headlab (python/headlab/__init__.py re-exports it): a model loaded from a
// checkpoint, a model folder or a llama2.c checkpoint (python/model.h: its tokens, parameters, forwards with
// TransformerLens's hook points, generation and gradients), the commands' runs as dicts of arrays, the residual
// stream's views (python/cache.cpp), and headlab's errors as headlab.Error.
#include <string>
#include <vector>

#include "analysis/ablation.h"
#include "analysis/attention_maps.h"
#include "analysis/circuit_report.h"
#include "analysis/files.h"
#include "analysis/heads_pairs.h"
#include "analysis/sae_features.h"
#include "io/sae_files.h"
#include "nn/layers.h"
#include "python/model.h"

using namespace headlab;
using namespace headlab::python;

namespace {

// A sparse autoencoder with SAELens's face (io/sae_files.h, nn/sae.h): load_from_disk, encode, decode, cfg.
struct PySae {
  std::shared_ptr<nn::SparseAutoencoder> sae;
  io::SaeOrigin origin;
  std::string path;  // the folder it was read from (empty: not read from one)
  Tensor input(const py::array& x) const { return to_dtype(from_numpy(x), sae->W_enc.dtype()); }
};

void bind_sae(py::module_& m) {
  py::class_<PySae>(m, "SAE", "A sparse autoencoder with SAELens's names (headlab sae train writes them)")
      .def_static(
          "load_from_disk",
          [](const std::string& path) {
            io::LoadedSae l = io::read_sae_folder(path);
            return PySae{std::move(l.sae), l.origin, path};
          },
          py::arg("path"), "a SAELens folder (cfg.json, sae_weights.safetensors), v3-v5's layout or v6's")
      .def(
          "encode",
          [](const PySae& s, const py::array& x) {
            const NoGradGuard no_grad;
            return to_numpy(s.sae->encode(s.input(x)));
          },
          py::arg("x"), "(..., d_in) -> the features (..., d_sae), hook_sae_acts_post")
      .def(
          "decode",
          [](const PySae& s, const py::array& f) {
            const NoGradGuard no_grad;
            return to_numpy(s.sae->decode(s.input(f)));
          },
          py::arg("feature_acts"), "(..., d_sae) -> the reconstruction (..., d_in)")
      .def(
          "__call__",
          [](const PySae& s, const py::array& x) {
            const NoGradGuard no_grad;
            return to_numpy(s.sae->forward(s.input(x)));
          },
          py::arg("x"), "decode(encode(x))")
      .def(
          "save_model", [](const PySae& s, const std::string& path) { io::write_sae_folder(path, *s.sae, s.origin); },
          py::arg("path"), "writes a SAELens folder (v6's layout)")
      .def_property_readonly(
          "cfg",
          [](const PySae& s) {
            const nn::SaeConfig& c = s.sae->config();
            py::dict d;
            d["d_in"] = c.d_in, d["d_sae"] = c.d_sae, d["d_out"] = c.out_width();
            const std::string arch = c.arch == nn::SaeArch::relu ? "standard" : enum_name(c.arch);
            d["architecture"] =
                s.origin.transcoder() ? (c.arch == nn::SaeArch::relu ? "transcoder" : arch + "_transcoder") : arch;
            d["k"] = c.arch == nn::SaeArch::topk ? py::object(py::int_(c.k)) : py::none();
            d["apply_b_dec_to_input"] = c.apply_b_dec_to_input;
            d["hook_name"] = s.origin.hook_name, d["model_name"] = s.origin.model_name;
            d["hook_name_out"] = s.origin.hook_name_out;
            return d;
          })
      .def_property_readonly("path", [](const PySae& s) { return s.path; })
      .def_property_readonly("W_enc", [](const PySae& s) { return to_numpy(s.sae->W_enc.detach()); })
      .def_property_readonly("W_dec", [](const PySae& s) { return to_numpy(s.sae->W_dec.detach()); })
      .def_property_readonly("b_enc", [](const PySae& s) { return to_numpy(s.sae->b_enc.detach()); })
      .def_property_readonly("b_dec", [](const PySae& s) { return to_numpy(s.sae->b_dec.detach()); })
      .def_property_readonly("threshold", [](const PySae& s) -> py::object {
        return s.sae->threshold.defined() ? py::object(to_numpy(s.sae->threshold.detach())) : py::none();
      });
}

// headlab sae features on one prompt as a dict (analysis/sae_features.h).
py::dict sae_features(const PyModel& m, const PySae& s, const py::object& text_or_tokens, int64_t features,
                      const std::vector<int64_t>& chosen, std::optional<int64_t> position, int64_t logits) {
  const std::vector<int64_t> ids = m.ids_of(py::isinstance<py::str>(text_or_tokens) ? m.to_tokens(text_or_tokens, true)
                                                                                    : text_or_tokens.cast<py::array>());
  HL_CHECK(s.sae->W_enc.device() == m.decoder().device(), "headlab.sae.features: the SAE is on ",
           s.sae->W_enc.device().str(), ", the model on ", m.decoder().device().str());
  analysis::FeatureOptions o;
  o.features = features, o.chosen = chosen, o.position = position, o.logits = logits;
  analysis::FeatureReport r;
  {
    const py::gil_scoped_release no_gil;
    r = analysis::features_on_prompt(m.decoder(), *s.sae, s.origin, ids, o);
  }
  const auto effects = [&](const std::vector<analysis::TokenEffect>& v) {
    py::list l;
    for (const analysis::TokenEffect& e : v) l.append(py::make_tuple(m.loaded->task->token_text(e.token), e.effect));
    return l;
  };
  py::list out;
  for (const analysis::FeatureOnPrompt& f : r.features) {
    py::dict parts;
    for (size_t i = 0; i < f.labels.size(); ++i) parts[py::str(f.labels[i])] = f.parts[i];
    py::dict d;
    d["feature"] = f.feature, d["position"] = f.position, d["activation"] = f.activation;
    d["activations"] = to_numpy(tensor(f.activations, {static_cast<int64_t>(f.activations.size())}));
    d["pre_activation"] = f.pre_activation, d["bias"] = f.bias, d["parts"] = parts;
    d["head_shares"] = f.head_shares;
    d["top_logits"] = effects(f.top_logits), d["bottom_logits"] = effects(f.bottom_logits);
    out.append(d);
  }
  py::dict d;
  d["hook_name"] = r.hook, d["split"] = r.split, d["features"] = out;
  d["tokens"] = m.to_str_tokens(to_numpy(tensor(ids, {static_cast<int64_t>(ids.size())})));
  return d;
}

py::array vector_array(const std::vector<double>& v) { return to_numpy(tensor(v, {static_cast<int64_t>(v.size())})); }
py::array matrix_array(const std::vector<std::vector<double>>& rows) {
  std::vector<double> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  const auto n = static_cast<int64_t>(rows.size());
  return to_numpy(tensor(flat, {n, n ? static_cast<int64_t>(flat.size()) / n : 0}));
}

analysis::PromptPairs pairs_for(const PyModel& m, const std::string& task, const std::string& pairs, int64_t rows,
                                int64_t templ, int64_t span, uint64_t seed, const char* who) {
  return analysis::make_prompt_pairs({task, pairs, rows, span, templ, seed}, *m.loaded->task, m.decoder().shape(), who);
}

// headlab heads --task/--pairs as a dict: the command's analysis (analysis/heads_pairs.h), its figures.
py::dict heads(const PyModel& m, const std::string& task, const std::string& pairs, int64_t rows, int64_t templ,
               int64_t span, uint64_t seed, bool by_position, const std::string& by) {
  HL_CHECK(by == "head" || by == "kv-group", "headlab.heads: by is 'head' or 'kv-group', not '", by, "'");
  const analysis::PromptPairs pp = pairs_for(m, task, pairs, rows, templ, span, seed, "headlab.heads");
  analysis::PairHeadsOptions o;
  o.seed = seed, o.by_position = by_position, o.kv_groups = by == "kv-group";
  analysis::PairHeads r;
  {
    const py::gil_scoped_release no_gil;
    r = analysis::heads_on_pairs(m.decoder(), pp, o);
  }
  const auto effect = [](std::vector<double> v) {  // metric -> its change
    for (double& x : v) x -= 1;
    return v;
  };
  std::vector<double> dla_heads;
  for (int64_t n : r.heads) dla_heads.push_back(r.dla.node[static_cast<size_t>(n)]);
  py::dict d;
  d["heads"] = r.names;
  d["clean"] = r.baseline.clean_mean;
  d["corrupt"] = r.baseline.corrupt_mean;
  d["zero_ablation"] = vector_array(effect(r.ablation.zero));
  d["mean_ablation"] = vector_array(effect(r.ablation.mean));
  d["resample_ablation"] = vector_array(effect(r.patching.noising));
  d["denoising"] = vector_array(r.patching.denoising);
  d["dla_logits"] = vector_array(dla_heads);
  if (by_position) {
    std::vector<std::vector<double>> noising = r.patching.noising_by_position;
    for (auto& row : noising) row = effect(row);
    d["noising_by_position"] = matrix_array(noising);
    d["denoising_by_position"] = matrix_array(r.patching.denoising_by_position);
  }
  if (o.kv_groups) {  // each key/value group's keys and values from the corrupted prompt
    d["kv_groups"] = r.key_values.groups;
    d["kv_resample"] = vector_array(effect(r.key_values.noising));
  }
  return d;
}

// headlab circuit as a dict: the command's analysis (analysis/circuit_report.h): every edge's attribution
// and whether discovery kept it, the circuit's metric, path patching of every head into the logits and
// activation patching of every node.
py::dict circuit(const PyModel& m, const std::string& task, const std::string& pairs, int64_t rows, int64_t templ,
                 int64_t span, uint64_t seed, double tau, int64_t ig_steps) {
  const analysis::PromptPairs pp = pairs_for(m, task, pairs, rows, templ, span, seed, "headlab.circuit");
  HL_CHECK(tau >= 0, "headlab.circuit: tau must be >= 0, got ", tau);
  analysis::CircuitRunOptions o;
  o.tau = tau, o.ig_steps = ig_steps, o.seed = seed;
  analysis::CircuitReport r;
  {
    const py::gil_scoped_release no_gil;
    r = analysis::run_circuit(m.decoder(), pp, o);
  }
  const analysis::CircuitGraph& g = r.patcher->graph();
  py::list edges;
  for (int64_t e = 0; e < g.edge_count(); ++e) {
    py::dict row;
    row["sender"] = g.node_name(g.edge_sender(e));
    row["receiver"] = g.receiver_name(g.edge_receiver(e));
    row["attribution"] = r.eap.effect[static_cast<size_t>(e)];
    row["kept"] = static_cast<bool>(r.circuit.kept[static_cast<size_t>(e)]);
    edges.append(row);
  }
  const auto names = [&](const std::vector<int64_t>& nodes) {
    std::vector<std::string> v;
    for (int64_t n : nodes) v.push_back(g.node_name(n));
    return v;
  };
  py::dict d;
  d["edges"] = edges;
  d["metric"] = r.circuit.metric;
  d["forwards"] = r.circuit.forwards;
  d["clean"] = r.patcher->baseline().clean_mean;
  d["corrupt"] = r.patcher->baseline().corrupt_mean;
  d["path_senders"] = names(r.senders);
  d["path_patching"] = vector_array(r.path);
  d["nodes"] = names(r.nodes);
  d["noising"] = vector_array(r.activation.noising);
  d["denoising"] = vector_array(r.activation.denoising);
  return d;
}

// headlab ablate's run as a dict (analysis/ablation.h): every head's zero, mean and resample ablation and
// importance on the task's validation batches (the checkpoint's evaluation batches and batch size by
// default), and the pruning curve.
py::dict ablate(const PyModel& m, int64_t batches, int64_t batch_size) {
  const train::RunConfig& run = m.loaded->config;
  const int64_t n = batches > 0 ? batches : run.run.eval_batches, B = batch_size > 0 ? batch_size : run.run.batch_size;
  HL_CHECK(n <= 10000 && B <= 100000, "headlab.ablate: ", n, " batches of ", B, " rows is more than it takes");
  const analysis::EvalSet data = analysis::make_eval_set(*m.loaded->task, n, B, run.batch_tokens());
  analysis::AblateOptions o;
  o.checkpoint = m.path;
  analysis::AblationReport report;
  {
    const py::gil_scoped_release no_gil;
    report = analysis::run_ablation(*m.loaded, data, o);
  }
  const analysis::AblationResult& r = report.ablation;
  std::vector<std::string> names;
  std::vector<double> zero, mean, resample, importance, importance_raw;
  for (const analysis::HeadAblation& h : r.heads) {
    names.push_back(analysis::head_name(*m.loaded->model, h.layer, h.head));
    zero.push_back(h.zero.loss - r.base.loss), mean.push_back(h.mean.loss - r.base.loss);
    resample.push_back(h.resample.loss - r.base.loss);
    importance.push_back(h.importance), importance_raw.push_back(h.importance_raw);
  }
  std::vector<double> pruned, curve;
  for (const analysis::PruneStep& s : report.curve.steps)
    pruned.push_back(static_cast<double>(s.pruned)), curve.push_back(analysis::metric_value(s.scores, report.metric));
  py::dict d;
  d["heads"] = names;
  d["loss"] = r.base.loss;
  d["token_accuracy"] = r.base.token_accuracy;
  d["zero_delta_loss"] = vector_array(zero);
  d["mean_delta_loss"] = vector_array(mean);
  d["resample_delta_loss"] = vector_array(resample);
  d["importance"] = vector_array(importance);
  d["importance_raw"] = vector_array(importance_raw);
  d["metric"] = std::string(enum_name(report.metric));
  d["pruned_heads"] = vector_array(pruned);
  d["pruning_curve"] = vector_array(curve);
  return d;
}

// headlab attention's maps for one prompt: every head's weights (layers, heads, T, T) and the tokens.
py::dict attention(const PyModel& m, const py::object& text_or_tokens) {
  const std::vector<int64_t> ids = m.ids_of(py::isinstance<py::str>(text_or_tokens) ? m.to_tokens(text_or_tokens, true)
                                                                                    : text_or_tokens.cast<py::array>());
  const analysis::AttentionMaps a = analysis::attention_maps(m.decoder(), ids);
  std::vector<double> w(a.weights.begin(), a.weights.end());
  py::dict d;
  d["tokens"] = m.to_str_tokens(to_numpy(tensor(ids, {static_cast<int64_t>(ids.size())})));
  d["layers"] = a.layer_names;
  d["weights"] = to_numpy(tensor(w, {a.layers, a.heads, a.T, a.S}).to(DType::f32));
  return d;
}

}  // namespace

PYBIND11_MODULE(_headlab, m) {
  m.doc() = "headlab: a small, fast toolkit for studying attention heads (C++ core)";
  static py::exception<Error> error(m, "Error", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      PyErr_SetString(error.ptr(), e.what());
    }
  });

  py::class_<PyModel>(m, "Model", "A decoder loaded from a headlab checkpoint or a Hugging Face model folder.")
      .def_property_readonly("config", &PyModel::config, "the model's configuration, as in its checkpoint")
      .def_property_readonly("path", [](const PyModel& p) { return p.path; })
      .def_property_readonly("task", [](const PyModel& p) { return p.loaded->task->name(); })
      .def_property_readonly(
          "eos_token_id",
          [](const PyModel& p) -> py::object {
            const int64_t end = p.loaded->task->end_id();
            return end >= 0 ? py::object(py::int_(end)) : py::none();
          },
          "the token generation stops at (the tokenizer's EOS, a task's end token), or None")
      .def("to_tokens", &PyModel::to_tokens, py::arg("input"), py::arg("prepend_bos") = true,
           "a text -> (1, T) int64 token ids, a list of texts -> (B, T) padded on the right with the tokenizer's EOS "
           "(0 where it has none); BOS first where the tokenizer has one and prepend_bos")
      .def("to_string", &PyModel::to_string, py::arg("tokens"), "token ids -> text")
      .def("to_str_tokens", &PyModel::to_str_tokens, py::arg("text_or_tokens"), "each token as its text")
      .def("state_dict", &PyModel::state_dict,
           "parameters by PyTorch's state_dict names, as arrays over the model's own memory (no copy: "
           "writing into one changes the model)")
      .def_property_readonly(
          "W_U", [](const PyModel& p) { return to_numpy(p.decoder().W_U()); },
          "the unembedding (d_model, vocab), over the model's memory")
      .def_property_readonly(
          "b_U",
          [](const PyModel& p) -> py::object {
            const Tensor b = p.decoder().b_U();
            return b.defined() ? py::object(to_numpy(b)) : py::none();
          },
          "the unembedding's bias (vocab), or None")
      .def(
          "to",
          [](PyModel& p, const std::string& dtype) {
            HL_CHECK(dtype == "float32" || dtype == "float64",
                     "headlab.Model.to: dtype is 'float32' or 'float64', not '", dtype, "'");
            p.loaded->model->to(dtype == "float64" ? DType::f64 : DType::f32);
            return p;
          },
          py::arg("dtype"), "the model's parameters in float32 or float64 (the same model, returned)")
      .def(
          "quantize_weights",
          [](PyModel& p, const std::string& dtype) {
            HL_CHECK(dtype == "bfloat16" || dtype == "q8_0" || dtype == "q4_k",
                     "headlab.Model.quantize_weights: dtype is 'bfloat16', 'q8_0' or 'q4_k', not '", dtype, "'");
            nn::Module& m = *p.loaded->model;
            return dtype == "bfloat16" ? nn::to_bfloat16_weights(m)
                                       : nn::to_quantized_weights(m, dtype == "q8_0" ? DType::q8_0 : DType::q4_k);
          },
          py::arg("dtype"),
          "the linear layers' weights stored in place as bfloat16, or as ggml's q8_0 or q4_k blocks (a tied head "
          "too), for inference, as `headlab generate --dtype` does; returns the bytes saved")
      .def("hook_names", [](const PyModel& p) { return analysis::hook_names(p.decoder()); })
      .def("__call__", &PyModel::forward, py::arg("input"), py::arg("return_type") = "logits",
           py::arg("prepend_bos") = py::none(), py::arg("attention_mask") = py::none(),
           "a text, a list of texts or (T) / (B, T) token ids -> logits (B, T, vocab); return_type 'loss': the mean "
           "next-token cross-entropy (padding left out), 'both': (logits, loss), None: nothing; attention_mask: "
           "token ids' right padding as (B, T) ones then zeros (an encoder's attention hides it)")
      .def("_run_with_cache", &PyModel::run_with_cache, py::arg("input"), py::arg("names") = py::none(),
           py::arg("prepend_bos") = py::none(), py::arg("attention_mask") = py::none())
      .def("_run_with_backward", &PyModel::run_with_backward, py::arg("input"), py::arg("names"), py::arg("gradients"),
           py::arg("dlogits"), py::arg("prepend_bos") = py::none())
      .def("_time_forward", &PyModel::time_forward, py::arg("tokens"), py::arg("repeats"),
           "seconds per call of the C++ forward model(tokens) makes, timed in C++ (benchmarks)")
      .def("run_with_hooks", &PyModel::run_with_hooks, py::arg("input"), py::arg("hooks"),
           py::arg("prepend_bos") = py::none(), py::arg("attention_mask") = py::none(),
           "logits with each hook fn(activation, name) called at its point; it returns None (an in-place "
           "edit counts) or the activation to go on with")
      .def("generate", &PyModel::generate, py::arg("input"), py::arg("max_new_tokens") = 10,
           py::arg("temperature") = 0.0, py::arg("top_k") = py::none(), py::arg("stop_at_eos") = true,
           py::arg("prepend_bos") = py::none(), py::arg("seed") = 0,
           "`headlab generate`'s decoding: a text -> the text and its continuation, (T) or (B, T) token ids -> the "
           "ids and the new ones; greedy at temperature 0, else sampled from the top_k (None: all) with seed");

  m.def(
      "load",
      [](const std::string& path, const std::string& device, const std::string& tokenizer) {
        auto l = std::make_shared<loader::Loaded>(loader::load("headlab.load", path, device, "", tokenizer));
        l->decoder("headlab.load");
        return PyModel{l, path};
      },
      py::arg("path"), py::arg("device") = "cpu", py::arg("tokenizer") = "",
      "a headlab checkpoint (.h5), a Hugging Face model folder (gpt2, llama) or a llama2.c checkpoint (.bin) with "
      "tokenizer= its tokenizer file");
  m.def("heads", &heads, py::arg("model"), py::arg("task") = "", py::arg("pairs") = "", py::arg("rows") = 64,
        py::arg("template") = 0, py::arg("span") = 0, py::arg("seed") = 1, py::arg("by_position") = false,
        py::arg("by") = "head",
        "headlab heads --task/--pairs: every head's zero, mean and resample ablation, denoising and direct logit "
        "attribution on prompt pairs (changes of the normalised metric), as a dict of arrays; by='kv-group' adds "
        "kv_groups and kv_resample (each key/value group's keys and values from the corrupted prompt)");
  m.def("circuit", &circuit, py::arg("model"), py::arg("task") = "", py::arg("pairs") = "", py::arg("rows") = 64,
        py::arg("template") = 0, py::arg("span") = 0, py::arg("seed") = 1, py::arg("tau") = 0.01,
        py::arg("ig_steps") = 0,
        "headlab circuit: every edge's attribution and the circuit discovery keeps (edges with 'kept'), its metric");
  m.def("ablate", &ablate, py::arg("model"), py::arg("batches") = 0, py::arg("batch_size") = 0,
        "headlab ablate's sweep: every head's zero, mean and resample ablation (loss increase) on the task's "
        "validation batches, and its importance, as a dict of arrays");
  m.def("attention", &attention, py::arg("model"), py::arg("text_or_tokens"),
        "headlab attention: every head's attention weights on one prompt, (layers, heads, T, T), and its tokens");
  bind_cache(m);
  bind_sae(m);
  m.def("_sae_features", &sae_features, py::arg("model"), py::arg("sae"), py::arg("text_or_tokens"),
        py::arg("features"), py::arg("chosen"), py::arg("position"), py::arg("logits"));
  m.def(
      "_roundtrip", [](const py::array& a) { return to_numpy(from_numpy(a)); }, py::arg("array"),
      "the array through a headlab tensor and back: the same memory when no copy is needed (tests)");
}
