// Hugging Face's tokenizer.json for byte-level BPE models (tasks/bpe_tokenizer.h): GPT-2's own files
// re-expressed as one give today's ids; Llama 3-, Qwen2- and SmolLM-shaped files (tests/fixtures/
// tokenizer_json, from tools/tokenizer_json_fixtures.sh) give tokenizers.js's ids; BOS, EOS and padded
// vocabularies; every refusal by name; and a LLaMA folder that loads through its tokenizer.json.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

#include "io/families.h"
#include "loader/load.h"
#include "nn/decoder_family.h"
#include "tasks/bpe_tokenizer.h"
#include "tasks/chars.h"
#include "tasks/internal.h"
#include "tasks/sentencepiece_tokenizer.h"
#include "tasks/tokenizer_discovery.h"
#include "tests/core_test_util.h"
#include "tests/process_util.h"

using namespace headlab;
using headlab::testing::slurp;
using headlab::testing::TempDir;
using nlohmann::json;

namespace {

namespace fs = std::filesystem;

const std::string kFixtures = std::string(HEADLAB_SOURCE_DIR) + "/tests/fixtures/tokenizer_json/";

json fixture(const std::string& name) { return json::parse(slurp(kFixtures + name + ".json")); }

tasks::BpeTokenizer load(const json& j, int64_t vocab_size = 0, const std::string& config = "") {
  return tasks::BpeTokenizer::from_tokenizer_json(j.dump(), "tok.json", vocab_size, config, "cfg.json");
}

std::string byte_char(uint8_t b) { return tasks::detail::encode_utf8(tasks::gpt2_byte_to_unicode(b)); }

// A minimal byte-level tokenizer.json: the 256 byte tokens by byte, the merges "h e", "l l", "he ll" and
// <|endoftext|> after them; each test breaks one thing.
json minimal() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(static_cast<uint8_t>(b))] = b;
  vocab["he"] = 256, vocab["ll"] = 257, vocab["hell"] = 258;
  json j;
  j["added_tokens"] = json::array({{{"id", 259},
                                    {"content", "<|endoftext|>"},
                                    {"single_word", false},
                                    {"lstrip", false},
                                    {"rstrip", false},
                                    {"normalized", true},
                                    {"special", true}}});
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  j["post_processor"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}};
  j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", ""},
                {"end_of_word_suffix", ""},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"vocab", vocab},
                {"merges", json::array({"h e", "l l", "he ll"})}};
  return j;
}

// GPT-2's vocabulary (scripts/install-deps.sh fetches it) as a tokenizer.json, its merges as "a b" strings
// or [a, b] pairs.
json gpt2_tokenizer_json(bool merges_as_pairs) {
  const std::string dir = HEADLAB_GPT2_VOCAB_DIR;
  if (!fs::exists(dir + "/vocab.json") || !fs::exists(dir + "/merges.txt"))
    throw std::runtime_error("GPT-2's vocab.json and merges.txt are not in " + dir +
                             ": run scripts/install-deps.sh (it fetches them with tools/gpt2_tokenizer_fixtures.sh)");
  json j = minimal();
  j["model"]["vocab"] = json::parse(slurp(dir + "/vocab.json"));
  json merges = json::array();
  const std::string text = slurp(dir + "/merges.txt");
  for (size_t pos = text.find('\n') + 1; pos < text.size();) {  // past "#version: 0.2"
    const size_t end = std::min(text.find('\n', pos), text.size());
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    merges.push_back(merges_as_pairs ? json::array({line.substr(0, space), line.substr(space + 1)}) : json(line));
  }
  j["model"]["merges"] = merges;
  j["added_tokens"][0]["id"] = 50256;
  return j;
}

}  // namespace

// ---- GPT-2 re-expressed: exactly the ids of vocab.json + merges.txt (and of js-tiktoken) ----

