// Token ids as numbers (see id_tokenizer.h).
#include "tasks/id_tokenizer.h"

#include <charconv>
#include <nlohmann/json.hpp>

#include "base/error.h"

namespace headlab::tasks {

IdTokenizer::IdTokenizer(int64_t size, std::map<int64_t, std::string> names) : size_(size), names_(std::move(names)) {
  HL_CHECK(size > 0, "ids tokenizer: size must be positive, got ", size);
  for (const auto& [id, name] : names_) {
    HL_CHECK(id >= 0 && id < size, "ids tokenizer: a name for token ", id, ", outside [0, ", size, ")");
    HL_CHECK(!name.empty() && name.find_first_of(" \t\n") == std::string::npos, "ids tokenizer: token ", id,
             "'s name '", name, "' must be one word");
  }
}

IdTokenizer IdTokenizer::from_json(const std::string& text, const std::string& where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    HL_FAIL(where, ": not JSON: ", e.what());
  }
  HL_CHECK(j.is_object() && j.contains("size") && j["size"].is_number_integer(), where,
           ": expected {\"size\": N, \"names\": {...}}");
  std::map<int64_t, std::string> names;
  if (j.contains("names")) {
    HL_CHECK(j["names"].is_object(), where, ": names must be an object of id -> name");
    for (const auto& [id, name] : j["names"].items()) {
      int64_t v = -1;
      const auto [end, ec] = std::from_chars(id.data(), id.data() + id.size(), v);
      HL_CHECK(ec == std::errc() && end == id.data() + id.size() && name.is_string(), where, ": names' entry '", id,
               "' must map a token id to a name");
      names.emplace(v, name.get<std::string>());
    }
  }
  return IdTokenizer(j["size"].get<int64_t>(), std::move(names));
}

std::vector<int64_t> IdTokenizer::encode(std::string_view text, std::string_view label) const {
  std::vector<int64_t> ids;
  size_t at = 0;
  while (true) {
    at = text.find_first_not_of(" \t\r\n,", at);
    if (at == std::string_view::npos) break;
    const size_t end = std::min(text.find_first_of(" \t\r\n,", at), text.size());
    const std::string_view word = text.substr(at, end - at);
    int64_t id = -1;
    const auto [p, ec] = std::from_chars(word.data(), word.data() + word.size(), id);
    if (ec != std::errc() || p != word.data() + word.size()) {
      id = -1;
      for (const auto& [i, name] : names_)
        if (name == word) id = i;
    }
    HL_CHECK(id >= 0 && id < size_, label, ": '", word, "' is not a token: this model's tokens are the numbers 0 to ",
             size_ - 1, names_.empty() ? "" : " or their names", " (", describe(), ")");
    ids.push_back(id);
    at = end;
  }
  return ids;
}

std::string IdTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  for (const int64_t id : ids) out.append(out.empty() ? "" : " ").append(token_text(id));
  return out;
}

std::string IdTokenizer::token_text(int64_t id) const {
  HL_CHECK(id >= 0 && id < size_, "ids tokenizer: token ", id, " is outside [0, ", size_, ")");
  const auto it = names_.find(id);
  return it != names_.end() ? it->second : std::to_string(id);
}

std::string IdTokenizer::describe() const {
  std::string out = "no text tokenizer: token ids 0.." + std::to_string(size_ - 1) + " written as numbers";
  for (const auto& [id, name] : names_) out.append(", ").append(std::to_string(id)).append(" is '").append(name).append("'");
  return out;
}

TokenizerFiles IdTokenizer::files() const {
  nlohmann::json names = nlohmann::json::object();
  for (const auto& [id, name] : names_) names[std::to_string(id)] = name;
  return {"ids", {{"ids.json", nlohmann::json{{"size", size_}, {"names", names}}.dump()}}};
}

}  // namespace headlab::tasks
