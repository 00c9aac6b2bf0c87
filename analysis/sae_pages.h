// Feature pages: an SAE's features as SAE-Vis and Neuronpedia show them, on one self-contained page (no network, the
// script inline, as the attention explorer's): for each feature its top activating contexts from a corpus with each
// token coloured by the activation, how often it fires, the tokens it promotes and suppresses, the heads that write
// it (hook_z SAEs) and the heads that made it fire (its pre-activation's split, analysis/sae_features.h, averaged
// over its top contexts). features.html#F123 opens feature 123, and choosing one rewrites the address.
#pragma once
#include <string>
#include <vector>

#include "analysis/sae_features.h"
#include "tasks/task.h"

namespace headlab::analysis {

struct FeatureContext {
  std::vector<int64_t> ids;         // the sequence it came from
  std::vector<double> activations;  // the feature's, at each of its tokens
  int64_t position = 0;             // the peak
  double activation = 0;
};

struct FeaturePage {
  int64_t feature = 0;
  double max_activation = 0;
  double frequency = 0;                  // share of the corpus's tokens it fires on
  std::vector<FeatureContext> contexts;  // largest activation first
  std::vector<TokenEffect> top_logits, bottom_logits;
  std::vector<double> head_shares;  // hook_z SAEs: feature_head_shares's row
  std::vector<std::string> labels;  // the split's: heads, "remainder"
  std::vector<double> parts;        // the pre-activation's split, averaged over its contexts' peaks
};

struct FeaturePages {
  std::string hook, split;
  int64_t tokens = 0;  // scanned
  int64_t d_sae = 0;
  std::vector<FeaturePage> features;  // the most active first (by their largest activation)
};

struct FeaturePagesOptions {
  int64_t features = 20;        // pages: the features with the largest activations on the corpus
  std::vector<int64_t> chosen;  // these features instead
  int64_t contexts = 10;        // top contexts a feature
  int64_t logits = 8;
};

// Scans `batches` validation batches of B x T of the task (bounded memory: K contexts a feature are kept as
// (activation, batch, row, position), the sequences rebuilt at the end), then splits each kept context's peak.
FeaturePages feature_pages(nn::DecoderModel& model, const tasks::Task& task, nn::SparseAutoencoder& sae,
                           const io::SaeOrigin& origin, int64_t batches, int64_t B, int64_t T,
                           const FeaturePagesOptions& o = {});

// The page; tokens shown with task.token_text. Written through a temporary file.
std::string feature_pages_html(const FeaturePages& pages, const tasks::Task& task, const std::string& title);
void save_feature_pages(const std::string& path, const FeaturePages& pages, const tasks::Task& task,
                        const std::string& title);

}  // namespace headlab::analysis