TEST(TokenizerJson, Gpt2ReExpressedGivesTheSameIdsInBothMergeForms) {
  const json cases = json::parse(slurp(std::string(HEADLAB_SOURCE_DIR) + "/tests/fixtures/gpt2_tokenizer_cases.json"));
  for (const bool pairs : {false, true}) {
    const tasks::BpeTokenizer tok = load(gpt2_tokenizer_json(pairs), 50257);
    EXPECT_EQ(tok.size(), 50257);
    EXPECT_EQ(tok.eos(), 50256);
    EXPECT_FALSE(tok.bos().has_value());
    for (const json& c : cases) {
      const std::string text = c.at("text");
      EXPECT_EQ(tok.encode(text), c.at("ids").get<std::vector<int64_t>>()) << c.at("name") << (pairs ? " (pairs)" : "");
      EXPECT_EQ(tok.decode(tok.encode(text)), text) << c.at("name");
    }
  }
}

// ---- Llama 3-, Qwen2- and SmolLM-shaped files against tokenizers.js ----

TEST(TokenizerJson, MatchesTokenizersJsOnEveryCase) {
  const json fixtures = fixture("cases");
  std::map<std::string, std::unique_ptr<tasks::BpeTokenizer>> toks;
  for (const auto& [name, t] : fixtures.at("tokenizers").items()) {
    toks[name] = std::make_unique<tasks::BpeTokenizer>(
        tasks::BpeTokenizer::from_tokenizer_json_file(kFixtures + t.at("file").get<std::string>()));
    EXPECT_EQ(toks[name]->tokens(), t.at("tokens").get<int64_t>()) << name;
    EXPECT_EQ(toks[name]->size(), toks[name]->tokens()) << name;
    const std::optional<int64_t> bos =
        t.at("bos").is_null() ? std::nullopt : std::optional<int64_t>(t.at("bos").get<int64_t>());
    EXPECT_EQ(toks[name]->bos(), bos) << name;
  }
  size_t checked = 0;
  for (const json& c : fixtures.at("cases")) {
    const tasks::BpeTokenizer& tok = *toks.at(c.at("tokenizer"));
    const std::string where = c.at("tokenizer").get<std::string>() + " " + c.at("name").get<std::string>();
    const std::vector<int64_t> ids = tok.encode(c.at("text").get<std::string>());
    EXPECT_EQ(ids, c.at("ids").get<std::vector<int64_t>>()) << where;
    EXPECT_EQ(tok.decode(ids), c.at("decoded").get<std::string>()) << where;
    ++checked;
  }
  EXPECT_GE(checked, 90u);
}

TEST(TokenizerJson, BosAndEosByTheDocumentedRule) {
  const tasks::BpeTokenizer llama3 = load(fixture("llama3"));
  EXPECT_EQ(llama3.bos(), llama3.find("<|begin_of_text|>"));  // the template's special token
  EXPECT_EQ(llama3.eos(), llama3.find("<|end_of_text|>"));    // the first of the usual names present
  ASSERT_TRUE(llama3.bos().has_value());
  const tasks::BpeTokenizer qwen2 = load(fixture("qwen2"));
  EXPECT_FALSE(qwen2.bos().has_value());
  EXPECT_EQ(qwen2.eos(), qwen2.find("<|endoftext|>"));
  // tokenizer_config.json decides where it says: strings or {"content": ...}.
  const tasks::BpeTokenizer chat =
      load(fixture("qwen2"), 0, R"({"bos_token": {"content": "<|im_start|>"}, "eos_token": "<|im_end|>",
                                   "add_bos_token": true, "chat_template": "ignored"})");
  EXPECT_EQ(chat.bos(), chat.find("<|im_start|>"));
  EXPECT_EQ(chat.eos(), chat.find("<|im_end|>"));
  EXPECT_FALSE(load(fixture("llama3"), 0, R"({"add_bos_token": false})").bos().has_value());
  // Without add_bos_token, the template still decides; bos_token alone names no BOS to add.
  EXPECT_EQ(load(fixture("llama3"), 0, R"({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"})").eos(),
            llama3.find("<|eot_id|>"));
  EXPECT_FALSE(load(fixture("qwen2"), 0, R"({"bos_token": "<|endoftext|>"})").bos().has_value());
  EXPECT_ERROR(load(fixture("qwen2"), 0, R"({"eos_token": "</s>"})"),
               "cfg.json: eos_token \"</s>\" is not a token of tok.json");
  EXPECT_ERROR(load(fixture("qwen2"), 0, R"({"bos_token": 5})"),
               "cfg.json: bos_token must be a string or an object with content, got 5");
  EXPECT_ERROR(load(fixture("qwen2"), 0, R"({"add_bos_token": true})"),
               "cfg.json: add_bos_token is true, but bos_token is not given");
  EXPECT_ERROR(load(fixture("qwen2"), 0, R"({"add_bos_token": "yes"})"),
               "cfg.json: add_bos_token must be true or false");
  EXPECT_ERROR(load(fixture("qwen2"), 0, "{"), "cfg.json: not JSON");
  EXPECT_ERROR(load(fixture("qwen2"), 0, R"({"eos_token": "<|im_end|>", "eos_token": "<|endoftext|>"})"),
               "cfg.json: key \"eos_token\" appears twice");
  EXPECT_ERROR(load(fixture("qwen2"), 0, "[]"), "cfg.json: the file must be an object");
}

