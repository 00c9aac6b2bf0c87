// Tests of tasks/seq2seq: the padded (source, target) batch layout, determinism, agreement of the
// digit pairs with the GPT tasks' examples, train/val disjointness, the number words of
// "numbers" in both directions, prompt errors and the factory and options.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "tasks/algorithmic.h"
#include "tasks/seq2seq.h"
#include "tests/core_test_util.h"

using namespace headlab;
using namespace headlab::tasks;
using headlab::testing::error_of;

namespace {

TaskOptions numbers_options(int64_t max_number = 99999, uint64_t seed = 1) {
  TaskOptions o;
  o.max_number = max_number, o.seed = seed;
  return o;
}

std::vector<int64_t> row(const std::vector<int64_t>& v, int64_t b, int64_t width) {
  return std::vector<int64_t>(v.begin() + b * width, v.begin() + (b + 1) * width);
}

// The spot values of the British style with "and".
const std::vector<std::pair<int64_t, std::string>>& spot_values() {
  static const std::vector<std::pair<int64_t, std::string>> v = {
      {0, "zero"},
      {13, "thirteen"},
      {21, "twenty one"},
      {100, "one hundred"},
      {101, "one hundred and one"},
      {312, "three hundred and twelve"},
      {1000, "one thousand"},
      {1005, "one thousand and five"},
      {1200, "one thousand two hundred"},
      {12345, "twelve thousand three hundred and forty five"},
      {99999, "ninety nine thousand nine hundred and ninety nine"},
      {120005, "one hundred and twenty thousand and five"},
      {999999, "nine hundred and ninety nine thousand nine hundred and ninety nine"}};
  return v;
}

}  // namespace

// =============================================================================================
// Batches

TEST(Seq2SeqBatch, LayoutPadsValidLensAndShiftedInputs) {
  for (const auto& name : seq2seq_task_names()) {
    SCOPED_TRACE(name);
    auto task = make_seq2seq_task(name, TaskOptions{});
    const int64_t B = 32;
    const Batch batch = task->batch(Split::train, 3, B, /*T, ignored*/ 1000);
    ASSERT_TRUE(batch.has_source());
    ASSERT_TRUE(batch.has_answers);
    ASSERT_EQ(batch.B, B);
    ASSERT_EQ(batch.inputs.size(), static_cast<size_t>(B * batch.T));
    ASSERT_EQ(batch.targets.size(), static_cast<size_t>(B * batch.T));
    ASSERT_EQ(batch.source.size(), static_cast<size_t>(B * batch.S));
    ASSERT_EQ(batch.source_valid_lens.size(), static_cast<size_t>(B));
    EXPECT_LE(batch.T, task->required_context_length());
    EXPECT_LE(batch.S, task->max_source_length());
    int64_t longest_source = 0, longest_target = 0;
    for (int64_t b = 0; b < B; ++b) {
      const Seq2SeqExample ex = task->example(Split::train, 3 * B + b);  // row b is example index*B + b
      const int64_t S = batch.S, T = batch.T;
      const int64_t slen = static_cast<int64_t>(ex.source.size());
      const int64_t tlen = static_cast<int64_t>(ex.target.size());
      longest_source = std::max(longest_source, slen);
      longest_target = std::max(longest_target, tlen);
      EXPECT_EQ(batch.source_valid_lens[static_cast<size_t>(b)], slen);
      std::vector<int64_t> source = ex.source;
      source.resize(static_cast<size_t>(S), task->source_pad_id());
      EXPECT_EQ(row(batch.source, b, S), source);
      // targets: answer + end, then ignored; inputs: bos + targets shifted right, then pads.
      std::vector<int64_t> targets = ex.target, inputs = {task->bos_id()};
      targets.resize(static_cast<size_t>(T), kIgnoreIndex);
      inputs.insert(inputs.end(), ex.target.begin(), ex.target.end() - 1);
      inputs.resize(static_cast<size_t>(T), task->target_pad_id());
      EXPECT_EQ(row(batch.targets, b, T), targets);
      EXPECT_EQ(row(batch.inputs, b, T), inputs);
      EXPECT_EQ(ex.target.back(), task->end_id());
      EXPECT_EQ(batch.answer_begin[static_cast<size_t>(b)], 0);
      EXPECT_EQ(batch.answer_end[static_cast<size_t>(b)], tlen);
    }
    EXPECT_EQ(batch.S, longest_source);  // padded to the batch's own longest rows
    EXPECT_EQ(batch.T, longest_target);

    // score() of the targets themselves: everything right.
    std::vector<int64_t> pred(batch.targets);
    for (auto& p : pred) p = p == kIgnoreIndex ? task->target_pad_id() : p;
    const Metrics m = score(batch, pred);
    EXPECT_DOUBLE_EQ(m.token_accuracy, 1.0);
    EXPECT_DOUBLE_EQ(m.exact_match, 1.0);
    EXPECT_EQ(m.rows, B);
  }
}

