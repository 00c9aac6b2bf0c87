// Prompt pairs: read from JSONL or generated, and the logit difference at the last position.
#include "analysis/prompt_pairs.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <tuple>

#include "base/input_path.h"
#include "tasks/chars.h"

namespace headlab::analysis {

namespace {

// The ids of `text` in the task's tokenizer; where = "file:line: field".
std::vector<int64_t> tokens_of(const tasks::Task& task, const std::string& text, const std::string& where) {
  HL_CHECK(!text.empty(), "prompt pairs: ", where, " is empty");
  try {
    return task.encode_prompt(text).ids;
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
    nlohmann::json row;
    try {
      row = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      HL_FAIL("prompt pairs: ", at, " is not a JSON object: ", e.what());
    }
    HL_CHECK(row.is_object(), "prompt pairs: ", at, " is not a JSON object: ", line.substr(0, 80));
    std::vector<int64_t> ids[4];
    const char* fields[4] = {"clean", "corrupt", "answer", "wrong"};
    for (int f = 0; f < 4; ++f) {
      HL_CHECK(row.contains(fields[f]) && row[fields[f]].is_string(), "prompt pairs: ", at, " has no string field '",
               fields[f], "' (each line: {\"clean\": ..., \"corrupt\": ..., \"answer\": ..., \"wrong\": ...})");
      ids[f] = tokens_of(task, row[fields[f]].get<std::string>(), at + ": " + fields[f]);
    }
    for (int f = 2; f < 4; ++f)
      HL_CHECK(ids[f].size() == 1, "prompt pairs: ", at, ": ", fields[f], " must be one token; it is ", ids[f].size(),
               ": ", listed(task, ids[f]));
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

double LogitDifference::normalized(double ld) const {
  const double gap = clean_mean - corrupt_mean;
  HL_CHECK(gap != 0, "logit difference: the clean and corrupted runs score the same (", clean_mean,
           "), so there is nothing to normalise by");
  return (ld - corrupt_mean) / gap;
}

LogitDifference logit_difference(nn::GPTModel& model, const PromptPairs& pairs) {
  const nn::GPTConfig& cfg = model.config();
  HL_CHECK(pairs.rows() > 0 && pairs.T > 0, "logit_difference: no prompt pairs");
  HL_CHECK(pairs.T <= cfg.context_length, "logit_difference: prompts of ", pairs.T,
           " tokens do not fit the model's context of ", cfg.context_length);
  for (int64_t r = 0; r < pairs.rows(); ++r)
    for (int64_t id : {pairs.answer[static_cast<size_t>(r)], pairs.wrong[static_cast<size_t>(r)]})
      HL_CHECK(id >= 0 && id < cfg.vocab_size, "logit_difference: row ", r, "'s token ", id,
               " is outside the vocabulary of ", cfg.vocab_size);
  const NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  LogitDifference d;
  for (const auto& [ids, out, mean] :
       {std::tuple{&pairs.clean, &d.clean, &d.clean_mean}, std::tuple{&pairs.corrupt, &d.corrupt, &d.corrupt_mean}}) {
    const Tensor idx = tensor(*ids, {pairs.rows(), pairs.T}).to(model.device());
    // (rows, V): the logits at the last position
    const std::vector<double> last = model.forward(idx).narrow(1, pairs.T - 1, 1).to_vector<double>();
    for (int64_t r = 0; r < pairs.rows(); ++r) {
      const double* row = last.data() + r * cfg.vocab_size;
      out->push_back(row[pairs.answer[static_cast<size_t>(r)]] - row[pairs.wrong[static_cast<size_t>(r)]]);
      *mean += out->back() / static_cast<double>(pairs.rows());
    }
  }
  if (was_training) model.train();
  return d;
}

}  // namespace headlab::analysis
