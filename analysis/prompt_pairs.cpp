// Prompt pairs: read from JSONL or generated, and the logit difference at the last position.
#include "analysis/prompt_pairs.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "analysis/table.h"
#include "base/input_path.h"
#include "base/json_text.h"
#include "tasks/chars.h"

namespace headlab::analysis {

namespace {

// The ids of `text` in the task's tokenizer, as a prompt or as what follows one (an answer); where = "file:line:
// field".
std::vector<int64_t> tokens_of(const tasks::Task& task, const std::string& text, const std::string& where,
                               bool continuation) {
  HL_CHECK(!text.empty(), "prompt pairs: ", where, " is empty");
  try {
    return continuation ? task.encode_continuation(text) : task.encode_prompt(text).ids;
  } catch (const Error& e) {  // the tokenizer's reason (a character it has never seen), and where
    HL_FAIL("prompt pairs: ", where, ": ", e.what());
  }
}

std::string listed(const tasks::Task& task, const std::vector<int64_t>& ids) {
  std::string s;
  for (int64_t id : ids) {
    if (!s.empty()) s += ' ';
    s += nlohmann::json(task.token_text(id)).dump();
  }
  return s;
}

}  // namespace

PromptPairs read_prompt_pairs(const std::string& path, const tasks::Task& task) {
  HL_CHECK(dynamic_cast<const tasks::TextWindowsTask*>(&task) != nullptr, "prompt pairs: '", path,
           "' needs a text model (chars or GPT-2's BPE); this model's task is ", task.name());
  check_input_file(path, "prompt pairs: file");
  std::ifstream in(path);
  HL_CHECK(in, "prompt pairs: cannot open '", path, "'");
  PromptPairs p;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string at = path + ":" + std::to_string(n);
    const nlohmann::json row = parse_json_text(line, "prompt pairs: " + at);
    HL_CHECK(row.is_object(), "prompt pairs: ", at, " is not a JSON object: ", line.substr(0, 80));
    std::vector<int64_t> ids[4];
    const char* fields[4] = {"clean", "corrupt", "answer", "wrong"};
    for (int f = 0; f < 4; ++f) {
      HL_CHECK(row.contains(fields[f]) && row[fields[f]].is_string(), "prompt pairs: ", at, " has no string field '",
               fields[f], "' (each line: {\"clean\": ..., \"corrupt\": ..., \"answer\": ..., \"wrong\": ...})");
      ids[f] = tokens_of(task, row[fields[f]].get<std::string>(), at + ": " + fields[f], f >= 2);
    }
    for (int f = 2; f < 4; ++f)
      HL_CHECK(ids[f].size() == 1, "prompt pairs: ", at, ": ", fields[f], " must be one token; it is ", ids[f].size(),
               ": ", listed(task, ids[f]));
    HL_CHECK(ids[2][0] != ids[3][0], "prompt pairs: ", at, ": answer and wrong are the same token (",
             listed(task, ids[2]), "), so their logit difference is 0 whatever the model does");
    HL_CHECK(ids[0].size() == ids[1].size(), "prompt pairs: ", at, ": clean and corrupt must align token for token; ",
             "clean has ", ids[0].size(), " tokens, corrupt ", ids[1].size());
    const int64_t T = static_cast<int64_t>(ids[0].size());
    HL_CHECK(p.T == 0 || T == p.T, "prompt pairs: ", at, ": prompts of ", T, " tokens, but the rows before have ", p.T,
             " (rows of one template align token for token: one file per template)");
    p.T = T;
    p.clean.insert(p.clean.end(), ids[0].begin(), ids[0].end());
    p.corrupt.insert(p.corrupt.end(), ids[1].begin(), ids[1].end());
    p.answer.push_back(ids[2][0]);
    p.wrong.push_back(ids[3][0]);
  }
  HL_CHECK(p.rows() > 0, "prompt pairs: '", path, "' has no rows");
  return p;
}

