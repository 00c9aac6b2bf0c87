#include "base/json_text.h"

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "base/error.h"

namespace headlab {

namespace {

using nlohmann::json;

// nlohmann's SAX events built into a json value, as its own DOM parser does (a stack of the open containers),
// with the depth checked at each opening and the watched object's keys remembered.
class Builder {
 public:
  Builder(const std::string& source, const JsonLimits& limits) : source_(source), limits_(limits) {}
  json result() { return std::move(root_); }
  // The repeated key of the watched object the value ends with: a repeated key on the way to it (a second
  // "model") replaces the object in which a repeat was seen, as nlohmann keeps the last value.
  std::string repeated() const {
    const json* watched = &root_;
    for (const std::string& k : limits_.watch) {
      if (!watched->is_object() || !watched->contains(k)) return {};
      watched = &(*watched)[k];
    }
    return watched->is_object() ? repeated_ : std::string();
  }

  bool null() { return add(nullptr); }
  bool boolean(bool v) { return add(v); }
  bool number_integer(json::number_integer_t v) { return add(v); }
  bool number_unsigned(json::number_unsigned_t v) { return add(v); }
  bool number_float(json::number_float_t v, const json::string_t&) { return add(v); }
  bool string(json::string_t& v) { return add(std::move(v)); }
  bool binary(json::binary_t& v) { return add(json::binary(std::move(v))); }
  bool start_object(std::size_t) { return open(json::object()); }
  bool start_array(std::size_t) { return open(json::array()); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(json::string_t& k) {
    if (watching() && repeated_.empty() && !keys_.insert(k).second) repeated_ = k;
    key_ = std::move(k);
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    HL_FAIL(source_, ": not JSON (", e.what(), ")");
  }

 private:
  // Whether the innermost open value is the watched object: its path of keys is the root's ("") and the watch's.
  bool watching() const {
    return path_.size() == limits_.watch.size() + 1 &&
           std::equal(limits_.watch.begin(), limits_.watch.end(), path_.begin() + 1);
  }
  json* add(json v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    json& parent = *stack_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(v));
      return &parent.back();
    }
    json& slot = parent[key_];  // a repeated key: the last value wins, as with nlohmann
    slot = std::move(v);
    return &slot;
  }
  bool open(json container) {
    const int depth = static_cast<int>(stack_.size()) + 1;
    if (depth > limits_.max_depth) {
      if (!limits_.depth_expected.empty())
        HL_FAIL(source_, ": ", limits_.depth_expected, ", got values nested ", depth, " deep");
      HL_FAIL(source_, ": JSON nested deeper than ", limits_.max_depth, " levels");
    }
    // The key path of the new container: its parent's path and its key (arrays' elements: no key).
    const bool in_object = !stack_.empty() && stack_.back()->is_object();
    path_.push_back(stack_.empty() ? std::string() : in_object ? key_ : std::string("[]"));
    if (watching()) {  // a watched object again (its parent's key repeated): only the last one counts
      keys_.clear();
      repeated_.clear();
    }
    stack_.push_back(add(std::move(container)));
    return true;
  }
  bool close() {
    stack_.pop_back();
    path_.pop_back();
    return true;
  }

  const std::string& source_;
  const JsonLimits& limits_;
  json root_;
  std::vector<json*> stack_;  // the open containers, innermost last
  std::vector<std::string> path_;
  std::string key_, repeated_;
  std::unordered_set<std::string> keys_;
};

}  // namespace

json parse_json_text(std::string_view text, const std::string& source, const JsonLimits& limits,
                     std::string* repeated) {
  if (const void* nul = std::memchr(text.data(), '\0', text.size()))
    HL_FAIL(source, ": not JSON (a NUL byte at offset ", static_cast<const char*>(nul) - text.data(), " of ",
            text.size(), "; is the file cut short or padded?)");
  Builder b(source, limits);
  json::sax_parse(text.begin(), text.end(), &b);  // strict: anything but whitespace after the value is an error
  if (repeated) *repeated = b.repeated();
  return b.result();
}

}  // namespace headlab