TEST(TokenizerJson, IgnoreMergesTakesAPreTokenThatIsAToken) {
  json j = fixture("llama3");
  const tasks::BpeTokenizer with = load(j);
  j["model"]["ignore_merges"] = false;
  const tasks::BpeTokenizer without = load(j);
  EXPECT_EQ(with.encode(" unbelievable"), std::vector<int64_t>{*with.find("\xC4\xA0unbelievable")});
  EXPECT_GT(without.encode(" unbelievable").size(), 1u);
  EXPECT_EQ(without.decode(without.encode(" unbelievable")), " unbelievable");
}

TEST(TokenizerJson, NfcNormalisesTheTextBetweenAddedTokens) {
  const tasks::BpeTokenizer qwen2 = load(fixture("qwen2"));
  EXPECT_EQ(qwen2.encode("Cafe\xCC\x81<|im_end|>e\xCC\x81"), qwen2.encode("Caf\xC3\xA9<|im_end|>\xC3\xA9"));
  const tasks::BpeTokenizer llama3 = load(fixture("llama3"));  // no normalizer: the text as it is
  EXPECT_NE(llama3.encode("Cafe\xCC\x81"), llama3.encode("Caf\xC3\xA9"));
  EXPECT_EQ(llama3.decode(llama3.encode("Cafe\xCC\x81")), "Cafe\xCC\x81");
}

TEST(TokenizerJson, InvalidUtf8NamesTheLabelAndOffset) {
  EXPECT_ERROR(load(fixture("qwen2")).encode("ok\xC3(", "story.txt"), "story.txt: invalid UTF-8 at byte offset 2");
}

TEST(TokenizerJson, APaddedModelVocabularyIsAllowedAndItsPaddingIdsAreNamed) {
  const tasks::BpeTokenizer tok = load(minimal(), 272);
  EXPECT_EQ(tok.tokens(), 260);
  EXPECT_EQ(tok.size(), 272);
  EXPECT_EQ(tok.decode(tok.encode("hello<|endoftext|>")), "hello<|endoftext|>");
  EXPECT_ERROR(tok.decode({104, 265}), "tok.json: id 265 is a padding row of the model's vocabulary of 272");
  EXPECT_ERROR(tok.decode({272}), "tok.json: expected a token id in 0..259, got 272");
  EXPECT_ERROR(tok.decode({-1}), "got -1");
  EXPECT_EQ(tok.token_text(265), "<unused 265>");
  EXPECT_EQ(tok.token_text(258), "hell");
  EXPECT_ERROR(load(minimal(), 259), "tok.json: 260 tokens, more than the model's vocab_size 259");
  EXPECT_NE(tok.describe().find("tokenizer.json"), std::string::npos);
}

