// Nanda et al. 2023, "Progress measures for grokking via mechanistic interpretability" (arXiv 2301.05217), on the
// paper's own checkpoint of modular addition (p = 113): what examples/grokking.cpp runs and tests/test_grokking.cpp
// checks. The forward is headlab's (loader::load reads the .pth as a decoder; analysis::run_hooked gives the MLP's
// hook_post); what is here is the paper's maths over it: Python's train/test split, the embedding's Fourier
// spectrum, the neurons' frequencies, and the restricted and excluded losses. docs/grokking.md says what each
// number means and compares it with the paper.
// P = 113 (the modulus), N = P * P pairs (a, b) in the order a * P + b, V = 114 outputs, F = 512 neurons.
#pragma once
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <iomanip>
#include <numbers>
#include <numeric>
#include <ostream>
#include <string>
#include <vector>

#include "analysis/hooked_run.h"
#include "io/torch_file.h"
#include "io/weight_files.h"
#include "loader/load.h"
#include "ops/ops.h"
#include "plot/plot.h"

namespace headlab::examples::grokking {

constexpr int64_t kP = 113;           // the modulus; token 113 is "="
constexpr int64_t kPairs = kP * kP;   // every (a, b)
constexpr int64_t kFreqs = kP / 2;    // frequencies k = 1..56
constexpr double kKeyShare = 0.5;     // a key frequency's embedding norm is at least this share of the largest
constexpr double kExplained = 0.85;   // "explained by one frequency": at least this share of a neuron's variance
constexpr double kFitted = 0.01;      // a loss curve has fallen once below this

// CPython's random.Random (Modules/_randommodule.c, Lib/random.py): MT19937 seeded by init_by_array over the
// seed's 32-bit words, getrandbits, _randbelow and shuffle, so that the paper's split is the paper's.
class PyRandom {
 public:
  explicit PyRandom(uint32_t seed) { init_by_array({seed}); }  // random.seed(n), 0 <= n < 2^32: key [n]

  uint32_t genrand_uint32() {
    if (index_ >= kN) twist();
    uint32_t y = mt_[index_++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680U;
    y ^= (y << 15) & 0xefc60000U;
    return y ^ (y >> 18);
  }
  uint32_t getrandbits(int k) { return genrand_uint32() >> (32 - k); }  // 1 <= k <= 32
  // random._randbelow(n) for 0 < n < 2^32: rejection sampling on n.bit_length() bits.
  uint32_t randbelow(uint32_t n) {
    const int k = 32 - std::countl_zero(n);
    uint32_t r = getrandbits(k);
    while (r >= n) r = getrandbits(k);
    return r;
  }
  template <class T>
  void shuffle(std::vector<T>& x) {  // random.shuffle: from the end, each swapped with one at or before it
    for (size_t i = x.size() - 1; i >= 1; --i) std::swap(x[i], x[randbelow(static_cast<uint32_t>(i + 1))]);
  }

 private:
  static constexpr int kN = 624, kM = 397;
  void init_genrand(uint32_t s) {
    mt_[0] = s;
    for (int i = 1; i < kN; ++i) mt_[i] = 1812433253U * (mt_[i - 1] ^ (mt_[i - 1] >> 30)) + static_cast<uint32_t>(i);
    index_ = kN;
  }
  void init_by_array(const std::vector<uint32_t>& key) {
    init_genrand(19650218U);
    int i = 1;
    size_t j = 0;
    for (size_t k = std::max<size_t>(kN, key.size()); k > 0; --k) {
      mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1664525U)) + key[j] + static_cast<uint32_t>(j);
      if (++i >= kN) mt_[0] = mt_[kN - 1], i = 1;
      if (++j >= key.size()) j = 0;
    }
    for (int k = kN - 1; k > 0; --k) {
      mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1566083941U)) - static_cast<uint32_t>(i);
      if (++i >= kN) mt_[0] = mt_[kN - 1], i = 1;
    }
    mt_[0] = 0x80000000U;
  }
  void twist() {
    for (int k = 0; k < kN; ++k) {
      const uint32_t y = (mt_[k] & 0x80000000U) | (mt_[(k + 1) % kN] & 0x7fffffffU);
      mt_[k] = mt_[(k + kM) % kN] ^ (y >> 1) ^ ((y & 1U) != 0 ? 0x9908b0dfU : 0U);
    }
    index_ = 0;
  }
  uint32_t mt_[kN] = {};
  int index_ = kN;
};

