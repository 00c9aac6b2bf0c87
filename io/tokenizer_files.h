// The files a checkpoint stores its subword tokenizer as, and export writes beside the weights
// (tasks::TokenizerFiles, defined beside the tokenizers that produce them).
#pragma once
#include "tasks/text_tokenizer.h"

namespace headlab::io {

using tasks::TokenizerFiles;

}  // namespace headlab::io
