// GPT-2's file formats: the byte-level BPE tokenizer against reference ids (tests/fixtures/
// gpt2_tokenizer_cases.json, from js-tiktoken and gpt-3-encoder), its checks of vocab.json and
// merges.txt, and the safetensors reader and writer, with every kind of lying file.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "core_test_util.h"
#include "io/safetensors.h"
#include "process_util.h"
#include "tasks/bpe_tokenizer.h"
#include "tasks/internal.h"

using namespace headlab;
using headlab::testing::TempDir;
using nlohmann::json;

namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// ---------------------------------------------------------------------------------------------
// Tokenizer

// GPT-2's vocabulary, fetched by scripts/install-deps.sh (too big to commit).
const tasks::BpeTokenizer& gpt2() {
  static const tasks::BpeTokenizer tok = [] {
    const std::string dir = HEADLAB_GPT2_VOCAB_DIR;
    if (!std::filesystem::exists(dir + "/vocab.json") || !std::filesystem::exists(dir + "/merges.txt"))
      throw std::runtime_error("GPT-2's vocab.json and merges.txt are not in " + dir +
                               ": run scripts/install-deps.sh (it fetches them with tools/gpt2_tokenizer_fixtures.sh)");
    return tasks::BpeTokenizer::from_files(dir + "/vocab.json", dir + "/merges.txt", 50257);
  }();
  return tok;
}

// A small byte-level vocabulary: the 256 byte tokens (ids 0..255, by byte), then the merges' results
// and extra tokens in order.
std::string small_vocab(const std::vector<std::string>& extra) {
  json v = json::object();
  for (int b = 0; b < 256; ++b) v[tasks::detail::encode_utf8(tasks::gpt2_byte_to_unicode(static_cast<uint8_t>(b)))] = b;
  int id = 256;
  for (const std::string& t : extra) v[t] = id++;
  return v.dump();
}

TEST(Gpt2Tokenizer, ByteToUnicodeIsGpt2s) {
  EXPECT_EQ(tasks::gpt2_byte_to_unicode(' '), U'\u0120');   // "Ġ"
  EXPECT_EQ(tasks::gpt2_byte_to_unicode('\n'), U'\u010A');  // "Ċ"
  EXPECT_EQ(tasks::gpt2_byte_to_unicode(0), U'\u0100');
  EXPECT_EQ(tasks::gpt2_byte_to_unicode('A'), U'A');
  EXPECT_EQ(tasks::gpt2_byte_to_unicode(0x7F), U'\u0121');
  EXPECT_EQ(tasks::gpt2_byte_to_unicode(0xA0), U'\u0142');
  EXPECT_EQ(tasks::gpt2_byte_to_unicode(0xAD), U'\u0143');
  EXPECT_EQ(tasks::gpt2_byte_to_unicode(0xFF), U'\u00FF');
}

TEST(Gpt2Tokenizer, IdsEqualTheReferenceFixture) {
  const tasks::BpeTokenizer& tok = gpt2();
  EXPECT_EQ(tok.size(), 50257);
  EXPECT_EQ(tok.end_of_text(), 50256);
  const json cases = json::parse(read_all(HEADLAB_SOURCE_DIR "/tests/fixtures/gpt2_tokenizer_cases.json"));
  ASSERT_GE(cases.size(), 20u);
  for (const json& c : cases) {
    const std::string text = c.at("text").get<std::string>();
    const std::vector<int64_t> want = c.at("ids").get<std::vector<int64_t>>();
    const std::vector<int64_t> got = tok.encode(text);
    EXPECT_EQ(got, want) << "case " << c.at("name");
    EXPECT_EQ(tok.decode(got), text) << "case " << c.at("name");
  }
}

