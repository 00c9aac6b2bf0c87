#include "tasks/bleu.h"

#include <algorithm>
#include <cmath>
#include <map>

namespace headlab::tasks {

double bleu(const std::vector<int64_t>& pred, const std::vector<int64_t>& label, int k) {
  const int64_t len_pred = static_cast<int64_t>(pred.size()), len_label = static_cast<int64_t>(label.size());
  if (len_pred == 0) return 0.0;
  double score = std::exp(std::min(0.0, 1.0 - static_cast<double>(len_label) / static_cast<double>(len_pred)));
  for (int64_t n = 1; n <= k && n <= len_pred; ++n) {
    std::map<std::vector<int64_t>, int64_t> label_subs;  // n-gram -> count still unmatched
    for (int64_t i = 0; i + n <= len_label; ++i) ++label_subs[{label.begin() + i, label.begin() + i + n}];
    int64_t matches = 0;
    for (int64_t i = 0; i + n <= len_pred; ++i) {
      auto it = label_subs.find({pred.begin() + i, pred.begin() + i + n});
      if (it != label_subs.end() && it->second > 0) {
        ++matches;
        --it->second;
      }
    }
    score *= std::pow(static_cast<double>(matches) / static_cast<double>(len_pred - n + 1), std::pow(0.5, n));
  }
  return score;
}

}  // namespace headlab::tasks
