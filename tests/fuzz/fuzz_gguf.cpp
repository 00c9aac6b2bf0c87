// libFuzzer target: any bytes as a GGUF file (io/gguf): the header's checks (every count, length, offset and size
// against the file's length before anything is allocated), every tensor widened to float32, and, where the bytes
// make a model headlab reads, the model built and run on two tokens and its tokenizer encoding a text.
// Seeds: tests/fuzz/corpus/gguf (tools/fixtures_gguf.py: every tensor type; a gpt2 and a llama model with their
// tokenizers).
#include "fuzz_util.h"
#include "io/families.h"
#include "io/gguf.h"

using namespace headlab;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::scratch_path("model.gguf");
  fuzz::write_file(path, data, size);
  try {
    const io::GgufFile f(path);
    for (const io::GgufTensorInfo& t : f.tensors()) {
      const Tensor x = f.to_float(t.name);
      if (x.shape() != t.shape()) __builtin_trap();
    }
  } catch (const Error&) {}
  try {
    if (size > (1u << 20)) return 0;  // a small model's file: the reader's bounds are the file's
    io::SourceModel m = io::read_gguf(path);
    if (m.embedded_tokenizer) {
      const std::vector<int64_t> ids = m.embedded_tokenizer->encode("Once upon a time, \xE6\x9D\xB1 \xF0\x9F\x99\x82");
      for (const int64_t id : ids)
        if (id < 0 || id >= m.embedded_tokenizer->size()) __builtin_trap();
      m.embedded_tokenizer->decode(ids);
    }
    auto model = io::build_folder_model(std::move(m.pretrained), path);
    const NoGradGuard no_grad;
    model->as_decoder()->forward(zeros({1, 2}, DType::i64));
  } catch (const Error&) {}
  return 0;
}