TEST(Gpt2Tokenizer, TokenStringsAndBytes) {
  const tasks::BpeTokenizer& tok = gpt2();
  const std::vector<int64_t> ids = tok.encode("Hello world");
  ASSERT_EQ(ids, (std::vector<int64_t>{15496, 995}));
  EXPECT_EQ(tok.token_string(995), "\xC4\xA0world");  // "Ġworld"
  EXPECT_EQ(tok.token_bytes(995), " world");
  EXPECT_EQ(tok.token_string(50256), "<|endoftext|>");
  EXPECT_EQ(tok.find("\xC4\xA0world"), 995);
  EXPECT_FALSE(tok.find("no such token").has_value());
  EXPECT_ERROR(tok.decode({50257}), "0..50256, got 50257");
  EXPECT_ERROR(tok.token_string(-1), "got -1");
  EXPECT_EQ(tok.token_text(995), " world");
  // An emoji GPT-2 splits over tokens: each piece's bytes are not a whole character, shown as U+FFFD;
  // the pieces decode back to the emoji.
  const std::vector<int64_t> emoji = tok.encode("\xF0\x9F\x99\x82");
  ASSERT_GT(emoji.size(), 1u);
  std::string shown;
  for (int64_t id : emoji) shown += tok.token_text(id);
  EXPECT_NE(shown.find("\xEF\xBF\xBD"), std::string::npos) << shown;
  EXPECT_EQ(tok.decode(emoji), "\xF0\x9F\x99\x82");
}

// Random text over many scripts and categories, whitespace runs and special-token fragments:
// decode(encode(x)) == x, and encode of a text with <|endoftext|> is its parts' ids around 50256.
TEST(Gpt2Tokenizer, DecodeEncodeRoundTrips) {
  const tasks::BpeTokenizer& tok = gpt2();
  const std::vector<uint32_t> pool = {'a',    'Z',    '0',      '7',    ' ',     ' ',     '\t',   '\n',  '\r',
                                      '\'',   's',    '!',      '.',    '<',     '|',     0xE9,   0x301, 0x4E2D,
                                      0x6587, 0x1EC7, 0x131,    0x130,  0x1F600, 0x1F3FD, 0x200D, 0xA0,  0x3000,
                                      0x663,  0xBD,   0x10FFFF, 0xFFFD, 0x7F,    0x1};
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    std::string text;
    const int len = static_cast<int>(rng() % 40);
    for (int i = 0; i < len; ++i) {
      if (rng() % 25 == 0) text += "<|endoftext|>";
      text += tasks::detail::encode_utf8(pool[rng() % pool.size()]);
    }
    const std::vector<int64_t> ids = tok.encode(text);
    ASSERT_EQ(tok.decode(ids), text);
  }
  const std::vector<int64_t> a = tok.encode("one two"), b = tok.encode(" three");
  std::vector<int64_t> joined = a;
  joined.push_back(50256);
  joined.insert(joined.end(), b.begin(), b.end());
  EXPECT_EQ(tok.encode("one two<|endoftext|> three"), joined);
}

// A word of 200000 letters is one pre-token: the merge loop must stay O(n log n), and round-trip.
TEST(Gpt2Tokenizer, VeryLongPreToken) {
  const tasks::BpeTokenizer& tok = gpt2();
  std::string word;
  std::mt19937 rng(3);
  for (int i = 0; i < 200000; ++i) word += static_cast<char>('a' + rng() % 26);
  const std::vector<int64_t> ids = tok.encode(word);
  EXPECT_LT(ids.size(), word.size());
  EXPECT_EQ(tok.decode(ids), word);
}

TEST(Gpt2Tokenizer, InvalidUtf8NamesTheOffset) {
  const tasks::BpeTokenizer& tok = gpt2();
  EXPECT_ERROR(tok.encode("abc\xFF"), "prompt: invalid UTF-8 at byte offset 3 (byte 0xff)");
  EXPECT_ERROR(tok.encode("caf\xC3"), "at byte offset 3");                   // cut short
  EXPECT_ERROR(tok.encode("ok \xC0\xAF"), "at byte offset 3");               // overlong '/'
  EXPECT_ERROR(tok.encode("\xE4\xB8\xAD\xED\xA0\x80"), "at byte offset 3");  // a surrogate
  EXPECT_ERROR(tok.encode("x\xF4\x90\x80\x80", "war.txt"), "war.txt: invalid UTF-8 at byte offset 1");
}