// The paper's gen_train_test: the pairs in order (a * P + b), random.seed(seed), random.shuffle, the first
// int(frac * N) train.
struct Split {
  std::vector<int64_t> order;  // the pairs as shuffled
  int64_t n_train = 0;
  std::vector<char> is_train;  // (N), by pair
};
inline Split python_split(uint32_t seed, double frac) {
  Split s;
  s.order.resize(kPairs);
  std::iota(s.order.begin(), s.order.end(), 0);
  PyRandom(seed).shuffle(s.order);
  s.n_train = static_cast<int64_t>(frac * static_cast<double>(kPairs));  // Python's int() of a float
  s.is_train.assign(kPairs, 0);
  for (int64_t i = 0; i < s.n_train; ++i) s.is_train[s.order[i]] = 1;
  return s;
}

// The Fourier basis of Z_p as the paper's make_fourier_basis: (P, P) rows, row 0 constant, rows 2k - 1 and 2k
// cos(2 pi k x / p) and sin(2 pi k x / p), each of norm 1.
inline Tensor fourier_basis() {
  std::vector<double> b(kP * kP);
  for (int64_t r = 0; r < kP; ++r) {
    const int64_t k = (r + 1) / 2;
    double norm = 0;
    for (int64_t x = 0; x < kP; ++x) {
      const double t = 2 * std::numbers::pi * static_cast<double>(k * x) / kP;
      const double v = r == 0 ? 1.0 : (r % 2 == 1 ? std::cos(t) : std::sin(t));
      b[r * kP + x] = v, norm += v * v;
    }
    for (int64_t x = 0; x < kP; ++x) b[r * kP + x] /= std::sqrt(norm);
  }
  return tensor(b, {kP, kP});
}

// Mean cross-entropy, in float64, of the rows of logits (N, V) whose mask is set, at label (a + b) mod P.
inline double mean_loss(const std::vector<double>& logits, int64_t V, const std::vector<char>& mask) {
  double sum = 0;
  int64_t n = 0;
  for (int64_t i = 0; i < kPairs; ++i) {
    if (mask[i] == 0) continue;
    const double* row = logits.data() + i * V;
    const double top = *std::max_element(row, row + V);
    double z = 0;
    for (int64_t c = 0; c < V; ++c) z += std::exp(row[c] - top);
    sum += top + std::log(z) - row[(i / kP + i % kP) % kP], ++n;
  }
  return sum / static_cast<double>(n);
}

struct Losses {
  double train = 0, test = 0, all = 0;
};
inline Losses split_losses(const std::vector<double>& logits, int64_t V, const Split& s) {
  std::vector<char> test(kPairs), all(kPairs, 1);
  for (int64_t i = 0; i < kPairs; ++i) test[i] = static_cast<char>(s.is_train[i] == 0);
  return {mean_loss(logits, V, s.is_train), mean_loss(logits, V, test), mean_loss(logits, V, all)};
}

struct Options {
  std::string model = "../shared/models/grokking/wd_10-1_mod_addition_loss_curve.pth";
  std::string out = "runs/grokking";
};

struct Report {
  double accuracy = 0;
  Losses full;                         // recomputed: the model's logits over all 114 outputs
  double stored_train = 0, stored_test = 0;
  int64_t train_fit = -1, test_fit = -1;  // the first epoch whose stored loss is below kFitted (-1: none)
  std::vector<double> freq_norm;       // (56): the embedding's norm at frequency k = 1..56
  double const_norm = 0;
  std::vector<int64_t> key_freqs;      // increasing
  std::vector<int64_t> neuron_freq;    // (F): the frequency explaining most of each neuron's variance
  std::vector<double> neuron_share;    // (F): the share it explains
  double share_explained = 0;          // neurons explained above kExplained by their frequency
  double share_in_key = 0;             // neurons whose frequency is a key frequency
  double key_variance = 0;             // the key frequencies' share of all neurons' variance
  double restricted_all = 0, restricted_test = 0, excluded_train = 0;
  std::vector<double> excluded_one;    // (key freqs): train loss with that frequency alone removed
  std::vector<std::string> pictures;
};

