// RunConfig <-> JSON, in the layout checkpoints have always had.
#include "train/config.h"

#include <filesystem>
#include <map>
#include <sstream>

#include "base/json_fields.h"
#include "tasks/bpe_tokenizer.h"
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
  c.model.emb_dim = 64;
  c.model.n_heads = 4;
  c.model.n_layers = 2;
  c.model.context_length = 0;  // the task's need
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
  if (task.options.bpe) tokenizer = {{"type", "bpe"}};
  if (arch == Arch::encoder_decoder) tokenizer["source_vocab"] = make_seq2seq_task_for(*this)->source_vocab();
  return {{"model", arch == Arch::gpt ? model.to_json() : seq2seq.to_json()},
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
  read_json_field(j["model"], "arch", c.arch, "config: model");
  if (c.arch == Arch::encoder_decoder)
    c.seq2seq = nn::TransformerConfig::from_json(j["model"]);
  else
    c.model = nn::GPTConfig::from_json(j["model"]);
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
  if (!task.options.bpe) return {};
  return {task.options.bpe->vocab_json(), task.options.bpe->merges_txt()};
}

RunConfig config_of(const io::Checkpoint& ckpt, const std::string& path) {
  RunConfig c = RunConfig::from_json(ckpt.config);
  if (!ckpt.tokenizer.empty()) {
    const std::string where = "checkpoint '" + path + "': tokenizer/";
    c.task.options.bpe = std::make_shared<const tasks::BpeTokenizer>(
        ckpt.tokenizer.vocab_json, ckpt.tokenizer.merges_txt, where + "vocab.json", where + "merges.txt",
        c.arch == Arch::gpt ? c.model.vocab_size : 0);
  }
  return c;
}

std::unique_ptr<tasks::Task> RunConfig::make_task(const std::string& text_override) const {
  tasks::TaskOptions options = task.options;
  if (!text_override.empty()) options.text_path = text_override;
  if (arch == Arch::encoder_decoder) return tasks::make_seq2seq_task(task.name, options);
  return tasks::make_task(task.name, options);
}

std::shared_ptr<nn::Model> RunConfig::make_model() const {
  if (arch == Arch::encoder_decoder) return std::make_shared<nn::EncoderDecoder>(seq2seq);
  return std::make_shared<nn::GPTModel>(model);
}

int64_t RunConfig::batch_tokens() const { return arch == Arch::gpt ? model.context_length : seq2seq.max_len; }

std::string RunConfig::describe_model() const {
  std::ostringstream os;
  if (arch == Arch::gpt) {
    os << enum_name(model.attention) << " attention, " << model.n_layers << " layers x " << model.n_heads
       << " heads, emb " << model.emb_dim << ", context " << model.context_length;
  } else {
    const nn::TransformerConfig& s = seq2seq;
    os << "encoder-decoder (d2l), " << s.num_layers << "+" << s.num_layers << " layers x " << s.num_heads
       << " heads, hiddens " << s.num_hiddens << ", ffn " << s.ffn_num_hiddens;
  }
  return os.str();
}

std::unique_ptr<tasks::Seq2SeqTask> make_seq2seq_task_for(const RunConfig& c) {
  return tasks::make_seq2seq_task(c.task.name, c.task.options);
}

void RunSettings::validate() const { check_fields(*this, kRunFields, "train", FieldNames::options); }

RunConfig resolve(RunConfig c) {
  c.run.validate();
  HL_CHECK(c.optimizer.lr > 0, "train: --lr must be positive, got ", c.optimizer.lr);
  c.task.options.seed = c.run.seed;
  if (c.arch == Arch::encoder_decoder) {
    const std::unique_ptr<tasks::Seq2SeqTask> task = make_seq2seq_task_for(c);
    c.task.name = task->name();
    c.task.options.vocabulary = task->tokenizer().vocab();
    c.seq2seq.src_vocab_size = task->source_vocab_size();
    c.seq2seq.tgt_vocab_size = task->vocab_size();
    const int64_t longest = std::max(task->max_source_length(), task->required_context_length());
    HL_CHECK(longest <= c.seq2seq.max_len, "train: task ", task->name(), " has sequences of up to ", longest,
             " tokens, more than the positional encoding's max_len ", c.seq2seq.max_len);
    c.seq2seq.validate();
    c.schedule.lr = c.optimizer.lr;
    c.schedule.total = c.run.steps;
    return c;
  }
  const bool chars = c.task.name == "chars";
  if (chars) c.task.options.text_path = std::filesystem::absolute(c.task.options.text_path).string();
  const std::unique_ptr<tasks::Task> task = c.make_task();
  c.task.name = task->name();
  c.task.options.vocabulary = task->tokenizer().vocab();
  c.model.vocab_size = task->vocab_size();
  if (c.model.context_length <= 0) c.model.context_length = chars ? 64 : task->required_context_length();
  task->check_context_length(c.model.context_length);
  c.model.validate();
  c.schedule.lr = c.optimizer.lr;
  c.schedule.total = c.run.steps;  // as the run uses it, so the stored schedule gives the logged rates
  return c;
}

}  // namespace headlab::train
