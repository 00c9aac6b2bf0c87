// The restricted unpickler of PyTorch's files (see torch_pickle.h): a machine that builds containers, numbers,
// text and tensor rebuilds and nothing else; every other global is kept as its name and never called.
#include "io/torch_pickle.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include "base/error.h"

namespace headlab::io {

namespace {

using ojson = nlohmann::ordered_json;

constexpr int kMaxDepth = 200;                    // nesting of the saved object, for its conversion to JSON
constexpr int64_t kMaxValues = 10'000'000;        // values written out: a pickle sharing one list many times

// ---- the pickle's values ----

struct Py;
using PyPtr = std::shared_ptr<Py>;

struct Py {
  enum class K { none, boolean, integer, real, text, bytes, list, tuple, dict, global, object, tensor, storage, mark };
  K k = K::none;
  int64_t i = 0;  // boolean, integer; tensor: its index; storage: its index in Unpickler::storages
  double d = 0;   // real
  std::string s;  // text, bytes, a global's or an object's name
  std::vector<PyPtr> items;  // list, tuple; dict: key, value, key, value, ...
};

PyPtr make(Py::K k) {
  auto p = std::make_shared<Py>();
  p->k = k;
  return p;
}
PyPtr make_int(int64_t v) {
  PyPtr p = make(Py::K::integer);
  p->i = v;
  return p;
}
PyPtr make_text(Py::K k, std::string s) {
  PyPtr p = make(k);
  p->s = std::move(s);
  return p;
}

// torch's storage types and dtypes by the names a pickle gives them.
struct StorageType {
  const char* storage;  // "FloatStorage"
  const char* dtype;    // "float32"
  int64_t size;
};
constexpr StorageType kStorageTypes[] = {
    {"FloatStorage", "float32", 4}, {"DoubleStorage", "float64", 8}, {"HalfStorage", "float16", 2},
    {"BFloat16Storage", "bfloat16", 2}, {"LongStorage", "int64", 8}, {"IntStorage", "int32", 4},
    {"ShortStorage", "int16", 2}, {"CharStorage", "int8", 1}, {"ByteStorage", "uint8", 1},
    {"BoolStorage", "bool", 1}};

const StorageType* storage_type(const std::string& global) {  // "torch.FloatStorage"
  for (const StorageType& t : kStorageTypes)
    if (global == std::string("torch.") + t.storage) return &t;
  return nullptr;
}

// The functions and types the machine knows; every other global is kept as a name and never called.
const std::set<std::string>& known_globals() {
  static const std::set<std::string> names = {
      "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor", "torch._utils._rebuild_parameter",
      "torch._utils._rebuild_parameter_with_state", "torch._tensor._rebuild_from_type_v2", "collections.OrderedDict",
      "torch.Size", "_codecs.encode", "builtins.set", "builtins.frozenset"};
  return names;
}

struct Storage {
  std::string key;
  const StorageType* type;
  int64_t numel;
};

// ---- the machine ----

class Unpickler {
 public:
  Unpickler(std::string_view bytes, std::string who) : p_(bytes), who_(std::move(who)) {}
  // A pickle can put a list inside itself (DUP, APPEND): the containers' items are let go here, cycles with them.
  ~Unpickler() {
    for (const PyPtr& c : containers_) c->items.clear();
  }

  PyPtr run() {
    while (true) {
      const uint8_t op = byte();
      if (op == '.') break;  // STOP
      step(op);
    }
    HL_CHECK(stack_.size() == 1, who_, ": the pickle ends with ", stack_.size(), " values on its stack, expected 1");
    return stack_.back();
  }

  std::vector<Storage> storages;
  std::vector<TorchTensor> tensors;
  std::vector<std::string> unbuilt;  // the objects it met and did not build, by global name

