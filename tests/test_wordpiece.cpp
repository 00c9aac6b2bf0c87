// BERT's WordPiece tokenizer (tasks/wordpiece_tokenizer.h): Google BERT's own tokenization tests
// (tokenization_test.py) and Hugging Face's BertTokenizer tests give the same tokens here, from a vocab.txt and
// from a tokenizer.json of the same vocabulary; special tokens written in the text, decoding, the files a
// checkpoint carries, and every refusal by its message.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tasks/wordpiece_tokenizer.h"
#include "tests/core_test_util.h"
#include "tests/process_util.h"

using namespace headlab;
using headlab::testing::TempDir;
using nlohmann::json;
using Tokens = std::vector<std::string>;
using namespace std::string_literals;

namespace {

using Tok = std::shared_ptr<const tasks::WordPieceTokenizer>;

// tokenization_test.py's vocabulary, with "," (test_full_tokenizer's).
const Tokens kGoogleVocab = {"[UNK]", "[CLS]", "[SEP]", "want", "##want", "##ed", "wa", "un", "runn", "##ing", ","};

std::string lines(const Tokens& vocab) {
  std::string s;
  for (const std::string& t : vocab) s += t + "\n";
  return s;
}

Tok from_vocab(const Tokens& vocab, const std::string& config = "", int64_t vocab_size = 0) {
  return tasks::WordPieceTokenizer::from_vocab_txt(lines(vocab), "vocab.txt", vocab_size, config);
}

// The tokens of a text, as the vocabulary spells them.
Tokens tokens(const tasks::WordPieceTokenizer& tok, std::string_view text) {
  Tokens out;
  for (const int64_t id : tok.encode(text)) out.push_back(tok.token_text(id));
  return out;
}

// A vocabulary of the words BasicTokenizer's tests expect, so that each word is one token.
Tokens basic_vocab() {
  return {"[UNK]",      "[CLS]", "[SEP]",    "[PAD]",  "[MASK]", "hello",      "HeLLo", "!",        "how",
          "are",        "Are",   "you",      "yoU",    "?",      "hällo",      "HäLLo", "hallo",    "HaLLo",
          "h\u00E9llo", "ah",    "\u535A",   "\u63A8", "zz",     "[",          "]",     "mask",     "world",
          "$",          "5",     "`",        "\u00BF", "\u00AB", "\u00BB",     "σας",   "angstrom", "i",
          "привет",     "e",     "##\u0301", "\u00E9", "H",      "##\u00E9llo"};
}

// bert-base-uncased's tokenizer.json, over a vocabulary: its normalizer, pre-tokenizer, template and decoder.
json bert_json(const Tokens& vocab, bool lowercase = true) {
  json v = json::object();
  for (size_t i = 0; i < vocab.size(); ++i) v[vocab[i]] = i;
  json added = json::array();
  for (const char* special : {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"})
    if (v.contains(special))
      added.push_back({{"id", v[special]},
                       {"content", special},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", true}});
  const auto special = [](const char* t) { return json{{"SpecialToken", {{"id", t}, {"type_id", 0}}}}; };
  return {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer",
       {{"type", "BertNormalizer"},
        {"clean_text", true},
        {"handle_chinese_chars", true},
        {"strip_accents", nullptr},
        {"lowercase", lowercase}}},
      {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", json::array({special("[CLS]"), {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}, special("[SEP]")})},
        {"special_tokens",
         {{"[CLS]", {{"id", "[CLS]"}, {"ids", json::array({v["[CLS]"]})}, {"tokens", json::array({"[CLS]"})}}},
          {"[SEP]", {{"id", "[SEP]"}, {"ids", json::array({v["[SEP]"]})}, {"tokens", json::array({"[SEP]"})}}}}}}},
      {"decoder", {{"type", "WordPiece"}, {"prefix", "##"}, {"cleanup", true}}},
      {"model",
       {{"type", "WordPiece"},
        {"unk_token", "[UNK]"},
        {"continuing_subword_prefix", "##"},
        {"max_input_chars_per_word", 100},
        {"vocab", v}}}};
}

Tok from_json(const json& j, int64_t vocab_size = 0, const std::string& config = "") {
  return tasks::WordPieceTokenizer::from_tokenizer_json(j.dump(), "tok.json", vocab_size, config);
}

}  // namespace

// ---- Google BERT's tokenization_test.py ----

TEST(WordPiece, GooglesFullTokenizer) {
  const Tok tok = from_vocab(kGoogleVocab);
  EXPECT_EQ(tokens(*tok, "UNwant\u00E9d,running"), (Tokens{"un", "##want", "##ed", ",", "runn", "##ing"}));
  EXPECT_EQ(tok->encode("UNwant\u00E9d,running"), (std::vector<int64_t>{7, 4, 5, 10, 8, 9}));
}

TEST(WordPiece, GooglesWordpieceTokenizer) {
  const Tok tok = from_vocab(kGoogleVocab);
  EXPECT_TRUE(tok->encode("").empty());
  EXPECT_EQ(tokens(*tok, "unwanted running"), (Tokens{"un", "##want", "##ed", "runn", "##ing"}));
  EXPECT_EQ(tokens(*tok, "unwantedX running"), (Tokens{"[UNK]", "runn", "##ing"}));  // the whole word
}

TEST(WordPiece, GooglesBasicTokenizerLowercases) {
  const Tok tok = from_vocab(basic_vocab());
  EXPECT_EQ(tokens(*tok, " \tHeLLo!how  \n Are yoU?  "), (Tokens{"hello", "!", "how", "are", "you", "?"}));
  EXPECT_EQ(tokens(*tok, "H\u00E9llo"), (Tokens{"hello"}));
}

TEST(WordPiece, GooglesBasicTokenizerKeepsCaseAndAccentsWithoutLowercase) {
  const Tok tok = from_vocab(basic_vocab(), R"({"do_lower_case": false})");
  EXPECT_EQ(tokens(*tok, " \tHeLLo!how  \n Are yoU?  "), (Tokens{"HeLLo", "!", "how", "Are", "yoU", "?"}));
  EXPECT_EQ(tokens(*tok, "H\u00E9llo"), (Tokens{"H", "##\u00E9llo"}));
  EXPECT_EQ(tok->describe(), "BERT's WordPiece tokenizer of 42 tokens (cased)");
}

TEST(WordPiece, GooglesChineseCharactersAreWordsOfTheirOwn) {
  EXPECT_EQ(tokens(*from_vocab(basic_vocab()), "ah\u535A\u63A8zz"), (Tokens{"ah", "\u535A", "\u63A8", "zz"}));
  // tokenize_chinese_chars false: one word, which the vocabulary cannot cut
  EXPECT_EQ(tokens(*from_vocab(basic_vocab(), R"({"tokenize_chinese_chars": false})"), "ah\u535A\u63A8zz"),
            (Tokens{"[UNK]"}));
}

// ---- Hugging Face's BertTokenizer tests: strip_accents apart from do_lower_case ----

TEST(WordPiece, StripAccentsAsConfigured) {
  const std::string text = " \tH\u00E4LLo!how  \n Are yoU?  ";
  EXPECT_EQ(tokens(*from_vocab(basic_vocab(), R"({"do_lower_case": true, "strip_accents": false})"), text),
            (Tokens{"hällo", "!", "how", "are", "you", "?"}));
  EXPECT_EQ(tokens(*from_vocab(basic_vocab(), R"({"do_lower_case": true, "strip_accents": null})"), text),
            (Tokens{"hallo", "!", "how", "are", "you", "?"}));
  EXPECT_EQ(tokens(*from_vocab(basic_vocab(), R"({"do_lower_case": false, "strip_accents": true})"), text),
            (Tokens{"HaLLo", "!", "how", "Are", "yoU", "?"}));
  EXPECT_EQ(tokens(*from_vocab(basic_vocab(), R"({"do_lower_case": false, "strip_accents": false})"), text),
            (Tokens{"HäLLo", "!", "how", "Are", "yoU", "?"}));
}

// Beyond Latin-1: ICU's full case mappings and decompositions, Unicode's punctuation and spaces.
TEST(WordPiece, UnicodeCasePunctuationAndSpaces) {
  const Tok tok = from_vocab(basic_vocab());
  EXPECT_EQ(tokens(*tok, "ΣΑΣ ÅNGSTRÖM İ ПРИВЕТ"), (Tokens{"σας", "angstrom", "i", "привет"}));  // final sigma
  EXPECT_EQ(tokens(*tok, "$5 how`are \u00BFyou? \u00ABhello\u00BB"),  // ASCII symbols split as punctuation
            (Tokens{"$", "5", "how", "`", "are", "\u00BF", "you", "?", "\u00AB", "hello", "\u00BB"}));
  // NUL, U+FFFD, a control and a format character (soft hyphen) dropped; no-break and ideographic spaces split
  EXPECT_EQ(tokens(*tok,
                   "hel\0lo\uFFFD h\x05"
                   "ello hel\u00ADlo how\u00A0are\u3000you"s),
            (Tokens{"hello", "hello", "hello", "how", "are", "you"}));
  EXPECT_EQ(tokens(*tok, "e\u0301"), (Tokens{"e"}));  // a decomposed accent stripped too
}

// A word is cut no further than max_input_chars_per_word: 100 characters, [UNK] past that.
TEST(WordPiece, AWordTooLongIsUnknown) {
  const Tok tok = from_vocab({"[UNK]", "a", "##a"});
  EXPECT_EQ(tok->encode(std::string(100, 'a')).size(), 100u);
  EXPECT_EQ(tok->encode(std::string(101, 'a')), (std::vector<int64_t>{0}));
}

// ---- special tokens ----

TEST(WordPiece, SpecialTokensWrittenInTheTextStayWhole) {
  const Tok tok = from_vocab(basic_vocab());
  EXPECT_EQ(tokens(*tok, "[CLS] Hello [MASK]world[SEP]"), (Tokens{"[CLS]", "hello", "[MASK]", "world", "[SEP]"}));
  EXPECT_EQ(tokens(*tok, "[mask]"), (Tokens{"[", "mask", "]"}));  // as written only: never lowercased
  EXPECT_EQ(tok->cls(), 1);
  EXPECT_EQ(tok->sep(), 2);
  EXPECT_EQ(tok->pad(), 3);
  EXPECT_EQ(tok->mask(), 4);
  EXPECT_EQ(tok->unk(), 0);
  EXPECT_EQ(tok->bos(), tok->cls());
  EXPECT_EQ(tok->eos(), tok->sep());
  EXPECT_EQ(tok->encode_with_specials("hello!"), (std::vector<int64_t>{1, 5, 7, 2}));
  // a prompt as the commands frame it: BertTokenizer's [CLS] ... [SEP]; without BOS, the text alone
  EXPECT_EQ(tok->encode_prompt("hello!"), tok->encode_with_specials("hello!"));
  EXPECT_EQ(tok->encode_prompt("hello!", false), (std::vector<int64_t>{5, 7}));
}

TEST(WordPiece, TheConfigNamesTheSpecialTokens) {
  Tokens vocab = basic_vocab();
  vocab.push_back("<mask>");
  const Tok tok = from_vocab(vocab, R"({"mask_token": {"content": "<mask>", "lstrip": false}, "unk_token": "[UNK]",
                                       "added_tokens_decoder": {"0": {"content": "[UNK]", "special": true}}})");
  EXPECT_EQ(tok->mask(), 42);
  EXPECT_EQ(tokens(*tok, "hello<mask> [MASK]"), (Tokens{"hello", "<mask>", "[", "mask", "]"}));
  EXPECT_EQ(from_vocab({"[UNK]", "a"})->cls(), std::nullopt);  // none in the vocabulary: none
}

// ---- decoding ----

TEST(WordPiece, DecodeJoinsContinuationsAsConvertTokensToString) {
  const Tok tok = from_vocab(kGoogleVocab);
  EXPECT_EQ(tok->decode({7, 4, 5, 10, 8, 9}), "unwanted , running");
  EXPECT_EQ(tok->decode(tok->encode_with_specials("unwanted")), "[CLS] unwanted [SEP]");
  EXPECT_EQ(tok->decode({4, 1, 9}), "##want [CLS] ##ing");  // a continuation joins a word piece only
  EXPECT_EQ(tok->token_text(4), "##want");
  EXPECT_EQ(tok->find("runn"), 8);
  EXPECT_EQ(tok->find("running"), std::nullopt);
  EXPECT_ERROR(tok->decode({11}), "vocab.txt: token id 11 is out of range for 11 tokens");
}

// ---- tokenizer.json ----

TEST(WordPiece, ATokenizerJsonGivesTheVocabTxtsTokens) {
  const Tok txt = from_vocab(basic_vocab()), js = from_json(bert_json(basic_vocab()));
  for (const char* text : {" \tHeLLo!how  \n Are yoU?  ", "H\u00E9llo", "ah\u535A\u63A8zz", "[CLS] Hello [MASK]world",
                           "ΣΑΣ ÅNGSTRÖM İ ПРИВЕТ", "$5 how`are \u00BFyou?"})
    EXPECT_EQ(js->encode(text), txt->encode(text)) << text;
  EXPECT_EQ(js->encode_with_specials("hello"), (std::vector<int64_t>{1, 5, 2}));
  EXPECT_EQ(js->options().nfc, false);
  // Cased: BertTokenizer composes (NFC) before it splits, tokenizers' BertNormalizer does not.
  const Tok cased_txt = from_vocab(basic_vocab(), R"({"do_lower_case": false})");
  const Tok cased_js = from_json(bert_json(basic_vocab(), false));
  EXPECT_EQ(tokens(*cased_txt, "e\u0301"), (Tokens{"\u00E9"}));
  EXPECT_EQ(tokens(*cased_js, "e\u0301"), (Tokens{"e", "##\u0301"}));
  // A tokenizer_config.json beside it overrides the normalizer where it speaks (as BertTokenizerFast).
  EXPECT_EQ(tokens(*from_json(bert_json(basic_vocab()), 0, R"({"do_lower_case": false})"), "HeLLo"), (Tokens{"HeLLo"}));
}

TEST(WordPiece, TheModelsLimitsAndPrefix) {
  json j = bert_json({"[UNK]", "[CLS]", "[SEP]", "a", "@@a"});
  j["model"]["continuing_subword_prefix"] = "@@";
  j["decoder"]["prefix"] = "@@";
  j["model"]["max_input_chars_per_word"] = 3;
  const Tok tok = from_json(j);
  EXPECT_EQ(tok->encode("aaa"), (std::vector<int64_t>{3, 4, 4}));
  EXPECT_EQ(tok->encode("aaaa"), (std::vector<int64_t>{0}));
  EXPECT_EQ(tok->decode({3, 4, 4}), "aaa");
}

TEST(WordPiece, TellsAWordPieceTokenizerJson) {
  EXPECT_TRUE(tasks::is_wordpiece_tokenizer_json(bert_json(kGoogleVocab).dump()));
  EXPECT_FALSE(tasks::is_wordpiece_tokenizer_json(R"({"model": {"type": "BPE", "vocab": {}}})"));
  EXPECT_FALSE(tasks::is_wordpiece_tokenizer_json(R"({"model": {"type": "WordPiece")"));  // not JSON: not one
  EXPECT_FALSE(tasks::is_wordpiece_tokenizer_json("\"WordPiece\""));
}

// ---- files and checkpoints ----

TEST(WordPiece, FromFilesAndBackThroughFiles) {
  TempDir dir("wordpiece");
  std::ofstream(dir.path("vocab.txt")) << lines(basic_vocab());
  std::ofstream(dir.path("tokenizer_config.json")) << R"({"do_lower_case": false})";
  std::ofstream(dir.path("tokenizer.json")) << bert_json(basic_vocab()).dump();
  const std::string text = "[CLS] HeLLo H\u00E9llo how\u00A0are you?";
  for (const Tok& tok : {tasks::wordpiece_from_file(dir.path("vocab.txt"), dir.path("tokenizer_config.json"), 42),
                         tasks::wordpiece_from_file(dir.path("tokenizer.json"), "", 42)}) {
    const tasks::TokenizerFiles files = tok->files();
    EXPECT_EQ(files.type, "wordpiece");
    const Tok again = tasks::wordpiece_from_files(files, "checkpoint 'x.h5': tokenizer/", 42);
    EXPECT_EQ(again->encode(text), tok->encode(text));
    EXPECT_EQ(again->describe(), tok->describe());
    EXPECT_EQ(again->files().files, files.files);
  }
  EXPECT_EQ(tasks::wordpiece_from_file(dir.path("vocab.txt"), dir.path("tokenizer_config.json"))->files().files,
            (std::vector<std::pair<std::string, std::string>>{
                {"vocab.txt", lines(basic_vocab())}, {"tokenizer_config.json", R"({"do_lower_case": false})"}}));
  EXPECT_ERROR(tasks::wordpiece_from_files({"wordpiece", {}}, "checkpoint 'x.h5': tokenizer/"),
               "checkpoint 'x.h5': tokenizer/vocab.txt is missing");
  // Files too large are refused by their size before they are read.
  std::ofstream(dir.path("big.json")).close();
  std::filesystem::resize_file(dir.path("big.json"), (int64_t{16} << 20) + 1);
  EXPECT_ERROR(tasks::wordpiece_from_file(dir.path("vocab.txt"), dir.path("big.json")),
               "tokenizer '" + dir.path("big.json") +
                   "' is 16.0 MiB (16777217 bytes), more than the 16.0 MiB headlab reads whole of a config file");
  EXPECT_ERROR(tasks::wordpiece_from_file(dir.path("none.txt")), "none.txt' does not exist");
}

// ---- refusals ----

TEST(WordPiece, RefusesABadVocabTxtOrConfig) {
  EXPECT_ERROR(from_vocab({}), "vocab.txt: is empty; expected one token a line");
  EXPECT_ERROR(from_vocab({"[UNK]", "a", "b", "a"}),
               "vocab.txt: line 4: token \"a\" appears again (first as id 1); expected each token once");
  EXPECT_ERROR(from_vocab(kGoogleVocab, "", 12), "vocab.txt: holds 11 tokens, but the model's vocab_size is 12");
  EXPECT_ERROR(from_vocab({"[UNK]", "a\xFF"}), "vocab.txt: line 2: invalid UTF-8 at byte offset 1 (byte 0xff)");
  EXPECT_ERROR(from_vocab({"a", "b"}), "vocab.txt: has no [UNK] token, which WordPiece gives a word it cannot cut");
  EXPECT_ERROR(from_vocab(kGoogleVocab, R"({"mask_token": "<mask>"})"),
               "tokenizer_config.json: mask_token is \"<mask>\", which is not a token of the vocabulary");
  EXPECT_ERROR(from_vocab(kGoogleVocab, R"({"do_lower_case": "yes"})"),
               "tokenizer_config.json: key 'do_lower_case' has the wrong type (string)");
  EXPECT_ERROR(from_vocab(kGoogleVocab, R"({"do_basic_tokenize": false})"),
               "tokenizer_config.json: do_basic_tokenize is false");
  EXPECT_ERROR(from_vocab(kGoogleVocab, R"({"do_lower_case": true, "do_lower_case": false})"),
               "tokenizer_config.json: key \"do_lower_case\" appears twice");
  EXPECT_ERROR(from_vocab(kGoogleVocab, "{"), "tokenizer_config.json: not JSON");
  EXPECT_ERROR(from_vocab(kGoogleVocab, R"({"added_tokens_decoder": {"5": {"content": "want"}}})"),
               "added_tokens_decoder.5: \"want\" has id 5, but the vocabulary's is 3");
}

TEST(WordPiece, RefusesInvalidUtf8Text) {
  EXPECT_ERROR(from_vocab(kGoogleVocab)->encode("un\xFFwant", "notes.txt"),
               "notes.txt: invalid UTF-8 at byte offset 2 (byte 0xff)");
  EXPECT_ERROR(from_vocab({"[UNK]", "a"})->encode_with_specials("a"), "vocab.txt: has no [CLS] token");
}

// Each part of a tokenizer.json headlab does not read, or reads wrong, by the file, the field and what came.
TEST(WordPiece, RefusesATokenizerJsonItDoesNotRead) {
  const auto refused = [](const std::function<void(json&)>& edit) {
    json j = bert_json(kGoogleVocab);
    edit(j);
    return headlab::testing::error_of([&] { from_json(j); });
  };
  const std::vector<std::pair<std::function<void(json&)>, std::string>> cases = {
      {[](json& j) { j["model"]["type"] = "BPE"; },
       "tok.json: model.type is \"BPE\"; headlab's WordPiece reads WordPiece"},
      {[](json& j) { j.erase("model"); }, "tok.json: model.type is null; headlab's WordPiece reads WordPiece"},
      {[](json& j) { j["model"]["vocab"] = json::object(); }, "tok.json: model.vocab must be a non-empty object"},
      {[](json& j) { j["model"]["vocab"]["want"] = 4; }, "tok.json: model.vocab gives id 4 to \"##want\" and \"want\""},
      {[](json& j) { j["model"]["vocab"]["want"] = 11; },
       "tok.json: model.vocab[\"want\"] is 11, expected an id in 0..10"},
      {[](json& j) { j["model"]["unk_token"] = "<unk>"; },
       "tok.json: model.unk_token is \"<unk>\", which is not a token of the vocabulary"},
      {[](json& j) { j["model"]["max_input_chars_per_word"] = 0; },
       "tok.json: model.max_input_chars_per_word must be positive, got 0"},
      {[](json& j) { j["model"]["max_input_chars_per_word"] = 2.5; },
       "tok.json: model: key 'max_input_chars_per_word' must be an integer, got 2.5"},
      {[](json& j) {
         j["normalizer"] = {{"type", "NFC"}};
       },
       "tok.json: normalizer.type is \"NFC\"; headlab's WordPiece reads BertNormalizer or none (null)"},
      {[](json& j) { j["normalizer"]["lowercase"] = "yes"; },
       "tok.json: normalizer: key 'lowercase' has the wrong type (string)"},
      {[](json& j) {
         j["pre_tokenizer"] = {{"type", "Whitespace"}};
       },
       "tok.json: pre_tokenizer.type is \"Whitespace\"; headlab's WordPiece reads BertPreTokenizer"},
      {[](json& j) { j["pre_tokenizer"] = nullptr; }, "tok.json: pre_tokenizer.type is null"},
      {[](json& j) {
         j["post_processor"] = {{"type", "RobertaProcessing"}};
       },
       "tok.json: post_processor.type is \"RobertaProcessing\"; headlab's WordPiece reads BertProcessing, "
       "TemplateProcessing or none (null)"},
      {[](json& j) { j["post_processor"]["single"].erase(2); }, "headlab reads the template \"[CLS] $A [SEP]\""},
      {[](json& j) { j["post_processor"]["special_tokens"]["[SEP]"]["ids"] = json::array({7}); },
       "tok.json: post_processor.special_tokens.[SEP]: \"[SEP]\"'s id is [7], but the vocabulary's is 2"},
      {[](json& j) {
         j["post_processor"] = {{"type", "BertProcessing"}, {"cls", {"[CLS]", 1}}, {"sep", {"[SEP]", 3}}};
       },
       "tok.json: post_processor.sep: \"[SEP]\"'s id is 3, but the vocabulary's is 2"},
      {[](json& j) {
         j["decoder"] = {{"type", "ByteLevel"}};
       },
       "tok.json: decoder.type is \"ByteLevel\"; headlab's WordPiece reads WordPiece or none (null)"},
      {[](json& j) { j["decoder"]["prefix"] = "@@"; },
       "tok.json: decoder.prefix is \"@@\", but model.continuing_subword_prefix is \"##\""},
      {[](json& j) { j["added_tokens"][0]["id"] = 5; },
       "tok.json: added_tokens[0]: \"[UNK]\" has id 5, but the vocabulary's is 0"},
      {[](json& j) {
         j["added_tokens"].push_back({{"id", 12}, {"content", "<new>"}});
       },
       "tok.json: added_tokens[3]: token \"<new>\" has id 12, expected 11"},
      {[](json& j) { j["added_tokens"][0]["single_word"] = true; }, "tok.json: added_tokens[0] has single_word true"},
      {[](json& j) {
         j["added_tokens"] = json::array({{{"content", "[UNK]"}}});
       },
       "tok.json: added_tokens[0] is"},
  };
  for (const auto& [edit, message] : cases) {
    const std::string got = refused(edit);
    EXPECT_NE(got.find(message), std::string::npos) << "expected: " << message << "\n     got: " << got;
  }
  std::string repeated = bert_json(kGoogleVocab).dump();
  repeated.replace(repeated.find("\"wa\":"), 5, "\"want\":");
  EXPECT_ERROR(tasks::WordPieceTokenizer::from_tokenizer_json(repeated, "tok.json"),
               "tok.json: model.vocab: key \"want\" appears twice");
  EXPECT_ERROR(tasks::WordPieceTokenizer::from_tokenizer_json("{\"model\": ", "tok.json"), "tok.json: not JSON");
  EXPECT_ERROR(from_json(bert_json(kGoogleVocab), 10), "tok.json: holds 11 tokens, but the model's vocab_size is 10");
  // An added token past the vocabulary is one more token.
  json j = bert_json(kGoogleVocab);
  j["added_tokens"].push_back({{"id", 11}, {"content", "<new>"}, {"special", false}});
  EXPECT_EQ(tokens(*from_json(j, 12), "want<new>"), (Tokens{"want", "<new>"}));
}
