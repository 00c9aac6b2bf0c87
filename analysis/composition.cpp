// Composition scores through D x D Gram matrices: for M = W_O^a W_Q^b (D x D),
// |W_V^a M W_K^b^T|_F^2 = tr(M^T G_V^a M G_K^b) with G_X = W_X^T W_X (D x D), and
// |W_V W_O|_F^2 = tr(G_V (W_O W_O^T)); no C x C matrix is ever formed.
#include "analysis/composition.h"

#include <cmath>

namespace headlab::analysis {

namespace {

// One head's matrices in float64 on the CPU, row-vector convention: W_Q, W_K, W_V (C, D), W_O (D, C).
struct HeadMatrices {
  Tensor Q, K, V, O;
  Tensor GQ, GK, GV, OOt;  // W^T W for Q, K, V (D, D); W_O W_O^T (D, D)
};

Tensor f64(const Tensor& t) { return t.detach().to(kCPU).to(DType::f64).contiguous(); }

std::vector<std::vector<HeadMatrices>> head_matrices(const nn::DecoderModel& model) {
  std::vector<std::vector<HeadMatrices>> out;
  for (int64_t l = 0; l < model.n_layers(); ++l) {
    const nn::HeadWeights w = model.head_weights(l, true, DType::f64);  // ln1's scale folded into the reads
    std::vector<HeadMatrices> layer;
    for (int64_t h = 0; h < model.attention(l).head_count(); ++h) {
      HeadMatrices m;
      m.Q = f64(w.W_Q.select(0, h)), m.K = f64(w.W_K.select(0, h)), m.V = f64(w.W_V.select(0, h));  // (C, D)
      m.O = f64(w.W_O.select(0, h));                                                                // (D, C)
      m.GQ = matmul(m.Q.transpose(0, 1), m.Q);
      m.GK = matmul(m.K.transpose(0, 1), m.K);
      m.GV = matmul(m.V.transpose(0, 1), m.V);
      m.OOt = matmul(m.O, m.O.transpose(0, 1));
      layer.push_back(std::move(m));
    }
    out.push_back(std::move(layer));
  }
  return out;
}

double trace_of_product(const Tensor& a, const Tensor& b) { return sum(mul(a, b.transpose(0, 1))).item<double>(); }

// |X M Y^T|_F with G_X = X^T X, G_Y = Y^T Y: sqrt(tr(M^T G_X M G_Y)).
double frobenius(const Tensor& GX, const Tensor& M, const Tensor& GY) {
  return std::sqrt(std::max(0.0, trace_of_product(matmul(M.transpose(0, 1), matmul(GX, M)), GY)));
}

}  // namespace

std::vector<CompositionScore> composition_scores(const nn::DecoderModel& model) {
  const NoGradGuard no_grad;
  const std::vector<std::vector<HeadMatrices>> heads = head_matrices(model);
  std::vector<CompositionScore> out;
  for (size_t la = 0; la < heads.size(); ++la)
    for (size_t ha = 0; ha < heads[la].size(); ++ha) {
      const HeadMatrices& a = heads[la][ha];
      const double ov_a = std::sqrt(std::max(0.0, trace_of_product(a.GV, a.OOt)));  // |W_V W_O|_F
      for (size_t lb = la + 1; lb < heads.size(); ++lb)
        for (size_t hb = 0; hb < heads[lb].size(); ++hb) {
          const HeadMatrices& b = heads[lb][hb];
          const double qk_b = std::sqrt(std::max(0.0, trace_of_product(b.GQ, b.GK)));  // |W_Q W_K^T|_F
          const double ov_b = std::sqrt(std::max(0.0, trace_of_product(b.GV, b.OOt)));
          CompositionScore s;
          s.layer_a = static_cast<int64_t>(la), s.layer_b = static_cast<int64_t>(lb);
          s.head_a = model.original_head(s.layer_a, static_cast<int64_t>(ha));
          s.head_b = model.original_head(s.layer_b, static_cast<int64_t>(hb));
          // W_OV^a W_QK^b = V_a (O_a Q_b) K_b^T; W_OV^a W_QK^b^T = V_a (O_a K_b) Q_b^T; W_OV^a W_OV^b = V_a (O_a V_b)
          // O_b.
          const double qn = ov_a * qk_b, vn = ov_a * ov_b;
          s.q = qn > 0 ? frobenius(a.GV, matmul(a.O, b.Q), b.GK) / qn : std::nan("");
          s.k = qn > 0 ? frobenius(a.GV, matmul(a.O, b.K), b.GQ) / qn : std::nan("");
          // |V_a N O_b|_F with N = O_a V_b: sqrt(tr(N^T G_V^a N (O_b O_b^T))).
          s.v = vn > 0 ? frobenius(a.GV, matmul(a.O, b.V), b.OOt) / vn : std::nan("");
          out.push_back(s);
        }
    }
  return out;
}

std::vector<InductionPair> induction_pairs(const HeadTypes& types, const std::vector<CompositionScore>& comp) {
  const auto find_head = [&](int64_t layer, int64_t original) -> const HeadTypeScores* {
    for (const HeadTypeScores& h : types.heads)
      if (h.layer == layer && h.original_head == original) return &h;
    return nullptr;
  };
  std::vector<InductionPair> out;
  for (const HeadTypeScores& h : types.heads) {
    if (h.label.find("induction") == std::string::npos) continue;
    InductionPair p;
    p.induction = h;
    int64_t partners = 0;
    for (const CompositionScore& c : comp) {
      if (c.layer_b != h.layer || c.head_b != h.original_head || !std::isfinite(c.k)) continue;
      p.k_mean += c.k, ++partners;
      if (partners == 1 || c.k > p.k.k) p.k = c;
    }
    if (partners == 0) continue;  // layer 0: nothing before it to compose with
    p.k_mean /= static_cast<double>(partners);
    const HeadTypeScores* partner = find_head(p.k.layer_a, p.k.head_a);
    HL_CHECK(partner, "induction_pairs: head L", p.k.layer_a, "H", p.k.head_a, " has no head-type scores");
    p.partner = *partner;
    out.push_back(p);
  }
  return out;
}

}  // namespace headlab::analysis