TEST(Gpt2Tokenizer, MergesByRankAllOccurrencesFirst) {
  // "a a" is merged everywhere before the lower-ranked "aa a" it creates is considered, as in
  // GPT-2's encoder.py: "aaaa" -> aa aa, not aaa a. Lowest rank first: "l l" before "e l".
  const std::string vocab = small_vocab({"aa", "aaa", "ll", "el", "he", "hell", "hello"});
  const std::string merges = "#version: 0.2\naa a\na a\nl l\ne l\nh e\nhe ll\nhell o\n";
  const tasks::BpeTokenizer tok(vocab, merges);
  EXPECT_EQ(tok.encode("aaaa"), (std::vector<int64_t>{256, 256}));
  EXPECT_EQ(tok.encode("aaa"), (std::vector<int64_t>{257}));  // a a, then aa a
  EXPECT_EQ(tok.encode("hello"), (std::vector<int64_t>{262}));
  EXPECT_EQ(tok.encode("hello hello"), (std::vector<int64_t>{262, ' ' /* "Ġ" */, 262}));
  EXPECT_EQ(tok.encode("hel"), (std::vector<int64_t>{'h', 259 /* "el" */}));
  // Without <|endoftext|> in the vocabulary it is ordinary text.
  EXPECT_FALSE(tok.end_of_text().has_value());
  EXPECT_EQ(tok.decode(tok.encode("<|endoftext|>")), "<|endoftext|>");
  EXPECT_GT(tok.encode("<|endoftext|>").size(), 1u);
}

TEST(Gpt2Tokenizer, MergesFileForms) {
  const std::string vocab = small_vocab({"he", "ll"});
  const tasks::BpeTokenizer with_header(vocab, "#version: 0.2\nh e\nl l\n");
  const tasks::BpeTokenizer without_header(vocab, "h e\nl l");  // no header, no final newline
  const tasks::BpeTokenizer crlf(vocab, "#version: 0.2\r\nh e\r\nl l\r\n");
  const std::vector<int64_t> want = {256, 257, 'o'};
  EXPECT_EQ(with_header.encode("hello"), want);
  EXPECT_EQ(without_header.encode("hello"), want);
  EXPECT_EQ(crlf.encode("hello"), want);
}

TEST(Gpt2Tokenizer, MalformedVocabularyIsRefused) {
  const std::string merges = "h e\n";
  const auto load = [&](const std::string& vocab, int64_t vocab_size = 0) {
    tasks::BpeTokenizer(vocab, merges, "my_vocab.json", "my_merges.txt", vocab_size);
  };
  EXPECT_ERROR(load("{\"a\": 1"), "my_vocab.json: not JSON");
  EXPECT_ERROR(load("[1, 2]"), "my_vocab.json: expected a JSON object of token -> id, got a array");
  EXPECT_ERROR(load("{\"a\": " + std::string(100000, '[')),
               "my_vocab.json: expected an object of token -> id, got values nested 3 deep");
  std::string v = small_vocab({"he"});
  EXPECT_ERROR(load(v, 300), "my_vocab.json: holds 257 tokens, but the model's vocab_size is 300");
  EXPECT_NO_THROW(load(v, 257));
  json j = json::parse(v);
  j["he"] = "256";
  EXPECT_ERROR(load(j.dump()), "key \"he\" has id \"256\", expected an integer");
  j["he"] = 256.5;
  EXPECT_ERROR(load(j.dump()), "key \"he\" has id 256.5, expected an integer");
  j["he"] = -1;
  EXPECT_ERROR(load(j.dump()), "key \"he\" has id -1, outside 0..256");
  j["he"] = 257;
  EXPECT_ERROR(load(j.dump()), "key \"he\" has id 257, outside 0..256");
  j["he"] = 5;  // byte 5's token has id 5 too
  EXPECT_ERROR(load(j.dump()), "my_vocab.json: id 5 is given to both");
  // A repeated key (JSON parsers keep the last silently).
  EXPECT_ERROR(load(v.substr(0, v.size() - 1) + ",\"he\":256}"), "my_vocab.json: key \"he\" appears twice");
  j = json::parse(v);
  j.erase(tasks::detail::encode_utf8(tasks::gpt2_byte_to_unicode(' ')));
  j["spare"] = 32;
  EXPECT_ERROR(load(j.dump()), "my_vocab.json: lacks the token \"\xC4\xA0\" of byte 32");
}