TEST(Seq2SeqBatch, NumbersRowsAreWordsAndDigits) {
  auto task = make_seq2seq_task("numbers", TaskOptions{});
  const Batch batch = task->batch(Split::train, 0, 64, 0);
  std::set<int64_t> digit_counts;
  for (int64_t b = 0; b < batch.B; ++b) {
    const int64_t slen = batch.source_valid_lens[static_cast<size_t>(b)];
    const std::vector<int64_t> source(batch.source.begin() + b * batch.S, batch.source.begin() + b * batch.S + slen);
    const int64_t tlen = batch.answer_end[static_cast<size_t>(b)];
    std::vector<int64_t> answer(batch.targets.begin() + b * batch.T, batch.targets.begin() + b * batch.T + tlen);
    const std::string digits = task->format_answer(answer);
    ASSERT_EQ(static_cast<int64_t>(digits.size()), tlen - 1);
    digit_counts.insert(tlen - 1);
    const std::string words = task->decode_source(source);
    EXPECT_EQ(words, number_words(std::stoll(digits)));
    EXPECT_EQ(task->expected_answer(words), digits);
  }
  EXPECT_EQ(digit_counts, (std::set<int64_t>{1, 2, 3, 4, 5}));  // short numbers are common
  // (The hash partition happens to put all of 0..9 in train: val rows have 2 to 5 digits.)
}

TEST(Seq2SeqBatch, DeterministicAndKeyed) {
  for (const auto& name : seq2seq_task_names()) {
    SCOPED_TRACE(name);
    auto task = make_seq2seq_task(name, TaskOptions{});
    auto again = make_seq2seq_task(name, task->options());  // another run, same options
    const Batch a = task->batch(Split::train, 5, 16, 0);
    const Batch b = again->batch(Split::train, 5, 16, 0);
    EXPECT_EQ(a.source, b.source);
    EXPECT_EQ(a.inputs, b.inputs);
    EXPECT_EQ(a.targets, b.targets);
    EXPECT_EQ(a.source_valid_lens, b.source_valid_lens);
    EXPECT_NE(task->batch(Split::train, 6, 16, 0).source, a.source);
    EXPECT_NE(task->batch(Split::val, 5, 16, 0).source, a.source);
    TaskOptions other = task->options();
    other.seed = 2;
    EXPECT_NE(make_seq2seq_task(name, other)->batch(Split::train, 5, 16, 0).source, a.source);
  }
}