 private:
  [[noreturn]] void bad(const std::string& what) const {
    HL_FAIL(who_, ": damaged pickle at byte ", at_, ": ", what);
  }
  uint8_t byte() {
    if (at_ >= p_.size()) bad("it ends without STOP");
    return static_cast<uint8_t>(p_[at_++]);
  }
  std::string_view take(uint64_t n) {
    if (n > p_.size() - at_) bad("a length of " + std::to_string(n) + " runs past its end");
    const std::string_view s = p_.substr(at_, n);
    at_ += n;
    return s;
  }
  uint64_t le(int n) {
    const std::string_view s = take(static_cast<uint64_t>(n));
    uint64_t v = 0;
    for (int j = n - 1; j >= 0; --j) v = (v << 8) | static_cast<unsigned char>(s[static_cast<size_t>(j)]);
    return v;
  }
  std::string line() {
    const size_t end = p_.find('\n', at_);
    if (end == std::string_view::npos) bad("a text argument has no end of line");
    std::string s(p_.substr(at_, end - at_));
    at_ = end + 1;
    return s;
  }
  PyPtr pop() {
    if (stack_.empty() || stack_.back()->k == Py::K::mark) bad("an opcode needs a value the stack lacks");
    PyPtr v = stack_.back();
    stack_.pop_back();
    return v;
  }
  PyPtr& top() {
    if (stack_.empty() || stack_.back()->k == Py::K::mark) bad("an opcode needs a value the stack lacks");
    return stack_.back();
  }
  std::vector<PyPtr> pop_to_mark() {
    size_t m = stack_.size();
    while (m > 0 && stack_[m - 1]->k != Py::K::mark) --m;
    if (m == 0) bad("MARK expected");
    std::vector<PyPtr> items(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m - 1);
    return items;
  }
  void put(uint64_t key) { memo_[key] = top(); }
  void get(uint64_t key) {
    const auto it = memo_.find(key);
    if (it == memo_.end()) bad("memo key " + std::to_string(key) + " was never stored");
    stack_.push_back(it->second);
  }
  PyPtr integer_from(std::string_view bytes) {  // LONG1/LONG4: little-endian two's complement
    if (bytes.empty()) return make_int(0);
    if (bytes.size() <= 8) {
      uint64_t v = 0;
      for (size_t j = bytes.size(); j-- > 0;) v = (v << 8) | static_cast<unsigned char>(bytes[j]);
      const int shift = 64 - 8 * static_cast<int>(bytes.size());
      return make_int(shift == 0 ? static_cast<int64_t>(v) : static_cast<int64_t>(v << shift) >> shift);
    }
    PyPtr r = make(Py::K::real);  // beyond int64: its magnitude is all a config could use
    double v = 0;
    for (size_t j = bytes.size(); j-- > 0;) v = v * 256 + static_cast<unsigned char>(bytes[j]);
    if (static_cast<unsigned char>(bytes.back()) & 0x80) v -= std::ldexp(1.0, 8 * static_cast<int>(bytes.size()));
    r->d = v;
    return r;
  }
  void append_to(PyPtr& list, std::vector<PyPtr> items) {
    if (list->k == Py::K::list) {
      list->items.insert(list->items.end(), items.begin(), items.end());
    } else if (list->k != Py::K::object) {  // an object's appends are skipped with it
      bad("APPEND to a value that is not a list");
    }
  }
  void set_items(PyPtr& dict, const std::vector<PyPtr>& kv) {
    if (kv.size() % 2) bad("SETITEMS with an odd number of values");
    if (dict->k == Py::K::object) return;
    if (dict->k != Py::K::dict) bad("SETITEM on a value that is not a dict");
    dict->items.insert(dict->items.end(), kv.begin(), kv.end());
  }
  PyPtr global(std::string name) {
    if (name.starts_with("__builtin__.")) name = "builtins." + name.substr(12);  // protocol 2's Python 2 names
    if (const StorageType* t = storage_type(name)) return make_text(Py::K::global, std::string("torch.") + t->storage);
    return make_text(Py::K::global, std::move(name));
  }

