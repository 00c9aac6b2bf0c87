// libFuzzer target: any bytes as a Hugging Face folder's config.json (io/hf_folder, io/families: the registry
// picks the family by model_type, its reader checks every key). What reads must describe a model the registry
// can count; a small one is built and run on two tokens. Seeds: tests/fuzz/corpus/hf_config (the test
// fixtures' config.json files: GPT-2, llama, mistral, qwen2, qwen3, olmo2, gemma, gemma2, gemma3_text, gpt_neox,
// gpt_neo; tools/make_fuzz_corpus.sh).
#include <filesystem>

#include "fuzz_util.h"
#include "io/families.h"

using namespace headlab;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string folder = fuzz::scratch_path("hf_folder");
  std::filesystem::create_directories(folder);
  fuzz::write_file(folder + "/config.json", data, size);
  try {
    const io::Family& family = io::family_of_folder(folder);
    const nlohmann::json section = family.folder->read_config(folder);
    const double n = io::num_parameters(section);  // the section must be one the registry accepts
    if (!(n >= 0)) __builtin_trap();
    if (n > 2e5) return 0;  // a small model only: building it allocates what it claims
    auto model = io::make_model(section);
    auto* decoder = dynamic_cast<nn::DecoderModel*>(model.get());
    if (decoder == nullptr) __builtin_trap();  // every folder family is a decoder
    if (model->num_parameters() != static_cast<int64_t>(n)) __builtin_trap();
    const NoGradGuard no_grad;
    decoder->forward(zeros({1, 2}, DType::i64));
  } catch (const Error&) {}
  return 0;
}
