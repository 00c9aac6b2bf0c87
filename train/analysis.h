// Head analysis of GPT models and checkpoints: zero and mean ablation of every head, the head-importance
// scores of Michel, Levy & Neubig (2019, "Are Sixteen Heads Really Better than One?"), iterative
// pruning by those scores, physical pruning (a smaller checkpoint without the pruned heads), and the
// wrapper-vs-fused attention measurements behind `headlab compare`. Everything computes; nothing prints.
// L = layers, H = heads of a layer, D = head size, B = batch, T = tokens.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nn/gpt.h"
#include "train/checkpoint.h"
#include "train/tasks.h"

namespace headlab::train {

// ------------------------------------------------------------------------------------------------
// Evaluation data and scores

// The batches an analysis measures on, drawn once so that every ablation sees the same tokens.
struct EvalSet {
  std::vector<Batch> batches;
  bool has_exact_match = false;  // task data (whole answers), not chars
  int64_t tokens() const;        // scored targets over all batches
};
// Batches 0..n-1 of the task's `split` stream, each (batch_size, T).
EvalSet make_eval_set(const Task& task, int64_t batches, int64_t batch_size, int64_t T, Split split = Split::val);

// Teacher-forced scores over an EvalSet. loss: mean cross entropy per scored token.
struct Scores {
  double loss = 0, token_accuracy = 0, exact_match = 0;
  bool has_exact_match = false;
  int64_t tokens = 0;
};

// The metric pruning watches (higher is better).
enum class Metric { exact_match, token_accuracy };
Metric parse_metric(const std::string& name);  // "exact_match" | "exact" | "token_accuracy" | "accuracy"
const char* metric_name(Metric m);             // "exact_match" / "token_accuracy"
double metric_value(const Scores& s, Metric m);
Metric default_metric(const EvalSet& data);    // exact match for tasks, token accuracy for chars

// A value per head: [layer][head], heads in the model's order (for a pruned model, its kept heads).
using HeadMatrix = std::vector<std::vector<double>>;
HeadMatrix head_matrix(const nn::GPTModel& model, double fill);
int64_t count_heads(const HeadMatrix& m);
// The original index of a model's head (differs from `head` only in pruned models).
int64_t original_head(const nn::GPTConfig& cfg, int64_t layer, int64_t head);

// Scores with each head's context c_h replaced by gates[l][h] * c_h + offsets[l][h] (HeadControl).
// gates empty: all ones; offsets empty or an undefined entry: none; offsets[l] is (H_l, D).
// The model's own head controls are restored afterwards, also when this throws.
Scores evaluate_heads(nn::GPTModel& model, const EvalSet& data, const HeadMatrix& gates = {},
                      const std::vector<Tensor>& offsets = {});

// Every head's mean context over the data (all rows and positions): per layer (H_l, D), model dtype.
std::vector<Tensor> mean_head_contexts(nn::GPTModel& model, const EvalSet& data);

// ------------------------------------------------------------------------------------------------
// Importance (Michel et al. 2019): I_h = E_x |dL/dxi_h| where xi are the head gates. One backward per
// batch through gates that require grad (functional grad(), parameters untouched); |grad| of each
// batch's mean loss is averaged over the batches. normalized: each layer's scores divided by their
// l2 norm, as in the paper, so that layers compare. Heads whose gate is 0 (already pruned) are left
// out of the normalisation and get NaN there.
struct Importance {
  HeadMatrix raw, normalized;
};
Importance head_importance(nn::GPTModel& model, const EvalSet& data, const HeadMatrix& gates = {});

// ------------------------------------------------------------------------------------------------
// Ablation of every head, one at a time: zero (gate 0) and mean (gate 0, offset = the head's mean context).
struct HeadAblation {
  int64_t layer = 0, head = 0, original_head = 0;
  double importance = 0, importance_raw = 0;  // at full gates
  Scores zero, mean;                          // scores with the head ablated
};
struct AblationResult {
  Scores base;
  Importance importance;
  std::vector<HeadAblation> heads;  // layer-major
};
AblationResult ablate_heads(nn::GPTModel& model, const EvalSet& data);

// ------------------------------------------------------------------------------------------------
// Iterative pruning: mask the least important step_fraction of the remaining heads (at least one),
// recompute importance over the heads left, repeat. Importance is the gradient score above
// (Criterion::gradient, the paper's) or, as a check on it, the loss increase when the head is masked
// on top of the heads already pruned (Criterion::ablation: one evaluation per remaining head and step). Every layer keeps at least one head, so the
// pruned model stays a GPTModel of the same depth (the library's Linear has no zero-width form).
// Stops once the metric falls below stop_below (after recording that step), unless fewer than
// min_pruned heads are pruned yet, or when no head can be pruned any more.
enum class Criterion { gradient, ablation };
Criterion parse_criterion(const std::string& name);  // "gradient" | "ablation"
const char* criterion_name(Criterion c);

struct PruneOptions {
  double step_fraction = 0.1;
  Criterion criterion = Criterion::gradient;
  Metric metric = Metric::exact_match;
  double stop_below = 0;   // absolute metric value
  int64_t min_pruned = 0;  // keep going until at least this many heads are masked
};
struct PruneStep {
  int64_t pruned = 0;                                // heads masked after this step
  double fraction = 0;                               // pruned / all heads
  std::vector<std::pair<int64_t, int64_t>> removed;  // (layer, head) masked in this step, least important first
  Scores scores;
};
struct PruningCurve {
  Metric metric = Metric::exact_match;
  int64_t total_heads = 0;
  std::vector<PruneStep> steps;                    // steps[0]: nothing pruned
  std::vector<std::pair<int64_t, int64_t>> order;  // every masked (layer, head), in pruning order
};
PruningCurve iterative_pruning(nn::GPTModel& model, const EvalSet& data, const PruneOptions& options);

// Heads per layer left after removing the first k heads of `order` (sorted model-local indices).
std::vector<std::vector<int64_t>> kept_after(const nn::GPTModel& model,
                                             const std::vector<std::pair<int64_t, int64_t>>& order, int64_t k);
// The gates that mask every head not in `keep` (1 kept, 0 pruned).
HeadMatrix gates_keeping(const nn::GPTModel& model, const std::vector<std::vector<int64_t>>& keep);
// How many heads to prune (from the curve) to keep the metric at or above `target`: the last step
// whose metric is >= target.
int64_t prune_count_for_metric(const PruningCurve& curve, double target);

// ------------------------------------------------------------------------------------------------
// Physical pruning and layout conversion on parameters by state_dict name (DESIGN.md section 7).

// keep[l]: model-local heads of layer l to keep (sorted, at least one). Returns the config with
// kept_heads (original indices) and the parameters without the other heads: fewer W_query/W_key/
// W_value rows (fused) or fewer heads.{j} modules, renumbered (wrapper), and fewer out_proj columns.
std::pair<nn::GPTConfig, NamedTensors> prune_parameters(const nn::GPTConfig& cfg, const NamedTensors& params,
                                                        const std::vector<std::vector<int64_t>>& keep);
// A checkpoint of the pruned model: config["model"] replaced (kept_heads), config["pruning"] added,
// optimizer state dropped (its shapes no longer match); the trainer state is kept for the record.
Checkpoint prune_checkpoint(const Checkpoint& ckpt, const std::vector<std::vector<int64_t>>& keep,
                            const std::string& source = "");
std::shared_ptr<nn::GPTModel> prune_model(const nn::GPTModel& model, const std::vector<std::vector<int64_t>>& keep);

// The same weights in the other attention layout ("fused" <-> "wrapper"); pruned configs too.
std::pair<nn::GPTConfig, NamedTensors> convert_parameters(const nn::GPTConfig& cfg, const NamedTensors& params,
                                                          const std::string& attention);
Checkpoint convert_checkpoint(const Checkpoint& ckpt, const std::string& attention);

// ------------------------------------------------------------------------------------------------
// Timing: `warmup` untimed calls, then `repeats` timed ones (device synchronised around each).
struct TimeStats {
  double median = 0, p25 = 0, p75 = 0, min = 0, max = 0;  // seconds
  int64_t repeats = 0;
};
TimeStats time_call(const std::function<void()>& fn, Device device, int64_t warmup, int64_t repeats);
// Several calls timed in turn within each repeat, so that a busy machine slows them alike.
std::vector<TimeStats> time_interleaved(const std::vector<std::function<void()>>& fns, Device device, int64_t warmup,
                                        int64_t repeats);

// Spearman rank correlation (ties get their mean rank); NaN pairs are skipped.
double rank_correlation(const std::vector<double>& x, const std::vector<double>& y);

// Max |a - b| over the logits of the data's batches (inputs only), model a against model b with
// gates_a applied to a.
double max_logit_difference(nn::GPTModel& a, const HeadMatrix& gates_a, nn::GPTModel& b, const EvalSet& data);

// ------------------------------------------------------------------------------------------------
// Attention maps for one input.
struct AttentionMaps {
  std::vector<int64_t> ids;                     // (T) the input
  int64_t layers = 0, heads = 0, T = 0;         // heads: the original n_heads
  std::vector<float> weights;                   // (layers, heads, T, T); NaN for pruned heads
  std::vector<std::vector<int64_t>> kept;       // per layer, the original indices present
};
AttentionMaps attention_maps(nn::GPTModel& model, const std::vector<int64_t>& ids);
// Greedy continuation: up to max_new tokens, stopping after end_id (kept) when end_id >= 0.
std::vector<int64_t> greedy_continue(nn::GPTModel& model, std::vector<int64_t> ids, int64_t max_new, int64_t end_id);

// ------------------------------------------------------------------------------------------------
// Wrapper vs fused multi-head attention (headlab compare). A config is the book's:
// wrapper = `heads` CausalAttention heads of width d_out/heads with out_proj (d_out -> d_out);
// fused = CausalMultiHeadAttention d_in -> d_out with `heads` heads; the fused module holds the
// wrapper's weights (wrapper_to_fused), so the outputs must agree.
struct CompareConfig {
  std::string name;
  int64_t B = 0, T = 0, d_in = 0, d_out = 0, heads = 0;
};
// "name,B,T,d_in,d_out,heads", as the PyTorch peer's --config.
CompareConfig parse_compare_config(const std::string& spec);
// The peer's default grid (torch_mha_cpu.py): seed-toy, small, medium, gpt2-ctx256.
std::vector<CompareConfig> peer_compare_grid();

struct CompareOptions {
  Device device = kCPU;
  int64_t warmup = 2, repeats = 10;
  uint64_t seed = 0;
};
struct FormMeasurement {
  int64_t params = 0;
  double flops_forward = 0, flops_backward = 0;  // GEMM FLOPs (2 per multiply-add); f+b = both
  TimeStats forward, forward_backward;            // forward under no-grad; f+b: loss = sum(y), backward
  int64_t peak_forward = 0, peak_forward_backward = 0;  // bytes: backend peak during the call above what was live
};
struct CompareResult {
  CompareConfig config;
  FormMeasurement wrapper, fused;
  double max_abs_out = 0, max_abs_dx = 0;  // fused vs wrapper, same weights, same input (and dL/dy)
};
// FLOPs of one forward of either form: projections 2*B*T*d_in*3*d_out + scores and context
// 2 * 2*B*T*T*d_out + out_proj 2*B*T*d_out*d_out. A backward costs twice the forward.
double attention_flops_forward(const CompareConfig& c);
CompareResult compare_attention(const CompareConfig& config, const CompareOptions& options);

// ------------------------------------------------------------------------------------------------
// Files: CSV, JSON, HDF5 and PNG (train/plot.h) for the three commands. Each throws on I/O failure.

// "L0H3" with the original head index.
std::string head_label(int64_t layer, int64_t original_head);
std::string removed_heads_str(const PruneStep& step, const nn::GPTConfig& cfg);  // "L0H3 L1H0"
// A token as a picture label: ASCII, blanks made visible (" " -> "sp", "\n" -> "\\n").
std::string token_label(const std::string& token);

// heads.csv: layer,head (original index),importance,importance_raw,zero_delta_loss,zero_delta_accuracy,
// [zero_delta_exact_match,]mean_delta_loss,mean_delta_accuracy[,mean_delta_exact_match]
void save_heads_csv(const std::string& path, const AblationResult& a);
// pruning.csv: step,heads_pruned,fraction_pruned,loss,token_accuracy[,exact_match],removed
void save_pruning_csv(const std::string& path, const PruningCurve& c, const nn::GPTConfig& cfg);
// importance.png: layer x head heatmap of the normalised scores (pruned heads grey), colour bar.
void save_importance_png(const std::string& path, const AblationResult& a, const nn::GPTConfig& cfg);
// pruning.png: fraction pruned -> token accuracy (and exact match), with the stop threshold when > 0.
void save_pruning_png(const std::string& path, const PruningCurve& c, double stop_below);

// attention.h5: `weights` float32 (layer, head, query, key) by original head index (NaN where pruned),
// `token_ids` int64 (T), `kept` int64 (layer, head) 1/0; root attributes format = "headlab-attention",
// tokens (JSON list of strings), prompt, checkpoint.
void save_attention_h5(const std::string& path, const AttentionMaps& maps, const std::vector<std::string>& tokens,
                       const std::string& prompt, const std::string& checkpoint);
// attention.png: one heatmap per (layer, kept head), titled "layer L head H", axes labelled by token.
void save_attention_png(const std::string& path, const AttentionMaps& maps, const std::vector<std::string>& tokens);

// compare.csv: one row per (config, form); compare.json: every config with both forms and the gap.
std::string compare_csv(const std::vector<CompareResult>& rows, const CompareOptions& options);
nlohmann::json compare_json(const std::vector<CompareResult>& rows, const CompareOptions& options);
// compare.png: median time against x ("auto" | "heads" | "tokens" | "emb" | "batch"; auto: the dimension
// with the most distinct values): per form a forward and a forward+backward line (log-log).
void save_compare_png(const std::string& path, const std::vector<CompareResult>& rows, const std::string& x,
                      const Device& device);

}  // namespace headlab::train