  // A persistent id: ('storage', storage type, key, location, numel) as torch.save writes it.
  PyPtr persistent(const PyPtr& pid) {
    if (pid->k != Py::K::tuple || pid->items.size() < 5 || pid->items[0]->k != Py::K::text ||
        pid->items[0]->s != "storage")
      bad("a persistent id that is not ('storage', type, key, location, size)");
    const PyPtr& type = pid->items[1];
    const StorageType* t = type->k == Py::K::global ? storage_type(type->s) : nullptr;
    HL_CHECK(t, who_, ": a storage of type ", type->k == Py::K::global ? type->s : "?",
             ", which headlab does not read (it reads float32, float64, float16, bfloat16, int and bool storages)");
    const PyPtr& key = pid->items[2];
    const PyPtr& numel = pid->items[4];
    if (key->k != Py::K::text || numel->k != Py::K::integer || numel->i < 0) bad("a storage's key or size is not valid");
    for (size_t j = 0; j < storages.size(); ++j)
      if (storages[j].key == key->s) {
        HL_CHECK(storages[j].type == t && storages[j].numel == numel->i, who_, ": storage '", key->s,
                 "' is described twice, differently");
        PyPtr s = make(Py::K::storage);
        s->i = static_cast<int64_t>(j);
        return s;
      }
    storages.push_back({key->s, t, numel->i});
    PyPtr s = make(Py::K::storage);
    s->i = static_cast<int64_t>(storages.size() - 1);
    return s;
  }

  std::vector<int64_t> ints(const PyPtr& v, const char* what) {
    if (v->k != Py::K::tuple && v->k != Py::K::list) bad(std::string("a tensor's ") + what + " is not a tuple");
    std::vector<int64_t> out;
    for (const PyPtr& x : v->items) {
      if (x->k != Py::K::integer || x->i < 0) bad(std::string("a tensor's ") + what + " holds a value that is not a size");
      out.push_back(x->i);
    }
    return out;
  }

  // _rebuild_tensor_v2(storage, storage_offset, size, stride, ...): the elements it spans checked to lie in the
  // storage, so that reading it later cannot run past the storage's bytes.
  PyPtr rebuild_tensor(const std::vector<PyPtr>& a) {
    if (a.size() < 4 || a[0]->k != Py::K::storage || a[1]->k != Py::K::integer || a[1]->i < 0)
      bad("_rebuild_tensor_v2 without (storage, offset, size, stride)");
    const Storage& s = storages[static_cast<size_t>(a[0]->i)];
    TorchTensor t;
    t.storage = s.key, t.dtype = s.type->dtype, t.element_size = s.type->size, t.storage_numel = s.numel;
    t.offset = a[1]->i;
    t.shape = ints(a[2], "size");
    t.stride = ints(a[3], "stride");
    if (t.shape.size() != t.stride.size()) bad("a tensor's size and stride differ in length");
    // The last element's index, each step checked before it can overflow; and the elements, at most the storage's.
    bool past = false, empty = false;
    int64_t last = t.offset, numel = 1;
    for (const int64_t n : t.shape) empty = empty || n == 0;
    for (size_t j = 0; j < t.shape.size() && !empty && numel <= s.numel; ++j)
      numel = numel > s.numel / t.shape[j] ? s.numel + 1 : numel * t.shape[j];
    for (size_t j = 0; j < t.shape.size() && !empty && !past; ++j) {
      if (t.shape[j] <= 1 || t.stride[j] == 0) continue;
      past = last >= s.numel || (t.shape[j] - 1) > (s.numel - 1 - last) / t.stride[j];
      if (!past) last += (t.shape[j] - 1) * t.stride[j];
    }
    HL_CHECK(empty || (!past && last < s.numel), who_, ": a tensor of size ", shape_str(t.shape), " at offset ",
             t.offset, " runs past its storage '", s.key, "' of ", s.numel, " elements");
    HL_CHECK(empty || numel <= std::max<int64_t>(s.numel, 1), who_, ": a tensor of size ", shape_str(t.shape),
             " has more elements than its storage '", s.key, "' holds (", s.numel,
             "): an expanded view, which headlab does not read");
    tensors.push_back(std::move(t));
    PyPtr r = make(Py::K::tensor);
    r->i = static_cast<int64_t>(tensors.size() - 1);
    return r;
  }

