// The registry of model families: one line each.
#include "io/families.h"

#include "io/hf_bert.h"
#include "io/hf_folder.h"
#include "io/hf_gpt2.h"
#include "io/hf_gpt_neo.h"
#include "io/hf_llama.h"
#include "io/hf_neox.h"
#include "nn/decoder_family.h"
#include "nn/transformer.h"

namespace headlab::io {

const std::vector<Family>& families() {
  static const std::vector<Family> all = {
      {nn::gpt_family(), &hf_gpt2_format()},         // the book's GPT; GPT-2's folders
      {nn::encoder_decoder_family()},                // d2l's Transformer
      {nn::llama_family(), &hf_llama_format()},      // LLaMA, Mistral, Qwen2 folders; llama2.c files (io/llama2c.h)
      {nn::qwen3_family(), &hf_qwen3_format()},      // Qwen3 folders
      {nn::olmo2_family(), &hf_olmo2_format()},      // OLMo-2 folders
      {nn::gemma_family(), &hf_gemma_format()},      // Gemma 1 folders
      {nn::gemma2_family(), &hf_gemma2_format()},    // Gemma 2 folders
      {nn::gemma3_family(), &hf_gemma3_format()},    // Gemma 3's text folders
      {nn::neox_family(), &hf_neox_format()},        // GPT-NeoX (Pythia) folders
      {nn::gpt_neo_family(), &hf_gpt_neo_format()},  // GPT-Neo (TinyStories) folders
      {nn::bert_family(), &hf_bert_format()},        // BERT encoders' (BertForMaskedLM) folders
      {nn::hooked_family()},                         // TransformerLens's HookedTransformer; no folder format
  };
  return all;
}

const Family& family_named(const std::string& arch, const std::string& who) {
  for (const Family& f : families())
    if (f.model.arch() == arch) return f;
  std::string names;
  for (const std::string& n : family_names()) names += (names.empty() ? "'" : ", '") + n + "'";
  HL_FAIL(who, ": expected one of ", names, ", got '", arch, "'");
}

const Family& family_of(const nlohmann::json& section) {
  HL_CHECK(section.is_object(), "config: model: expected a JSON object, got ", section.type_name());
  if (!section.contains("arch")) return family_named("gpt", "config: model: arch");
  HL_CHECK(section.at("arch").is_string(), "config: model: key 'arch' has the wrong type (",
           section.at("arch").type_name(), ")");
  return family_named(section.at("arch").get<std::string>(), "config: model: arch");
}

std::vector<std::string> family_names() {
  std::vector<std::string> names;
  for (const Family& f : families()) names.push_back(f.model.arch());
  return names;
}

std::string families_help() {
  std::string help;
  for (const Family& f : families()) help += (help.empty() ? "" : " | ") + f.model.help();
  return help;
}

std::shared_ptr<nn::Model> make_model(const nlohmann::json& section) { return family_of(section).model.build(section); }

double num_parameters(const nlohmann::json& section) { return family_of(section).model.parameter_count(section); }

const Family& family_of_folder(const std::string& folder) {
  const std::string path = hf_config_path(folder);
  // (absent: gpt2, the one family whose folders predate the key)
  const std::string type = hf_config_value<std::string>(read_hf_config(folder), "model_type", "gpt2", path);
  std::string known;
  for (const Family& f : families()) {
    if (!f.folder) continue;
    for (const std::string& t : f.folder->model_types()) {
      if (t == type) return f;
      known += (known.empty() ? "" : ", ") + t;
    }
  }
  HL_FAIL(path, ": model_type '", type, "' is not one headlab reads (", known, ")");
}

std::shared_ptr<nn::Model> build_folder_model(FolderModel&& m, const std::string& folder) {
  std::shared_ptr<nn::Model> model;
  {
    const nn::SkipInit no_values;  // every value is about to be replaced
    model = make_model(m.config);
  }
  model->adopt_parameters(std::move(m.parameters), folder);
  model->eval();
  return model;
}

}  // namespace headlab::io