TEST(Seq2SeqBatch, PairsAreTheGptTasksExamples) {
  for (auto kind : {AlgorithmicTask::Kind::copy, AlgorithmicTask::Kind::reverse, AlgorithmicTask::Kind::sort,
                    AlgorithmicTask::Kind::add}) {
    const AlgorithmicTask gpt(kind, TaskOptions{});
    auto task = make_seq2seq_task(gpt.name(), TaskOptions{});
    SCOPED_TRACE(task->name());
    EXPECT_EQ(task->name(), gpt.name());
    EXPECT_EQ(task->source_vocab(), gpt.tokenizer().vocab());
    EXPECT_EQ(task->tokenizer().vocab(), gpt.tokenizer().vocab());
    EXPECT_EQ(task->source_vocab_size(), gpt.vocab_size());
    EXPECT_EQ(task->bos_id(), gpt.sep_id());
    EXPECT_EQ(task->end_id(), gpt.end_id());
    EXPECT_EQ(task->source_pad_id(), gpt.pad_id());
    EXPECT_EQ(task->target_pad_id(), gpt.pad_id());
    for (uint64_t n = 0; n < 200; ++n) {
      const Split split = n % 2 ? Split::val : Split::train;
      const Example ex = gpt.example(split, n);
      const Seq2SeqExample pair = task->example(split, n);
      std::vector<int64_t> joined = pair.source;  // source > target is the GPT sequence
      joined.push_back(gpt.sep_id());
      joined.insert(joined.end(), pair.target.begin(), pair.target.end());
      ASSERT_EQ(joined, ex.tokens);
      if (kind == AlgorithmicTask::Kind::reverse) {
        std::vector<int64_t> reversed(pair.source.rbegin(), pair.source.rend());
        reversed.push_back(gpt.end_id());
        EXPECT_EQ(pair.target, reversed);
      }
    }
  }
}

TEST(Seq2SeqBatch, BatchSizeAndContextLengthChecks) {
  auto rev = make_seq2seq_task("reverse", TaskOptions{});
  EXPECT_EQ(rev->required_context_length(), 9);  // 8 digits + end
  EXPECT_EQ(rev->max_source_length(), 8);
  auto add = make_seq2seq_task("add", TaskOptions{});
  EXPECT_EQ(add->required_context_length(), 5);  // 4 sum digits + end
  EXPECT_EQ(add->max_source_length(), 7);
  auto numbers = make_seq2seq_task("numbers", TaskOptions{});
  EXPECT_EQ(numbers->required_context_length(), 6);
  // "seventy seven thousand seven hundred and seventy seven" is among the longest.
  EXPECT_EQ(numbers->max_source_length(), 8);
  EXPECT_EQ(make_seq2seq_task("numbers", numbers_options(999999))->max_source_length(), 11);
  EXPECT_NO_THROW(rev->check_context_length(9));
  EXPECT_EQ(error_of([&] { rev->check_context_length(8); }),
            "task reverse: decoder context length 8 is too small: the longest target needs 9 "
            "tokens (8 answer + 1 end); use a context length of at least 9");
  EXPECT_EQ(error_of([&] { numbers->batch(Split::train, 0, 0, 6); }),
            "task numbers: batch size must be positive, got 0");
}

TEST(Seq2SeqSplits, TrainAndValidationAreDisjoint) {
  for (const auto& name : seq2seq_task_names()) {
    SCOPED_TRACE(name);
    auto task = make_seq2seq_task(name, TaskOptions{});
    std::set<std::vector<int64_t>> train, val;
    for (uint64_t n = 0; n < 3000; ++n) {
      train.insert(task->example(Split::train, n).source);
      val.insert(task->example(Split::val, n).source);
    }
    EXPECT_GT(val.size(), 500u);  // not vacuous (numbers repeat its many short ones)
    for (const auto& s : val) EXPECT_EQ(train.count(s), 0u) << task->decode_source(s);
  }
  // The partition does not depend on the seed.
  auto seed1 = make_seq2seq_task("numbers", numbers_options(99999, 1));
  auto seed2 = make_seq2seq_task("numbers", numbers_options(99999, 2));
  std::set<std::vector<int64_t>> train1;
  for (uint64_t n = 0; n < 3000; ++n) train1.insert(seed1->example(Split::train, n).source);
  for (uint64_t n = 0; n < 3000; ++n) EXPECT_EQ(train1.count(seed2->example(Split::val, n).source), 0u);
}

// =============================================================================================
// numbers: words in both directions

TEST(Numbers, SpotValuesBothDirections) {
  auto task = make_seq2seq_task("numbers", numbers_options(999999));
  for (const auto& [n, words] : spot_values()) {
    EXPECT_EQ(number_words(n), words);
    EXPECT_EQ(task->expected_answer(words), std::to_string(n)) << words;
    const Prompt p = task->encode_prompt(words);
    EXPECT_EQ(p.text, words);
    EXPECT_EQ(p.answer_length, -1);
    EXPECT_EQ(task->decode_source(p.ids), words);
  }
}

