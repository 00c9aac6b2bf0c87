// Head types from attention patterns: one forward per batch keeping every layer's hook_pattern, sums in
// double.
#include "analysis/head_scores.h"

#include <cmath>
#include <limits>
#include <set>
#include <tuple>

#include "analysis/head_control.h"

namespace headlab::analysis {

using namespace detail;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Every layer's attention weights for ids (B, T): per layer (B, H_l, T, T) in double.
std::vector<std::vector<double>> attention_weights(nn::DecoderModel& m, const Tensor& ids) {
  std::set<nn::HookKey> patterns;
  for (int64_t l = 0; l < m.n_layers(); ++l) patterns.insert({nn::HookPoint::pattern, l});
  nn::ActivationCache cache(std::move(patterns));
  {
    NoGradGuard no_grad;
    m.forward(ids, &cache);
  }
  std::vector<std::vector<double>> w;
  for (int64_t l = 0; l < m.n_layers(); ++l)
    w.push_back(cache.cache().at({nn::HookPoint::pattern, l}).to_vector<double>());
  return w;
}

// Rows per forward so that every layer's kept attention weights (float, and their double copies) stay
// near 256 MB: GPT-2's 144 heads over 32 rows of 1024 tokens would otherwise keep 58 GB.
int64_t rows_per_forward(const nn::DecoderModel& m, int64_t T, const HeadTypeOptions& o) {
  if (o.rows_per_forward > 0) return o.rows_per_forward;
  int64_t heads = 0;
  for (int64_t l = 0; l < m.n_layers(); ++l) heads += m.attention(l).head_count();
  const int64_t per_row = std::max<int64_t>(1, heads * T * T * int64_t{12});
  return std::max<int64_t>(1, (int64_t{256} << 20) / per_row);
}

// Sums of one head's scores and their query counts.
struct Sums {
  double prev = 0, first = 0, sep = 0, self = 0, next = 0, entropy = 0, entropy_norm = 0, induction = 0, duplicate = 0;
};

}  // namespace

namespace {

// The length of the repeated random sequences that score induction.
int64_t induction_half(const nn::DecoderShape& cfg, int64_t T, const HeadTypeOptions& o) {
  return o.induction_half > 0 ? o.induction_half : std::min(cfg.context_length, T) / 2;
}

}  // namespace

void check_head_types(const nn::DecoderShape& cfg, int64_t T, const HeadTypeOptions& o) {
  HL_CHECK(o.separator_id >= -1 && o.separator_id < cfg.vocab_size, "head_types: separator id ", o.separator_id,
           " is outside the vocabulary of ", cfg.vocab_size, " tokens");
  const int64_t half = induction_half(cfg, T, o);
  HL_CHECK(o.induction_half > 0 || T >= 2, "head types: rows of ", T,
           " token leave nothing to score (previous-token and induction scores need at least 2 tokens a row)");
  HL_CHECK(half >= 1 && 2 * half <= cfg.context_length, "head_types: repeated sequences of 2 x ", half,
           " tokens do not fit the context length ", cfg.context_length);
  HL_CHECK(o.induction_rows > 0, "head_types: induction_rows must be positive, got ", o.induction_rows);
}