PromptPairs induction_prompt_pairs(int64_t vocab_size, int64_t rows, int64_t n, uint64_t seed) {
  HL_CHECK(vocab_size >= 2 && rows > 0 && n >= 2, "induction_prompt_pairs: need a vocabulary of >= 2 tokens, rows and ",
           "n >= 2; got ", vocab_size, ", ", rows, ", ", n);
  Generator gen(seed);
  const std::vector<int64_t> draws = randint(0, vocab_size, {rows, 2, n}, gen).to_vector<int64_t>();
  PromptPairs p;
  p.T = 2 * n - 1;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int64_t> x(draws.begin() + 2 * n * r, draws.begin() + 2 * n * r + n);
    std::vector<int64_t> y(draws.begin() + 2 * n * r + n, draws.begin() + 2 * n * (r + 1));
    if (y.back() == x.back()) y.back() = (x.back() + 1) % vocab_size;  // the wrong token is never the answer
    for (auto [copy, to] : {std::pair{&x, &p.clean}, std::pair{&y, &p.corrupt}}) {
      to->insert(to->end(), copy->begin(), copy->end());
      to->insert(to->end(), copy->begin(), copy->end() - 1);
    }
    p.answer.push_back(x.back());
    p.wrong.push_back(y.back());
  }
  return p;
}

namespace {

// Wang et al.'s templates, in their "BABA" order; the prompt ends before the last " [A]".
constexpr std::array<const char*, kIoiTemplates> kIoiTemplateText = {
    "Then, [B] and [A] went to the [PLACE]. [B] gave a [OBJECT] to",
    "Then, [B] and [A] had a lot of fun at the [PLACE]. [B] gave a [OBJECT] to",
    "Then, [B] and [A] were working at the [PLACE]. [B] decided to give a [OBJECT] to",
    "Then, [B] and [A] were thinking about going to the [PLACE]. [B] wanted to give a [OBJECT] to",
    "Then, [B] and [A] had a long argument, and afterwards [B] said to",
    "After [B] and [A] went to the [PLACE], [B] gave a [OBJECT] to",
    "When [B] and [A] got a [OBJECT] at the [PLACE], [B] decided to give it to",
    "When [B] and [A] got a [OBJECT] at the [PLACE], [B] decided to give the [OBJECT] to",
    "While [B] and [A] were working at the [PLACE], [B] gave a [OBJECT] to",
    "While [B] and [A] were commuting to the [PLACE], [B] gave a [OBJECT] to",
    "After the lunch, [B] and [A] went to the [PLACE]. [B] gave a [OBJECT] to",
    "Afterwards, [B] and [A] went to the [PLACE]. [B] gave a [OBJECT] to",
    "Then, [B] and [A] had a long argument. Afterwards [B] said to",
    "The [PLACE] [B] and [A] went to had a [OBJECT]. [B] gave it to",
    "Friends [B] and [A] found a [OBJECT] at the [PLACE]. [B] gave it to",
};
constexpr std::array kIoiNames = {"Mary",  "John",  "Tom",    "James", "Dan",     "Sid",    "Martin", "Amy",
                                  "Lisa",  "Kate",  "Jane",   "Paul",  "Mark",    "Anna",   "Sarah",  "David",
                                  "Alex",  "Max",   "Ben",    "Laura", "Emma",    "Chris",  "Joe",    "Ryan",
                                  "Adam",  "Eric",  "Kevin",  "Jack",  "Tim",     "Steve",  "Sam",    "Mike",
                                  "Peter", "Brian", "Daniel", "Rose",  "Michael", "Andrew", "George", "Henry"};
constexpr std::array kIoiPlaces = {"store", "garden", "restaurant", "school", "hospital", "office", "house", "station"};
constexpr std::array kIoiObjects = {"ring", "kiss", "bone", "basketball", "computer", "necklace", "drink", "snack"};

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return s;
}

// The words that are one token with a leading space (as they stand in the templates), refused when none is.
template <size_t N>
std::vector<std::string> single_tokens(const tasks::Task& task, const std::array<const char*, N>& words,
                                       const char* what, size_t need, const char* who = "ioi") {
  std::vector<std::string> out;
  std::string refused;
  for (const char* w : words) {
    std::vector<int64_t> ids;
    try {
      ids = task.encode_continuation(std::string(" ") + w);
    } catch (const Error& e) {  // a tokenizer without these characters
      if (refused.empty()) refused = std::string("' ") + w + "': " + e.what();
      continue;
    }
    if (ids.size() == 1)
      out.push_back(w);
    else if (refused.empty())
      refused = std::string("' ") + w + "' is " + std::to_string(ids.size()) + " tokens";
  }
  HL_CHECK(out.size() >= need, who, ": needs ", need, " ", what, " that are one token each in the model's tokenizer (",
           "GPT-2's BPE); only ", out.size(), " are (", refused, ")");
  return out;
}

}  // namespace

