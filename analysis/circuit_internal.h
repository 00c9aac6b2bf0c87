// Internal to analysis/'s circuit files: the stored runs of a chunk of prompt rows and the patcher's
// state, which circuit_runs.cpp and circuit_patcher.cpp implement and edge attribution (circuit.cpp)
// drives with probes.
// B = prompt rows of a chunk, T = tokens, C = d_model, N = nodes, P = B*T*C, K = copies of one forward.
#pragma once
#include <memory>
#include <vector>

#include "analysis/circuit.h"
#include "analysis/head_control.h"

namespace headlab::analysis {

// One chunk of prompt rows with its stored runs (when not stored: only its rows, the runs made again).
struct Chunk {
  int64_t B = 0, T = 0, first_row = 0;
  bool stored = false;
  Tensor clean_tokens, corrupt_tokens;  // (B, T) int64
  Tensor direction;                     // (B, C): W_U[answer] - W_U[wrong]
  Tensor bias_diff;                     // (B): the unembedding's bias difference (zeros without one)
  Tensor candidates, weights;           // probability metric: (M) token ids, (B, M) signs; else undefined
  Tensor corrupt_out, delta;            // (N, P): corrupted outputs of every node; clean - corrupted
  Tensor delta_last;                    // (N, B*C): delta at the last position
  std::vector<Tensor> clean_resid;      // [layer 0..L] (B, T, C): the clean stream entering each layer
  std::vector<double> clean_ld, corrupt_ld;
};

struct CircuitPatcher::Impl {
  // Edge attribution's zero leaves of one receiver group, whose gradients give its receivers'. An MLP's or
  // the logits' group: `input`, added to its inputs (R, 1, width). An attention layer's: `q`, `k` and `v`,
  // added to its projections before rotary (B, T, heads, D), with `stream`, what its norm reads (B, T, C):
  // every receiver reads the same stream when nothing is patched, so the plain forward runs and each
  // head's gradient goes back through its own projection rows and the norm afterwards
  // (receiver_gradients), where per-receiver inputs made the layer's norm and projections 3H-fold.
  struct Probe {
    Tensor input, q, k, v, stream;
  };
  // What one forward does beyond the plain run.
  struct Pass {
    int64_t copies = 1, first_layer = 0;
    std::vector<Tensor> patches;           // [group]: (K, R, senders) or undefined (nothing patched there)
    std::vector<Probe>* probes = nullptr;  // [group], sized by the caller: filled with zero leaves; no patches
    Tensor start;                          // the stream entering layer 0 (B, T, C), when not the clean one
    std::vector<Replace> replaced;         // [copy]: the node whose output is set to a value of its own
    bool record = false;                   // K = 1, from layer 0, no patches: fill `recorded`
    Tensor tokens;                         // record: (B, T)
  };
  struct Recorded {
    Tensor outputs;             // (N, P), allocated by the caller: every node's output, written as reached
    std::vector<Tensor> resid;  // [layer 0..L-1] (B, T, C): the stream after each layer
  };

  nn::DecoderModel& model;
  detail::ControlGuard guard;  // the model in eval mode without head controls while this lives
  CircuitGraph graph;
  CircuitOptions options;
  std::shared_ptr<train::Collectives> comm;
  std::vector<int64_t> attention_group, mlp_group;  // [layer]: the group of its attention's / MLP's inputs, or -1
  PromptPairs pairs;                                // the patcher's: chunks not stored are run again from them
  std::vector<Chunk> chunks;                        // this rank's
  LogitDifference baseline;
  Tensor mean_out;  // (N, T*C): every node's clean output averaged over the prompts, once asked for
  int64_t rows = 0, positions = 0, forwards = 0, rerun_rows = 0, C = 0;

  Impl(nn::DecoderModel& m, const CircuitOptions& o);
  // The groups' patch matrices for K copies; the first layer any copy patches (n_layers: the logits only).
  Pass pass_for(const std::vector<const EdgePatch*>& copies) const;
  // The metric of every copy and row, (K, B), for chunk c under pass p.
  Tensor forward(const Chunk& c, const Pass& p, Recorded* rec = nullptr);
  // Group g's receivers' gradients (R, width) from those of its probe's leaves (one copy): an attention
  // layer's from dq, dk, dv (B, T, heads, D), another group's from its input's (R, 1, width).
  Tensor receiver_gradients(size_t g, const Probe& probe, const std::vector<Tensor>& leaf_grads) const;
  // Runs the clean and corrupted prompts of rows [first, first + B) and stores what patching reads.
  Chunk make_chunk(const PromptPairs& pairs, int64_t first, int64_t B);
  // Chunk i with its runs: itself when stored, else run again into `scratch` (emptied first: one chunk's
  // runs alive beyond the stored ones).
  const Chunk& runs(size_t i, Chunk& scratch);
  int64_t stored_row_budget(int64_t T) const;  // CircuitOptions::stored_rows, or what memory allows
  void compute_means();                        // mean_out from every rank's chunks
  DirectLogitAttribution logit_attribution();
  // Bytes one forward's activations may take: the model's weights' size, at least 256 MB and at most 1 GiB.
  // A chunk's rows then stay alike across depths (the weights and a row's activations both grow with the
  // layers), and a product's rows pay for libxsmm's copies of each weight block: GPT-2 small's path
  // patching (stored runs and senders), six interleaved rounds, 2.82 s in chunks of 8 pairs (256 MB), 2.79 in
  // 16, 2.46 in 32 (the weights' 498 MB).
  int64_t activation_budget() const;
  // Prompt rows per chunk: a chunk's runs (unless every row's are stored, and so counted in the stored
  // budget), one forward's activations and one group's per-receiver gradients within the budget. With a
  // backward (edge attribution) every layer's activations stay alive until it runs: 512 MB, where 256 MB
  // cost 10-20% more CPU time (GPT-2 small, 8 pairs of 15 tokens a chunk, 0.98 GB at the peak; 4 pairs: 0.74
  // GB) and the weights' size (16 pairs) bought 5% for 39% more memory (0.82 -> 1.15 GB).
  int64_t chunk_rows(int64_t T, bool backward) const;
  // Rows per chunk for `rows` rows at most `most` a chunk: a divisor of rows in [most / 2, most] when
  // there is one, since chunks of one shape reuse the allocator's cached blocks (GPT-2 small's edge
  // attribution: 1.06 GB at the peak in chunks of 4 rows, 1.64 GB in chunks of 5 and a last one of 4).
  static int64_t even_chunks(int64_t rows, int64_t most);
  int64_t copies_per_forward(const Chunk& c) const;
  int64_t widest_group() const;  // the most receivers one group has (a layer's 3H q/k/v inputs)
};

// Throws, naming who, unless the pairs fit the model (context, vocabulary, the probability metric's weights).
void check_pairs(const nn::DecoderModel& model, const PromptPairs& pairs, const char* who);
// Every row's logit differences where only this rank's chunks wrote theirs (zeros elsewhere), summed
// over the ranks: each rank then holds every row's; then their means.
void gather_rows(train::Collectives& comm, LogitDifference& d);
void finish_baseline(LogitDifference& d);

}  // namespace headlab::analysis