TEST(TokenizerJson, AddedTokensSplitTheTextLongestFirst) {
  json j = minimal();
  j["added_tokens"].push_back({{"id", 260}, {"content", "<|endoftext|>!"}, {"special", false}});
  j["added_tokens"].push_back({{"id", 261}, {"content", "he"}, {"special", false}});  // the model's token "he"
  EXPECT_ERROR(load(j), "added_tokens[2]: \"he\" has id 261, but it is token 256");
  j["added_tokens"][2]["id"] = 256;
  const tasks::BpeTokenizer tok = load(j);
  EXPECT_EQ(tok.encode("a<|endoftext|>!<|endoftext|>hello"), (std::vector<int64_t>{'a', 260, 259, 256, 257, 'o'}));
  EXPECT_EQ(tok.encode("ahe"), (std::vector<int64_t>{'a', 256}));  // an added token splits inside a word
}

// ---- refusals: each names the file and the field ----

TEST(TokenizerJson, WhatItDoesNotReadIsRefusedByName) {
  const auto refused = [](const std::function<void(json&)>& change, const std::string& message) {
    json j = minimal();
    change(j);
    EXPECT_ERROR(load(j), message);
  };
  refused([](json& j) { j["model"]["type"] = "WordPiece"; }, "tok.json: model.type is \"WordPiece\"");
  refused([](json& j) { j["model"]["byte_fallback"] = true; }, "tok.json: model.byte_fallback is true");
  refused([](json& j) { j["model"]["continuing_subword_prefix"] = "##"; },
          "tok.json: model.continuing_subword_prefix is \"##\"");
  refused([](json& j) { j["model"]["end_of_word_suffix"] = "</w>"; }, "tok.json: model.end_of_word_suffix is \"</w>\"");
  refused([](json& j) { j["model"]["dropout"] = 0.1; }, "tok.json: model.dropout is 0.1");
  refused([](json& j) { j["normalizer"] = {{"type", "NFKC"}}; }, "tok.json: normalizer.type is \"NFKC\"");
  refused([](json& j) { j["normalizer"] = {{"type", "Lowercase"}}; }, "normalizer.type is \"Lowercase\"");
  refused(
      [](json& j) {
        j["pre_tokenizer"] = {{"type", "Metaspace"}};
      },
      "tok.json: pre_tokenizer.type is \"Metaspace\"");
  const json split = {{"type", "Split"}, {"pattern", {{"Regex", "\\s+"}}}, {"behavior", "Isolated"}, {"invert", false}};
  const auto sequence = [](json first, json second) {
    return json{{"type", "Sequence"}, {"pretokenizers", json::array({first, second})}};
  };
  refused(
      [&](json& j) {
        json s = split;
        s["behavior"] = "Removed";
        j["pre_tokenizer"] = sequence(s, j["pre_tokenizer"]);
      },
      "tok.json: pre_tokenizer.pretokenizers[0].behavior is \"Removed\"");
  refused(
      [&](json& j) {
        json s = split;
        s["invert"] = true;
        j["pre_tokenizer"] = sequence(s, j["pre_tokenizer"]);
      },
      "pre_tokenizer.pretokenizers[0].invert is true");
  refused(
      [&](json& j) {
        json s = split;
        s["pattern"] = {{"Regex", "(unclosed"}};
        j["pre_tokenizer"] = sequence(s, j["pre_tokenizer"]);
      },
      "tok.json: pre_tokenizer.pretokenizers[0]: PCRE2 cannot compile the pattern \"(unclosed\"");
  refused(
      [&](json& j) {
        json s = split;
        s["pattern"] = {{"Glob", "*"}};
        j["pre_tokenizer"] = sequence(s, j["pre_tokenizer"]);
      },
      "pre_tokenizer.pretokenizers[0].pattern is {\"Glob\":\"*\"}, expected {\"Regex\"");
  refused([&](json& j) { j["pre_tokenizer"] = sequence(j["pre_tokenizer"], split); },
          "tok.json: pre_tokenizer.pretokenizers[1] (Split) comes after ByteLevel");
  refused([&](json& j) { j["pre_tokenizer"] = split; }, "tok.json: pre_tokenizer has no ByteLevel step");
  refused([&](json& j) { j["pre_tokenizer"] = nullptr; }, "pre_tokenizer has no ByteLevel step");
  refused([&](json& j) { j["pre_tokenizer"].erase("add_prefix_space"); }, "pre_tokenizer.add_prefix_space is missing");
  refused([&](json& j) { j["pre_tokenizer"]["use_regex"] = "yes"; }, "pre_tokenizer.use_regex must be true or false");
  refused([](json& j) { j["decoder"] = {{"type", "WordPiece"}}; }, "tok.json: decoder is WordPiece");
  refused([](json& j) { j["decoder"] = nullptr; }, "tok.json: decoder is null");
  refused(
      [](json& j) {
        j["post_processor"] = {{"type", "RobertaProcessing"}};
      },
      "tok.json: post_processor.type is \"RobertaProcessing\"");
  refused(
      [](json& j) {
        j["post_processor"] = {{"type", "TemplateProcessing"},
                               {"single", json::array({{{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                                       {{"SpecialToken", {{"id", "<|endoftext|>"}, {"type_id", 0}}}}})},
                               {"special_tokens", json::object()}};
      },
      "tok.json: post_processor.single is");
  refused(
      [](json& j) {
        j["post_processor"] = {{"type", "TemplateProcessing"},
                               {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                                       {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                               {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {4000}}, {"tokens", {"<s>"}}}}}}};
      },
      "tok.json: post_processor.special_tokens.<s>.ids holds 4000, which is not a token id");
  for (const char* key : {"lstrip", "rstrip", "single_word"})
    refused([&](json& j) { j["added_tokens"][0][key] = true; },
            std::string("tok.json: added_tokens[0] (\"<|endoftext|>\") has ") + key + " true");
}

