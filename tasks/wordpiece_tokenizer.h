// BERT's WordPiece tokenizer (BERT, DistilBERT, MiniLM, ELECTRA): Hugging Face's BertTokenizer over a vocab.txt
// (with the folder's tokenizer_config.json) or a tokenizer.json whose model is WordPiece. The text's special
// tokens ([CLS], [MASK], ...) are split out as written; the rest is cleaned (NUL, U+FFFD and control characters
// dropped), CJK ideographs set apart, split on whitespace, lowercased and stripped of accents (NFD, then the
// marks Mn dropped) where the model is uncased, split on punctuation, and each word cut into the longest
// vocabulary tokens from its start ("##" before a piece that continues a word): [UNK] for a word that cannot be
// cut so or is longer than max_input_chars_per_word. Unicode's categories, case mappings and normal forms are
// ICU's (libicu, linked for BPE's NFC), whole, not a table of some scripts. encode may run on several threads.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/error.h"  // every bad input throws headlab::Error
#include "tasks/text_tokenizer.h"

namespace headlab::tasks {

class WordPieceTokenizer : public TextTokenizer {
 public:
  // How a text becomes words: tokenizer_config.json's do_lower_case, strip_accents, tokenize_chinese_chars, or
  // tokenizer.json's BertNormalizer (lowercase, strip_accents, handle_chinese_chars, clean_text) and model.
  struct Options {
    bool lowercase = true;
    bool strip_accents = true;  // unless given: as lowercase
    bool chinese_chars = true;
    bool clean_text = true;
    // NFC before the split on whitespace: BertTokenizer's (vocab.txt), not tokenizers' BertNormalizer's; it
    // changes a cased model's tokens of decomposed text only.
    bool nfc = true;
    std::string prefix = "##";  // continuing_subword_prefix
    int64_t max_chars_per_word = 100;
  };

  // A vocab.txt's contents (one token a line, id = line number from 0) and, when the folder has one, its
  // tokenizer_config.json's ("" if none). vocab_name, config_name name them in errors. vocab_size > 0: the
  // model's embedding rows, which the tokens must number exactly; 0 accepts any.
  static std::shared_ptr<const WordPieceTokenizer> from_vocab_txt(std::string_view vocab_txt, std::string vocab_name,
                                                                  int64_t vocab_size = 0,
                                                                  std::string_view config_json = "",
                                                                  std::string config_name = "tokenizer_config.json");
  // A tokenizer.json of model.type "WordPiece": model.vocab, unk_token, continuing_subword_prefix,
  // max_input_chars_per_word; normalizer BertNormalizer or null; pre_tokenizer BertPreTokenizer; post_processor
  // BertProcessing, TemplateProcessing ([CLS] $A [SEP]) or null; decoder WordPiece or null; added_tokens (matched
  // as written, normalized or not, as transformers.js does). Anything else is refused by name. A
  // tokenizer_config.json beside it overrides what it says where it speaks (as BertTokenizerFast).
  static std::shared_ptr<const WordPieceTokenizer> from_tokenizer_json(
      std::string_view tokenizer_json, std::string name, int64_t vocab_size = 0, std::string_view config_json = "",
      std::string config_name = "tokenizer_config.json");

  int64_t size() const override { return static_cast<int64_t>(tokens_.size()); }
  // Text (UTF-8) -> ids, without [CLS] and [SEP]. Invalid UTF-8 throws "<label>: invalid UTF-8 at byte offset N".
  std::vector<int64_t> encode(std::string_view text, std::string_view label = "prompt") const override;
  // [CLS] encode(text) [SEP]: what BertTokenizer's __call__ gives a single text.
  std::vector<int64_t> encode_with_specials(std::string_view text, std::string_view label = "prompt") const;
  // The tokens joined by spaces, a piece that continues a word ("##ing") joined to the one before it, as
  // BertTokenizer's convert_tokens_to_string ("un ##want ##ed ," -> "unwanted ,": no clean-up of spaces).
  std::string decode(const std::vector<int64_t>& ids) const override;
  std::string token_text(int64_t id) const override;  // as the vocabulary spells it ("##ing")
  std::optional<int64_t> find(std::string_view token) const;
  std::optional<int64_t> bos() const override { return cls_; }  // prompts start with [CLS]
  std::optional<int64_t> eos() const override { return sep_; }
  std::optional<int64_t> cls() const { return cls_; }
  std::optional<int64_t> sep() const { return sep_; }
  std::optional<int64_t> pad() const { return pad_; }
  std::optional<int64_t> mask() const override { return mask_; }  // (TextTokenizer::mask: the masked-LM task)
  int64_t unk() const { return *unk_; }
  const Options& options() const { return options_; }
  std::string describe() const override;  // "BERT's WordPiece tokenizer of 30522 tokens (lowercased)"
  // {"wordpiece", vocab.txt [+ tokenizer_config.json]} or {"wordpiece", tokenizer.json [+ tokenizer_config.json]}.
  TokenizerFiles files() const override { return files_; }

 private:
  struct Special {
    std::string content;
    int64_t id;
  };
  struct Reader;  // the sources: vocab.txt, tokenizer.json, tokenizer_config.json (wordpiece_tokenizer.cpp)
  WordPieceTokenizer() = default;
  void check_id(int64_t id) const;
  void encode_text(std::string_view text, std::vector<int64_t>& out) const;  // between special tokens
  void encode_word(std::u16string word, std::vector<int64_t>& out) const;    // between spaces
  void word_pieces(std::string_view word, std::vector<int64_t>& out) const;  // between punctuation

  std::string name_;                              // the file, in errors
  std::vector<std::string> tokens_;               // (n,) id -> token
  std::unordered_map<std::string, int64_t> ids_;  // token -> id
  size_t longest_ = 0;                            // the longest token's bytes: no longer piece is tried
  std::vector<Special> specials_;                 // special and added tokens: split out as written, longest first
  std::vector<bool> is_special_;                  // (n,) id -> among them
  Options options_;
  std::optional<int64_t> unk_, cls_, sep_, pad_, mask_;  // unk_: always, once read
  TokenizerFiles files_;
};

// A vocab.txt, or a tokenizer.json (a path ending in .json), with the folder's tokenizer_config.json ("" if none),
// read within the sizes headlab allows (base/sizes.h). vocab_size as above.
std::shared_ptr<const WordPieceTokenizer> wordpiece_from_file(const std::string& path,
                                                              const std::string& config_path = "",
                                                              int64_t vocab_size = 0);
// From files() as a checkpoint carries them; where ("checkpoint 'x.h5': tokenizer/") starts the names in errors.
std::shared_ptr<const WordPieceTokenizer> wordpiece_from_files(const TokenizerFiles& files, const std::string& where,
                                                               int64_t vocab_size = 0);
// Whether a tokenizer.json's text is JSON whose model.type is "WordPiece" (text without the word is not parsed), and
// the same of a file: what tokenizer discovery asks. Neither throws: what is not one is left to the BPE reader.
bool is_wordpiece_tokenizer_json(std::string_view text);
bool is_wordpiece_tokenizer_json_file(const std::string& path);

}  // namespace headlab::tasks
