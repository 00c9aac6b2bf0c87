// Byte-level BPE's two sources (bpe_tokenizer.h): GPT-2's vocab.json + merges.txt, and a Hugging Face
// tokenizer.json (+ tokenizer_config.json) whose model is byte-level BPE, each read into the vocabulary
// (bpe_vocab.cpp) with its pre-tokenizer, BOS and EOS; what headlab does not read is refused by name.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/json_fields.h"
#include "base/json_text.h"
#include "tasks/bpe_internal.h"
#include "tasks/bpe_tokenizer.h"
#include "tasks/internal.h"

namespace headlab::tasks {

using namespace detail;

namespace {

constexpr int kMaxJsonDepth = 32;  // tokenizer.json nests 5 deep; deeper is refused early
constexpr const char* kDepthExpected = "expected at most 32 levels of nesting";
// EOS of a tokenizer.json without tokenizer_config.json: the first of these that is a token.
constexpr const char* kEosNames[] = {"<|endoftext|>", "<|end_of_text|>", "<|im_end|>"};

// "left right" -> its two tokens; false unless exactly one space separates two non-empty tokens (a
// byte-level token never holds a space: that is "Ġ").
bool split_merge(std::string_view merge, std::string_view& left, std::string_view& right) {
  const size_t space = merge.find(' ');
  if (space == std::string_view::npos || space == 0 || space + 1 == merge.size() ||
      merge.find(' ', space + 1) != std::string_view::npos)
    return false;
  left = merge.substr(0, space), right = merge.substr(space + 1);
  return true;
}

// A JSON value in a message, cut short: a field may hold a whole vocabulary.
std::string shown(const json& v) {
  const std::string s = json_text(v);
  return s.size() <= 80 ? s : detail::valid_utf8(std::string_view(s).substr(0, 77)) + "...";
}

// A pre-tokenizer pattern as Hugging Face's Oniguruma reads it: over code points, with Unicode's
// categories and spaces (\p{L}, \s); literal for a Split whose pattern is {"String": ...}.
Pcre2Code compile_pattern(std::string_view pattern, bool literal, const std::string& what) {
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP), &error, &error_offset, nullptr);
  HL_CHECK(code != nullptr, what, ": PCRE2 cannot compile the pattern ", json_text(std::string(pattern)), " (",
           pcre2_message(error), " at offset ", error_offset, ")");
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // where PCRE2 has no JIT, it interprets: same matches
  return Pcre2Code(code);
}

// ---- JSON files ----

// text as JSON (base/json_text.h); `repeated` gets the first key seen twice in the object at `watch`.
json parse_json(std::string_view text, const std::string& name, int max_depth, std::string_view depth_expected,
                const std::vector<std::string>& watch, std::string& repeated) {
  return parse_json_text(text, name, {.max_depth = max_depth, .depth_expected = depth_expected, .watch = watch},
                         &repeated);
}

}  // namespace

namespace detail {

// A JSON file's fields, every error naming the file and the field's path ("model.merges[3]").
struct Fields {
  const std::string& file;