TEST(Gpt2Tokenizer, MalformedMergesAreRefused) {
  const std::string vocab = small_vocab({"he", "ll", "hell"});
  const auto load = [&](const std::string& merges) { tasks::BpeTokenizer(vocab, merges, "v.json", "m.txt"); };
  EXPECT_ERROR(load("#version: 0.2\nh e\nhe\n"), "m.txt: line 3 is \"he\", expected two tokens separated by one space");
  EXPECT_ERROR(load("h e l\n"), "m.txt: line 1 is \"h e l\"");
  EXPECT_ERROR(load("h  e\n"), "m.txt: line 1");
  EXPECT_ERROR(load("h e\n\nl l\n"), "m.txt: line 2 is \"\"");  // a blank line inside
  EXPECT_ERROR(load("h e\nx yz\n"), "m.txt: line 2: \"yz\" is not in v.json");
  EXPECT_ERROR(load("h e\nqq e\n"), "m.txt: line 2: \"qq\" is not in v.json");
  EXPECT_ERROR(load("h e\nl o\n"), "m.txt: line 2: the merge's result \"lo\" is not in v.json");
  EXPECT_ERROR(load("h e\nl l\nh e\n"), "m.txt: line 3 repeats the merge of line 1");
  EXPECT_NO_THROW(load("h e\nl l\nhe ll\n"));
}

TEST(Gpt2Tokenizer, MissingFilesAreNamed) {
  EXPECT_ERROR(tasks::BpeTokenizer::from_files("/nonexistent/vocab.json", "/nonexistent/merges.txt"),
               "/nonexistent/vocab.json");
}

// ---------------------------------------------------------------------------------------------
// safetensors

// A file from a header (any text) and data bytes.
void write_safetensors_raw(const std::string& path, const std::string& header, const std::string& data,
                           uint64_t claimed_length = UINT64_MAX) {
  const uint64_t n = claimed_length == UINT64_MAX ? header.size() : claimed_length;
  std::string bytes(8, '\0');
  std::memcpy(bytes.data(), &n, 8);
  write_all(path, bytes + header + data);
}

Tensor filled(const Shape& shape, const std::vector<float>& values) {
  Tensor t = Tensor::empty(shape);
  std::copy(values.begin(), values.end(), t.data<float>());
  return t;
}

std::vector<uint32_t> bits_of(const Tensor& t) {
  std::vector<uint32_t> out;
  for (float f : t.to_vector<float>()) out.push_back(std::bit_cast<uint32_t>(f));
  return out;
}

TEST(Safetensors, RoundTripIsBitwise) {
  TempDir dir;
  const float nan_payload = std::bit_cast<float>(0x7FC01234u);
  const std::vector<float> odd = {0.0f, -0.0f, INFINITY, -INFINITY, nan_payload, 1e-45f, 3.4028235e38f, -1.5f};
  const std::vector<std::pair<std::string, Tensor>> tensors = {
      {"h.0.attn.c_attn.weight", filled({2, 4}, odd)},
      {"scalar", filled({}, {42.5f})},
      {"empty", Tensor::empty({0, 3})},
      {"wte.weight", filled({2, 3}, {1, 2, 3, 4, 5, 6}).transpose(0, 1)},  // written contiguous
  };
  const std::string path = dir.path("model.safetensors");
  io::write_safetensors(path, tensors, {{"format", "pt"}, {"note", "ünïcode"}});
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"model.safetensors"});  // no temporary file left
  const io::SafetensorsFile f(path);
  EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"note", "ünïcode"}}));
  EXPECT_EQ(f.entries().size(), 4u);
  for (const auto& [name, t] : tensors) {
    const Tensor back = f.to_float(name);
    EXPECT_EQ(back.shape(), t.shape()) << name;
    EXPECT_EQ(bits_of(back), bits_of(t)) << name;
    EXPECT_EQ(f.entry(name).dtype, "F32");
  }
  // bytes() reads the tensor's bytes as the file holds them.
  const std::vector<std::byte> raw_tensor = f.bytes("h.0.attn.c_attn.weight");
  ASSERT_EQ(raw_tensor.size(), 32u);
  EXPECT_EQ(std::memcmp(raw_tensor.data(), odd.data(), 32), 0);
  // The writer aligns the data to 8 bytes.
  const std::string raw = read_all(path);
  uint64_t n = 0;
  std::memcpy(&n, raw.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_ERROR(io::write_safetensors(dir.path("x.safetensors"), {{"a", Tensor::empty({1})}, {"a", Tensor::empty({1})}}),
               "tensor 'a' is given twice");
  EXPECT_ERROR(io::write_safetensors(dir.path("x.safetensors"), {{"__metadata__", Tensor::empty({1})}}),
               "expected a tensor name");
}

