// The files the analysis commands write: CSV, JSON, HDF5 and pictures (through plot/), written atomically:
// per-head tables and maps, pruning curves, composition, attention maps, the wrapper-vs-fused comparison.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "analysis/attention_maps.h"
#include "analysis/compare.h"
#include "analysis/composition.h"
#include "analysis/pruning.h"
#include "analysis/residual.h"

namespace headlab::analysis {

// ------------------------------------------------------------------------------------------------
// Files: CSV, JSON, HDF5 and PNG (train/plot.h) for the three commands. Each throws on I/O failure.

// "L0H3" with the original head index.
std::string head_label(int64_t layer, int64_t original_head);
// Head h of attention module l as reports name it: "L0H3" (GPT), "enc.L0H3", "dec.L1H0", "cross.L0H2",
// with the original head index.
std::string head_name(const nn::Model& model, int64_t l, int64_t h);
std::string removed_heads_str(const PruneStep& step, const nn::Model& model);  // "L0H3 L1H0"
// "layer 0: 1,2; layer 1: 0": the heads each layer keeps.
std::string kept_heads_text(const std::vector<std::vector<int64_t>>& kept);
// The heads a model has, by original index: "layer 0: 0,2; layer 1: 1" for a decoder, "enc.L0: 0,2; ..." for
// the encoder-decoder.
std::string kept_heads_text(const nn::Model& model);
// A token as a picture label: ASCII, blanks made visible (" " -> "sp", "\n" -> "\\n").
std::string token_label(const std::string& token);

// A further heads.csv column: a value per (layer, model-local head), already formatted.
struct HeadColumn {
  std::string name;
  std::vector<std::vector<std::string>> values;
};
// heads.csv: layer,head (original index),importance,importance_raw, then for zero, mean and resample
// ablation <kind>_delta_loss,<kind>_delta_accuracy[,<kind>_delta_exact_match], then `extra`.
// Encoder-decoders get a first column `module` (enc.L0, dec.L0, cross.L0; layer is then the module index).
void save_heads_csv(const std::string& path, const AblationResult& a, const std::vector<HeadColumn>& extra = {},
                    const nn::Model* model = nullptr);
// A value per head as a layer x head heatmap by original head index (heads pruned before: grey).
struct HeadMap {
  std::string title, colorbar_label;
  HeadMatrix values;                 // [layer][model-local head]
  std::optional<double> vmin, vmax;  // colour range; default: the data's
};
void save_head_map_png(const std::string& path, const HeadMap& map, const nn::Model& model);
// Several such maps side by side with one colour range (e.g. the head-type scores, all in [0, 1]).
void save_head_maps_png(const std::string& path, const std::string& title, const std::vector<HeadMap>& maps,
                        const nn::Model& model, double vmin, double vmax);
// composition.png: Q-, K- and V-composition side by side, heads of the earlier layers (rows) against
// those of the later ones (columns), grey where the row's layer is not earlier or a head was pruned.
void save_composition_png(const std::string& path, const std::vector<CompositionScore>& comp,
                          const nn::DecoderModel& model);
// importance.png: layer x head heatmap of the measure the report ranks by (heads_ranked): the
// normalised gradient scores, or zero ablation's loss increase where they are unreliable; pruned heads grey.
void save_importance_png(const std::string& path, const AblationResult& a, const nn::Model& model);
// pruning.png: fraction pruned -> token accuracy (and exact match), with the stop threshold when > 0.
void save_pruning_png(const std::string& path, const PruningCurve& c, double stop_below);

// attention.h5: `weights` float32 (layer, head, query, key) by original head index (NaN where pruned),
// `token_ids` int64 (T), `kept` int64 (layer, head) 1/0; root attributes format = "headlab-attention",
// tokens (JSON list of strings), prompt, checkpoint.
void save_attention_h5(const std::string& path, const AttentionMaps& maps, const std::vector<std::string>& tokens,
                       const std::string& prompt, const std::string& checkpoint);
// Several kinds in one file (an encoder-decoder's: groups "encoder", "decoder", "cross"): each group as
// the root above, plus `key_token_ids` (S) and the attribute key_tokens, and its kind as an attribute.
void save_attention_h5(const std::string& path, const std::vector<AttentionText>& kinds, const std::string& prompt,
                       const std::string& checkpoint);
// attention.png: one heatmap per (layer, kept head), titled by the layer's name and head ("L0H1",
// "cross.L1H3"), axes labelled by token (key_tokens: the keys' when they are not the queries').
void save_attention_png(const std::string& path, const AttentionMaps& maps, const std::vector<std::string>& tokens,
                        const std::vector<std::string>& key_tokens = {});

// The logit lens (analysis/residual.h) on one prompt of `tokens` (their texts): logit_lens.png, the stream entering
// each layer (rows, then the final one) x positions, coloured by the probability its readout gives the next
// token (the columns' labels; the value written in cells big enough); logit_lens.csv, a row per cell, with ranks:
// row,position,token,next_token,probability,rank.
void save_logit_lens_png(const std::string& path, const LogitLens& lens, const std::vector<std::string>& tokens);
std::string logit_lens_csv(const LogitLens& lens, const std::vector<std::string>& tokens);

// compare.csv: one row per (config, form); compare.json: every config with both forms and the gap.
std::string compare_csv(const std::vector<CompareResult>& rows, const CompareOptions& options);
nlohmann::json compare_json(const std::vector<CompareResult>& rows, const CompareOptions& options);
// compare.png: median time against x ("auto" | "heads" | "tokens" | "emb" | "batch"; auto: the dimension
// with the most distinct values): per form a forward and a forward+backward line (log-log).
void save_compare_png(const std::string& path, const std::vector<CompareResult>& rows, const std::string& x,
                      const Device& device);

}  // namespace headlab::analysis