  PyPtr call(const PyPtr& f, const PyPtr& args) {
    if (f->k == Py::K::object) return f;  // what an object returns is not built either
    if (f->k != Py::K::global) bad("REDUCE of a value that cannot be called");
    const std::string& name = f->s;
    if (!known_globals().count(name)) {  // kept as a name: never called
      unbuilt.push_back(name);
      return make_text(Py::K::object, name);
    }
    if (args->k != Py::K::tuple) bad("REDUCE's arguments are not a tuple");
    const std::vector<PyPtr>& a = args->items;
    if (name == "torch._utils._rebuild_tensor_v2" || name == "torch._utils._rebuild_tensor") return rebuild_tensor(a);
    if (name == "torch._utils._rebuild_parameter" || name == "torch._utils._rebuild_parameter_with_state") {
      if (a.empty() || a[0]->k != Py::K::tensor) bad("_rebuild_parameter without a tensor");
      return a[0];
    }
    if (name == "torch._tensor._rebuild_from_type_v2") {  // (func, type, args, state): func(*args)
      if (a.size() < 3) bad("_rebuild_from_type_v2 without (func, type, args)");
      return call(a[0], a[2]);
    }
    if (name == "collections.OrderedDict") return container(Py::K::dict);
    if (name == "torch.Size") {
      PyPtr t = container(Py::K::tuple);
      if (!a.empty()) t->items = a[0]->items;
      return t;
    }
    if (name == "_codecs.encode") {  // protocol 2's bytes: encode(text, 'latin1')
      if (a.empty() || a[0]->k != Py::K::text) bad("_codecs.encode without text");
      return make_text(Py::K::bytes, a[0]->s);
    }
    PyPtr set = container(Py::K::list);  // set, frozenset: as lists
    if (!a.empty()) set->items = a[0]->items;
    return set;
  }

