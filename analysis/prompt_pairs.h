// Prompt-pair tasks, the data of circuit analyses (Wang et al. 2022's IOI, Conmy et al. 2023's ACDC): rows
// of a clean prompt and a corrupted one that align token for token, the token the clean prompt should
// be followed by (answer) and the one the corruption points to (wrong). The metric is the logit
// difference answer - wrong at the last position, normalised so that the clean run scores 1 and the
// corrupted run 0.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "analysis/heads.h"

namespace headlab::analysis {

struct PromptPairs {
  int64_t T = 0;                        // tokens per prompt, the same for every row and both prompts
  std::vector<int64_t> clean, corrupt;  // (rows, T) token ids
  std::vector<int64_t> answer, wrong;   // (rows) single tokens
  // Probability-difference tasks (greater-than): the metric is sum_m weights[r, m] * p(candidates[m]) at
  // the last position in place of the logit difference answer - wrong. Empty for logit-difference tasks.
  std::vector<int64_t> candidates;  // (M) token ids
  std::vector<double> weights;      // (rows, M): +1 for the row's right answers, -1 for the others
  int64_t rows() const { return static_cast<int64_t>(answer.size()); }
  bool probability_metric() const { return !candidates.empty(); }
};

// A JSONL file, one object a line: {"clean": str, "corrupt": str, "answer": str, "wrong": str}, the
// strings tokenized by the task's tokenizer (chars or text: a checkpoint's or a GPT-2 folder's). Every
// error names the file and line: malformed JSON, a missing or non-string field, an answer or wrong that is
// not exactly one token (with the tokens it became), prompts of different lengths. Blank lines are skipped.
PromptPairs read_prompt_pairs(const std::string& path, const tasks::Task& task);

// The induction task: clean = n random tokens x, then x's first n - 1 again, answer = x's last (what
// copying predicts); corrupt = the same built from n other random tokens y, wrong = y's last (never the
// answer). T = 2n - 1 for every row.
PromptPairs induction_prompt_pairs(int64_t vocab_size, int64_t rows, int64_t n, uint64_t seed);

// Indirect object identification (Wang et al. 2022) in the task's tokenizer (GPT-2's BPE: every name, place
// and object is a single token there, so that rows align). Template `templ` of the paper's 15 (0-based),
// rows alternating its two orders ("Then, B and A went to the store. B gave a ring to" and A first);
// answer = the indirect object A, wrong = the subject B; corrupt = the same template with three other
// names in place of the three (the paper's "ABC" distribution), so that nothing points to A or B.
// A tokenizer in which a name is not one token is refused with the name and its tokens.
inline constexpr int64_t kIoiTemplates = 15;
PromptPairs ioi_prompt_pairs(const tasks::Task& task, int64_t rows, int64_t templ, uint64_t seed);

// Greater-than (Hanna et al. 2023) in GPT-2's tokenizer: "The war lasted from the year 17YY to the year 17"
// with nouns and YY drawn (YY in 02..98, where " 17YY" is the tokens " 17", "YY"); the metric is the
// probability of the two-digit tokens above YY minus that of those up to YY; corrupt = the same sentence
// from the year 1701, so that nothing says where the threshold is. answer and wrong: YY + 1 and YY.
PromptPairs greater_than_prompt_pairs(const tasks::Task& task, int64_t rows, uint64_t seed);

// The pairs of a named source, as the commands and the Python module take them: task "induction" (rows
// of `span` random tokens repeated; 0: min(10, half the context)), "ioi" (template `templ`) or
// "greater-than", `rows` of them drawn from `seed`; or `file`, a JSONL file (exactly one of task and file).
// Errors start with `who`; `source`, when given, receives where the pairs came from in words.
struct PairSource {
  std::string task, file;
  int64_t rows = 64, span = 0, templ = 0;
  uint64_t seed = 1;
};
PromptPairs make_prompt_pairs(const PairSource& s, const tasks::Task& task, const nn::DecoderShape& shape,
                              const char* who, std::string* source = nullptr);

// The task's metric at the last position of each clean and corrupted prompt: the logit difference answer
// - wrong, or the probability difference of a probability_metric() task.
struct LogitDifference {
  std::vector<double> clean, corrupt;  // (rows)
  double clean_mean = 0, corrupt_mean = 0;
  // (ld - corrupt_mean) / (clean_mean - corrupt_mean): 1 for the clean run, 0 for the corrupted one.
  double normalized(double ld) const;
  // Why normalised effects cannot mean what they say on these pairs, or "": the corrupted prompts score
  // at or above the clean ones (the model does not do the task), or the gap is within the rows' noise
  // (under kNoiseMultiple standard errors of the paired differences) or small (under kSmallGap logits,
  // or probability for a probability metric), so that dividing by it magnifies noise.
  std::string warning(bool probability_metric) const;
  static constexpr double kNoiseMultiple = 3, kSmallLogitGap = 1.0, kSmallProbabilityGap = 0.1;
};
LogitDifference logit_difference(nn::DecoderModel& model, const PromptPairs& pairs);

}  // namespace headlab::analysis
