// libFuzzer target: llama2.c's two file formats (io/llama2c, tasks/llama2c_tokenizer). The first byte picks
// which the rest is: even, a tokenizer file (read; if it loads, text encoded and decoded back); odd, a
// checkpoint (the header's claimed sizes checked against the file before anything is allocated; if it loads,
// the model built and run on two tokens). Seeds: tests/fuzz/corpus/llama2c (tools/make_fuzz_corpus.sh).
#include "fuzz_util.h"
#include "io/families.h"
#include "io/llama2c.h"
#include "tasks/llama2c_tokenizer.h"

using namespace headlab;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    try {
      const tasks::Llama2cTokenizer tok(rest, "fuzz tokenizer");
      const std::string text = "Once upon a time, \xE6\x9D\xB1\xE4\xBA\xAC \xF0\x9F\x99\x82\n  x";
      std::vector<int64_t> ids = tok.encode(text);
      for (const int64_t id : ids)
        if (id < 0 || id >= tok.size()) __builtin_trap();
      ids.insert(ids.begin(), 1);
      tok.decode(ids);
    } catch (const Error&) {}
    return 0;
  }
  const std::string path = fuzz::scratch_path("model.bin");
  fuzz::write_file(path, data + 1, size - 1);
  try {
    if (size - 1 > (1u << 20)) return 0;  // a small model's file: the reader's bounds are the file's
    io::FolderModel m = io::read_llama2c(path);
    auto model = io::build_folder_model(std::move(m), path);
    const NoGradGuard no_grad;
    dynamic_cast<nn::DecoderModel&>(*model).forward(zeros({1, 2}, DType::i64));
  } catch (const Error&) {}
  return 0;
}