  static std::string join(const std::string& path, std::string_view key) {
    return path.empty() ? std::string(key) : path + "." + std::string(key);
  }
  // obj[key], nullptr when absent or null (optional fields).
  static const json* find(const json& obj, std::string_view key) {
    const auto it = obj.find(key);
    return it == obj.end() || it->is_null() ? nullptr : &*it;
  }
  const json& object(const json& v, const std::string& path) const {
    HL_CHECK(v.is_object(), file, ": ", path.empty() ? "the file" : path, " must be an object, got ", shown(v));
    return v;
  }
  const json& need(const json& obj, const std::string& path, std::string_view key) const {
    const json* v = find(obj, key);
    HL_CHECK(v != nullptr, file, ": ", join(path, key), " is missing");
    return *v;
  }
  std::string text(const json& obj, const std::string& path, std::string_view key) const {
    const json& v = need(obj, path, key);
    HL_CHECK(v.is_string(), file, ": ", join(path, key), " must be a string, got ", shown(v));
    return v.get<std::string>();
  }
  bool flag(const json& obj, const std::string& path, std::string_view key, bool fallback) const {
    const json* v = find(obj, key);
    if (v == nullptr) return fallback;
    HL_CHECK(v->is_boolean(), file, ": ", join(path, key), " must be true or false, got ", shown(*v));
    return v->get<bool>();
  }
  const json& array(const json& obj, const std::string& path, std::string_view key) const {
    const json& v = need(obj, path, key);
    HL_CHECK(v.is_array(), file, ": ", join(path, key), " must be a list, got ", shown(v));
    return v;
  }
};

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// GPT-2's files: vocab.json and merges.txt

BpeTokenizer::BpeTokenizer() : impl_(std::make_unique<Impl>()) {}

BpeTokenizer::BpeTokenizer(std::string_view vocab_json, std::string_view merges_txt, std::string vocab_name,
                           std::string merges_name, int64_t vocab_size)
    : BpeTokenizer() {
  Impl& m = *impl_;
  m.name = kWho;
  m.gpt2_files = true;
  m.files = {"bpe", {{"vocab.json", std::string(vocab_json)}, {"merges.txt", std::string(merges_txt)}}};
  // ---- vocab.json: an object of token -> id, ids 0..n-1 each once ----
  const std::string& vn = vocab_name;
  std::string repeated;
  m.read_vocab(parse_json(vocab_json, vn, 2, "expected an object of token -> id", {}, repeated), vn);
  HL_CHECK(repeated.empty(), vn, ": key ", json_text(repeated), " appears twice");
  const size_t n = m.spellings.size();
  HL_CHECK(vocab_size <= 0 || static_cast<size_t>(vocab_size) == n, vn, ": holds ", n,
           " tokens, but the model's vocab_size is ", vocab_size);

  // ---- merges.txt: "#version..." first line optional, then "left right" per line, by rank ----
  const std::string& mn = merges_name;
  size_t pos = 0;
  int64_t line_no = 0;
  std::vector<int64_t> line_of_rank;
  while (pos < merges_txt.size()) {
    size_t end = merges_txt.find('\n', pos);
    if (end == std::string_view::npos) end = merges_txt.size();
    std::string_view line = merges_txt.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);  // '\r' is never part of a token ("č")
    if (line_no == 1 && line.starts_with("#version")) continue;
    if (line.empty() && pos >= merges_txt.size()) break;  // the file's last newline
    std::string_view left, right;
    HL_CHECK(split_merge(line, left, right), mn, ": line ", line_no, " is ", json_text(std::string(line)),
             ", expected two tokens separated by one space");
    const std::string where = mn + ": line " + std::to_string(line_no);
    const auto earlier = m.add_merge(left, right, where, vn);
    HL_CHECK(!earlier, where, " repeats the merge of line ", earlier ? line_of_rank[static_cast<size_t>(*earlier)] : 0);
    line_of_rank.push_back(line_no);
  }
  // As the transformers tokenizer does: <|endoftext|> splits the text, each part is encoded alone.
  if (const auto it = m.index.find(std::string_view(kEndOfText)); it != m.index.end()) {
    m.added.push_back({kEndOfText, it->second});
    m.eos = it->second;
  }
  m.finish(m.spellings.size(), vocab_size, vn);
  m.steps.push_back({compile_pattern(kGpt2Pattern, false, kWho)});
}

BpeTokenizer BpeTokenizer::from_files(const std::string& vocab_path, const std::string& merges_path,
                                      int64_t vocab_size) {
  std::string why_not;
  const std::string vocab = detail::read_text_file(vocab_path, WholeFile::tokenizer, why_not);
  HL_CHECK(why_not.empty(), vocab_path, ": ", why_not);
  const std::string merges = detail::read_text_file(merges_path, WholeFile::tokenizer, why_not);
  HL_CHECK(why_not.empty(), merges_path, ": ", why_not);
  return BpeTokenizer(vocab, merges, vocab_path, merges_path, vocab_size);
}

// ---------------------------------------------------------------------------------------------
// Hugging Face's tokenizer.json