TEST(Safetensors, HalfAndBfloat16ConvertExactly) {
  TempDir dir;
  const std::vector<uint16_t> f16 = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x03FF, 0x0400,
                                     0x7C00, 0xFC00, 0x8000, 0x3555, 0x8001};
  const std::vector<float> f16_want = {1.0f,     -2.0f,     65504.0f, 0x1p-24f,        1023 * 0x1p-24f, 0x1p-14f,
                                       INFINITY, -INFINITY, -0.0f,    0.333251953125f, -0x1p-24f};
  const std::vector<uint16_t> bf16 = {0x3F80, 0xC049, 0x7F80, 0x0001, 0xFF7F, 0x8000};
  const std::vector<float> bf16_want = {
      1.0f, -3.140625f, INFINITY, std::bit_cast<float>(0x00010000u), std::bit_cast<float>(0xFF7F0000u), -0.0f};
  std::string data(reinterpret_cast<const char*>(f16.data()), f16.size() * 2);
  data.append(reinterpret_cast<const char*>(bf16.data()), bf16.size() * 2);
  data.append("\x00\x7E", 2);  // one F16 NaN
  const json header = {
      {"half", {{"dtype", "F16"}, {"shape", {f16.size()}}, {"data_offsets", {0, 22}}}},
      {"brain", {{"dtype", "BF16"}, {"shape", {2, 3}}, {"data_offsets", {22, 34}}}},
      {"nan", {{"dtype", "F16"}, {"shape", json::array()}, {"data_offsets", {34, 36}}}},
  };
  // A 1-byte-longer header: the data starts at an odd offset, so the reader cannot assume alignment.
  const std::string path = dir.path("half.safetensors");
  write_safetensors_raw(path, header.dump() + " ", data);
  const io::SafetensorsFile f(path);
  const Tensor h = f.to_float("half"), b = f.to_float("brain"), nan = f.to_float("nan");
  EXPECT_EQ(bits_of(h), bits_of(filled({11}, f16_want)));
  EXPECT_EQ(b.shape(), (Shape{2, 3}));
  EXPECT_EQ(bits_of(b), bits_of(filled({6}, bf16_want)));
  EXPECT_TRUE(std::isnan(nan.item<float>()));
  EXPECT_EQ(nan.dim(), 0);
}