HeadTypes head_types(nn::DecoderModel& model, const EvalSet& data, const HeadTypeOptions& o) {
  const nn::DecoderShape& cfg = model.shape();
  HL_CHECK(!data.batches.empty(), "head_types: the evaluation data has no batches");
  check_head_types(cfg, data.batches.front().T, o);
  const int64_t half = induction_half(cfg, data.batches.front().T, o);
  ControlGuard guard(model);
  model.eval();
  set_controls(model, {}, {});
  const int64_t L = model.n_layers();
  std::vector<std::vector<Sums>> sums(static_cast<size_t>(L));
  for (int64_t l = 0; l < L; ++l)
    sums[static_cast<size_t>(l)].resize(static_cast<size_t>(model.attention(l).head_count()));
  HeadTypes r;
  const bool causal = cfg.causal;
  int64_t next_queries = 0;  // queries with a key after them (an encoder's)
  for (const Batch& b : data.batches) {
    const int64_t B = b.B, T = b.T, chunk = rows_per_forward(model, T, o);
    const Tensor ids = train::batch_tensors(b, model.device()).first;
    std::vector<std::vector<double>> w;
    for (int64_t row = 0; row < B; ++row) {
      if (row % chunk == 0) w = attention_weights(model, ids.narrow(0, row, std::min(chunk, B - row)));
      const int64_t in_chunk = row % chunk;
      // Queries 1..last (tasks: up to the end token; padding after it is left out), the separator's position.
      const int64_t last = b.has_answers ? b.answer_end[static_cast<size_t>(row)] : T - 1;
      int64_t sep = -1;
      for (int64_t t = 0; t < T && sep < 0 && o.separator_id >= 0; ++t)
        if (b.input(row, t) == o.separator_id) sep = t;
      r.queries += last;
      if (!causal) next_queries += std::max<int64_t>(0, std::min(last, T - 2));
      if (sep >= 0) r.separator_queries += causal ? last - sep : last;
      for (int64_t l = 0; l < L; ++l) {
        const int64_t H = model.attention(l).head_count();
        for (int64_t h = 0; h < H; ++h) {
          Sums& s = sums[static_cast<size_t>(l)][static_cast<size_t>(h)];
          const double* base = w[static_cast<size_t>(l)].data() + ((in_chunk * H + h) * T) * T;
          for (int64_t q = 1; q <= last; ++q) {
            const double* wq = base + q * T;
            const int64_t seen = causal ? q + 1 : T;  // keys 0..q, or every key
            s.prev += wq[q - 1];
            s.first += wq[0];
            s.self += wq[q];
            if (!causal && q + 1 < T) s.next += wq[q + 1];
            if (sep >= 0 && (q > sep || !causal)) s.sep += wq[sep];
            double e = 0;
            for (int64_t k = 0; k < seen; ++k)
              if (wq[k] > 0) e -= wq[k] * std::log(wq[k]);
            s.entropy += e;
            s.entropy_norm += e / std::log(static_cast<double>(seen));
          }
        }
      }
    }
  }
  // Induction: rows of `half` random tokens, twice.
  const Tensor repeated = repeated_random_tokens(cfg.vocab_size, o.induction_rows, half, o.seed).to(model.device());
  const int64_t T = 2 * half, chunk = rows_per_forward(model, T, o);
  r.induction_rows = o.induction_rows;
  r.induction_half = half;
  r.induction_queries = o.induction_rows * half;
  for (int64_t r0 = 0; r0 < o.induction_rows; r0 += chunk) {
    const int64_t n = std::min(chunk, o.induction_rows - r0);
    const auto w = attention_weights(model, repeated.narrow(0, r0, n));
    for (int64_t l = 0; l < L; ++l) {
      const int64_t H = model.attention(l).head_count();
      for (int64_t row = 0; row < n; ++row)
        for (int64_t h = 0; h < H; ++h) {
          Sums& s = sums[static_cast<size_t>(l)][static_cast<size_t>(h)];
          const double* base = w[static_cast<size_t>(l)].data() + ((row * H + h) * T) * T;
          for (int64_t q = half; q < T; ++q) {
            s.induction += base[q * T + q - half + 1];
            s.duplicate += base[q * T + q - half];
          }
        }
    }
  }
  auto mean = [](double sum, int64_t n) { return n > 0 ? sum / static_cast<double>(n) : kNaN; };
  for (int64_t l = 0; l < L; ++l)
    for (int64_t h = 0; h < model.attention(l).head_count(); ++h) {
      const Sums& s = sums[static_cast<size_t>(l)][static_cast<size_t>(h)];
      HeadTypeScores t;
      t.layer = l;
      t.head = h;
      t.original_head = model.original_head(l, h);
      t.previous_token = mean(s.prev, r.queries);
      t.first_token = mean(s.first, r.queries);
      t.separator = mean(s.sep, r.separator_queries);
      t.self_token = mean(s.self, r.queries);
      t.next_token = mean(s.next, next_queries);  // NaN in a causal model
      t.entropy = mean(s.entropy, r.queries);
      t.entropy_normalized = mean(s.entropy_norm, r.queries);
      t.induction = mean(s.induction, r.induction_queries);
      t.duplicate_token = mean(s.duplicate, r.induction_queries);
      for (const auto& [score, threshold, name] : {std::tuple{t.previous_token, kPatternThreshold, "previous-token"},
                                                   std::tuple{t.first_token, kPatternThreshold, "first-token"},
                                                   std::tuple{t.separator, kPatternThreshold, "separator"},
                                                   // labels of an encoder's (Clark et al.'s) kinds only
                                                   std::tuple{causal ? kNaN : t.self_token, kPatternThreshold, "self"},
                                                   std::tuple{t.next_token, kPatternThreshold, "next-token"},
                                                   std::tuple{t.induction, kRepeatThreshold, "induction"},
                                                   std::tuple{t.duplicate_token, kRepeatThreshold, "duplicate-token"},
                                                   std::tuple{t.entropy_normalized, kBroadThreshold, "broad"}})
        if (score >= threshold) {
          if (!t.label.empty()) t.label += '+';
          t.label += name;
        }
      r.heads.push_back(t);
    }
  return r;
}

Tensor repeated_random_tokens(int64_t vocab_size, int64_t rows, int64_t half, uint64_t seed) {
  HL_CHECK(vocab_size > 0 && rows > 0 && half > 0, "repeated_random_tokens: need a vocabulary, rows and tokens; got ",
           vocab_size, " tokens, ", rows, " rows of ", half);
  Generator gen(seed);
  const Tensor first = randint(0, vocab_size, {rows, half}, gen);
  return cat({first, first}, 1);  // (rows, 2 half)
}

EvalSet repeated_tokens_set(int64_t vocab_size, int64_t rows, int64_t half, uint64_t seed) {
  HL_CHECK(half >= 2, "repeated_tokens_set: a copy of ", half, " token(s) leaves nothing to predict from the context");
  const std::vector<int64_t> ids = repeated_random_tokens(vocab_size, rows, half, seed).to_vector<int64_t>();
  Batch b;
  b.B = rows, b.T = 2 * half;
  b.inputs = ids;
  b.targets.assign(ids.size(), kIgnoreIndex);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t q = half; q + 1 < b.T; ++q)
      b.targets[static_cast<size_t>(r * b.T + q)] = ids[static_cast<size_t>(r * b.T + q + 1)];
  EvalSet set;
  set.batches.push_back(std::move(b));
  return set;
}

}  // namespace headlab::analysis