TEST(TokenizerJson, MalformedFilesAreRefusedWithTheField) {
  EXPECT_ERROR(tasks::BpeTokenizer::from_tokenizer_json("{\"model\": ", "tok.json"), "tok.json: not JSON");
  EXPECT_ERROR(tasks::BpeTokenizer::from_tokenizer_json(std::string("{}\0x", 4), "tok.json"),
               "tok.json: not JSON (a NUL byte at offset 2");
  EXPECT_ERROR(tasks::BpeTokenizer::from_tokenizer_json("[]", "tok.json"), "tok.json: the file must be an object");
  EXPECT_ERROR(tasks::BpeTokenizer::from_tokenizer_json("{\"a\": " + std::string(100000, '['), "tok.json"),
               "tok.json: expected at most 32 levels of nesting");
  EXPECT_ERROR(tasks::BpeTokenizer::from_tokenizer_json_file("/nonexistent/tokenizer.json"),
               "/nonexistent/tokenizer.json");
  const auto refused = [](const std::function<void(json&)>& change, const std::string& message) {
    json j = minimal();
    change(j);
    EXPECT_ERROR(load(j), message);
  };
  refused([](json& j) { j.erase("model"); }, "tok.json: model is missing");
  refused([](json& j) { j["model"] = 3; }, "tok.json: model must be an object, got 3");
  refused([](json& j) { j["model"].erase("type"); }, "tok.json: model.type is missing");
  refused([](json& j) { j["model"].erase("vocab"); }, "tok.json: model.vocab is missing");
  refused([](json& j) { j["model"]["vocab"] = json::array(); }, "tok.json: model.vocab must be an object");
  refused([](json& j) { j["model"]["vocab"]["he"] = "256"; }, "tok.json: model.vocab: key \"he\" has id \"256\"");
  refused([](json& j) { j["model"]["vocab"]["he"] = 7; }, "tok.json: model.vocab: id 7 is given to both");
  refused([](json& j) { j["model"]["vocab"].erase(byte_char(' ')); }, "tok.json: model.vocab: key");
  refused([](json& j) { j["model"].erase("merges"); }, "tok.json: model.merges is missing");
  refused([](json& j) { j["model"]["merges"] = "h e"; }, "tok.json: model.merges must be a list");
  refused([](json& j) { j["model"]["merges"][1] = 5; }, "tok.json: model.merges[1] is 5, expected \"left right\"");
  refused([](json& j) { j["model"]["merges"][1] = "ll"; },
          "tok.json: model.merges[1] is \"ll\", expected two tokens separated by one space");
  refused([](json& j) { j["model"]["merges"][1] = json::array({"l"}); }, "tok.json: model.merges[1] is [\"l\"]");
  refused([](json& j) { j["model"]["merges"][1] = "l zz"; }, "tok.json: model.merges[1]: \"zz\" is not in model.vocab");
  refused(
      [](json& j) {
        j["model"]["merges"][1] = json::array({"l", "o"});
      },
      "tok.json: model.merges[1]: the merge's result \"lo\" is not in model.vocab");
  refused([](json& j) { j["model"]["merges"][2] = "h e"; }, "tok.json: model.merges[2] repeats model.merges[0]");
  refused([](json& j) { j["added_tokens"] = 3; }, "tok.json: added_tokens must be a list");
  refused([](json& j) { j["added_tokens"][0]["id"] = "259"; }, "tok.json: added_tokens[0].id must be an integer");
  refused([](json& j) { j["added_tokens"][0].erase("content"); }, "tok.json: added_tokens[0].content is missing");
  refused([](json& j) { j["added_tokens"][0]["content"] = ""; }, "tok.json: added_tokens[0]: content is empty");
  refused([](json& j) { j["added_tokens"][0]["id"] = 261; }, "tok.json: added_tokens[0].id is 261, outside 0..259");
  refused([](json& j) { j["added_tokens"][0]["id"] = int64_t{1} << 40; }, "added_tokens[0].id is 1099511627776");
  refused(
      [](json& j) {
        j["added_tokens"].push_back(j["added_tokens"][0]);  // listed twice: fine, but it numbers one id
        j["added_tokens"].push_back({{"id", 261}, {"content", "<|x|>"}});
      },
      "tok.json: id 260 names no token");
  refused([](json& j) { j["added_tokens"][0]["id"] = 256; }, "added_tokens[0]: id 256 is given to both \"he\"");
  refused([](json& j) { j["added_tokens"][0]["special"] = "yes"; }, "added_tokens[0].special must be true or false");
  // A repeated key of model.vocab (JSON parsers keep the last silently).
  std::string text = minimal().dump();
  text.replace(text.find("\"vocab\":{") + 9, 0, "\"hell\":1,");
  EXPECT_ERROR(tasks::BpeTokenizer::from_tokenizer_json(text, "tok.json"),
               "tok.json: model.vocab: key \"hell\" appears twice");
  // A repeated "model": the last one is read, so a repeat inside an earlier one does not count, and one inside
  // the last does (fuzz_json found the earlier one's repeat reported against the last one).
  std::string earlier = minimal().dump();  // a repeat in an earlier "model"
  earlier.insert(earlier.find("\"model\":"), R"("model":{"vocab":{"hell":1,"hell":2}},)");
  EXPECT_NO_THROW(tasks::BpeTokenizer::from_tokenizer_json(earlier, "tok.json"));
  std::string last = minimal().dump();  // a repeat in the last "model"
  last.replace(last.find("\"vocab\":{") + 9, 0, "\"hell\":1,");
  last.insert(last.find("\"model\":"), R"("model":{"vocab":{}},)");
  EXPECT_ERROR(tasks::BpeTokenizer::from_tokenizer_json(last, "tok.json"),
               "tok.json: model.vocab: key \"hell\" appears twice");
}