TEST(Safetensors, ShardedIndex) {
  TempDir dir;
  io::write_safetensors(dir.path("model-00001-of-00002.safetensors"),
                        {{"a", filled({2}, {1, 2})}, {"b", filled({1}, {3})}});
  io::write_safetensors(dir.path("model-00002-of-00002.safetensors"), {{"c", filled({1}, {4})}});
  const json index = {{"metadata", {{"total_size", 16}}},
                      {"weight_map",
                       {{"a", "model-00001-of-00002.safetensors"},
                        {"b", "model-00001-of-00002.safetensors"},
                        {"c", "model-00002-of-00002.safetensors"}}}};
  write_all(dir.path("model.safetensors.index.json"), index.dump());
  for (const std::string& where : {dir.dir(), dir.path("model.safetensors.index.json")}) {
    const io::SafetensorsModel m = io::SafetensorsModel::open(where);
    EXPECT_EQ(m.names(), (std::vector<std::string>{"a", "b", "c"}));
    EXPECT_EQ(m.files().size(), 2u);  // each shard mapped once
    EXPECT_EQ(m.to_float("a").to_vector<float>(), (std::vector<float>{1, 2}));
    EXPECT_EQ(m.to_float("c").to_vector<float>(), (std::vector<float>{4}));
    EXPECT_EQ(m.file_of("c").path(), dir.path("model-00002-of-00002.safetensors"));
    EXPECT_ERROR(m.to_float("d"), "no tensor 'd' (the model has 3 tensors)");
  }
  // A single file, and a folder holding one.
  TempDir one;
  io::write_safetensors(one.path("model.safetensors"), {{"w", filled({1}, {5})}});
  EXPECT_EQ(io::SafetensorsModel::open(one.dir()).to_float("w").item<float>(), 5.0f);
  EXPECT_EQ(io::SafetensorsModel::open(one.path("model.safetensors")).names(), std::vector<std::string>{"w"});

  const auto index_with = [&](const json& j) {
    write_all(dir.path("bad.index.json"), j.dump());
    return dir.path("bad.index.json");
  };
  EXPECT_ERROR(io::SafetensorsModel::open(index_with({{"weight_map", {{"c", "model-00001-of-00002.safetensors"}}}})),
               "weight_map puts tensor 'c' in model-00001-of-00002.safetensors, which has no such tensor");
  EXPECT_ERROR(io::SafetensorsModel::open(index_with({{"weight_map", {{"a", "missing.safetensors"}}}})),
               "missing.safetensors' does not exist");
  EXPECT_ERROR(io::SafetensorsModel::open(index_with({{"weight_map", {{"a", "../x.safetensors"}}}})),
               "expected a file name in the index's folder");
  EXPECT_ERROR(io::SafetensorsModel::open(index_with({{"weight_map", {{"a", 3}}}})), "expected a shard file name");
  EXPECT_ERROR(io::SafetensorsModel::open(index_with({{"files", json::array()}})),
               "expected an object with a \"weight_map\"");
  write_all(dir.path("bad.index.json"), "{not json");
  EXPECT_ERROR(io::SafetensorsModel::open(dir.path("bad.index.json")), "bad.index.json: not JSON");
  TempDir empty;
  EXPECT_ERROR(io::SafetensorsModel::open(empty.dir()), "holds neither model.safetensors nor");
}