// The model's logits at the last position (N, V) and hook_post there (N, F), as float64, from headlab's forward.
struct Forward {
  std::vector<double> logits, post;
  int64_t V = 0, F = 0;
};
inline Forward run_model(nn::DecoderModel& model) {
  std::vector<int64_t> ids;
  ids.reserve(kPairs * 3);
  for (int64_t i = 0; i < kPairs; ++i) ids.insert(ids.end(), {i / kP, i % kP, kP});  // [a, b, =]
  const auto run = analysis::run_hooked(model, tensor(ids, {kPairs, 3}), {"blocks.0.mlp.hook_post"});
  Forward f;
  f.logits = select(run.logits, 1, 2).to_vector<double>();  // (N, V)
  const Tensor post = select(run.cache.at("blocks.0.mlp.hook_post"), 1, 2);  // (N, F)
  f.post = post.to_vector<double>();
  f.V = run.logits.size(2), f.F = post.size(1);
  return f;
}

// The embedding's spectrum: W_E (C, V) has token t in column t; its columns 0..P-1 in the Fourier basis, the norm
// over C of each frequency's cos and sin coefficients. Key frequencies: norm >= kKeyShare x the largest.
inline void embedding_spectrum(const Tensor& W_E, const Tensor& basis, Report& r) {
  const Tensor coef = matmul(narrow(W_E.to(DType::f64), 1, 0, kP), basis.mT());  // (C, P): per basis vector
  const Tensor sq = sum(coef * coef, {0});                                      // (P)
  const std::vector<double> s = sq.to_vector<double>();
  r.const_norm = std::sqrt(s[0]);
  r.freq_norm.resize(kFreqs);
  for (int64_t k = 1; k <= kFreqs; ++k) r.freq_norm[k - 1] = std::sqrt(s[2 * k - 1] + s[2 * k]);
  const double top = *std::max_element(r.freq_norm.begin(), r.freq_norm.end());
  for (int64_t k = 1; k <= kFreqs; ++k)
    if (r.freq_norm[k - 1] >= kKeyShare * top) r.key_freqs.push_back(k);
}

// Each neuron's activations over the (a, b) grid, centred, in the 2D Fourier basis (basis_a x basis_b); the share of
// their variance in frequency k's terms: const x {cos, sin} k b, {cos, sin} k a x const, and the four products.
inline void neuron_frequencies(const Forward& f, const Tensor& basis, Report& r) {
  const int64_t F = f.F;
  Tensor acts = tensor(f.post, {kP, kP, F});  // (a, b, F)
  acts = acts - mean(acts, {0, 1}, true);
  Tensor t = matmul(basis, acts.reshape({kP, kP * F})).reshape({kP, kP, F});                        // (fa, b, F)
  t = matmul(basis, t.permute({1, 0, 2}).contiguous().reshape({kP, kP * F})).reshape({kP, kP, F});  // (fb, fa, F)
  const std::vector<double> c = (t * t).to_vector<double>();
  std::vector<double> total(F, 0), in_key(F, 0);
  for (int64_t i = 0; i < kP * kP; ++i)
    for (int64_t n = 0; n < F; ++n) total[n] += c[i * F + n];
  r.neuron_freq.assign(F, 0), r.neuron_share.assign(F, -1);
  for (int64_t k = 1; k <= kFreqs; ++k) {
    const int64_t idx[3] = {0, 2 * k - 1, 2 * k};
    const bool key = std::find(r.key_freqs.begin(), r.key_freqs.end(), k) != r.key_freqs.end();
    for (int64_t n = 0; n < F; ++n) {
      double s = 0;
      for (int64_t i : idx)
        for (int64_t j : idx) s += c[(i * kP + j) * F + n];  // the constant x constant term is 0 (centred)
      s /= total[n];
      if (key) in_key[n] += s;
      if (s > r.neuron_share[n]) r.neuron_share[n] = s, r.neuron_freq[n] = k;
    }
  }
  double explained = 0, keyed = 0, var_key = 0, var_all = 0;
  for (int64_t n = 0; n < F; ++n) {
    explained += r.neuron_share[n] > kExplained;
    keyed += std::find(r.key_freqs.begin(), r.key_freqs.end(), r.neuron_freq[n]) != r.key_freqs.end();
    var_key += in_key[n] * total[n], var_all += total[n];
  }
  r.share_explained = explained / static_cast<double>(F);
  r.share_in_key = keyed / static_cast<double>(F);
  r.key_variance = var_key / var_all;
}

