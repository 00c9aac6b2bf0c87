// attention.html: every head's attention for one input as one self-contained page (no network: the
// script and style are inline), in the manner of bertviz's head view: the tokens twice, lines from
// each query to the keys it attends to, a thumbnail of every (layer, head) to pick from, hovering a
// token shows its row, and the analysis scores of the chosen head beside it. Drawn on canvases, so
// a few hundred tokens and 12 x 12 heads stay usable (no DOM node per weight). The address names the head
// shown, as its thumbnail does: attention.html#L1H3 opens layer L1's head 3 (an encoder-decoder's
// #cross.L0H2; #L1: all of the layer's heads overlaid), and choosing a head rewrites it, so that a view can
// be shared as a link.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "analysis/attention_maps.h"
#include "analysis/heads.h"
#include "tasks/task.h"

namespace headlab::analysis {

// Per-head numbers shown beside the picture: name -> [layer][original head] (NaN: none).
struct ExplorerScore {
  std::string name;
  HeadMatrix values;
};

// A page template with its /*DATA*/ replaced by `data` as JSON that cannot end the script element around it (a
// token "</script>"): how the explorer and the feature pages (sae_pages.h) carry their data.
std::string page_with_data(const std::string& page_template, const nlohmann::json& data);

// Weights travel as uint16 (w * 65535, rounded), base64: 2.7 bytes per weight, exact to 8e-6.
constexpr double kExplorerWeightScale = 65535.0;

std::string attention_explorer_html(const AttentionMaps& maps, const std::vector<std::string>& tokens,
                                    const std::string& title, const std::vector<ExplorerScore>& scores = {});
void save_attention_html(const std::string& path, const AttentionMaps& maps, const std::vector<std::string>& tokens,
                         const std::string& title, const std::vector<ExplorerScore>& scores = {});
// Several kinds on one page with a switch between them (an encoder-decoder's encoder, decoder, cross);
// scores: none, or one list per kind.
std::string attention_explorer_html(const std::vector<AttentionText>& kinds, const std::string& title,
                                    const std::vector<std::vector<ExplorerScore>>& scores = {});
void save_attention_html(const std::string& path, const std::vector<AttentionText>& kinds, const std::string& title,
                         const std::vector<std::vector<ExplorerScore>>& scores = {});

// The page for one row of an evaluation batch (its tokens up to the end token, tasks; all of it,
// chars), as the analysis commands write it; scores by [attention module][model-local head], as analyses
// give them (an encoder-decoder's modules: encoder layers, decoder self, cross; its page has the three kinds).
void save_row_explorer(const std::string& path, nn::Model& model, const tasks::Task& task, const Batch& batch,
                       int64_t row, const std::string& title, const std::vector<ExplorerScore>& scores);

}  // namespace headlab::analysis