// Every way a header can lie about the file gets an error naming the file (and the tensor).
TEST(Safetensors, LyingFilesAreRefused) {
  TempDir dir;
  const std::string path = dir.path("lie.safetensors");
  const auto open_with = [&](const std::string& header, const std::string& data, uint64_t claimed = UINT64_MAX) {
    write_safetensors_raw(path, header, data, claimed);
    io::SafetensorsFile f(path);
  };
  const std::string eight(8, '\x01');
  const auto one = [](const std::string& dtype, const json& shape, const json& offsets) {
    return json{{"t", {{"dtype", dtype}, {"shape", shape}, {"data_offsets", offsets}}}}.dump();
  };
  EXPECT_NO_THROW(open_with(one("F32", {2}, {0, 8}), eight));

  write_all(path, "abc");
  EXPECT_ERROR(io::SafetensorsFile{path}, "lie.safetensors: 3 bytes, too short");
  EXPECT_ERROR(open_with("{}", "", 1ull << 62), "the header claims 4611686018427387904 bytes, but only 2 follow");
  EXPECT_ERROR(open_with("{}", "", 3), "the header claims 3 bytes, but only 2 follow");
  EXPECT_ERROR(open_with("{\"t\": ", ""), "lie.safetensors: header: not JSON");
  EXPECT_ERROR(open_with("[1, 2]", ""), "the header must be a JSON object, got a array");
  EXPECT_ERROR(open_with(std::string(5000, '[') + std::string(5000, ']'), ""), "nested deeper than");
  // Nothing after the header's JSON: a NUL (nlohmann's end of input) or anything else.
  EXPECT_ERROR(open_with(std::string("{}\0junk", 7), ""), "lie.safetensors: header: not JSON (a NUL byte at offset 2 of 7");
  EXPECT_ERROR(open_with("{} []", ""), "lie.safetensors: header: not JSON");
  // 100,000 empty tensors (4.6 MB of header) parse in linear time (nlohmann's callback parser took 108 s).
  {
    std::string many = "{";
    for (int i = 0; i < 100000; ++i)
      many += (i ? ", \"t" : "\"t") + std::to_string(i) + R"(": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]})";
    open_with(many + "}", "");
    EXPECT_EQ(io::SafetensorsFile(path).entries().size(), 100000u);
  }
  EXPECT_ERROR(open_with("{\"t\": 3}", ""), "tensor 't': expected an object");
  EXPECT_ERROR(open_with(one("F17", {2}, {0, 8}), eight), "tensor 't': unknown dtype \"F17\"");
  EXPECT_ERROR(open_with(R"({"t": {"shape": [2], "data_offsets": [0, 8]}})", eight),
               "tensor 't': expected a string dtype");
  EXPECT_ERROR(open_with(one("F32", {-2}, {0, 8}), eight), "tensor 't': shape [-2] holds -2");
  EXPECT_ERROR(open_with(one("F32", "2", {0, 8}), eight), "tensor 't': expected a shape");
  EXPECT_ERROR(open_with(one("F32", {3}, {0, 8}), eight),
               "tensor 't': shape [3] of F32 is 12 bytes, but data_offsets [0, 8] span 8");
  // A claimed size far past the file is refused before anything is allocated.
  EXPECT_ERROR(open_with(one("F32", {1ll << 40, 1ll << 20}, {0, 8}), eight), "tensor 't': shape");
  EXPECT_ERROR(open_with(one("F64", {1ll << 62, 1ll << 62}, {0, 8}), eight), "is too large");
  EXPECT_ERROR(open_with(one("F32", {2}, {0, 16}), eight),
               "tensor 't': data_offsets [0, 16] reach past the data's 8 bytes");
  EXPECT_ERROR(open_with(one("F32", {0}, {8, 0}), eight), "tensor 't': data_offsets [8, 0] end before they begin");
  EXPECT_ERROR(open_with(one("F32", {2}, {0}), eight), "tensor 't': expected data_offsets [begin, end], got [0]");
  EXPECT_ERROR(open_with(one("F32", {2}, {0, -8}), eight), "expected data_offsets");
  EXPECT_ERROR(open_with(one("F32", {1}, {4, 8}), eight), "tensor 't': data_offsets [4, 8] leave a gap after byte 0");
  EXPECT_ERROR(open_with(one("F32", {1}, {0, 4}), eight),
               "the tensors end at byte 4 of the data, but the file holds 8");
  const json overlap = {{"a", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}}},
                        {"b", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {4, 8}}}}};
  EXPECT_ERROR(open_with(overlap.dump(), eight), "tensor 'b': data_offsets [4, 8] overlap the tensor before it");
  EXPECT_ERROR(open_with(R"({"__metadata__": {"k": 1}})", ""), "__metadata__ key 'k' must be a string");
  EXPECT_ERROR(open_with(R"({"__metadata__": [1]})", ""), "__metadata__ must be an object");

  // Tensors in any order of the header, and the ones asked for that are missing or not float.
  const json fine = {{"z", {{"dtype", "I64"}, {"shape", {1}}, {"data_offsets", {0, 8}}}},
                     {"a", {{"dtype", "U8"}, {"shape", {2, 0}}, {"data_offsets", {8, 8}}}}};
  write_safetensors_raw(path, fine.dump(), eight);
  const io::SafetensorsFile f(path);
  EXPECT_ERROR(f.to_float("missing"), "lie.safetensors: no tensor 'missing' (the file has 2 tensors)");
  EXPECT_ERROR(f.to_float("z"), "lie.safetensors: tensor 'z' has dtype I64; only F32, F16 and BF16 convert");
  EXPECT_EQ(f.bytes("z").size(), 8u);
  EXPECT_EQ(f.entry("a").shape, (Shape{2, 0}));
  EXPECT_ERROR(io::SafetensorsFile(dir.path("absent.safetensors")), "absent.safetensors' does not exist");
  EXPECT_ERROR(io::SafetensorsFile(dir.dir()), "is a folder, not a file");

  // A file cut short after it was opened (another program rewriting it): a clear error, not SIGBUS, for
  // float32, float16 and raw reads alike.
  const std::string cut = dir.path("cut.safetensors");
  for (const char* dtype : {"F32", "F16"}) {
    write_safetensors_raw(cut, one(dtype, {std::string(dtype) == "F32" ? 2 : 4}, {0, 8}), eight);
    const io::SafetensorsFile opened(cut);
    std::filesystem::resize_file(cut, std::filesystem::file_size(cut) - 4);
    EXPECT_ERROR(opened.to_float("t"), "cut.safetensors: tensor 't': the file ends before its data");
    EXPECT_ERROR(opened.bytes("t"), "cut.safetensors: tensor 't': the file ends before its data");
  }
}

}  // namespace