// The paper's restricted and excluded losses (its calculate_trig_loss and calculate_excluded_loss) on the logits
// of the P answers (the "=" output dropped): each answer c's logits over the (a, b) grid projected on the unit
// vectors cos(w_k (a + b)) and sin(w_k (a + b)), w_k = 2 pi k / p, of the key frequencies (whose span holds
// cos(w_k (a + b - c)) and sin(w_k (a + b - c)) for every c). Restricted: that projection, plus each answer's mean
// logit over the grid (the paper's bias correction), over all pairs; excluded: the logits less the projection, over
// the train pairs; and the latter with one key frequency removed at a time, as the paper's training logs hold it.
inline void fourier_losses(const Forward& f, const Split& s, Report& r) {
  const auto K = static_cast<int64_t>(r.key_freqs.size());
  std::vector<double> dirs(kPairs * 2 * K);  // (N, 2K), orthonormal columns
  for (int64_t q = 0; q < K; ++q)
    for (int64_t i = 0; i < kPairs; ++i) {
      const double t = 2 * std::numbers::pi * static_cast<double>(r.key_freqs[q] * (i / kP + i % kP)) / kP;
      dirs[i * 2 * K + 2 * q] = std::cos(t) / std::sqrt(kPairs / 2.0);
      dirs[i * 2 * K + 2 * q + 1] = std::sin(t) / std::sqrt(kPairs / 2.0);
    }
  const Tensor L = narrow(tensor(f.logits, {kPairs, f.V}), 1, 0, kP);  // (N, P)
  const Tensor D = tensor(dirs, {kPairs, 2 * K});
  const Tensor coef = matmul(D.mT(), L);  // (2K, P)
  const Tensor trig = matmul(D, coef);    // (N, P)
  const Tensor restricted = trig + mean(L - trig, {0}, true);
  const Losses lr = split_losses(restricted.to_vector<double>(), kP, s);
  r.restricted_all = lr.all, r.restricted_test = lr.test;
  r.excluded_train = split_losses((L - trig).to_vector<double>(), kP, s).train;
  for (int64_t q = 0; q < K; ++q) {
    const Tensor Dq = narrow(D, 1, 2 * q, 2), one = matmul(Dq, narrow(coef, 0, 2 * q, 2));
    r.excluded_one.push_back(split_losses((L - one).to_vector<double>(), kP, s).train);
  }
}

// A stored curve with one point every `every` epochs, thinned to at most about n points (there are 100,000).
struct Curve {
  std::vector<double> loss;
  int64_t every = 1;
};
inline plot::Series thinned(const std::string& name, const Curve& c, size_t n) {
  plot::Series s{name, {}, {}};
  const size_t step = std::max<size_t>(1, c.loss.size() / n);
  for (size_t i = 0; i < c.loss.size(); i += step)
    s.x.push_back(static_cast<double>(i) * static_cast<double>(c.every)), s.y.push_back(c.loss[i]);
  return s;
}

