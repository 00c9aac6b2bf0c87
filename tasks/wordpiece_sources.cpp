// BERT's WordPiece tokenizer's sources (see wordpiece_tokenizer.h): a vocab.txt with its tokenizer_config.json, or a
// tokenizer.json of model.type WordPiece; each field checked, and what headlab does not read refused by name.
#include <algorithm>
#include <charconv>
#include <nlohmann/json.hpp>

#include "base/json_fields.h"
#include "base/json_text.h"
#include "base/sizes.h"
#include "tasks/internal.h"
#include "tasks/wordpiece_tokenizer.h"

namespace headlab::tasks {

using json = nlohmann::json;
using Shared = std::shared_ptr<const WordPieceTokenizer>;

namespace {

constexpr int kMaxJsonDepth = 32;  // tokenizer.json nests 5 deep
constexpr const char* kDepthExpected = "expected at most 32 levels of nesting";

// A JSON object, whose repeated keys are refused where they are watched: the vocabulary's (model.vocab) or the root's.
json parse(std::string_view text, const std::string& name, bool vocab = false) {
  std::string repeated;
  const std::vector<std::string> watch =
      vocab ? std::vector<std::string>{"model", "vocab"} : std::vector<std::string>{};
  json j = parse_json_text(text, name, {.max_depth = kMaxJsonDepth, .depth_expected = kDepthExpected, .watch = watch},
                           &repeated);
  HL_CHECK(j.is_object(), name, ": expected a JSON object, got ", j.type_name());
  HL_CHECK(repeated.empty(), name, ": ", vocab ? "model.vocab: " : "", "key ", json_text(repeated), " appears twice");
  return j;
}

// obj[key], nullptr when absent or null (an optional field).
const json* field(const json& obj, const char* key) {
  const auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

// A value in a message, cut short: a field may hold a whole vocabulary.
std::string shown(const json& v) {
  const std::string s = json_text(v);
  return s.size() <= 80 ? s : detail::valid_utf8(std::string_view(s).substr(0, 77)) + "...";
}

// The type of a part of a tokenizer.json (j[key]: "normalizer"), one of those headlab reads; "" for none (null),
// where that may be.
std::string part_type(const json& j, const char* key, const std::string& file, std::vector<std::string> reads,
                      bool or_none = false) {
  const json* v = field(j, key);
  HL_CHECK(!v || (v->is_object() && v->contains("type") && (*v)["type"].is_string()), file, ": ", key,
           " must be an object with a type, got ", shown(*v));
  const std::string type = v ? (*v)["type"].get<std::string>() : "";
  if ((type.empty() && or_none) || std::find(reads.begin(), reads.end(), type) != reads.end()) return type;
  if (or_none) reads.push_back("none (null)");
  std::string listed;
  for (const std::string& r : reads) listed += (listed.empty() ? "" : &r == &reads.back() ? " or " : ", ") + r;
  HL_FAIL(file, ": ", key, ".type is ", v ? json_text(type) : "null", "; headlab's WordPiece reads ", listed);
}

// A special token as tokenizer_config.json names it: "[CLS]", {"content": "[CLS]", ...}, or null (none).
std::optional<std::string> config_token(const json& config, const char* key, const std::string& file) {
  const json* v = field(config, key);
  if (v == nullptr) return std::nullopt;
  const json* content = v->is_object() ? field(*v, "content") : v;
  HL_CHECK(content != nullptr && content->is_string(), file, ": ", key,
           " must be a token or an object with its content, got ", shown(*v));
  return content->get<std::string>();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The sources: the vocabulary, the options, the special tokens

struct WordPieceTokenizer::Reader {
  WordPieceTokenizer& t;
  std::optional<bool> strip;  // strip_accents where a file gives it; else as lowercase

  // The special tokens: tokenizer_config.json's key, the name where no file gives one, the member.
  struct Slot {
    const char* key;
    const char* fallback;
    std::optional<int64_t> WordPieceTokenizer::*id;
  };
  static constexpr Slot kSlots[] = {{"unk_token", "[UNK]", &WordPieceTokenizer::unk_},
                                    {"cls_token", "[CLS]", &WordPieceTokenizer::cls_},
                                    {"sep_token", "[SEP]", &WordPieceTokenizer::sep_},
                                    {"pad_token", "[PAD]", &WordPieceTokenizer::pad_},
                                    {"mask_token", "[MASK]", &WordPieceTokenizer::mask_}};

  void add_token(const std::string& token, int64_t id, const std::string& where) {
    HL_CHECK(id == t.size(), where, ": token ", json_text(token), " has id ", id, ", expected ", t.size(),
             " (ids number the tokens from 0, none left out)");
    const auto [it, inserted] = t.ids_.emplace(token, id);
    HL_CHECK(inserted, where, ": token ", json_text(token), " appears again (first as id ", it->second,
             "); expected each token once");
    t.tokens_.push_back(token);
    t.longest_ = std::max(t.longest_, token.size());
  }
  void mark_special(int64_t id) { t.specials_.push_back({t.tokens_[static_cast<size_t>(id)], id}); }
  // An added token ({"content": "[MASK]", "single_word": false, ...}), split out of the text as written: a
  // vocabulary token with that id, or the next id after them.
  void add_added(const json& a, int64_t id, const std::string& where) {
    const json* content = a.is_object() ? field(a, "content") : nullptr;
    HL_CHECK(content && content->is_string() && !content->empty(), where, " is ", shown(a),
             ", expected {\"id\": N, \"content\": \"...\", ...}");
    bool single_word = false;  // lstrip and rstrip change nothing here: spaces are never tokens
    read_json_field(a, "single_word", single_word, where.c_str());
    HL_CHECK(!single_word, where, " has single_word true; headlab matches added tokens wherever they are written");
    const std::string& token = content->get_ref<const std::string&>();
    if (const auto it = t.ids_.find(token); it != t.ids_.end())
      HL_CHECK(it->second == id, where, ": ", json_text(token), " has id ", id, ", but the vocabulary's is ",
               it->second);
    else
      add_token(token, id, where);
    mark_special(id);
  }
  // A special token named by a file: it must be a token.
  void name(std::optional<int64_t>& slot, const std::string& token, const std::string& where) {
    const auto it = t.ids_.find(token);
    HL_CHECK(it != t.ids_.end(), where, " is ", json_text(token), ", which is not a token of the vocabulary");
    slot = it->second;
  }
  void defaults() {
    for (const Slot& s : kSlots)
      if (const auto it = t.ids_.find(s.fallback); it != t.ids_.end()) t.*s.id = it->second;
  }
  // tokenizer_config.json: do_lower_case, strip_accents, tokenize_chinese_chars and the special tokens' names,
  // where it gives them.
  void read_config(const json& config, const std::string& file) {
    const char* who = file.c_str();
    read_json_field(config, "do_lower_case", t.options_.lowercase, who);
    read_json_field(config, "tokenize_chinese_chars", t.options_.chinese_chars, who);
    if (field(config, "strip_accents") != nullptr) read_json_field(config, "strip_accents", strip, who);
    bool basic = true;
    read_json_field(config, "do_basic_tokenize", basic, who);
    HL_CHECK(basic, file,
             ": do_basic_tokenize is false (WordPiece over whitespace alone); headlab reads "
             "BertTokenizer's basic tokenization (true)");
    for (const Slot& s : kSlots)
      if (const auto token = config_token(config, s.key, file)) name(t.*s.id, *token, file + ": " + s.key);
  }
  // The checks of the whole, and the files as given (source: vocab.txt or tokenizer.json) for a checkpoint.
  void finish(const std::string& name, int64_t vocab_size, const char* source, std::string_view text,
              std::string_view config_json) {
    t.files_ = {"wordpiece", {{source, std::string(text)}}};
    if (!config_json.empty()) t.files_.files.emplace_back("tokenizer_config.json", config_json);
    HL_CHECK(vocab_size <= 0 || vocab_size == t.size(), name, ": holds ", t.size(),
             " tokens, but the model's vocab_size is ", vocab_size);
    HL_CHECK(t.unk_, name, ": has no [UNK] token, which WordPiece gives a word it cannot cut into tokens");
    for (const Slot& s : kSlots)
      if (t.*s.id) mark_special(*(t.*s.id));
    std::vector<Special>& s = t.specials_;  // longest first, each once
    std::sort(s.begin(), s.end(), [](const Special& a, const Special& b) {
      return a.content.size() != b.content.size() ? a.content.size() > b.content.size() : a.id < b.id;
    });
    s.erase(std::unique(s.begin(), s.end(), [](const Special& a, const Special& b) { return a.id == b.id; }), s.end());
    t.is_special_.assign(t.tokens_.size(), false);
    for (const Special& special : s) t.is_special_[static_cast<size_t>(special.id)] = true;
    t.options_.strip_accents = strip.value_or(t.options_.lowercase);
  }

  // ---- tokenizer.json's parts ----
  void read_model(const json& j, const std::string& file, std::string& unk) {
    part_type(j, "model", file, {"WordPiece"});
    const json* model = field(j, "model");
    const json* vocab = field(*model, "vocab");
    HL_CHECK(vocab != nullptr && vocab->is_object() && !vocab->empty(), file,
             ": model.vocab must be a non-empty object of token -> id, got ", vocab ? shown(*vocab) : "nothing");
    std::vector<const std::string*> by_id(vocab->size(), nullptr);  // (n,)
    for (const auto& entry : vocab->items()) {
      int64_t id = -1;
      HL_CHECK(json_to_integer(entry.value(), id) && id >= 0 && id < static_cast<int64_t>(by_id.size()), file,
               ": model.vocab[", json_text(entry.key()), "] is ", shown(entry.value()), ", expected an id in 0..",
               by_id.size() - 1);
      const std::string*& slot = by_id[static_cast<size_t>(id)];
      HL_CHECK(slot == nullptr, file, ": model.vocab gives id ", id, " to ", json_text(*slot), " and ",
               json_text(entry.key()));
      slot = &entry.key();
    }
    for (size_t id = 0; id < by_id.size(); ++id) add_token(*by_id[id], static_cast<int64_t>(id), file);
    const std::string who = file + ": model";
    read_json_field(*model, "unk_token", unk, who.c_str());
    read_json_field(*model, "continuing_subword_prefix", t.options_.prefix, who.c_str());
    read_json_field(*model, "max_input_chars_per_word", t.options_.max_chars_per_word, who.c_str());
    HL_CHECK(t.options_.max_chars_per_word > 0, file, ": model.max_input_chars_per_word must be positive, got ",
             t.options_.max_chars_per_word);
  }
  void read_added_tokens(const json& j, const std::string& file) {
    const json* list = field(j, "added_tokens");
    if (list == nullptr) return;
    HL_CHECK(list->is_array(), file, ": added_tokens must be a list, got ", shown(*list));
    for (size_t i = 0; i < list->size(); ++i) {
      const json& a = (*list)[i];
      const std::string where = file + ": added_tokens[" + std::to_string(i) + "]";
      int64_t id = -1;
      HL_CHECK(a.is_object() && a.contains("id") && json_to_integer(a["id"], id), where, " is ", shown(a),
               ", expected {\"id\": N, \"content\": \"...\", ...}");
      add_added(a, id, where);
    }
  }
  void read_normalizer(const json& j, const std::string& file) {
    Options& o = t.options_;
    if (part_type(j, "normalizer", file, {"BertNormalizer"}, true).empty()) {  // the text as it comes
      o.lowercase = o.clean_text = o.chinese_chars = false;
      strip = false;
      return;
    }
    const json* n = field(j, "normalizer");
    const std::string who = file + ": normalizer";
    read_json_field(*n, "lowercase", o.lowercase, who.c_str());
    read_json_field(*n, "clean_text", o.clean_text, who.c_str());
    read_json_field(*n, "handle_chinese_chars", o.chinese_chars, who.c_str());
    if (field(*n, "strip_accents") != nullptr) read_json_field(*n, "strip_accents", strip, who.c_str());
  }
  // [CLS] and [SEP] as the post-processor puts them around a text, each checked against the vocabulary's id.
  void read_post_processor(const json& j, const std::string& file) {
    const std::string type = part_type(j, "post_processor", file, {"BertProcessing", "TemplateProcessing"}, true);
    const json* pp = field(j, "post_processor");
    if (type.empty()) return;
    const auto named = [&](std::optional<int64_t>& slot, const std::string& token, const json* ids,
                           const std::string& where) {
      name(slot, token, where);
      HL_CHECK(ids && (*ids == *slot || *ids == json::array({*slot})), where, ": ", json_text(token), "'s id is ",
               ids ? shown(*ids) : "missing", ", but the vocabulary's is ", *slot);
    };
    if (type == "BertProcessing") {  // "cls": ["[CLS]", 101], "sep": ["[SEP]", 102]
      for (auto [key, slot] : {std::pair{"cls", &t.cls_}, {"sep", &t.sep_}}) {
        const json* v = field(*pp, key);
        const std::string where = file + ": post_processor." + key;
        HL_CHECK(v && v->is_array() && v->size() == 2 && (*v)[0].is_string(), where, " is ", v ? shown(*v) : "missing",
                 ", expected [token, id]");
        named(*slot, (*v)[0].get<std::string>(), &(*v)[1], where);
      }
      return;
    }
    const json* single = field(*pp, "single");
    const auto special = [](const json& item) -> const json* {
      const json* s = item.is_object() ? field(item, "SpecialToken") : nullptr;
      const json* id = s && s->is_object() ? field(*s, "id") : nullptr;
      return id && id->is_string() ? id : nullptr;
    };
    HL_CHECK(single != nullptr && single->is_array() && single->size() == 3 && special((*single)[0]) &&
                 (*single)[1].is_object() && (*single)[1].contains("Sequence") && special((*single)[2]),
             file, ": post_processor.single is ", single ? shown(*single) : "missing",
             "; headlab reads the template \"[CLS] $A [SEP]\"");
    const json* tokens = field(*pp, "special_tokens");
    for (auto [at, slot] : {std::pair{size_t{0}, &t.cls_}, {size_t{2}, &t.sep_}}) {
      const std::string token = special((*single)[at])->get<std::string>();
      const json* entry = tokens && tokens->is_object() ? field(*tokens, token.c_str()) : nullptr;
      named(*slot, token, entry && entry->is_object() ? field(*entry, "ids") : nullptr,
            file + ": post_processor.special_tokens." + token);
    }
  }
};

// ---- vocab.txt (+ tokenizer_config.json) ----

Shared WordPieceTokenizer::from_vocab_txt(std::string_view vocab_txt, std::string vocab_name, int64_t vocab_size,
                                          std::string_view config_json, std::string config_name) {
  std::shared_ptr<WordPieceTokenizer> t(new WordPieceTokenizer());
  Reader r{*t, std::nullopt};
  t->name_ = vocab_name;
  HL_CHECK(!vocab_txt.empty(), vocab_name, ": is empty; expected one token a line");
  for (size_t pos = 0, line = 1; pos < vocab_txt.size(); ++line) {  // the last line end ends the last token
    const size_t end = std::min(vocab_txt.find('\n', pos), vocab_txt.size());
    std::string_view token = vocab_txt.substr(pos, end - pos);
    pos = end + 1;
    if (token.ends_with('\r')) token.remove_suffix(1);  // Windows' line ends
    const std::string where = vocab_name + ": line " + std::to_string(line);
    detail::check_utf8(token, where);
    r.add_token(std::string(token), static_cast<int64_t>(line - 1), where);
  }
  const json config = config_json.empty() ? json::object() : parse(config_json, config_name);
  // added_tokens_decoder ({"100": {"content": "[UNK]", ...}}), by id: those after the vocabulary's come in order.
  std::vector<std::pair<int64_t, const json*>> added;
  if (const json* decoder = field(config, "added_tokens_decoder")) {
    HL_CHECK(decoder->is_object(), config_name, ": added_tokens_decoder must be an object, got ", shown(*decoder));
    for (const auto& entry : decoder->items()) {
      const std::string& key = entry.key();
      int64_t id = -1;
      const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
      HL_CHECK(ec == std::errc() && end == key.data() + key.size(), config_name, ": added_tokens_decoder's key ",
               json_text(key), " must be a token id");
      added.emplace_back(id, &entry.value());
    }
  }
  std::sort(added.begin(), added.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [id, a] : added) r.add_added(*a, id, config_name + ": added_tokens_decoder." + std::to_string(id));
  r.defaults();
  r.read_config(config, config_name);
  r.finish(vocab_name, vocab_size, "vocab.txt", vocab_txt, config_json);
  return t;
}

// ---- tokenizer.json (+ tokenizer_config.json) ----

Shared WordPieceTokenizer::from_tokenizer_json(std::string_view tokenizer_json, std::string name, int64_t vocab_size,
                                               std::string_view config_json, std::string config_name) {
  std::shared_ptr<WordPieceTokenizer> t(new WordPieceTokenizer());
  Reader r{*t, std::nullopt};
  t->name_ = name;
  t->options_.nfc = false;  // tokenizers' BertNormalizer composes nothing
  const json j = parse(tokenizer_json, name, true);
  std::string unk = "[UNK]";
  r.read_model(j, name, unk);
  r.read_added_tokens(j, name);
  r.defaults();
  r.name(t->unk_, unk, name + ": model.unk_token");
  r.read_normalizer(j, name);
  part_type(j, "pre_tokenizer", name, {"BertPreTokenizer"});  // whitespace, then punctuation
  r.read_post_processor(j, name);
  if (!part_type(j, "decoder", name, {"WordPiece"}, true).empty()) {
    const json* decoder = field(j, "decoder");
    std::string prefix = "##";
    read_json_field(*decoder, "prefix", prefix, (name + ": decoder").c_str());
    HL_CHECK(prefix == t->options_.prefix, name, ": decoder.prefix is ", json_text(prefix),
             ", but model.continuing_subword_prefix is ", json_text(t->options_.prefix));
  }
  if (!config_json.empty()) r.read_config(parse(config_json, config_name), config_name);
  r.finish(name, vocab_size, "tokenizer.json", tokenizer_json, config_json);
  return t;
}

// ---- files ----

Shared wordpiece_from_file(const std::string& path, const std::string& config_path, int64_t vocab_size) {
  const std::string text = read_whole_file(path, WholeFile::tokenizer, "WordPiece tokenizer");
  const std::string config =
      config_path.empty() ? "" : read_whole_file(config_path, WholeFile::config, "WordPiece tokenizer");
  const auto from =
      path.ends_with(".json") ? WordPieceTokenizer::from_tokenizer_json : WordPieceTokenizer::from_vocab_txt;
  return from(text, path, vocab_size, config, config_path);
}

Shared wordpiece_from_files(const TokenizerFiles& files, const std::string& where, int64_t vocab_size) {
  HL_CHECK(files.type == "wordpiece", where, ": tokenizer type '", files.type, "', expected wordpiece");
  const std::string* config = files.find("tokenizer_config.json");
  const std::string config_json = config ? *config : std::string();
  if (const std::string* j = files.find("tokenizer.json"))
    return WordPieceTokenizer::from_tokenizer_json(*j, where + "tokenizer.json", vocab_size, config_json,
                                                   where + "tokenizer_config.json");
  const std::string* vocab = files.find("vocab.txt");
  HL_CHECK(vocab != nullptr, where, "vocab.txt is missing (a wordpiece tokenizer's file, or tokenizer.json)");
  return WordPieceTokenizer::from_vocab_txt(*vocab, where + "vocab.txt", vocab_size, config_json,
                                            where + "tokenizer_config.json");
}

bool is_wordpiece_tokenizer_json(std::string_view text) {
  if (text.find("\"WordPiece\"") == std::string_view::npos) return false;  // (one spelt with \u escapes is missed)
  try {
    const json j = parse(text, "tokenizer.json");
    const json* model = field(j, "model");
    return model != nullptr && model->is_object() && model->value("type", json()) == "WordPiece";
  } catch (const Error&) {
    return false;
  }
}

bool is_wordpiece_tokenizer_json_file(const std::string& path) {
  std::string why_not;
  const std::string text = detail::read_text_file(path, WholeFile::tokenizer, why_not);
  return why_not.empty() && is_wordpiece_tokenizer_json(text);
}

}  // namespace headlab::tasks