PromptPairs ioi_prompt_pairs(const tasks::Task& task, int64_t rows, int64_t templ, uint64_t seed) {
  HL_CHECK(rows > 0, "ioi: the number of rows must be positive, got ", rows);
  HL_CHECK(templ >= 0 && templ < kIoiTemplates, "ioi: template ", templ, " does not exist (0..", kIoiTemplates - 1,
           ")");
  const std::vector<std::string> names = single_tokens(task, kIoiNames, "names", 5);
  const std::vector<std::string> places = single_tokens(task, kIoiPlaces, "places", 1);
  const std::vector<std::string> objects = single_tokens(task, kIoiObjects, "objects", 1);
  Generator gen(seed);
  const auto draw = [&](size_t n) {
    return static_cast<size_t>(randint(0, static_cast<int64_t>(n), {1}, gen).to_vector<int64_t>()[0]);
  };
  PromptPairs p;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<size_t> pick;  // A, B, then the corruption's three: distinct names
    while (pick.size() < 5) {
      const size_t n = draw(names.size());
      if (std::find(pick.begin(), pick.end(), n) == pick.end()) pick.push_back(n);
    }
    std::string t = replace_all(kIoiTemplateText[static_cast<size_t>(templ)], "[PLACE]", places[draw(places.size())]);
    t = replace_all(t, "[OBJECT]", objects[draw(objects.size())]);
    // Odd rows in the other order: the first two names swapped ("ABBA").
    const std::string first = r % 2 ? "[A]" : "[B]", second = r % 2 ? "[B]" : "[A]";
    const size_t at = t.find("[B]");
    t.replace(at, 3, "[1]");
    t.replace(t.find("[A]"), 3, "[2]");
    t = replace_all(replace_all(replace_all(t, "[B]", "[S2]"), "[1]", first), "[2]", second);
    const auto fill = [&](const std::string& a, const std::string& b, const std::string& s2) {
      return replace_all(replace_all(replace_all(t, "[A]", a), "[B]", b), "[S2]", s2);
    };
    const std::string clean = fill(names[pick[0]], names[pick[1]], names[pick[1]]);
    const std::string corrupt = fill(names[pick[2]], names[pick[3]], names[pick[4]]);
    const std::vector<int64_t> c = task.encode_prompt(clean).ids, x = task.encode_prompt(corrupt).ids;
    HL_CHECK(c.size() == x.size() && (p.T == 0 || static_cast<int64_t>(c.size()) == p.T), "ioi: '", clean, "' and '",
             corrupt, "' do not align token for token (", c.size(), " and ", x.size(), " tokens)");
    p.T = static_cast<int64_t>(c.size());
    p.clean.insert(p.clean.end(), c.begin(), c.end());
    p.corrupt.insert(p.corrupt.end(), x.begin(), x.end());
    p.answer.push_back(task.encode_continuation(" " + names[pick[0]])[0]);
    p.wrong.push_back(task.encode_continuation(" " + names[pick[1]])[0]);
  }
  return p;
}

namespace {

constexpr std::array kGreaterThanNouns = {"war",        "expedition", "siege",  "battle",  "campaign", "rebellion",
                                          "revolution", "famine",     "plague", "drought", "conflict", "occupation",
                                          "voyage",     "journey",    "strike", "crisis",  "reign",    "trial"};

// The id of `text` if it is one token, else -1.
int64_t single_id(const tasks::Task& task, const std::string& text) {
  try {
    const std::vector<int64_t> ids = task.encode_continuation(text);
    return ids.size() == 1 ? ids[0] : -1;
  } catch (const Error&) {  // a tokenizer without these characters
    return -1;
  }
}

std::string two_digits(int64_t yy) { return std::string(1, char('0' + yy / 10)) + char('0' + yy % 10); }

}  // namespace

