// Tests of train/tasks: exact sequences of every task, where targets are ignored, determinism of
// the streams, train/val disjointness, the tokenizer, score(), the chars split regions, the
// factory and option round trips, and the wording of every user-facing error.
#include "tasks/tasks.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "tests/core_test_util.h"

using namespace headlab;
using namespace headlab::tasks;
using headlab::testing::error_of;

namespace {

#define EXPECT_ERROR_CONTAINS(stmt, needle) \
  EXPECT_NE(error_of([&] { stmt; }).find(needle), std::string::npos) << error_of([&] { stmt; })

AlgorithmicTask algo(AlgorithmicTask::Kind kind, int64_t min_len = 4, int64_t max_len = 8, int64_t n_digits = 3,
                     uint64_t seed = 1) {
  TaskOptions o;
  o.min_len = min_len, o.max_len = max_len, o.n_digits = n_digits, o.seed = seed;
  return AlgorithmicTask(kind, o);
}

std::vector<int64_t> ids_of(const Task& task, const std::string& s) { return task.tokenizer().encode(s); }

std::string row_text(const Task& task, const std::vector<int64_t>& v, int64_t b, int64_t T) {
  return task.tokenizer().decode(std::vector<int64_t>(v.begin() + b * T, v.begin() + (b + 1) * T));
}

// A temporary file removed at scope exit.
struct TempFile {
  std::string path;
  explicit TempFile(const std::string& name, const std::string& content) {
    path = (std::filesystem::temp_directory_path() / ("headlab_tasks_" + std::to_string(::getpid()) + "_" + name))
               .string();
    std::ofstream(path, std::ios::binary) << content;
  }
  ~TempFile() { std::remove(path.c_str()); }
};

// The 95 printable ASCII characters in order: sorted and unique, so token id == position,
// which lets the chars tests read window positions straight off the ids.
std::string printable_ascii() {
  std::string s;
  for (char c = 32; c < 127; ++c) s += c;
  return s;
}

std::string repo_path(const std::string& rel) { return (std::filesystem::path(HEADLAB_SOURCE_DIR) / rel).string(); }

}  // namespace

// =============================================================================================
// Tokenizer

TEST(Tokenizer, VocabularyIsSortedUniqueCharactersAndRoundTrips) {
  Tokenizer tok = Tokenizer::from_text("hello world");
  EXPECT_EQ(tok.vocab(), (std::vector<std::string>{" ", "d", "e", "h", "l", "o", "r", "w"}));
  EXPECT_EQ(tok.encode("hello"), (std::vector<int64_t>{3, 2, 4, 4, 5}));
  EXPECT_EQ(tok.decode({7, 5, 6, 4, 1}), "world");
  EXPECT_EQ(tok.decode(tok.encode("hello world")), "hello world");
  // Serialised form is the list; rebuilding from it gives the same ids.
  Tokenizer again(tok.vocab());
  EXPECT_EQ(again.encode("old"), tok.encode("old"));
}

TEST(Tokenizer, WorksOnUnicodeCharactersNotBytes) {
  Tokenizer tok = Tokenizer::from_text("h\xC3\xA9llo");  // "héllo"
  EXPECT_EQ(tok.vocab(), (std::vector<std::string>{"h", "l", "o", "\xC3\xA9"}));
  EXPECT_EQ(tok.encode("h\xC3\xA9llo"), (std::vector<int64_t>{0, 3, 1, 1, 2}));
  EXPECT_EQ(tok.decode({3, 0}), "\xC3\xA9h");
  EXPECT_EQ(tok.find("\xC3\xA9"), std::optional<int64_t>(3));
  EXPECT_EQ(tok.find("x"), std::nullopt);
}

TEST(Tokenizer, UnknownCharacterAndBadIdErrors) {
  Tokenizer tok({"a", "b"}, "tok");
  EXPECT_EQ(error_of([&] { tok.encode("abc", "prompt"); }),
            "tok: prompt 'abc' has character 'c' outside the vocabulary \"ab\"");
  Tokenizer lines({"\n", "a", "b"}, "tok");
  EXPECT_EQ(error_of([&] { lines.encode("ab\nba\nabz", "text 'f.txt'"); }),
            "tok: text 'f.txt' has character 'z' at line 3, column 3 outside the vocabulary "
            "\"\\nab\"");
  EXPECT_EQ(error_of([&] { tok.encode("a\tb"); }),
            "tok: text 'a\\tb' has character '\\t' outside the vocabulary \"ab\"");
  EXPECT_EQ(error_of([&] {
              tok.decode({0, 2});
            }),
            "tok: cannot decode id 2 at position 1: the vocabulary has 2 tokens (ids 0 to 1)");
  EXPECT_EQ(error_of([&] { tok.encode("a\xFF"); }), "tok: text is not valid UTF-8 (byte 0xff at offset 1)");
}

TEST(Tokenizer, RejectsBadVocabularies) {
  EXPECT_EQ(error_of([] { Tokenizer({}, "tok"); }), "tok: the vocabulary is empty; expected a list of characters");
  EXPECT_EQ(error_of([] {
              Tokenizer({"a", "bc"}, "tok");
            }),
            "tok: vocabulary entry 1 'bc' is not a single character (2 bytes)");
  EXPECT_EQ(error_of([] { Tokenizer({"a", "b", "a"}, "tok"); }), "tok: vocabulary entry 2 'a' repeats entry 0");
}

// =============================================================================================
// Exact sequences of the algorithmic tasks

