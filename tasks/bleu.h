// BLEU as d2l.ai defines it (section 9.7 / 10.7 of the seeds' edition): brevity penalty
// exp(min(0, 1 - len_label / len_pred)) times prod_{n=1..k} p_n^(1/2^n), p_n the clipped n-gram
// precision. Where d2l would divide by zero (an empty prediction, or one shorter than n) the empty
// prediction scores 0 and the missing n-gram orders are left out.
#pragma once
#include <cstdint>
#include <vector>

namespace headlab::tasks {

double bleu(const std::vector<int64_t>& pred, const std::vector<int64_t>& label, int k = 2);

}  // namespace headlab::tasks