PromptPairs greater_than_prompt_pairs(const tasks::Task& task, int64_t rows, uint64_t seed) {
  HL_CHECK(rows > 0, "greater-than: the number of rows must be positive, got ", rows);
  const std::vector<std::string> nouns = single_tokens(task, kGreaterThanNouns, "nouns", 1, "greater-than");
  const int64_t century = single_id(task, " 17");
  std::vector<int64_t> digits;  // the id of "00".."99", -1 where it is not one token
  for (int64_t yy = 0; yy < 100; ++yy) digits.push_back(single_id(task, two_digits(yy)));
  // The years whose " 17YY" is the tokens " 17", "YY" (so that the answer is one two-digit token).
  std::vector<int64_t> years;
  for (int64_t yy = 2; yy <= 98; ++yy) {
    if (century < 0 || digits[static_cast<size_t>(yy)] < 0) continue;
    std::vector<int64_t> ids;
    try {
      ids = task.encode_continuation(" 17" + two_digits(yy));
    } catch (const Error&) {
      continue;
    }
    if (ids == std::vector<int64_t>{century, digits[static_cast<size_t>(yy)]}) years.push_back(yy);
  }
  HL_CHECK(years.size() >= 10 && digits[1] >= 0, "greater-than: needs a tokenizer in which \" 17\" and the years ",
           "after it are one token each (GPT-2's BPE); this one has ", years.size(), " such years");
  PromptPairs p;
  for (int64_t yy = 0; yy < 100; ++yy)
    if (digits[static_cast<size_t>(yy)] >= 0) p.candidates.push_back(digits[static_cast<size_t>(yy)]);
  Generator gen(seed);
  const auto draw = [&](size_t n) {
    return static_cast<size_t>(randint(0, static_cast<int64_t>(n), {1}, gen).to_vector<int64_t>()[0]);
  };
  for (int64_t r = 0; r < rows; ++r) {
    const std::string noun = nouns[draw(nouns.size())];
    const int64_t yy = years[draw(years.size())];
    const auto prompt = [&](int64_t start) {
      return "The " + noun + " lasted from the year 17" + two_digits(start) + " to the year 17";
    };
    const std::vector<int64_t> c = task.encode_prompt(prompt(yy)).ids, x = task.encode_prompt(prompt(1)).ids;
    HL_CHECK(c.size() == x.size() && (p.T == 0 || static_cast<int64_t>(c.size()) == p.T), "greater-than: '", prompt(yy),
             "' and '", prompt(1), "' do not align token for token (", c.size(), " and ", x.size(), " tokens)");
    p.T = static_cast<int64_t>(c.size());
    p.clean.insert(p.clean.end(), c.begin(), c.end());
    p.corrupt.insert(p.corrupt.end(), x.begin(), x.end());
    p.answer.push_back(digits[static_cast<size_t>(yy + 1)] >= 0 ? digits[static_cast<size_t>(yy + 1)]
                                                                : p.candidates.back());
    p.wrong.push_back(digits[static_cast<size_t>(yy)]);
    for (int64_t y = 0; y < 100; ++y)
      if (digits[static_cast<size_t>(y)] >= 0) p.weights.push_back(y > yy ? 1.0 : -1.0);
  }
  return p;
}

double LogitDifference::normalized(double ld) const {
  const double gap = clean_mean - corrupt_mean;
  HL_CHECK(gap != 0, "logit difference: the clean and corrupted runs score the same (", clean_mean,
           "), so there is nothing to normalise by");
  return (ld - corrupt_mean) / gap;
}

std::string LogitDifference::warning(bool probability_metric) const {
  // (a stream, not "..." + std::string: GCC 12 warns falsely of an overlapping memcpy there, its bug 105329)
  std::ostringstream os;
  const auto scores = [&] { os << "clean " << fmt(clean_mean, 4) << ", corrupted " << fmt(corrupt_mean, 4); };
  const char* unit = probability_metric ? "" : " logits";
  const double gap = clean_mean - corrupt_mean;
  const auto n = static_cast<double>(clean.size());
  double ss = 0;  // the paired differences' spread about their mean, the gap
  for (size_t r = 0; r < clean.size(); ++r) ss += std::pow(clean[r] - corrupt[r] - gap, 2);
  const double se = n > 1 ? std::sqrt(ss / (n - 1) / n) : std::numeric_limits<double>::infinity();
  if (!(gap > 0)) {
    os << "the corrupted prompts score at or above the clean ones (";
    scores();
    os << "): the model does not do this task on these pairs, so effects normalised by the gap mean nothing";
  } else if (gap < kNoiseMultiple * se) {
    os << "the clean-corrupted gap (" << fmt(gap, 4) << unit << "; ";
    scores();
    os << ") is within the rows' noise (" << kNoiseMultiple << " standard errors: " << fmt(kNoiseMultiple * se, 4)
       << "): normalised effects are noise; use more rows or pairs the model separates";
  } else if (gap < (probability_metric ? kSmallProbabilityGap : kSmallLogitGap)) {
    os << "the clean-corrupted gap is small (" << fmt(gap, 4) << unit << "; ";
    scores();
    os << "): normalised effects divide by it and magnify small changes (a circuit or a head can score above 1)";
  }
  return os.str();
}

