// Every head's attention weights for one input.
#include "analysis/attention_maps.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <tuple>

#include "analysis/head_control.h"

namespace headlab::analysis {

using namespace detail;

// ---- attention maps ----
AttentionMaps attention_maps(nn::GPTModel& model, const std::vector<int64_t>& ids) {
  const nn::GPTConfig& cfg = model.config();
  const int64_t T = static_cast<int64_t>(ids.size());
  HL_CHECK(T > 0, "attention_maps: the input is empty");
  HL_CHECK(T <= cfg.context_length, "attention_maps: ", T, " tokens exceed context_length ", cfg.context_length);
  ControlGuard guard(model);
  model.eval();
  set_controls(model, {}, {});
  AttentionMaps m;
  m.ids = ids;
  m.layers = cfg.n_layers;
  m.heads = cfg.n_heads;
  m.T = T;
  m.weights.assign(static_cast<size_t>(m.layers * m.heads * T * T), std::numeric_limits<float>::quiet_NaN());
  for (int64_t l = 0; l < m.layers; ++l) model.attention(l).keep_attention_weights(true);
  {
    NoGradGuard no_grad;
    model.forward(tensor(ids, {1, T}).to(model.device()));
  }
  for (int64_t l = 0; l < m.layers; ++l) {
    nn::CausalMultiHead& att = model.attention(l);
    const std::vector<float> w = att.last_attention_weights().to_vector<float>();  // (1, H_l, T, T)
    att.keep_attention_weights(false);
    std::vector<int64_t> kept;
    for (int64_t h = 0; h < att.head_count(); ++h) {
      const int64_t oh = original_head(cfg, l, h);
      kept.push_back(oh);
      std::copy(w.begin() + h * T * T, w.begin() + (h + 1) * T * T, m.weights.begin() + (l * m.heads + oh) * T * T);
    }
    m.kept.push_back(kept);
  }
  return m;
}

}  // namespace headlab::analysis