// model: BPE over a byte-level vocabulary; what would change its merges is refused.
void BpeTokenizer::Impl::read_model(const json& j, const Fields& f) {
  const std::string p = "model";
  const json& model = f.object(f.need(j, "", "model"), p);
  const std::string type = f.text(model, p, "type");
  HL_CHECK(type == "BPE", f.file, ": model.type is ", json_text(type), "; headlab reads byte-level BPE models only");
  HL_CHECK(!f.flag(model, p, "byte_fallback", false), f.file,
           ": model.byte_fallback is true (SentencePiece-style <0x..> byte tokens); headlab reads byte-level BPE, "
           "whose bytes are characters of the vocabulary");
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (const json* v = Fields::find(model, affix))
      HL_CHECK(v->is_string() && v->get<std::string>().empty(), f.file, ": model.", affix, " is ", shown(*v),
               "; headlab's byte-level BPE has none");
  if (const json* v = Fields::find(model, "dropout"))
    HL_CHECK(v->is_number() && v->get<double>() == 0, f.file, ": model.dropout is ", shown(*v),
             "; BPE-dropout skips merges at random, and headlab encodes deterministically");
  ignore_merges = f.flag(model, p, "ignore_merges", false);
  read_vocab(f.object(f.need(model, p, "vocab"), "model.vocab"), f.file + ": model.vocab");
  // merges: "left right" strings (older files) or [left, right] pairs (tokenizers >= 0.20).
  const json& merges = f.array(model, p, "merges");
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& v = merges[i];
    const std::string where = f.file + ": model.merges[" + std::to_string(i) + "]";
    std::string_view left, right;
    if (v.is_string()) {
      HL_CHECK(split_merge(v.get_ref<const std::string&>(), left, right), where, " is ", shown(v),
               ", expected two tokens separated by one space");
    } else {
      HL_CHECK(v.is_array() && v.size() == 2 && v[0].is_string() && v[1].is_string(), where, " is ", shown(v),
               ", expected \"left right\" or [\"left\", \"right\"]");
      left = v[0].get_ref<const std::string&>(), right = v[1].get_ref<const std::string&>();
    }
    const auto earlier = add_merge(left, right, where, "model.vocab");
    HL_CHECK(!earlier, where, " repeats model.merges[", earlier.value_or(0), "]");
  }
}

// added_tokens: split out of the text as they are; space-stripping variants are refused.
void BpeTokenizer::Impl::read_added_tokens(const json& j, const Fields& f) {
  const json* list = Fields::find(j, "added_tokens");
  if (list == nullptr) return;
  HL_CHECK(list->is_array(), f.file, ": added_tokens must be a list, got ", shown(*list));
  const size_t model_tokens = spellings.size();
  const int64_t ids = static_cast<int64_t>(model_tokens + list->size());  // the most ids they can number
  for (size_t i = 0; i < list->size(); ++i) {
    const std::string p = "added_tokens[" + std::to_string(i) + "]";
    const json& t = f.object((*list)[i], p);
    const std::string content = f.text(t, p, "content");
    int64_t id = -1;
    HL_CHECK(json_to_integer(f.need(t, p, "id"), id), f.file, ": ", p, ".id must be an integer, got ", shown(t["id"]));
    HL_CHECK(id >= 0 && id < ids, f.file, ": ", p, ".id is ", id, ", outside 0..", ids - 1, " (model.vocab's ",
             model_tokens, " tokens and the ", list->size(), " added tokens number ids from 0 with none left out)");
    for (const char* key : {"lstrip", "rstrip", "single_word"})
      HL_CHECK(!f.flag(t, p, key, false), f.file, ": ", p, " (", json_text(content), ") has ", key,
               " true; headlab matches added tokens exactly as written");
    // "normalized" and "special" are read as they come: either way the token is matched in the text
    // before normalisation (as transformers.js does), and decodes to its content.
    f.flag(t, p, "normalized", false);
    f.flag(t, p, "special", false);
    add_token(content, id, f.file + ": " + p);
  }
}

void BpeTokenizer::Impl::read_normalizer(const json& j, const Fields& f) {
  const json* n = Fields::find(j, "normalizer");
  if (n == nullptr) return;
  const std::string type = f.text(f.object(*n, "normalizer"), "normalizer", "type");
  HL_CHECK(type == "NFC", f.file, ": normalizer.type is ", json_text(type),
           "; headlab reads no normalizer (null) or NFC");
  nfc = true;
}