LogitDifference logit_difference(nn::DecoderModel& model, const PromptPairs& pairs) {
  const nn::DecoderShape& cfg = model.shape();
  HL_CHECK(pairs.rows() > 0 && pairs.T > 0, "logit_difference: no prompt pairs");
  HL_CHECK(pairs.T <= cfg.context_length, "logit_difference: prompts of ", pairs.T,
           " tokens do not fit the model's context of ", cfg.context_length);
  for (int64_t r = 0; r < pairs.rows(); ++r)
    for (int64_t id : {pairs.answer[static_cast<size_t>(r)], pairs.wrong[static_cast<size_t>(r)]})
      HL_CHECK(id >= 0 && id < cfg.out_vocab_size, "logit_difference: row ", r, "'s token ", id,
               " is outside the predicted vocabulary of ", cfg.out_vocab_size);
  const NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  LogitDifference d;
  for (const auto& [ids, out, mean] :
       {std::tuple{&pairs.clean, &d.clean, &d.clean_mean}, std::tuple{&pairs.corrupt, &d.corrupt, &d.corrupt_mean}}) {
    const Tensor idx = tensor(*ids, {pairs.rows(), pairs.T}).to(model.device());
    // (rows, V): the logits at the last position (probabilities for a probability metric)
    Tensor last = model.forward(idx).narrow(1, pairs.T - 1, 1).reshape({pairs.rows(), cfg.out_vocab_size});
    if (pairs.probability_metric()) last = softmax(last.to(DType::f64), 1);
    const std::vector<double> v = last.to_vector<double>();
    const auto M = pairs.candidates.size();
    for (int64_t r = 0; r < pairs.rows(); ++r) {
      const double* row = v.data() + r * cfg.out_vocab_size;
      double m = 0;
      if (pairs.probability_metric()) {
        for (size_t i = 0; i < M; ++i) m += pairs.weights[static_cast<size_t>(r) * M + i] * row[pairs.candidates[i]];
      } else {
        m = row[pairs.answer[static_cast<size_t>(r)]] - row[pairs.wrong[static_cast<size_t>(r)]];
      }
      out->push_back(m);
      *mean += m / static_cast<double>(pairs.rows());
    }
  }
  if (was_training) model.train();
  return d;
}

PromptPairs make_prompt_pairs(const PairSource& a, const tasks::Task& task, const nn::DecoderShape& cfg,
                              const char* who, std::string* source) {
  HL_CHECK(a.task.empty() != a.file.empty(), who,
           ": give the prompt pairs by --task induction|ioi|greater-than or by --pairs FILE",
           a.task.empty() ? "" : " (not both)");
  HL_CHECK(a.file.size() || a.task == "induction" || a.task == "ioi" || a.task == "greater-than", who,
           ": --task is induction, ioi or greater-than, not '", a.task,
           "' (or give your own prompt pairs with --pairs FILE)");
  std::string said;
  PromptPairs pairs;
  if (!a.file.empty()) {
    pairs = read_prompt_pairs(a.file, task);
    said = a.file;
  } else if (a.task == "induction") {
    const int64_t n = a.span > 0 ? a.span : std::min<int64_t>(10, (cfg.context_length + 1) / 2);
    HL_CHECK(2 * n - 1 <= cfg.context_length, who, ": --span ", n, " makes prompts of ", 2 * n - 1,
             " tokens; the model's context is ", cfg.context_length);
    // the repeated token is the answer: tokens the model both reads and predicts
    pairs = induction_prompt_pairs(std::min(cfg.vocab_size, cfg.out_vocab_size), a.rows, n, a.seed);
    said = "induction: " + std::to_string(n) + " random tokens, then all but the last again";
  } else if (a.task == "greater-than") {
    pairs = greater_than_prompt_pairs(task, a.rows, a.seed);
    said = "greater-than: Hanna et al.'s \"The <noun> lasted from the year 17YY to the year 17\", corrupted to 1701";
  } else {
    pairs = ioi_prompt_pairs(task, a.rows, a.templ, a.seed);
    said = "ioi: Wang et al.'s template " + std::to_string(a.templ) + ", corrupted by three other names (ABC)";
  }
  if (source) *source = said;
  return pairs;
}

}  // namespace headlab::analysis