  void step(uint8_t op) {
    switch (op) {
      case 0x80: byte(); break;                                   // PROTO
      case 0x95: le(8); break;                                    // FRAME
      case '(': stack_.push_back(make(Py::K::mark)); break;       // MARK
      case 'N': stack_.push_back(make(Py::K::none)); break;       // NONE
      case 0x88: case 0x89: {                                     // NEWTRUE, NEWFALSE
        PyPtr b = make(Py::K::boolean);
        b->i = op == 0x88;
        stack_.push_back(b);
        break;
      }
      case 'J': stack_.push_back(make_int(static_cast<int32_t>(le(4)))); break;  // BININT
      case 'K': stack_.push_back(make_int(static_cast<int64_t>(le(1)))); break;  // BININT1
      case 'M': stack_.push_back(make_int(static_cast<int64_t>(le(2)))); break;  // BININT2
      case 0x8a: stack_.push_back(integer_from(take(le(1)))); break;             // LONG1
      case 0x8b: stack_.push_back(integer_from(take(le(4)))); break;             // LONG4
      case 'I': case 'L': {                                                       // INT, LONG (text)
        std::string s = line();
        if (!s.empty() && s.back() == 'L') s.pop_back();
        if (s == "00" || s == "01") {
          PyPtr b = make(Py::K::boolean);
          b->i = s == "01";
          stack_.push_back(b);
          break;
        }
        try {
          stack_.push_back(make_int(std::stoll(s)));
        } catch (const std::exception&) {
          bad("INT '" + s + "' is not a whole number");
        }
        break;
      }
      case 'G': {  // BINFLOAT: big-endian
        const std::string_view s = take(8);
        uint64_t v = 0;
        for (const char c : s) v = (v << 8) | static_cast<unsigned char>(c);
        PyPtr r = make(Py::K::real);
        r->d = std::bit_cast<double>(v);
        stack_.push_back(r);
        break;
      }
      case 'F': {  // FLOAT (text)
        const std::string s = line();
        PyPtr r = make(Py::K::real);
        try {
          r->d = std::stod(s);
        } catch (const std::exception&) {
          bad("FLOAT '" + s + "' is not a number");
        }
        stack_.push_back(r);
        break;
      }
      case 'X': stack_.push_back(make_text(Py::K::text, std::string(take(le(4))))); break;     // BINUNICODE
      case 0x8c: stack_.push_back(make_text(Py::K::text, std::string(take(le(1))))); break;  // SHORT_BINUNICODE
      case 0x8d: stack_.push_back(make_text(Py::K::text, std::string(take(le(8))))); break;  // BINUNICODE8
      case 'T': stack_.push_back(make_text(Py::K::text, std::string(take(le(4))))); break;     // BINSTRING
      case 'U': stack_.push_back(make_text(Py::K::text, std::string(take(le(1))))); break;     // SHORT_BINSTRING
      case 'B': stack_.push_back(make_text(Py::K::bytes, std::string(take(le(4))))); break;    // BINBYTES
      case 'C': stack_.push_back(make_text(Py::K::bytes, std::string(take(le(1))))); break;    // SHORT_BINBYTES
      case 0x8e: stack_.push_back(make_text(Py::K::bytes, std::string(take(le(8))))); break;   // BINBYTES8
      case 0x96: stack_.push_back(make_text(Py::K::bytes, std::string(take(le(8))))); break;   // BYTEARRAY8
      case 'V': case 'S': {  // UNICODE, STRING (text; STRING quoted)
        std::string s = line();
        if (op == 'S' && s.size() >= 2 && (s[0] == '\'' || s[0] == '"')) s = s.substr(1, s.size() - 2);
        stack_.push_back(make_text(Py::K::text, std::move(s)));
        break;
      }
      case ']': stack_.push_back(container(Py::K::list)); break;  // EMPTY_LIST
      case '}': stack_.push_back(container(Py::K::dict)); break;  // EMPTY_DICT
      case ')': stack_.push_back(container(Py::K::tuple)); break; // EMPTY_TUPLE
      case 0x8f: stack_.push_back(container(Py::K::list)); break;  // EMPTY_SET, as a list
      case 'l': case 't': case 0x91: {  // LIST, TUPLE, FROZENSET
        PyPtr v = container(op == 't' ? Py::K::tuple : Py::K::list);
        v->items = pop_to_mark();
        stack_.push_back(v);
        break;
      }
      case 'd': {  // DICT
        PyPtr v = container(Py::K::dict);
        std::vector<PyPtr> kv = pop_to_mark();
        set_items(v, kv);
        stack_.push_back(v);
        break;
      }
      case 0x85: case 0x86: case 0x87: {  // TUPLE1, TUPLE2, TUPLE3
        const size_t n = op - 0x84u;
        if (stack_.size() < n) bad("TUPLE" + std::to_string(n) + " needs values the stack lacks");
        PyPtr v = container(Py::K::tuple);
        for (size_t j = 0; j < n; ++j) v->items.insert(v->items.begin(), pop());
        stack_.push_back(v);
        break;
      }
      case 'a': {  // APPEND
        PyPtr v = pop();
        append_to(top(), {v});
        break;
      }
      case 'e': {  // APPENDS
        std::vector<PyPtr> items = pop_to_mark();
        append_to(top(), std::move(items));
        break;
      }
      case 0x90: {  // ADDITEMS (a set)
        std::vector<PyPtr> items = pop_to_mark();
        append_to(top(), std::move(items));
        break;
      }
      case 's': {  // SETITEM
        PyPtr v = pop(), k = pop();
        set_items(top(), {k, v});
        break;
      }
      case 'u': {  // SETITEMS
        const std::vector<PyPtr> kv = pop_to_mark();
        set_items(top(), kv);
        break;
      }
      case 'c': {  // GLOBAL: module and name on two lines
        std::string module = line();
        std::string name = line();
        stack_.push_back(global(module + "." + name));
        break;
      }
      case 0x93: {  // STACK_GLOBAL
        PyPtr name = pop(), module = pop();
        if (name->k != Py::K::text || module->k != Py::K::text) bad("STACK_GLOBAL of values that are not text");
        stack_.push_back(global(module->s + "." + name->s));
        break;
      }
      case 'R': {  // REDUCE
        PyPtr args = pop(), f = pop();
        stack_.push_back(call(f, args));
        break;
      }
      case 0x81: case 0x92: {  // NEWOBJ, NEWOBJ_EX: an instance of a class, never built
        if (op == 0x92) pop();  // kwargs
        pop();                  // args
        PyPtr cls = pop();
        const std::string name = cls->k == Py::K::global || cls->k == Py::K::object ? cls->s : "?";
        unbuilt.push_back(name);
        stack_.push_back(make_text(Py::K::object, name));
        break;
      }
      case 'i': {  // INST: module, name, then the arguments after MARK
        std::string module = line();
        std::string name = line();
        pop_to_mark();
        unbuilt.push_back(module + "." + name);
        stack_.push_back(make_text(Py::K::object, module + "." + name));
        break;
      }
      case 'o': {  // OBJ: class and arguments after MARK
        std::vector<PyPtr> items = pop_to_mark();
        const std::string name = !items.empty() && items[0]->k == Py::K::global ? items[0]->s : "?";
        unbuilt.push_back(name);
        stack_.push_back(make_text(Py::K::object, name));
        break;
      }
      case 'b':  // BUILD: attributes (a state_dict's _metadata, a tensor's state) are not needed; objects stay unbuilt
        pop();
        top();
        break;
      case 'Q': stack_.push_back(persistent(pop())); break;  // BINPERSID
      case 'P': bad("a text persistent id (the legacy format's)");
      case 'q': put(le(1)); break;                             // BINPUT
      case 'r': put(le(4)); break;                             // LONG_BINPUT
      case 0x94: put(memo_.size()); break;                     // MEMOIZE
      case 'p': {                                              // PUT (text)
        const std::string s = line();
        try {
          put(std::stoull(s));
        } catch (const std::exception&) {
          bad("PUT '" + s + "'");
        }
        break;
      }
      case 'h': get(le(1)); break;  // BINGET
      case 'j': get(le(4)); break;  // LONG_BINGET
      case 'g': {                   // GET (text)
        const std::string s = line();
        try {
          get(std::stoull(s));
        } catch (const std::exception&) {
          bad("GET '" + s + "'");
        }
        break;
      }
      case '0': pop(); break;             // POP
      case '1': pop_to_mark(); break;     // POP_MARK
      case '2': stack_.push_back(top()); break;  // DUP
      default: {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", op);
        bad(std::string("opcode ") + hex + ", which a torch.save pickle does not use");
      }
    }
  }