// pre_tokenizer: ByteLevel, Split, Digits, or a Sequence of them, ending in ByteLevel (which maps the
// text to byte characters: a split after it would see those, not the text).
void BpeTokenizer::Impl::read_pre_tokenizer(const json& v, const std::string& p, const Fields& f, bool& byte_level) {
  const json& pt = f.object(v, p);
  const std::string type = f.text(pt, p, "type");
  if (type == "Sequence") {
    const json& list = f.array(pt, p, "pretokenizers");
    for (size_t i = 0; i < list.size(); ++i)
      read_pre_tokenizer(list[i], p + ".pretokenizers[" + std::to_string(i) + "]", f, byte_level);
    return;
  }
  HL_CHECK(!byte_level, f.file, ": ", p, " (", type,
           ") comes after ByteLevel, which maps the text to byte characters; headlab reads ByteLevel last");
  const std::string what = f.file + ": " + p;
  if (type == "ByteLevel") {
    const json& prefix = f.need(pt, p, "add_prefix_space");
    HL_CHECK(prefix.is_boolean(), what, ".add_prefix_space must be true or false, got ", shown(prefix));
    if (prefix.get<bool>()) steps.push_back({nullptr});
    if (f.flag(pt, p, "use_regex", true)) steps.push_back({compile_pattern(kGpt2Pattern, false, what)});
    byte_level = true;
  } else if (type == "Split") {
    const json& pattern = f.object(f.need(pt, p, "pattern"), p + ".pattern");
    const json* regex = Fields::find(pattern, "Regex");
    const json* literal = Fields::find(pattern, "String");
    HL_CHECK((regex != nullptr) != (literal != nullptr) && (regex ? regex : literal)->is_string(), what, ".pattern is ",
             shown(pattern), ", expected {\"Regex\": \"...\"} or {\"String\": \"...\"}");
    const std::string behavior = f.text(pt, p, "behavior");
    HL_CHECK(behavior == "Isolated", what, ".behavior is ", json_text(behavior),
             "; headlab reads Isolated splits (each match a piece) only");
    HL_CHECK(!f.flag(pt, p, "invert", false), what, ".invert is true; headlab reads invert false only");
    steps.push_back({compile_pattern((regex ? regex : literal)->get<std::string>(), literal != nullptr, what)});
  } else if (type == "Digits") {
    // Rust's char::is_numeric, as Hugging Face's library: the categories Nd, Nl and No.
    const bool individual = f.flag(pt, p, "individual_digits", false);
    steps.push_back({compile_pattern(individual ? "\\p{N}" : "\\p{N}+", false, what)});
  } else {
    HL_FAIL(what, ".type is ", json_text(type), "; headlab reads ByteLevel, Split, Digits and Sequence");
  }
}

// The BOS of a post_processor's template "<special> $A", if it has one; a template that adds more
// than a token before the text is refused (headlab's prompts get at most the BOS).
std::optional<int32_t> BpeTokenizer::Impl::read_post_processor(const json& v, const std::string& p,
                                                               const Fields& f) const {
  const json& pp = f.object(v, p);
  const std::string type = f.text(pp, p, "type");
  if (type == "ByteLevel") return std::nullopt;  // it adjusts offsets only
  std::optional<int32_t> bos;
  if (type == "Sequence") {
    const json& list = f.array(pp, p, "processors");
    for (size_t i = 0; i < list.size(); ++i) {
      const auto b = read_post_processor(list[i], p + ".processors[" + std::to_string(i) + "]", f);
      if (b) bos = b;
    }
    return bos;
  }
  HL_CHECK(type == "TemplateProcessing", f.file, ": ", p, ".type is ", json_text(type),
           "; headlab reads ByteLevel, TemplateProcessing and Sequence post-processors");
  const json& single = f.array(pp, p, "single");
  const auto is = [](const json& item, const char* kind) { return item.is_object() && item.contains(kind); };
  const bool plain = single.size() == 1 && is(single[0], "Sequence");
  const bool with_bos = single.size() == 2 && is(single[0], "SpecialToken") && is(single[1], "Sequence");
  HL_CHECK(plain || with_bos, f.file, ": ", p, ".single is ", shown(single),
           "; headlab reads the templates \"$A\" and \"<special token> $A\"");
  if (plain) return std::nullopt;
  const json& special = f.object(single[0]["SpecialToken"], p + ".single[0].SpecialToken");
  const std::string token = f.text(special, p + ".single[0].SpecialToken", "id");
  const json& ids = f.object(f.need(pp, p, "special_tokens"), p + ".special_tokens");
  const std::string q = p + ".special_tokens." + token;
  const json& entry = f.object(f.need(ids, p + ".special_tokens", token), q);
  const json& list = f.array(entry, q, "ids");
  int64_t id = -1;
  HL_CHECK(list.size() == 1 && json_to_integer(list[0], id), f.file, ": ", q, ".ids is ", shown(list),
           ", expected one token id");
  HL_CHECK(id >= 0 && id < static_cast<int64_t>(spellings.size()), f.file, ": ", q, ".ids holds ", id,
           ", which is not a token id (0..", spellings.size() - 1, ")");
  return static_cast<int32_t>(id);
}

