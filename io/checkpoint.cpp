// Checkpoint file layout:
//   /                    attrs format = "headlab-checkpoint", format_version, config (JSON text)
//   /model/<name>        float32, one dataset per parameter, by state_dict key
//   /tokenizer           a subword tokenizer's files, uint8 (n,) each (config tokenizer type: "bpe": vocab.json,
//                        merges.txt; "tokenizer.json": tokenizer.json [, tokenizer_config.json]; "sentencepiece":
//                        tokenizer.model; "llama2c": tokenizer.bin; "wordpiece": vocab.txt or tokenizer.json
//                        [, tokenizer_config.json])
//   /optimizer           attrs kind, hyperparameters (JSON); state/<param>/<exp_avg|exp_avg_sq|momentum_buffer>,
//                        steps/<param> (int64 scalar)
//   /trainer             step, rng (uint64 seed and offset as int64 [2]), data_index, elapsed_seconds,
//                        metrics/<column> (float64 (n,))
// Every dataset carries HDF5's Fletcher32 checksum (io/h5file.h).
#include "io/checkpoint.h"

#include <algorithm>
#include <cstring>

#include "base/json_text.h"
#include "io/families.h"
#include "io/h5file.h"

namespace headlab::io {

namespace {

const char* kFormat = "headlab-checkpoint";

std::string where(const std::string& path) { return "checkpoint '" + path + "'"; }

// A block type's tensor (nn::to_quantized_weights) is stored as its bytes, (rows, blocks * block bytes) uint8, with
// the attribute dtype naming the blocks; every other tensor as float32.
void write_tensor(h5::Writer& w, const std::string& name, const Tensor& t) {
  if (is_block_quantized(t.dtype())) {
    const Tensor c = t.detach().to(kCPU).contiguous();
    w.write_u8(name, {c.size(0), c.size(1) * static_cast<int64_t>(dtype_size(c.dtype()))},
               static_cast<const uint8_t*>(c.raw_data()));
    w.set_attr(name, "dtype", dtype_name(c.dtype()));
    return;
  }
  const Tensor c = t.detach().to(kCPU).to(DType::f32).contiguous();
  w.write_f32(name, c.shape(), c.data<float>());
}

// A parameter stored as blocks: (rows, bytes) uint8 whose weights fill the expected (rows, in) shape.
Tensor read_blocks(const h5::Reader& r, const std::string& name, const std::string& dtype, const Shape& expected) {
  const DType block = dtype == "q8_0" ? DType::q8_0 : dtype == "q4_k" ? DType::q4_k : DType::f32;
  HL_CHECK(block != DType::f32, where(r.path()), ": dataset ", name, " has dtype attribute '", dtype,
           "', expected q8_0 or q4_k");
  const h5::ArrayInfo info = r.info(name);
  const auto bytes = static_cast<int64_t>(dtype_size(block));
  HL_CHECK(info.dtype == h5::DType::u8 && info.shape.size() == 2 && expected.size() == 2 &&
               info.shape[0] == expected[0] && info.shape[1] == expected[1] / dtype_block(block) * bytes &&
               expected[1] % dtype_block(block) == 0,
           where(r.path()), ": parameter ", name.substr(name.find('/') + 1), " of ", dtype, " blocks has ",
           h5::dtype_name(info.dtype), " shape ", shape_str(info.shape), "; the model expects ", shape_str(expected),
           " weights, stored as uint8 [", expected.empty() ? 0 : expected[0], ", ",
           expected.size() == 2 ? expected[1] / dtype_block(block) * bytes : 0, "]");
  const h5::Array a = r.read(name, h5::DType::u8, info.shape);
  Tensor out = Tensor::empty({expected[0], expected[1] / dtype_block(block)}, block);
  std::memcpy(out.raw_data(), a.bytes.data(), a.bytes.size());
  return out;
}

Tensor read_f32(const h5::Reader& r, const std::string& name, const Shape* expected = nullptr) {
  if (expected && r.has_attr(name, "dtype")) return read_blocks(r, name, r.attr_str(name, "dtype"), *expected);
  const h5::ArrayInfo info = r.info(name);
  HL_CHECK(info.dtype == h5::DType::f32, where(r.path()), ": dataset ", name, " has dtype ", h5::dtype_name(info.dtype),
           ", expected float32");
  if (expected)
    HL_CHECK(info.shape == *expected, where(r.path()), ": parameter ", name.substr(name.find('/') + 1), " has shape ",
             shape_str(info.shape), ", model expects ", shape_str(*expected));
  const h5::Array a = r.read(name, h5::DType::f32, info.shape);
  const std::vector<float> v = a.as<float>();
  return tensor(v, a.shape.empty() ? Shape{} : Shape(a.shape.begin(), a.shape.end()));
}

const std::vector<std::pair<const char*, double MetricRow::*>> kMetricColumns = {
    {"train_loss", &MetricRow::train_loss},
    {"val_loss", &MetricRow::val_loss},
    {"val_accuracy", &MetricRow::val_accuracy},
    {"val_exact_match", &MetricRow::val_exact_match},
    {"lr", &MetricRow::lr},
    {"grad_norm", &MetricRow::grad_norm},
    {"tokens_per_s", &MetricRow::tokens_per_s}};

}  // namespace

NamedTensors snapshot_parameters(const nn::Module& model) {
  NamedTensors out;
  for (auto& [name, t] : model.named_parameters()) out.emplace_back(name, t.detach().to(kCPU).to(DType::f32).clone());
  return out;
}

void save_checkpoint(const std::string& path, const Checkpoint& ckpt) {
  h5::Writer w(path, "checkpoint");
  w.set_attr("/", "format", kFormat);
  w.set_attr("/", "format_version", kCheckpointVersion);
  w.set_attr("/", "config", ckpt.config.dump());
  w.create_group("model");
  for (const auto& [name, t] : ckpt.model) write_tensor(w, "model/" + name, t);
  for (const auto& [name, bytes] : ckpt.tokenizer.files)
    w.write_u8("tokenizer/" + name, {static_cast<int64_t>(bytes.size())},
               reinterpret_cast<const uint8_t*>(bytes.data()));
  if (ckpt.has_optimizer) {
    w.create_group("optimizer");
    w.set_attr("/optimizer", "kind", enum_name(ckpt.optimizer.kind));
    w.set_attr("/optimizer", "hyperparameters", ckpt.optimizer.to_json().dump());
    for (const auto& [name, t] : ckpt.optimizer_state) write_tensor(w, "optimizer/state/" + name, t);
    for (const auto& [name, s] : ckpt.optimizer_steps) w.write<int64_t>("optimizer/steps/" + name, {}, {s});
  }
  if (ckpt.has_trainer) {
    const TrainerState& t = ckpt.trainer;
    w.write<int64_t>("trainer/step", {}, {t.step});
    w.write<int64_t>("trainer/rng", {2}, {static_cast<int64_t>(t.rng_seed), static_cast<int64_t>(t.rng_offset)});
    w.write<int64_t>("trainer/data_index", {}, {static_cast<int64_t>(t.data_index)});
    w.write<double>("trainer/elapsed_seconds", {}, {t.elapsed_seconds});
    const int64_t n = static_cast<int64_t>(t.metrics.size());
    std::vector<int64_t> steps;
    for (const MetricRow& m : t.metrics) steps.push_back(m.step);
    w.write<int64_t>("trainer/metrics/step", {n}, steps);
    for (const auto& [col, member] : kMetricColumns) {
      std::vector<double> v;
      for (const MetricRow& m : t.metrics) v.push_back(m.*member);
      w.write<double>(std::string("trainer/metrics/") + col, {n}, v);
    }
  }
  w.commit();
}

Checkpoint load_checkpoint(const std::string& path) {
  h5::Reader r(path, "checkpoint");
  const std::string ctx = where(path);
  HL_CHECK(r.has_attr("/", "format") && r.attr_str("/", "format") == kFormat, ctx,
           ": not a headlab checkpoint (the root attribute 'format' is missing or is not '", kFormat, "')");
  const int64_t version = r.attr_i64("/", "format_version");
  HL_CHECK(version == kCheckpointVersion, ctx, ": format_version ", version, " is not supported (this headlab reads ",
           kCheckpointVersion, ")");
  Checkpoint ck;
  ck.config = parse_json_text(r.attr_str("/", "config"), ctx + ": the root attribute 'config'");
  HL_CHECK(ck.config.is_object() && ck.config.contains("model"), ctx, ": config has no 'model' section");
  double n_params = 0;
  try {
    n_params = num_parameters(ck.config["model"]);
  } catch (const Error& e) {
    HL_FAIL(ctx, ": ", e.what());
  }
  // Every parameter is stored as float32 or as blocks of at least 4.5 bits a weight (q4_k), so a config that
  // describes more than the file holds is damaged: say so before building a model of that size.
  HL_CHECK(n_params * 0.5625 <= static_cast<double>(r.file_size()), ctx, ": config describes a model of ", n_params,
           " parameters, more than the file's ", r.file_size(), " bytes can hold");
  // The expected parameters are those of the model the config describes.
  // Building it draws initial values from the global generator; reading a file must not move the
  // generator (it decides dropout masks and the next model's init), so its state is put back.
  std::vector<std::pair<std::string, Shape>> expected;
  {
    NoGradGuard no_grad;
    const Generator saved = default_generator();
    const nn::SkipInit no_values;  // names and shapes only (GPT-2's 124M would take a second to draw)
    const std::shared_ptr<nn::Model> shape_model = make_model(ck.config["model"]);
    default_generator() = saved;
    for (auto& [name, t] : shape_model->named_parameters()) expected.emplace_back(name, t.shape());
  }
  HL_CHECK(r.has("model"), ctx, ": group /model is missing");
  const std::vector<std::string> stored = r.list("model");
  for (const auto& [name, shape] : expected) {
    HL_CHECK(r.has("model/" + name), ctx, ": parameter ", name, " is missing");
    ck.model.emplace_back(name, read_f32(r, "model/" + name, &shape));
  }
  for (const std::string& name : stored) {
    const bool known = find_named(expected, name) != expected.end();
    HL_CHECK(known, ctx, ": dataset model/", name, " is not a parameter of the model its config describes");
  }
  // A subword tokenizer's files (tasks::TokenizerFiles): every dataset under /tokenizer; which ones its type
  // needs is the tokenizer's to check (tasks::tokenizer_from_files).
  const nlohmann::json* tok =
      ck.config.contains("tokenizer") && ck.config["tokenizer"].is_object() ? &ck.config["tokenizer"] : nullptr;
  const std::string type =
      tok && tok->contains("type") && (*tok)["type"].is_string() ? (*tok)["type"].get<std::string>() : "char";
  if (type != "char") {
    HL_CHECK(r.has("tokenizer"), ctx, ": the config's tokenizer is ", type, " but group /tokenizer is missing");
    ck.tokenizer.type = type;
    for (const std::string& name : r.list("tokenizer")) {
      const std::string dataset = "tokenizer/" + name;
      const h5::ArrayInfo info = r.info(dataset);
      HL_CHECK(info.dtype == h5::DType::u8 && info.shape.size() == 1, ctx, ": dataset ", dataset,
               " should be uint8 bytes of one dimension");
      const h5::Array a = r.read(dataset, h5::DType::u8, info.shape);
      ck.tokenizer.files.emplace_back(name, std::string(reinterpret_cast<const char*>(a.bytes.data()), a.bytes.size()));
    }
  }
  if (r.has("optimizer")) {
    ck.has_optimizer = true;
    const nlohmann::json hyper =
        parse_json_text(r.attr_str("/optimizer", "hyperparameters"), ctx + ": optimizer hyperparameters");
    try {
      ck.optimizer = optim::OptimizerOptions::from_json(hyper);
    } catch (const Error& e) {
      HL_FAIL(ctx, ": optimizer hyperparameters: ", e.what());
    }
    if (r.has("optimizer/state"))
      for (const std::string& name : r.list_datasets_recursive("optimizer/state"))
        ck.optimizer_state.emplace_back(name, read_f32(r, "optimizer/state/" + name));
    if (r.has("optimizer/steps"))
      for (const std::string& name : r.list("optimizer/steps"))
        ck.optimizer_steps.emplace_back(name, r.read("optimizer/steps/" + name, h5::DType::i64, {}).as<int64_t>()[0]);
  }
  if (r.has("trainer")) {
    ck.has_trainer = true;
    TrainerState& t = ck.trainer;
    t.step = r.read("trainer/step", h5::DType::i64, {}).as<int64_t>()[0];
    const auto rng = r.read("trainer/rng", h5::DType::i64, {2}).as<int64_t>();
    t.rng_seed = static_cast<uint64_t>(rng[0]);
    t.rng_offset = static_cast<uint64_t>(rng[1]);
    t.data_index = static_cast<uint64_t>(r.read("trainer/data_index", h5::DType::i64, {}).as<int64_t>()[0]);
    t.elapsed_seconds = r.read("trainer/elapsed_seconds", h5::DType::f64, {}).as<double>()[0];
    const h5::ArrayInfo step_info = r.info("trainer/metrics/step");
    HL_CHECK(step_info.shape.size() == 1, ctx, ": dataset trainer/metrics/step has shape ", shape_str(step_info.shape),
             ", expected one dimension");
    const auto steps = r.read("trainer/metrics/step", h5::DType::i64, step_info.shape).as<int64_t>();
    const int64_t n = static_cast<int64_t>(steps.size());
    t.metrics.resize(steps.size());
    for (size_t i = 0; i < steps.size(); ++i) t.metrics[i].step = steps[i];
    for (const auto& [col, member] : kMetricColumns) {
      const auto v = r.read(std::string("trainer/metrics/") + col, h5::DType::f64, {n}).as<double>();
      for (size_t i = 0; i < v.size(); ++i) t.metrics[i].*member = v[i];
    }
  }
  return ck;
}

namespace {
// The checkpoint's model with uninitialised parameters (every one is about to be replaced: an initialisation would
// only write memory, and make it resident, for nothing), and the model made ready to use.
std::shared_ptr<nn::Model> model_to_fill(const Checkpoint& ckpt) {
  const nn::SkipInit no_values;
  return make_model(ckpt.config.at("model"));
}
std::shared_ptr<nn::Model> ready(std::shared_ptr<nn::Model> model, Device device) {
  model->to(device);
  model->eval();
  return model;
}
}  // namespace

std::shared_ptr<nn::Model> load_model(const Checkpoint& ckpt, const std::string& path, Device device) {
  std::shared_ptr<nn::Model> model = model_to_fill(ckpt);
  model->load_parameters(ckpt.model, where(path));
  return ready(std::move(model), device);
}

std::shared_ptr<nn::Model> adopt_model(Checkpoint& ckpt, const std::string& path, Device device) {
  std::shared_ptr<nn::Model> model = model_to_fill(ckpt);
  model->adopt_parameters(NamedTensors(ckpt.model), where(path));  // handles: the storages are shared
  ckpt.model.clear();
  for (const auto& [name, t] : model->named_parameters()) ckpt.model.emplace_back(name, t.detach());
  return ready(std::move(model), device);
}

}  // namespace headlab::io