// ---- where tokenizers are chosen: --tokenizer FILE and a model folder ----

TEST(TokenizerJson, TokenizerFromFileTakesATokenizerJsonWithTheConfigBesideIt) {
  TempDir dir("tokenizer_json");
  {
    std::ofstream(dir.path("tokenizer.json")) << "\n  " << fixture("qwen2").dump();
    std::ofstream(dir.path("tokenizer_config.json")) << R"({"eos_token": "<|im_end|>"})";
  }
  const auto tok = tasks::tokenizer_from_file(dir.path("tokenizer.json"), 1500);
  EXPECT_EQ(tok->size(), 1500);
  EXPECT_EQ(tok->eos(), dynamic_cast<const tasks::BpeTokenizer&>(*tok).find("<|im_end|>"));
  EXPECT_EQ(tok->decode(tok->encode("Hello world")), "Hello world");
  EXPECT_ERROR(tasks::tokenizer_from_file(dir.path("tokenizer.json"), 1000),
               "tokenizer.json: 1464 tokens, more than the model's vocab_size 1000");
}

// A tiny random LLaMA folder (padded vocabulary: 272 rows for 260 tokens) loads through its tokenizer.json,
// and its prompts start with the template's BOS.
TEST(TokenizerJson, ALlamaFolderLoadsThroughItsTokenizerJson) {
  TempDir dir("llama_tokenizer_json");
  const std::string folder = dir.path("model");
  nn::DecoderConfig c = nn::llama_family().config();
  c.vocab_size = 272, c.context_length = 16, c.emb_dim = 16, c.n_heads = 2, c.n_kv_heads = 1;
  c.n_layers = 1, c.hidden_dim = 24, c.rope_theta = 10000.0;
  manual_seed(3);
  nn::DecoderModel m(c);
  io::family_named("llama", "test").folder->write(folder, m, {});
  json j = minimal();
  j["added_tokens"].push_back({{"id", 260}, {"content", "<|begin_of_text|>"}, {"special", true}});
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", json::array({{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                                                 {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                         {"special_tokens", {{"<|begin_of_text|>", {{"id", "<|begin_of_text|>"}, {"ids", {260}}}}}}};
  std::ofstream(folder + "/tokenizer.json") << j.dump();
  ASSERT_FALSE(fs::exists(folder + "/vocab.json"));
  const headlab::loader::Loaded l = headlab::loader::load("test", folder, "cpu");
  const tasks::TextTokenizer* tok = l.subword();
  ASSERT_NE(tok, nullptr);
  EXPECT_NE(tok->describe().find("tokenizer.json"), std::string::npos);
  EXPECT_EQ(tok->size(), 272);
  EXPECT_EQ(l.task->vocab_size(), 272);
  EXPECT_EQ(l.task->end_id(), 259);  // <|endoftext|>
  const tasks::Prompt p = l.task->encode_prompt("hello<|endoftext|>");
  EXPECT_EQ(p.ids, (std::vector<int64_t>{260, 258, 'o', 259}));  // BOS, "hell", "o", <|endoftext|>
  EXPECT_EQ(tok->decode(p.ids), "<|begin_of_text|>hello<|endoftext|>");
  // A checkpoint carries the tokenizer.json, and reads it back to the same tokenizer.
  EXPECT_EQ(l.ckpt.tokenizer.type, "tokenizer.json");
  const std::shared_ptr<const tasks::TextTokenizer> carried =
      tasks::tokenizer_from_files(l.ckpt.tokenizer, "checkpoint: tokenizer/", 272);
  EXPECT_EQ(carried->encode("hello<|endoftext|>"), tok->encode("hello<|endoftext|>"));
  EXPECT_EQ(carried->bos(), tok->bos());
  // A tokenizer_config.json beside it is read: here it turns the BOS off.
  std::ofstream(folder + "/tokenizer_config.json") << R"({"add_bos_token": false})";
  const io::FolderModel read = io::family_of_folder(folder).folder->read(folder);
  const tasks::FolderTokenizer files = tasks::folder_tokenizer(folder, read.vocab_path, read.merges_path);
  EXPECT_EQ(files.kind, tasks::FolderTokenizer::Kind::tokenizer_json);
  EXPECT_EQ(files.describe(), folder + "/tokenizer.json, " + folder + "/tokenizer_config.json");
  EXPECT_EQ(headlab::loader::load("test", folder, "cpu").task->encode_prompt("hello").ids,
            (std::vector<int64_t>{258, 'o'}));
}