TEST(Numbers, EveryNumberUpTo1200RoundTrips) {
  auto task = make_seq2seq_task("numbers", TaskOptions{});
  for (int64_t n = 0; n <= 1200; ++n) {
    const std::string words = number_words(n);
    ASSERT_EQ(task->expected_answer(words), std::to_string(n)) << words;
    ASSERT_EQ(task->decode_source(task->encode_source(words)), words);
  }
}

TEST(Numbers, VocabulariesAndNormalisation) {
  auto task = make_seq2seq_task("numbers", TaskOptions{});
  const auto vocab = task->source_vocab();
  ASSERT_EQ(vocab.size(), 32u);
  EXPECT_EQ(vocab[0], "<pad>");
  EXPECT_EQ(task->source_pad_id(), 0);
  EXPECT_EQ(vocab[1], "zero");
  EXPECT_EQ(vocab[20], "nineteen");
  EXPECT_EQ(vocab[21], "twenty");
  EXPECT_EQ(vocab[28], "ninety");
  EXPECT_EQ((std::vector<std::string>(vocab.end() - 3, vocab.end())),
            (std::vector<std::string>{"hundred", "thousand", "and"}));
  // Target: copy/reverse/sort's characters, id == digit.
  EXPECT_EQ(task->tokenizer().vocab(), make_seq2seq_task("copy", TaskOptions{})->tokenizer().vocab());
  EXPECT_EQ(task->bos_id(), 10);
  EXPECT_EQ(task->end_id(), 11);
  EXPECT_EQ(task->target_pad_id(), 12);
  EXPECT_EQ(task->format_answer({1, 0, 0, 5, 11, 12, 3}), "1005");
  EXPECT_EQ(task->format_answer({4, 2}), "42");
  // Case, hyphens and extra spaces are normalised.
  EXPECT_EQ(task->encode_prompt("  Twenty-One  Thousand\tand FIVE\n").text, "twenty one thousand and five");
  EXPECT_EQ(task->expected_answer("twenty-one"), "21");
}

TEST(Numbers, PromptErrors) {
  auto task = make_seq2seq_task("numbers", TaskOptions{});
  EXPECT_EQ(error_of([&] { task->encode_source("twenty onee"); }),
            "task numbers: prompt 'twenty onee' has word 'onee' outside the vocabulary (zero, one, "
            "two, three, four, five, six, seven, eight, nine, ten, eleven, twelve, thirteen, "
            "fourteen, fifteen, sixteen, seventeen, eighteen, nineteen, twenty, thirty, forty, "
            "fifty, sixty, seventy, eighty, ninety, hundred, thousand, and)");
  EXPECT_ERROR(task->encode_source("<pad>"), "has word '<pad>' outside the vocabulary");
  const std::string style = "' is not a number from 0 to 999999 written in this task's style";
  EXPECT_ERROR(task->encode_source("hundred and"), "task numbers: prompt 'hundred and" + style);
  EXPECT_ERROR(task->encode_source("one hundred one"), "prompt 'one hundred one" + style);
  EXPECT_ERROR(task->encode_source("one thousand five"), "prompt 'one thousand five" + style);
  EXPECT_ERROR(task->encode_source("five five"), "prompt 'five five" + style);
  EXPECT_ERROR(task->encode_source("twenty zero"), "prompt 'twenty zero" + style);
  EXPECT_ERROR(task->encode_source("one thousand thousand"), "prompt 'one thousand thousand" + style);
  EXPECT_ERROR(task->encode_source("ninety hundred hundred hundred thousand thousand"), style);
  EXPECT_EQ(error_of([&] { task->encode_source("one hundred thousand"); }),
            "task numbers: prompt 'one hundred thousand' is 100000, above max_number = 99999");
  EXPECT_EQ(error_of([&] { task->encode_source(" - "); }),
            "task numbers: prompt is empty; expected a number in words, e.g. 'twelve thousand "
            "three hundred and forty five'");
  EXPECT_EQ(error_of([&] { task->decode_source({32}); }),
            "task numbers: cannot decode source id 32 at position 0: the source vocabulary has 32 "
            "words (ids 0 to 31)");
  EXPECT_EQ(error_of([] { number_words(1000000); }), "number_words: 1000000 is outside [0, 999999]");
  // The digit tasks validate as their GPT forms do; the separator is not part of the source.
  auto rev = make_seq2seq_task("reverse", TaskOptions{});
  EXPECT_EQ(error_of([&] { rev->encode_source("12a"); }),
            "task reverse: prompt '12a' has character 'a' outside the vocabulary \"0123456789\"");
  EXPECT_EQ(rev->encode_prompt("31415>").ids, (std::vector<int64_t>{3, 1, 4, 1, 5}));
  EXPECT_EQ(rev->expected_answer("31415"), "51413");
  auto add = make_seq2seq_task("add", TaskOptions{});
  EXPECT_EQ(add->encode_prompt("123+45").text, "123+045");
  EXPECT_EQ(add->expected_answer("999+1"), "1000");
  EXPECT_EQ(add->format_answer(add->tokenizer().encode("8610.")), "168");
}