  std::string_view p_;
  std::string who_;
  size_t at_ = 0;
  PyPtr container(Py::K k) {
    PyPtr c = make(k);
    containers_.push_back(c);
    return c;
  }
  std::vector<PyPtr> stack_;
  std::map<uint64_t, PyPtr> memo_;
  std::vector<PyPtr> containers_;
};

std::string key_text(const PyPtr& k) {
  switch (k->k) {
    case Py::K::text: return k->s;
    case Py::K::integer: return std::to_string(k->i);
    case Py::K::boolean: return k->i ? "True" : "False";
    case Py::K::none: return "None";
    default: return "<" + std::string(k->k == Py::K::tuple ? "tuple" : "key") + ">";
  }
}

ojson to_json(const PyPtr& v, int depth, int64_t& budget, const std::string& who) {
  HL_CHECK(depth < kMaxDepth, who, ": the saved object nests deeper than ", kMaxDepth, " levels");
  HL_CHECK(--budget >= 0, who, ": the saved object holds more than ", kMaxValues, " values");
  switch (v->k) {
    case Py::K::none: return nullptr;
    case Py::K::boolean: return v->i != 0;
    case Py::K::integer: return v->i;
    case Py::K::real: return v->d;
    case Py::K::text: return v->s;
    case Py::K::bytes: return ojson{{"__bytes__", v->s.size()}};
    case Py::K::tensor: return ojson{{"__tensor__", v->i}};
    case Py::K::global: return ojson{{"__global__", v->s}};
    case Py::K::object: return ojson{{"__object__", v->s}};
    case Py::K::storage: return ojson{{"__storage__", v->i}};
    case Py::K::list: case Py::K::tuple: {
      ojson a = ojson::array();
      for (const PyPtr& x : v->items) a.push_back(to_json(x, depth + 1, budget, who));
      return a;
    }
    case Py::K::dict: {
      ojson o = ojson::object();
      for (size_t j = 0; j + 1 < v->items.size(); j += 2) o[key_text(v->items[j])] = to_json(v->items[j + 1], depth + 1, budget, who);
      return o;
    }
    case Py::K::mark: break;
  }
  HL_FAIL(who, ": a MARK left in the saved object");
}


}  // namespace

Unpickled unpickle(std::string_view bytes, const std::string& who) {
  Unpickler u(bytes, who);
  const PyPtr root = u.run();
  Unpickled out;
  for (const Storage& s : u.storages) out.storages.push_back({s.key, s.type->dtype, s.type->size, s.numel});
  out.tensors = std::move(u.tensors);
  int64_t budget = kMaxValues;
  out.value = to_json(root, 0, budget, who);  // while u holds the values: its destructor lets cycles go
  out.unbuilt = std::move(u.unbuilt);
  return out;
}

}  // namespace headlab::io