// tokenizer_config.json's bos_token or eos_token: a string, {"content": "..."} or null; it must name a token.
std::optional<int32_t> BpeTokenizer::Impl::config_token(const json& config, const char* key, const Fields& f) const {
  const json* v = Fields::find(config, key);
  if (v == nullptr) return std::nullopt;
  HL_CHECK(v->is_object() || v->is_string(), f.file, ": ", key, " must be a string or an object with content, got ",
           shown(*v));
  const std::string content = v->is_object() ? f.text(*v, key, "content") : v->get<std::string>();
  const auto it = index.find(content);
  HL_CHECK(it != index.end(), f.file, ": ", key, " ", json_text(content), " is not a token of ", name);
  return it->second;
}

BpeTokenizer BpeTokenizer::from_tokenizer_json(std::string_view tokenizer_json, std::string name, int64_t vocab_size,
                                               std::string_view tokenizer_config_json, std::string config_name) {
  BpeTokenizer t;
  Impl& m = *t.impl_;
  m.name = std::move(name);
  const Fields f{m.name};
  std::string repeated;
  const json j = parse_json(tokenizer_json, m.name, kMaxJsonDepth, kDepthExpected, {"model", "vocab"}, repeated);
  f.object(j, "");
  HL_CHECK(repeated.empty(), m.name, ": model.vocab: key ", json_text(repeated), " appears twice");
  m.read_model(j, f);
  const size_t model_tokens = m.spellings.size();
  m.read_added_tokens(j, f);
  m.finish(model_tokens, vocab_size, m.name);
  m.read_normalizer(j, f);
  const json* pre = Fields::find(j, "pre_tokenizer");
  bool byte_level = false;
  if (pre != nullptr) m.read_pre_tokenizer(*pre, "pre_tokenizer", f, byte_level);
  HL_CHECK(byte_level, m.name,
           ": pre_tokenizer has no ByteLevel step, so the text would not be mapped to byte characters (headlab "
           "reads byte-level BPE)");
  const json* decoder = Fields::find(j, "decoder");
  const std::string decoder_type = decoder ? f.text(f.object(*decoder, "decoder"), "decoder", "type") : "null";
  HL_CHECK(decoder_type == "ByteLevel", m.name, ": decoder is ", decoder_type,
           "; headlab decodes byte-level BPE (ByteLevel)");
  const json* post = Fields::find(j, "post_processor");
  const std::optional<int32_t> template_bos = post ? m.read_post_processor(*post, "post_processor", f) : std::nullopt;

  // ---- BOS and EOS: tokenizer_config.json's where it says, else the template's and the usual names ----
  json config = json::object();
  if (!tokenizer_config_json.empty()) {
    config = parse_json(tokenizer_config_json, config_name, kMaxJsonDepth, kDepthExpected, {}, repeated);
    Fields{config_name}.object(config, "");
    HL_CHECK(repeated.empty(), config_name, ": key ", json_text(repeated), " appears twice");
  }
  const Fields cf{config_name};
  const std::optional<int32_t> config_bos = m.config_token(config, "bos_token", cf);
  if (Fields::find(config, "add_bos_token") != nullptr) {
    if (cf.flag(config, "", "add_bos_token", false)) {
      HL_CHECK(config_bos, config_name, ": add_bos_token is true, but bos_token is not given");
      m.bos = config_bos;
    }
  } else {
    m.bos = template_bos;
  }
  m.eos = m.config_token(config, "eos_token", cf);
  for (const char* eos : kEosNames)
    if (const auto it = m.index.find(std::string_view(eos)); !m.eos && it != m.index.end()) m.eos = it->second;
  m.files = {"tokenizer.json", {{"tokenizer.json", std::string(tokenizer_json)}}};
  if (!tokenizer_config_json.empty()) m.files.files.emplace_back("tokenizer_config.json", tokenizer_config_json);
  return t;
}

BpeTokenizer BpeTokenizer::from_tokenizer_json_file(const std::string& path, int64_t vocab_size,
                                                    const std::string& config_path) {
  std::string why_not;
  const std::string text = detail::read_text_file(path, WholeFile::tokenizer, why_not);
  HL_CHECK(why_not.empty(), path, ": ", why_not);
  std::string config;
  if (!config_path.empty()) {
    config = detail::read_text_file(config_path, WholeFile::config, why_not);
    HL_CHECK(why_not.empty(), config_path, ": ", why_not);
  }
  return from_tokenizer_json(text, path, vocab_size, config, config_path);
}

}  // namespace headlab::tasks