inline void draw(const Report& r, const Curve& train_curve, const Curve& test_curve, const std::string& out,
                 std::vector<std::string>& pictures) {
  plot::LineChart curves{"Stored loss curves: train falls early, test (grokking) much later", "epoch",
                         "cross-entropy loss", {}, {}, false, true, 800, 500};
  curves.series = {thinned("train", train_curve, 4000), thinned("test", test_curve, 4000)};
  plot::save_line_chart(curves, out + "/loss_curves.png");

  std::vector<double> ks(kFreqs);
  std::iota(ks.begin(), ks.end(), 1.0);
  const double top = *std::max_element(r.freq_norm.begin(), r.freq_norm.end());
  plot::LineChart spectrum{"Embedding W_E in the Fourier basis", "frequency k", "norm of the cos k and sin k terms",
                           {}, {}, false, false, 800, 500};
  spectrum.series = {{"W_E", ks, r.freq_norm},
                     {"half the largest", {1, static_cast<double>(kFreqs)}, {kKeyShare * top, kKeyShare * top}}};
  for (int64_t k : r.key_freqs) spectrum.x_marks.push_back({static_cast<double>(k), std::to_string(k)});
  plot::save_line_chart(spectrum, out + "/embedding_spectrum.png");

  std::vector<double> count(kFreqs, 0), sorted = r.neuron_share, rank(r.neuron_share.size());
  for (int64_t k : r.neuron_freq) count[k - 1] += 1;
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  std::iota(rank.begin(), rank.end(), 1.0);
  plot::LineChart per_freq{"Neurons per frequency", "frequency k", "neurons", {}, {}, false, false, 600, 500};
  per_freq.series = {{"", ks, count}};
  plot::LineChart shares{"Share of each neuron's variance its frequency explains", "neuron (sorted)", "share",
                         {}, {}, false, false, 600, 500};
  shares.series = {{"neurons", rank, sorted}, {"85%", {1, rank.back()}, {kExplained, kExplained}}};
  plot::save_line_charts({per_freq, shares}, out + "/neurons.png");
  pictures = {out + "/loss_curves.png", out + "/embedding_spectrum.png", out + "/neurons.png"};
}

// A stored number: a float, or a 0-d tensor ({"__tensor__": i}).
inline double stored_number(const io::TorchFile& file, const std::string& key) {
  const auto& v = file.value().at(key);
  const int64_t t = io::torch_tensor_index(v);
  return t >= 0 ? file.to_float(t, key).to_vector<double>().at(0) : v.get<double>();
}

