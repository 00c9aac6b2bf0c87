// RunConfig <-> JSON, in the layout checkpoints have always had.
#include "train/config.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <sstream>

#include "base/json_fields.h"
#include "tasks/chars.h"
#include "tasks/sentencepiece_tokenizer.h"
#include "tasks/seq2seq.h"

namespace headlab::train {

namespace {

// The JSON section "training" (with "optimizer" and "schedule" beside these). Every key is optional:
// checkpoints older than a setting, or from tools/import_torch.py, get its default. Errors name the
// command-line option that sets the field.
const auto kRunFields = std::tuple{
    field("steps", &RunSettings::steps, kPositive),
    field("batch_size", &RunSettings::batch_size, kPositive),
    field("grad_clip", &RunSettings::grad_clip, kNonNegative),
    field("seed", &RunSettings::seed),
    field("device", &RunSettings::device),
    field("eval_every", &RunSettings::eval_every, kPositive),
    field("eval_batches", &RunSettings::eval_batches, kPositive),
    field("save_every", &RunSettings::save_every, kPositive),
    field("keep_last", &RunSettings::keep_last, kNonNegative),
    field("skip_nonfinite", &RunSettings::skip_nonfinite),
    field("max_skipped_steps", &RunSettings::max_skipped_steps, kPositive),
};

RunSettings run_settings_from_json(const nlohmann::json& j) {
  RunSettings r;
  const char* who = "config: training";
  fields_from_json(j, r, kRunFields, who);
  try {
    r.validate();
  } catch (const Error& e) {
    HL_FAIL(who, ": ", e.what());
  }
  return r;
}

}  // namespace

RunConfig RunConfig::defaults() {
  RunConfig c;
  c.optimizer = optim::OptimizerOptions::defaults(optim::OptimizerKind::adamw);
  c.optimizer.lr = 3e-3;
  c.schedule.min_lr = 1e-4;
  c.schedule.warmup = 100;
  return c;
}

nlohmann::json RunConfig::to_json() const {
  nlohmann::json training = fields_to_json(run, kRunFields);
  training["optimizer"] = optimizer.to_json();
  training["schedule"] = schedule.to_json();
  nlohmann::json tokenizer = {{"type", "char"}, {"vocab", task.options.vocabulary}};
  if (task.options.subword) tokenizer = {{"type", task.options.subword->files().type}};
  if (family().model.seq2seq())
    tokenizer["source_vocab"] = tasks::make_seq2seq_task(task.name, task.options)->source_vocab();
  return {{"model", model},
          {"tokenizer", tokenizer},
          {"task", {{"name", task.name}, {"options", tasks::options_to_map(task.name, task.options)}}},
          {"training", training}};
}

RunConfig RunConfig::from_json(const nlohmann::json& j) {
  HL_CHECK(j.is_object(), "config: expected a JSON object, got ", j.type_name());
  HL_CHECK(j.contains("model"), "config: the 'model' section is missing");
  HL_CHECK(j.contains("task") && j["task"].is_object() && j["task"].contains("name") && j["task"]["name"].is_string(),
           "config: the 'task' section is missing or has no name");
  RunConfig c;
  c.model = io::family_of(j["model"]).model.canonical(j["model"]);
  c.task.name = j["task"]["name"].get<std::string>();
  try {
    std::map<std::string, std::string> options;
    if (j["task"].contains("options")) options = j["task"]["options"].get<std::map<std::string, std::string>>();
    c.task.options = tasks::options_from_map(options);
    if (j.contains("tokenizer") && j["tokenizer"].contains("vocab"))
      c.task.options.vocabulary = j["tokenizer"]["vocab"].get<std::vector<std::string>>();
    if (j.contains("training") && j["training"].is_object()) {
      const nlohmann::json& tr = j["training"];
      c.run = run_settings_from_json(tr);
      if (tr.contains("optimizer")) c.optimizer = optim::OptimizerOptions::from_json(tr["optimizer"]);
      if (tr.contains("schedule")) c.schedule = optim::LRSchedule::from_json(tr["schedule"]);
    }
  } catch (const nlohmann::json::exception& e) {
    HL_FAIL("config: a value has the wrong type (", e.what(), ")");
  }
  return c;
}

io::TokenizerFiles RunConfig::tokenizer_files() const {
  return task.options.subword ? task.options.subword->files() : io::TokenizerFiles{};
}

RunConfig config_of(const io::Checkpoint& ckpt, const std::string& path) {
  RunConfig c = RunConfig::from_json(ckpt.config);
  if (!ckpt.tokenizer.type.empty())
    c.task.options.subword =
        tasks::tokenizer_from_files(ckpt.tokenizer, "checkpoint '" + path + "': tokenizer/",
                                    c.family().model.seq2seq() ? 0 : c.family().model.vocab_size(c.model));
  return c;
}

std::unique_ptr<tasks::Task> RunConfig::make_task(const std::string& text_override) const {
  tasks::TaskOptions options = task.options;
  if (!text_override.empty()) options.text_path = text_override, options.text_digest.clear();
  if (family().model.seq2seq()) return tasks::make_seq2seq_task(task.name, options);
  return tasks::make_task(task.name, options);
}

void RunSettings::validate() const { check_fields(*this, kRunFields, "train", FieldNames::options); }

RunConfig resolve(const nn::ModelOptions& model, RunConfig c, const nlohmann::json& init_model) {
  c.run.validate();
  HL_CHECK(c.optimizer.lr > 0, "train: --lr must be positive, got ", c.optimizer.lr);
  c.task.options.seed = c.run.seed;
  const nn::ModelFamily& family =
      init_model.is_null() ? io::family_named(model.arch, "train: --arch").model : io::family_of(init_model).model;
  const auto listed = [&](const std::vector<std::string>& names) {
    return std::find(names.begin(), names.end(), c.task.name) != names.end();
  };
  if (!family.seq2seq() && listed(tasks::seq2seq_task_names()) && !listed(tasks::task_names())) {
    const auto& all = io::families();
    const auto s2s = std::find_if(all.begin(), all.end(), [](const io::Family& f) { return f.model.seq2seq(); });
    HL_FAIL("train: task ", c.task.name, " is a source -> target task; use --arch ",
            s2s == all.end() ? std::string("of a source -> target family") : s2s->model.arch());
  }
  c.model = {{"arch", family.arch()}};  // which family the task is made for
  // A text is stored as an absolute path with its digest, so that --resume from another folder, or after
  // the file changed, reads the same data or refuses.
  if ((c.task.name == "chars" || c.task.name == "text") && !c.task.options.text_path.empty())
    c.task.options.text_path = std::filesystem::absolute(c.task.options.text_path).lexically_normal().string();
  c.task.options.text_digest.clear();  // (an --init checkpoint's: this run reads its own text)
  const std::unique_ptr<tasks::Task> task = c.make_task();
  if (const auto* text = dynamic_cast<const tasks::TextWindowsTask*>(task.get()))
    c.task.options.text_digest = text->text_digest();
  nn::TaskSizes sizes;
  sizes.task = c.task.name = task->name();
  sizes.vocab_size = task->vocab_size();
  sizes.context_length = model.context_length > 0 ? model.context_length
                         : c.task.name == "chars" ? 64
                                                  : task->required_context_length();
  const auto* s2s = dynamic_cast<const tasks::Seq2SeqTask*>(task.get());
  if (s2s) {
    sizes.source_vocab_size = s2s->source_vocab_size();
    sizes.longest_sequence = std::max(s2s->max_source_length(), s2s->required_context_length());
  }
  c.task.options.vocabulary = task->tokenizer().vocab();
  if (init_model.is_null()) {
    if (!s2s) task->check_context_length(sizes.context_length);
    c.model = family.from_options(model, sizes);
  } else {
    c.model = family.canonical(init_model);
    if (!s2s) task->check_context_length(family.row_tokens(c.model));
    HL_CHECK(family.vocab_size(c.model) == sizes.vocab_size, "train: --init's model predicts ",
             family.vocab_size(c.model), " tokens; task ", c.task.name, " has ", sizes.vocab_size);
  }
  c.schedule.lr = c.optimizer.lr;
  c.schedule.total = c.run.steps;  // as the run uses it, so the stored schedule gives the logged rates
  return c;
}

}  // namespace headlab::train