TEST(AlgorithmicTasks, VocabulariesPutDigitsFirst) {
  auto rev = algo(AlgorithmicTask::Kind::reverse);
  EXPECT_EQ(rev.tokenizer().vocab(),
            (std::vector<std::string>{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9", ">", ".", "_"}));
  EXPECT_EQ(rev.sep_id(), 10);
  EXPECT_EQ(rev.end_id(), 11);
  EXPECT_EQ(rev.pad_id(), 12);
  auto add = algo(AlgorithmicTask::Kind::add);
  EXPECT_EQ(add.tokenizer().vocab(),
            (std::vector<std::string>{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "+", "=", ".", "_"}));
  EXPECT_EQ(add.plus_id(), 10);
  EXPECT_EQ(add.sep_id(), 11);
  EXPECT_EQ(add.end_id(), 12);
  EXPECT_EQ(add.pad_id(), 13);
}

TEST(AlgorithmicTasks, ExactSequencesOfKnownPrompts) {
  auto copy = algo(AlgorithmicTask::Kind::copy, 1, 8);
  auto rev = algo(AlgorithmicTask::Kind::reverse, 1, 8);
  auto sort = algo(AlgorithmicTask::Kind::sort, 1, 8);
  const Example c = copy.make_example("31415");
  EXPECT_EQ(c.tokens, (std::vector<int64_t>{3, 1, 4, 1, 5, 10, 3, 1, 4, 1, 5, 11}));
  EXPECT_EQ(c.answer_begin, 6);
  const Example r = rev.make_example("31415");
  EXPECT_EQ(r.tokens, (std::vector<int64_t>{3, 1, 4, 1, 5, 10, 5, 1, 4, 1, 3, 11}));
  EXPECT_EQ(rev.tokenizer().decode(r.tokens), "31415>51413.");
  EXPECT_EQ(r.prompt_text, "31415");
  EXPECT_EQ(r.answer_text, "51413");
  const Example s = sort.make_example("31415");
  EXPECT_EQ(sort.tokenizer().decode(s.tokens), "31415>11345.");
  EXPECT_EQ(s.answer_text, "11345");
  EXPECT_EQ(sort.tokenizer().decode(sort.make_example("90210").tokens), "90210>00129.");
}

TEST(AlgorithmicTasks, AddWritesTheSumReversedWithCarries) {
  auto add = algo(AlgorithmicTask::Kind::add);
  const Example e = add.make_example("999+1");
  // 999 + 001 = 1000, written least significant digit first: 0001.
  EXPECT_EQ(add.tokenizer().decode(e.tokens), "999+001=0001.");
  EXPECT_EQ(e.tokens, (std::vector<int64_t>{9, 9, 9, 10, 0, 0, 1, 11, 0, 0, 0, 1, 12}));
  EXPECT_EQ(e.answer_begin, 8);
  EXPECT_EQ(e.prompt_text, "999+1");
  EXPECT_EQ(e.answer_text, "1000");
  EXPECT_EQ(add.tokenizer().decode(add.make_example("123+45").tokens), "123+045=8610.");
  EXPECT_EQ(add.tokenizer().decode(add.make_example("0+0").tokens), "000+000=0000.");
  EXPECT_EQ(add.tokenizer().decode(add.make_example("58+67").tokens), "058+067=5210.");  // 125
  auto add5 = algo(AlgorithmicTask::Kind::add, 4, 8, 5);
  EXPECT_EQ(add5.tokenizer().decode(add5.make_example("99999+99999").tokens),
            "99999+99999=899991.");  // 199998
}

TEST(AlgorithmicTasks, StreamExamplesObeyTheirTask) {
  // Every sampled example is a well-formed instance of its task.
  for (auto kind : {AlgorithmicTask::Kind::copy, AlgorithmicTask::Kind::reverse, AlgorithmicTask::Kind::sort}) {
    auto task = algo(kind);
    for (uint64_t n = 0; n < 300; ++n) {
      const Example e = task.example(n % 2 ? Split::val : Split::train, n);
      const int64_t len = e.answer_begin - 1;
      ASSERT_GE(len, 4);
      ASSERT_LE(len, 8);
      ASSERT_EQ(static_cast<int64_t>(e.tokens.size()), 2 * len + 2);
      std::vector<int64_t> prompt(e.tokens.begin(), e.tokens.begin() + len);
      std::vector<int64_t> answer(e.tokens.begin() + len + 1, e.tokens.end() - 1);
      if (kind == AlgorithmicTask::Kind::reverse) std::reverse(prompt.begin(), prompt.end());
      if (kind == AlgorithmicTask::Kind::sort) std::sort(prompt.begin(), prompt.end());
      EXPECT_EQ(answer, prompt);
      EXPECT_EQ(e.tokens[static_cast<size_t>(len)], 10);
      EXPECT_EQ(e.tokens.back(), 11);
    }
  }
  auto add = algo(AlgorithmicTask::Kind::add);
  for (uint64_t n = 0; n < 300; ++n) {
    const Example e = add.example(Split::train, n);
    const std::string s = add.tokenizer().decode(e.tokens);
    ASSERT_EQ(s.size(), 13u);
    const long a = std::stol(s.substr(0, 3)), b = std::stol(s.substr(4, 3));
    std::string sum(s.substr(8, 4));
    std::reverse(sum.begin(), sum.end());
    EXPECT_EQ(std::stol(sum), a + b) << s;
    EXPECT_EQ(e.answer_text, std::to_string(a + b));
  }
}

TEST(AlgorithmicTasks, StreamIsPinnedAcrossMachinesAndVersions) {
  // The stream is a fixed function of (seed, split, n): these values must never change, or
  // resumed runs and saved validation numbers stop being comparable.
  auto rev = algo(AlgorithmicTask::Kind::reverse);
  EXPECT_EQ(rev.tokenizer().decode(rev.example(Split::train, 0).tokens), "8106635>5366018.");
  EXPECT_EQ(rev.tokenizer().decode(rev.example(Split::train, 1).tokens), "74466948>84966447.");
  EXPECT_EQ(rev.tokenizer().decode(rev.example(Split::val, 0).tokens), "6259>9526.");
  auto add = algo(AlgorithmicTask::Kind::add);
  EXPECT_EQ(add.tokenizer().decode(add.example(Split::train, 0).tokens), "499+943=2441.");
}

// =============================================================================================
// Batches

TEST(AlgorithmicBatch, LayoutTargetsAndAnswerSpans) {
  auto rev = algo(AlgorithmicTask::Kind::reverse, 5, 5);
  const int64_t B = 3, T = 14;  // examples take 12 tokens; 2 positions of padding
  const Batch batch = rev.batch(Split::train, 7, B, T);
  ASSERT_EQ(batch.B, B);
  ASSERT_EQ(batch.T, T);
  ASSERT_EQ(batch.inputs.size(), static_cast<size_t>(B * T));
  ASSERT_EQ(batch.targets.size(), static_cast<size_t>(B * T));
  EXPECT_TRUE(batch.has_answers);
  for (int64_t b = 0; b < B; ++b) {
    const Example ex = rev.example(Split::train, 7 * B + b);  // row b is example index*B + b
    std::vector<int64_t> seq = ex.tokens;
    seq.resize(T + 1, rev.pad_id());
    for (int64_t t = 0; t < T; ++t) {
      EXPECT_EQ(batch.input(b, t), seq[static_cast<size_t>(t)]);
      // Positions 5..10 predict the 5 answer digits and the end token; the rest are ignored.
      const bool scored = t >= 5 && t <= 10;
      EXPECT_EQ(batch.target(b, t), scored ? seq[static_cast<size_t>(t + 1)] : kIgnoreIndex)
          << "row " << b << " t " << t;
    }
    EXPECT_EQ(batch.answer_begin[static_cast<size_t>(b)], 5);
    EXPECT_EQ(batch.answer_end[static_cast<size_t>(b)], 11);
    EXPECT_EQ(batch.target(b, 10), rev.end_id());
    EXPECT_EQ(batch.input(b, 12), rev.pad_id());
    EXPECT_EQ(batch.input(b, 13), rev.pad_id());
  }
}

TEST(AlgorithmicBatch, VariableLengthsArePaddedAndIgnored) {
  auto rev = algo(AlgorithmicTask::Kind::reverse);  // defaults: 4..8 digits, needs T >= 18
  EXPECT_EQ(rev.required_context_length(), 18);
  const int64_t B = 64, T = 20;
  const Batch batch = rev.batch(Split::val, 0, B, T);
  std::set<int64_t> lengths;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t begin = batch.answer_begin[static_cast<size_t>(b)];
    const int64_t end = batch.answer_end[static_cast<size_t>(b)];
    const int64_t len = begin;  // the separator is input position len
    lengths.insert(len);
    EXPECT_EQ(end - begin, len + 1);  // answer digits + end token
    const std::string text = row_text(rev, batch.inputs, b, T);
    const std::string digits = text.substr(0, static_cast<size_t>(len));
    std::string reversed(digits.rbegin(), digits.rend());
    EXPECT_EQ(text, digits + ">" + reversed + "." + std::string(static_cast<size_t>(T - 2 * len - 2), '_'));
    int64_t scored = 0;
    for (int64_t t = 0; t < T; ++t) {
      const bool in_span = t >= begin && t < end;
      EXPECT_EQ(batch.target(b, t) != kIgnoreIndex, in_span) << text << " t " << t;
      scored += in_span;
    }
    EXPECT_EQ(scored, len + 1);
  }
  EXPECT_EQ(lengths, (std::set<int64_t>{4, 5, 6, 7, 8}));  // every length occurs in 64 rows
}

TEST(AlgorithmicBatch, AddTargetsCoverTheReversedSumAndEnd) {
  auto add = algo(AlgorithmicTask::Kind::add);
  const Batch batch = add.batch(Split::train, 0, 2, 13);
  for (int64_t b = 0; b < 2; ++b) {
    EXPECT_EQ(batch.answer_begin[static_cast<size_t>(b)], 7);  // input '=' predicts the 1st digit
    EXPECT_EQ(batch.answer_end[static_cast<size_t>(b)], 12);
    for (int64_t t = 0; t < 7; ++t) EXPECT_EQ(batch.target(b, t), kIgnoreIndex);
    for (int64_t t = 7; t < 11; ++t) EXPECT_LE(batch.target(b, t), 9);
    EXPECT_EQ(batch.target(b, 11), add.end_id());
    EXPECT_EQ(batch.target(b, 12), kIgnoreIndex);
  }
}

TEST(Determinism, SameKeySameBatchOtherKeysDiffer) {
  auto rev = algo(AlgorithmicTask::Kind::reverse);
  auto rev_again = make_task("reverse", rev.options());  // another run, same options
  const Batch a = rev.batch(Split::train, 3, 16, 18);
  const Batch b = rev_again->batch(Split::train, 3, 16, 18);
  EXPECT_EQ(a.inputs, b.inputs);
  EXPECT_EQ(a.targets, b.targets);
  EXPECT_NE(rev.batch(Split::train, 4, 16, 18).inputs, a.inputs);
  EXPECT_NE(rev.batch(Split::val, 3, 16, 18).inputs, a.inputs);
  EXPECT_NE(algo(AlgorithmicTask::Kind::reverse, 4, 8, 3, 2).batch(Split::train, 3, 16, 18).inputs, a.inputs);
  // A longer T only adds padding: the examples do not depend on T.
  const Batch wide = rev.batch(Split::train, 3, 16, 24);
  for (int64_t r = 0; r < 16; ++r)
    for (int64_t t = 0; t < 18; ++t) EXPECT_EQ(wide.input(r, t), a.input(r, t));
  // Resume needs only the index: batch k does not depend on earlier batches being drawn.
  const Batch fresh = make_task("reverse", rev.options())->batch(Split::train, 3, 16, 18);
  EXPECT_EQ(fresh.inputs, a.inputs);
}

TEST(Determinism, CharsBatchesAreStatelessToo) {
  TaskOptions o;
  o.text = printable_ascii() + printable_ascii() + printable_ascii();
  auto t1 = make_task("chars", o);
  auto t2 = make_task("chars", o);
  EXPECT_EQ(t1->batch(Split::train, 5, 8, 10).inputs, t2->batch(Split::train, 5, 8, 10).inputs);
  EXPECT_NE(t1->batch(Split::train, 5, 8, 10).inputs, t1->batch(Split::train, 6, 8, 10).inputs);
  EXPECT_NE(t1->batch(Split::train, 5, 8, 10).inputs, t1->batch(Split::val, 5, 8, 10).inputs);
}

TEST(Splits, TrainAndValidationExamplesAreDisjoint) {
  for (const std::string name : {"reverse", "sort", "add"}) {
    auto task = make_task(name, TaskOptions{});
    const auto& a = dynamic_cast<const AlgorithmicTask&>(*task);
    std::set<std::vector<int64_t>> train, val;
    for (uint64_t n = 0; n < 2000; ++n) {
      const Example t = a.example(Split::train, n);
      const Example v = a.example(Split::val, n);
      train.insert(std::vector<int64_t>(t.tokens.begin(), t.tokens.begin() + t.answer_begin - 1));
      val.insert(std::vector<int64_t>(v.tokens.begin(), v.tokens.begin() + v.answer_begin - 1));
    }
    // Not vacuous: both streams are diverse (birthday collisions aside).
    EXPECT_GT(train.size(), 1900u) << name;
    EXPECT_GT(val.size(), 1900u) << name;
    for (const auto& p : val) {
      EXPECT_EQ(train.count(p), 0u) << name;
      EXPECT_EQ(a.split_of(p), Split::val);
    }
    for (const auto& p : train) EXPECT_EQ(a.split_of(p), Split::train);
  }
}

TEST(Splits, PartitionDoesNotDependOnTheSeedAndHoldsAnEighth) {
  auto seed1 = algo(AlgorithmicTask::Kind::copy, 4, 4, 3, 1);
  auto seed2 = algo(AlgorithmicTask::Kind::copy, 4, 4, 3, 2);
  // All 10^4 four-digit prompts: val share ~ 1/8, and the same prompts for both seeds.
  int64_t val = 0;
  for (int v = 0; v < 10000; ++v) {
    const std::vector<int64_t> p = {v / 1000, v / 100 % 10, v / 10 % 10, v % 10};
    const Split s = seed1.split_of(p);
    EXPECT_EQ(s, seed2.split_of(p));
    val += s == Split::val;
  }
  EXPECT_GT(val, 1100);
  EXPECT_LT(val, 1400);
  // So a model trained with seed 1 never saw the validation prompts of a seed-2 run.
  std::set<std::vector<int64_t>> train1;
  for (uint64_t n = 0; n < 2000; ++n) train1.insert(seed1.example(Split::train, n).tokens);
  for (uint64_t n = 0; n < 2000; ++n) EXPECT_EQ(train1.count(seed2.example(Split::val, n).tokens), 0u);
}

// =============================================================================================
// score()

TEST(Score, PerfectPredictionsAndOneWrongToken) {
  auto rev = algo(AlgorithmicTask::Kind::reverse);
  const int64_t B = 4, T = 18;
  const Batch batch = rev.batch(Split::val, 2, B, T);
  std::vector<int64_t> pred(batch.targets.size());
  int64_t scored = 0;
  for (size_t i = 0; i < pred.size(); ++i) {
    // Ignored positions get a deliberately wrong id: they must not count.
    pred[i] = batch.targets[i] == kIgnoreIndex ? 3 : batch.targets[i];
    scored += batch.targets[i] != kIgnoreIndex;
  }
  Metrics m = score(batch, pred);
  EXPECT_TRUE(m.has_exact_match);
  EXPECT_EQ(m.tokens, scored);
  EXPECT_EQ(m.tokens_correct, scored);
  EXPECT_EQ(m.rows, B);
  EXPECT_EQ(m.rows_correct, B);
  EXPECT_DOUBLE_EQ(m.token_accuracy, 1.0);
  EXPECT_DOUBLE_EQ(m.exact_match, 1.0);

  // One wrong answer digit in row 2 drops exact match of that row only.
  const int64_t t = batch.answer_begin[2] + 1;
  pred[static_cast<size_t>(2 * T + t)] = (batch.target(2, t) + 1) % 10;
  m = score(batch, pred);
  EXPECT_EQ(m.rows_correct, B - 1);
  EXPECT_DOUBLE_EQ(m.exact_match, 0.75);
  EXPECT_EQ(m.tokens_correct, scored - 1);
  EXPECT_DOUBLE_EQ(m.token_accuracy, static_cast<double>(scored - 1) / static_cast<double>(scored));

  // A wrong end token also breaks the row.
  pred[static_cast<size_t>(0 * T + batch.answer_end[0] - 1)] = rev.pad_id();
  m = score(batch, pred);
  EXPECT_EQ(m.rows_correct, B - 2);

  // Accumulation over batches recomputes the ratios.
  Metrics total;
  EXPECT_TRUE(std::isnan(total.token_accuracy));
  total += m;
  total += score(batch, std::vector<int64_t>(batch.targets.size(), 12));  // all wrong
  EXPECT_EQ(total.rows, 2 * B);
  EXPECT_EQ(total.rows_correct, B - 2);
  EXPECT_DOUBLE_EQ(total.exact_match, static_cast<double>(B - 2) / static_cast<double>(2 * B));
  EXPECT_EQ(total.tokens, 2 * scored);
  EXPECT_DOUBLE_EQ(total.token_accuracy, static_cast<double>(scored - 2) / static_cast<double>(2 * scored));
}

TEST(Score, CharsHasNoExactMatchAndSizesAreChecked) {
  TaskOptions o;
  o.text = printable_ascii();
  auto chars = make_task("chars", o);
  const Batch batch = chars->batch(Split::train, 0, 2, 5);
  EXPECT_FALSE(batch.has_answers);
  EXPECT_TRUE(batch.answer_begin.empty());
  std::vector<int64_t> pred = batch.targets;
  pred[3] = pred[3] == 0 ? 1 : 0;
  const Metrics m = score(batch, pred);
  EXPECT_FALSE(m.has_exact_match);
  EXPECT_TRUE(std::isnan(m.exact_match));
  EXPECT_EQ(m.rows, 0);
  EXPECT_EQ(m.tokens, 10);
  EXPECT_EQ(m.tokens_correct, 9);
  EXPECT_DOUBLE_EQ(m.token_accuracy, 0.9);
  EXPECT_EQ(error_of([&] { score(batch, std::vector<int64_t>(9)); }),
            "score: predicted_ids has 9 entries, expected B * T = 2 * 5 = 10 (argmax of the "
            "logits for every input position)");
}

// =============================================================================================
// chars

TEST(Chars, WindowsComeFromTheirSplitRegion) {
  TaskOptions o;
  o.text = printable_ascii();  // 95 characters, id == position
  o.seed = 7;
  CharsTask chars(o);
  ASSERT_EQ(chars.vocab_size(), 95);
  ASSERT_EQ(chars.text_length(), 95);
  EXPECT_EQ(chars.region(Split::train), (std::pair<int64_t, int64_t>{0, 85}));
  EXPECT_EQ(chars.region(Split::val), (std::pair<int64_t, int64_t>{85, 95}));
  const int64_t T = 4;
  std::set<int64_t> starts[2];
  for (Split split : {Split::train, Split::val}) {
    const auto [lo, hi] = chars.region(split);
    for (uint64_t index = 0; index < 50; ++index) {
      const Batch batch = chars.batch(split, index, 8, T);
      for (int64_t b = 0; b < 8; ++b) {
        const int64_t start = batch.input(b, 0);
        starts[split == Split::val].insert(start);
        ASSERT_GE(start, lo);
        ASSERT_LE(start + T + 1, hi);  // the whole window of T+1 characters is inside
        for (int64_t t = 0; t < T; ++t) {
          EXPECT_EQ(batch.input(b, t), start + t);
          EXPECT_EQ(batch.target(b, t), start + t + 1);  // every position is a target
        }
      }
    }
  }
  EXPECT_EQ(starts[1], (std::set<int64_t>{85, 86, 87, 88, 89, 90}));  // all val windows occur
  EXPECT_EQ(*starts[0].begin(), 0);
  EXPECT_EQ(*starts[0].rbegin(), 80);
}

TEST(Chars, VocabularyRoundTripAndEvalOnAnotherText) {
  TaskOptions o;
  o.text = "to be or not to be";
  auto chars = make_task("chars", o);
  EXPECT_EQ(chars->tokenizer().vocab(), (std::vector<std::string>{" ", "b", "e", "n", "o", "r", "t"}));
  // Stored description -> same task.
  const TaskOptions stored = chars->options();
  EXPECT_EQ(stored.vocabulary, chars->tokenizer().vocab());
  auto again = make_task("chars", stored);
  EXPECT_EQ(again->tokenizer().vocab(), chars->tokenizer().vocab());
  EXPECT_EQ(again->batch(Split::train, 1, 2, 3).inputs, chars->batch(Split::train, 1, 2, 3).inputs);

  // Another text with the trained vocabulary: ids keep their meaning even if a character is
  // missing from the new text.
  TempFile other("other.txt", "not to be, or to be");
  TaskOptions eval = stored;
  eval.text.clear();
  eval.text_path = other.path;
  EXPECT_EQ(error_of([&] { make_task("chars", eval); }),
            "task chars: text '" + other.path +
                "' has character ',' at line 1, column 10 outside the vocabulary \" benort\" (the "
                "vocabulary is fixed by the model's training text; this text uses a character "
                "the model has never seen)");
  TempFile fine("fine.txt", "be not to be or not to be");
  eval.text_path = fine.path;
  auto on_fine = make_task("chars", eval);
  EXPECT_EQ(on_fine->tokenizer().vocab(), chars->tokenizer().vocab());
  EXPECT_EQ(on_fine->tokenizer().encode("be"), (std::vector<int64_t>{1, 2}));
}

TEST(Chars, VocabularyOnlyTaskWhenTheTextFileIsGone) {
  TaskOptions o;
  o.text_path = "/nonexistent/headlab/train.txt";
  o.vocabulary = {" ", "a", "b"};
  auto chars = make_task("chars", o);  // generate needs only the tokenizer
  const CharsTask& c = dynamic_cast<const CharsTask&>(*chars);
  EXPECT_FALSE(c.has_text());
  EXPECT_EQ(chars->encode_prompt("ab a").ids, (std::vector<int64_t>{1, 2, 0, 1}));
  EXPECT_EQ(chars->format_answer({2, 2, 0}), "bb ");
  EXPECT_EQ(error_of([&] { chars->batch(Split::val, 0, 1, 4); }),
            "task chars: no text to read: text file '/nonexistent/headlab/train.txt' does not "
            "exist; pass --text FILE with a plain-text file");
}

TEST(Chars, PromptsAndErrors) {
  TaskOptions o;
  o.text = std::string(120, 'a');
  auto chars = make_task("chars", o);
  EXPECT_EQ(chars->encode_prompt("aa").answer_length, -1);
  EXPECT_EQ(chars->end_id(), -1);
  EXPECT_EQ(error_of([&] { chars->encode_prompt("ab"); }),
            "task chars: prompt 'ab' has character 'b' outside the vocabulary \"a\"");
  EXPECT_EQ(error_of([&] { chars->encode_prompt(""); }), "task chars: prompt is empty; give at least one character");
  // Text shorter than T + 2.
  EXPECT_EQ(error_of([&] { chars->check_context_length(128); }),
            "task chars: text has 120 characters, need at least context_length + 2 = 130");
  EXPECT_EQ(error_of([&] { chars->batch(Split::train, 0, 1, 128); }),
            "task chars: text has 120 characters, need at least context_length + 2 = 130");
  // Long enough overall, but the last 10% (12 characters) cannot hold a window of 21.
  EXPECT_EQ(error_of([&] { chars->check_context_length(20); }),
            "task chars: the validation part of text (its last 10%) has 12 characters, need at "
            "least context_length + 1 = 21 for one window; use a longer text or a smaller "
            "context length");
  EXPECT_NO_THROW(chars->batch(Split::train, 0, 1, 20));  // the train part is long enough
  EXPECT_NO_THROW(chars->check_context_length(11));
  EXPECT_EQ(error_of([&] { chars->batch(Split::train, 0, 0, 4); }), "task chars: batch size must be positive, got 0");
  EXPECT_EQ(error_of([&] { chars->batch(Split::train, 0, 2, 0); }),
            "task chars: context length must be positive, got 0");

  TempFile short_file("short.txt", std::string(120, 'x'));
  TaskOptions f;
  f.text_path = short_file.path;
  EXPECT_EQ(error_of([&] { make_task("chars", f)->check_context_length(128); }),
            "task chars: text '" + short_file.path + "' has 120 characters, need at least context_length + 2 = 130");
}

TEST(Chars, MissingAndEmptyFiles) {
  TaskOptions o;
  o.text_path = "/nonexistent/headlab/x.txt";
  EXPECT_EQ(error_of([&] { make_task("chars", o); }),
            "task chars: text file '/nonexistent/headlab/x.txt' does not exist; pass --text "
            "FILE with a plain-text file");
  TempFile empty("empty.txt", "");
  o.text_path = empty.path;
  EXPECT_EQ(error_of([&] { make_task("chars", o); }), "task chars: text file '" + empty.path + "' is empty");
  o.text_path = std::filesystem::temp_directory_path().string();
  EXPECT_ERROR_CONTAINS(make_task("chars", o), "is a folder, not a file");
  // A device is no text: reading /dev/zero never ended.
  o.text_path = "/dev/zero";
  EXPECT_EQ(error_of([&] { make_task("chars", o); }),
            "task chars: text file '/dev/zero' is not a regular file (it is a character device); pass --text FILE with "
            "a plain-text file");
}

TEST(Chars, DefaultTextIsUsable) {
  const std::string path = repo_path("data/tiny.txt");
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  const auto size = std::filesystem::file_size(path);
  EXPECT_GE(size, 30u * 1024);
  EXPECT_LE(size, 60u * 1024);
  TaskOptions o;
  o.text_path = path;
  auto chars = make_task("chars", o);
  const auto& c = dynamic_cast<const CharsTask&>(*chars);
  EXPECT_EQ(c.text_length(), static_cast<int64_t>(size));  // plain ASCII: 1 byte per character
  for (const auto& ch : chars->tokenizer().vocab()) {
    ASSERT_EQ(ch.size(), 1u);
    EXPECT_TRUE(ch == "\n" || (ch[0] >= 32 && ch[0] < 127)) << int(ch[0]);
  }
  EXPECT_GE(chars->vocab_size(), 40);
  EXPECT_LE(chars->vocab_size(), 96);
  EXPECT_NO_THROW(chars->check_context_length(256));
}

// =============================================================================================
// Generation support

TEST(Generation, PromptsAnswersAndFormatting) {
  auto rev = make_task("reverse", TaskOptions{});
  const Prompt p = rev->encode_prompt(" 31415\n");
  EXPECT_EQ(p.ids, (std::vector<int64_t>{3, 1, 4, 1, 5, 10}));
  EXPECT_EQ(p.answer_length, 5);
  EXPECT_EQ(p.text, "31415>");
  EXPECT_EQ(rev->encode_prompt("31415>").ids, p.ids);
  EXPECT_EQ(rev->format_answer(ids_of(*rev, "51413.__")), "51413");
  EXPECT_EQ(rev->format_answer(ids_of(*rev, "514")), "514");
  EXPECT_EQ(rev->expected_answer("31415"), "51413");

  auto add = make_task("add", TaskOptions{});
  const Prompt q = add->encode_prompt("123+45");
  EXPECT_EQ(q.text, "123+045=");
  EXPECT_EQ(q.answer_length, 4);
  EXPECT_EQ(q.ids, ids_of(*add, "123+045="));
  EXPECT_EQ(add->encode_prompt("123+045=").ids, q.ids);
  EXPECT_EQ(add->format_answer(ids_of(*add, "8610.")), "168");
  EXPECT_EQ(add->format_answer(ids_of(*add, "0001._")), "1000");
  EXPECT_EQ(add->format_answer(ids_of(*add, "0000.")), "0");
  EXPECT_EQ(add->format_answer(ids_of(*add, "86+0")), "86+0");  // not a number: as generated
  EXPECT_EQ(add->expected_answer("999+1"), "1000");
  EXPECT_EQ(add->end_id(), 12);
  EXPECT_EQ(error_of([&] { add->format_answer({14}); }),
            "task add: cannot decode id 14 at position 0: the vocabulary has 14 tokens (ids 0 to "
            "13)");
}

TEST(Generation, PromptErrors) {
  auto rev = make_task("reverse", TaskOptions{});
  EXPECT_EQ(error_of([&] { rev->encode_prompt("12a"); }),
            "task reverse: prompt '12a' has character 'a' outside the vocabulary \"0123456789\"");
  EXPECT_EQ(error_of([&] { rev->encode_prompt("123"); }),
            "task reverse: prompt '123' has 3 digits, expected 4 to 8 digits");
  EXPECT_EQ(error_of([&] { rev->encode_prompt("123456789"); }),
            "task reverse: prompt '123456789' has 9 digits, expected 4 to 8 digits");
  EXPECT_EQ(error_of([&] { rev->encode_prompt("  "); }),
            "task reverse: prompt is empty; expected 4 to 8 digits, e.g. '31415926'");
  auto copy8 = algo(AlgorithmicTask::Kind::copy, 8, 8);
  EXPECT_EQ(error_of([&] { copy8.encode_prompt("1234"); }), "task copy: prompt '1234' has 4 digits, expected 8 digits");

  auto add = make_task("add", TaskOptions{});
  EXPECT_EQ(error_of([&] { add->encode_prompt("12-3"); }),
            "task add: prompt '12-3' has character '-' outside the vocabulary \"0123456789+\"");
  EXPECT_EQ(error_of([&] { add->encode_prompt("123"); }),
            "task add: prompt '123' is not of the form A+B with A and B of 1 to 3 digits, e.g. "
            "'111+22'");
  EXPECT_EQ(error_of([&] { add->encode_prompt("1++2"); }),
            "task add: prompt '1++2' is not of the form A+B with A and B of 1 to 3 digits, e.g. "
            "'111+22'");
  EXPECT_EQ(error_of([&] { add->encode_prompt("1234+5"); }),
            "task add: operand '1234' in prompt '1234+5' has 4 digits, at most n_digits = 3");
}

// =============================================================================================
// Factory, options, context lengths, bad inputs

TEST(Factory, NamesOptionsAndRoundTrips) {
  EXPECT_EQ(task_names(), (std::vector<std::string>{"copy", "reverse", "sort", "add", "chars", "text"}));
  for (const auto& name : task_names()) {
    if (name == "chars" || name == "text") continue;
    auto t = make_task(name, TaskOptions{});
    EXPECT_EQ(t->name(), name);
    EXPECT_FALSE(t->description().empty());
  }
  EXPECT_EQ(error_of([] { make_task("revers", TaskOptions{}); }),
            "unknown task 'revers': valid tasks are copy, reverse, sort, add, chars, text");

  TaskOptions o;
  o.seed = 18446744073709551615ULL;
  o.min_len = 3, o.max_len = 6;
  auto sort = make_task("sort", o);
  const auto map = options_to_map("sort", sort->options());
  EXPECT_EQ(map,
            (std::map<std::string, std::string>{{"seed", "18446744073709551615"}, {"min_len", "3"}, {"max_len", "6"}}));
  auto restored = make_task("sort", options_from_map(map));
  EXPECT_EQ(restored->batch(Split::val, 9, 4, 14).inputs, sort->batch(Split::val, 9, 4, 14).inputs);
  EXPECT_EQ(options_to_map("add", TaskOptions{}),
            (std::map<std::string, std::string>{{"seed", "1"}, {"n_digits", "3"}}));
  EXPECT_EQ(options_to_map("chars", TaskOptions{}),
            (std::map<std::string, std::string>{{"seed", "1"}, {"text_path", "data/tiny.txt"}}));

  EXPECT_EQ(error_of([] {
              options_from_map({{"min_len", "4x"}});
            }),
            "task options: key 'min_len' has value '4x', expected an integer");
  EXPECT_EQ(error_of([] {
              options_from_map({{"length", "4"}});
            }),
            "task options: unknown key 'length'; known keys are seed, min_len, max_len, n_digits, "
            "max_number, text_path, text, text_digest, repeat_prob, repeat_span, mask_prob");
  TaskOptions rep;
  rep.repeat_prob = 0.3;
  rep.repeat_span = 40;
  EXPECT_EQ(options_to_map("chars", rep), (std::map<std::string, std::string>{{"seed", "1"},
                                                                              {"text_path", "data/tiny.txt"},
                                                                              {"repeat_prob", "0.29999999999999999"},
                                                                              {"repeat_span", "40"}}));
  EXPECT_EQ(options_from_map(options_to_map("chars", rep)).repeat_prob, 0.3);
  EXPECT_EQ(options_from_map(options_to_map("chars", rep)).repeat_span, 40);
  EXPECT_EQ(error_of([] {
              options_from_map({{"repeat_prob", "1.5"}});
            }),
            "task options: key 'repeat_prob' has value '1.5', expected a probability in [0, 1]");
}

// Data with more repetition: the text cut into segments of span/6 .. span characters, each written
// once or twice as drawn from the seed; the same seed gives the same stream.
TEST(Chars, RepeatedSegmentsCopyTheTextInPlace) {
  TaskOptions o;
  o.text = printable_ascii();  // 95 distinct characters: a repeat is visible as a step back
  for (int i = 0; i < 30; ++i) o.text += printable_ascii();
  o.repeat_prob = 0.5;
  o.repeat_span = 24;
  const CharsTask a(o), b(o);
  EXPECT_EQ(a.text_ids(), b.text_ids());
  const std::vector<int32_t>& ids = a.text_ids();
  // A copy shows as a step back by its length L in [24 / 6, 24], followed by the L characters before
  // it; with the copies taken out, the stream is the text.
  const int64_t n = 31 * 95;
  int64_t kept = 1, copies = 0;
  ASSERT_EQ(ids[0], 0);
  for (size_t j = 1; j < ids.size();) {
    if (ids[j] == (ids[j - 1] + 1) % 95) {
      ++kept, ++j;
      continue;
    }
    const int64_t L = (ids[j - 1] + 1 - ids[j] + 95) % 95;
    ASSERT_GE(L, 4) << j;
    ASSERT_LE(L, 24) << j;
    ASSERT_LE(j + static_cast<size_t>(L), ids.size());
    EXPECT_TRUE(std::equal(ids.begin() + static_cast<int64_t>(j), ids.begin() + static_cast<int64_t>(j) + L,
                           ids.begin() + static_cast<int64_t>(j) - L))
        << j;
    ++copies, j += static_cast<size_t>(L);
  }
  EXPECT_EQ(kept, n);     // every character of the text, in order
  EXPECT_GT(copies, 40);  // ~n / 14 segments, half of them twice
  EXPECT_LT(copies, 160);
  o.repeat_prob = 0;
  EXPECT_EQ(static_cast<int64_t>(CharsTask(o).text_ids().size()), n);
  o.repeat_prob = 1;
  const CharsTask all(o);
  EXPECT_EQ(static_cast<int64_t>(all.text_ids().size()), 2 * n);
  EXPECT_NE(all.description().find("each written twice with probability 1"), std::string::npos);
}

TEST(Factory, BadOptions) {
  TaskOptions o;
  o.min_len = 0;
  EXPECT_EQ(error_of([&] { make_task("copy", o); }), "task copy: min_len must be at least 1, got 0");
  o.min_len = 9;
  EXPECT_EQ(error_of([&] { make_task("reverse", o); }), "task reverse: min_len 9 is greater than max_len 8");
  o = TaskOptions{};
  o.max_len = 1000;
  EXPECT_EQ(error_of([&] { make_task("sort", o); }), "task sort: max_len must be at most 256, got 1000");
  o = TaskOptions{};
  o.n_digits = 0;
  EXPECT_EQ(error_of([&] { make_task("add", o); }), "task add: n_digits must be between 1 and 18, got 0");
  o = TaskOptions{};
  o.vocabulary = {"0", "1"};
  EXPECT_EQ(error_of([&] { make_task("reverse", o); }),
            "task reverse: the given vocabulary \"01\" does not match this task's vocabulary "
            "\"0123456789>._\"");
  o.vocabulary = make_task("reverse", TaskOptions{})->tokenizer().vocab();
  EXPECT_NO_THROW(make_task("reverse", o));
}

TEST(Factory, ContextLengthAndBatchSizeChecks) {
  auto rev = make_task("reverse", TaskOptions{});
  EXPECT_EQ(rev->required_context_length(), 18);
  EXPECT_EQ(make_task("add", TaskOptions{})->required_context_length(), 13);
  EXPECT_NO_THROW(rev->check_context_length(18));
  EXPECT_EQ(error_of([&] { rev->check_context_length(10); }),
            "task reverse: context length 10 is too small: the longest example needs 18 tokens "
            "(8 prompt + 1 separator + 8 answer + 1 end); use a context length of at least 18");
  EXPECT_EQ(error_of([&] { make_task("add", TaskOptions{})->batch(Split::train, 0, 4, 12); }),
            "task add: context length 12 is too small: the longest example needs 13 tokens "
            "(7 prompt + 1 separator + 4 answer + 1 end); use a context length of at least 13");
  EXPECT_EQ(error_of([&] { rev->batch(Split::train, 0, 0, 18); }), "task reverse: batch size must be positive, got 0");
  EXPECT_EQ(error_of([&] { rev->batch(Split::train, 0, -2, 18); }),
            "task reverse: batch size must be positive, got -2");
  EXPECT_EQ(error_of([&] { rev->batch(Split::train, 0, 4, 0); }),
            "task reverse: context length must be positive, got 0");
}

TEST(Factory, HelpListsEveryTask) {
  const std::string help = tasks_help();
  for (const auto& name : task_names()) EXPECT_NE(help.find(name), std::string::npos) << name;
  EXPECT_NE(help.find("999+001=0001."), std::string::npos);
  EXPECT_NE(help.find("least significant digit first"), std::string::npos);
}

TEST(AlgorithmicTasks, CorruptChangesOnePromptDigitPerRowAndRecomputesTheAnswer) {
  for (auto kind : {AlgorithmicTask::Kind::reverse, AlgorithmicTask::Kind::sort, AlgorithmicTask::Kind::add}) {
    const AlgorithmicTask task = algo(kind);
    SCOPED_TRACE(task.name());
    const int64_t T = task.required_context_length();
    const Batch clean = task.batch(Split::val, 0, 16, T);
    const Batch bad = task.corrupt(clean, 5);
    EXPECT_EQ(bad.answer_begin, clean.answer_begin);  // same layout, position by position
    EXPECT_EQ(bad.answer_end, clean.answer_end);
    for (int64_t b = 0; b < clean.B; ++b) {
      const int64_t sep = clean.answer_begin[static_cast<size_t>(b)];  // the separator's position
      int changed = 0;
      std::string prompt;
      for (int64_t t = 0; t < sep; ++t) {
        changed += bad.input(b, t) != clean.input(b, t);
        EXPECT_LT(bad.input(b, t), 10 + (kind == AlgorithmicTask::Kind::add)) << "a digit (or +)";
        prompt += task.tokenizer().decode({bad.input(b, t)});
      }
      EXPECT_EQ(changed, 1) << "row " << b;
      // The answer is the corrupted prompt's: the example built from it, token by token.
      const Example ex = task.make_example(prompt);
      for (int64_t t = 0; t < static_cast<int64_t>(ex.tokens.size()); ++t)
        EXPECT_EQ(bad.input(b, t), ex.tokens[static_cast<size_t>(t)]) << "row " << b << " t " << t;
    }
    const Batch again = task.corrupt(clean, 5), other = task.corrupt(clean, 6);
    EXPECT_EQ(again.inputs, bad.inputs);
    EXPECT_NE(other.inputs, bad.inputs);
  }
}