// =============================================================================================
// Factory and options

TEST(Seq2SeqFactory, NamesDescriptionsAndErrors) {
  EXPECT_EQ(seq2seq_task_names(), (std::vector<std::string>{"copy", "reverse", "sort", "add", "numbers"}));
  for (const auto& name : seq2seq_task_names()) {
    auto task = make_seq2seq_task(name, TaskOptions{});
    EXPECT_EQ(task->name(), name);
    EXPECT_NE(task->description().find("encoder-decoder"), std::string::npos) << name;
  }
  EXPECT_EQ(error_of([] { make_seq2seq_task("chars", TaskOptions{}); }),
            "unknown seq2seq task 'chars': valid seq2seq tasks are copy, reverse, sort, add, numbers "
            "(chars has no source/target pairs; it is a GPT task only)");
  EXPECT_EQ(error_of([] { make_seq2seq_task("number", TaskOptions{}); }),
            "unknown seq2seq task 'number': valid seq2seq tasks are copy, reverse, sort, add, numbers");
  EXPECT_EQ(error_of([] { make_seq2seq_task("numbers", numbers_options(1000000)); }),
            "task numbers: max_number must be between 0 and 999999 (the words stop at thousands), "
            "got 1000000");
  EXPECT_EQ(error_of([] { make_seq2seq_task("numbers", numbers_options(-1)); }),
            "task numbers: max_number must be between 0 and 999999 (the words stop at thousands), "
            "got -1");
  EXPECT_ERROR(make_seq2seq_task("numbers", numbers_options(0)),
               "task numbers: max_number 0 gives only 1 distinct numbers, too few to hold out a "
               "validation part");
  TaskOptions o;
  o.vocabulary = {"0", "1"};
  EXPECT_EQ(error_of([&] { make_seq2seq_task("numbers", o); }),
            "task numbers: the given vocabulary \"01\" does not match this task's vocabulary "
            "\"0123456789>._\"");
  o.vocabulary = make_seq2seq_task("numbers", TaskOptions{})->tokenizer().vocab();
  EXPECT_NO_THROW(make_seq2seq_task("numbers", o));
  EXPECT_NE(tasks_help().find("numbers"), std::string::npos);
}

TEST(Seq2SeqFactory, OptionsRoundTrip) {
  auto numbers = make_seq2seq_task("numbers", numbers_options(4321, 7));
  const auto map = options_to_map("numbers", numbers->options());
  EXPECT_EQ(map, (std::map<std::string, std::string>{{"seed", "7"}, {"max_number", "4321"}}));
  auto restored = make_seq2seq_task("numbers", options_from_map(map));
  EXPECT_EQ(restored->batch(Split::val, 2, 8, 0).source, numbers->batch(Split::val, 2, 8, 0).source);
  EXPECT_EQ(options_to_map("add", TaskOptions{}),
            (std::map<std::string, std::string>{{"seed", "1"}, {"n_digits", "3"}}));
  EXPECT_EQ(options_to_map("unknown", TaskOptions{}).count("max_number"), 1u);  // every key
  EXPECT_EQ(error_of([] {
              options_from_map({{"max_number", "1e5"}});
            }),
            "task options: key 'max_number' has value '1e5', expected an integer");
}