inline Report run(const Options& o, std::ostream& log) {
  const io::TorchFile file(o.model);
  const auto& cfg = file.value().at("config");
  HL_CHECK(cfg.at("p").get<int64_t>() == kP, "grokking: ", o.model, " is not the p = 113 modular-addition run");
  const Split split = python_split(cfg.at("seed").get<uint32_t>(), cfg.at("frac_train").get<double>());

  Report r;
  r.stored_train = stored_number(file, "train_loss"), r.stored_test = stored_number(file, "test_loss");
  // The file holds a train loss every epoch (epochs 0..epoch) and a test loss every tenth: its points spread
  // evenly over the same epochs, the last one the stored test_loss.
  const auto epochs = file.value().at("epoch").get<int64_t>();
  auto curve = [&](const char* key) {
    Curve c{file.value().at(key).get<std::vector<double>>(), 1};
    const auto gaps = static_cast<int64_t>(c.loss.size()) - 1;
    HL_CHECK(gaps > 0 && epochs % gaps == 0, "grokking: ", key, "'s ", gaps + 1, " points do not spread evenly over ",
             epochs, " epochs");
    c.every = epochs / gaps;
    return c;
  };
  const Curve train_curve = curve("train_losses"), test_curve = curve("test_losses");
  auto fitted = [](const Curve& c) {
    const auto it = std::find_if(c.loss.begin(), c.loss.end(), [](double v) { return v < kFitted; });
    return it == c.loss.end() ? int64_t{-1} : static_cast<int64_t>(it - c.loss.begin()) * c.every;
  };
  r.train_fit = fitted(train_curve), r.test_fit = fitted(test_curve);
  Tensor W_E;
  for (const auto& [name, index] : io::find_state_dict(file).tensors)
    if (name == "embed.W_E") W_E = file.to_float(index, name);  // (C, V)
  HL_CHECK(W_E.defined(), "grokking: ", o.model, " holds no embed.W_E");

  loader::Loaded loaded = loader::load("grokking", o.model, "cpu");
  const Forward f = run_model(loaded.decoder("grokking"));
  int64_t right = 0;
  for (int64_t i = 0; i < kPairs; ++i) {
    const double* row = f.logits.data() + i * f.V;
    right += std::max_element(row, row + f.V) - row == (i / kP + i % kP) % kP;
  }
  r.accuracy = static_cast<double>(right) / kPairs;
  r.full = split_losses(f.logits, f.V, split);

  const Tensor basis = fourier_basis();
  embedding_spectrum(W_E, basis, r);
  neuron_frequencies(f, basis, r);
  fourier_losses(f, split, r);
  std::filesystem::create_directories(o.out);
  draw(r, train_curve, test_curve, o.out, r.pictures);

  log << std::setprecision(5) << "model " << o.model << ": " << epochs << " epochs; stored losses every "
      << train_curve.every << " (train) and " << test_curve.every << " (test) epochs, first below "
      << kFitted << " at epoch " << r.train_fit << " (train), " << r.test_fit << " (test)\n"
      << "split: random.seed(" << cfg.at("seed") << ") shuffle of " << kPairs << " pairs, " << split.n_train
      << " train, " << kPairs - split.n_train << " test; first pairs";
  for (int i = 0; i < 5; ++i) log << " (" << split.order[i] / kP << ", " << split.order[i] % kP << ")";
  log << "\naccuracy on all pairs " << 100 * r.accuracy << "% (" << right << " / " << kPairs << ")\n"
      << "loss          recomputed    stored        ratio\n"
      << "train         " << std::setw(12) << r.full.train << "  " << std::setw(12) << r.stored_train << "  "
      << r.full.train / r.stored_train << "\n"
      << "test          " << std::setw(12) << r.full.test << "  " << std::setw(12) << r.stored_test << "  "
      << r.full.test / r.stored_test << "\n"
      << "key frequencies (embedding norm >= " << kKeyShare << " x the largest):";
  for (int64_t k : r.key_freqs) log << " " << k << " (" << r.freq_norm[k - 1] << ")";
  log << "\nneurons per frequency:";
  for (int64_t k = 1; k <= kFreqs; ++k) {
    const auto n = std::count(r.neuron_freq.begin(), r.neuron_freq.end(), k);
    if (n > 0) log << " " << k << ": " << n;
  }
  log << "\nneurons explained above " << 100 * kExplained << "% by one frequency: " << 100 * r.share_explained
      << "%; in a key frequency's cluster: " << 100 * r.share_in_key << "%; key frequencies' share of all neuron "
      << "variance: " << 100 * r.key_variance << "%\n"
      << "restricted loss (key frequencies kept): all pairs " << r.restricted_all << ", test " << r.restricted_test
      << "\nexcluded loss (key frequencies removed), train pairs: " << r.excluded_train << "; one at a time:";
  for (size_t q = 0; q < r.key_freqs.size(); ++q) log << " " << r.key_freqs[q] << ": " << r.excluded_one[q];
  log << "\nfull model: train " << r.full.train << ", test " << r.full.test << ", all " << r.full.all << "\n";
  for (const auto& p : r.pictures) log << "wrote " << p << "\n";
  return r;
}

// What --check holds the run to, from the paper's claims (docs/grokking.md): each failure, said.
inline std::vector<std::string> failures(const Report& r) {
  std::vector<std::string> f;
  auto need = [&f](bool ok, const std::string& what) {
    if (!ok) f.push_back(what);
  };
  need(r.accuracy == 1.0, "accuracy below 100%");
  const double tr = r.full.train / r.stored_train, te = r.full.test / r.stored_test;
  need(tr >= 0.5 && tr <= 2 && te >= 0.5 && te <= 2, "recomputed losses not within 2x of the stored ones");
  need(r.train_fit >= 0 && r.test_fit > 10 * r.train_fit, "the test loss did not fall 10x later than the train loss");
  need(r.key_freqs.size() >= 3 && r.key_freqs.size() <= 7, "not 3 to 7 key frequencies");
  need(r.share_in_key >= 0.8, "fewer than 80% of neurons in a key frequency's cluster");
  need(r.restricted_all < 100 * r.full.test, "restricted loss not below 100x the full model's test loss");
  need(r.excluded_train > 1, "excluded loss not above 1");
  return f;
}

}  // namespace headlab::examples::grokking
