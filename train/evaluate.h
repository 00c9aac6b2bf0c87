// One evaluation for training and analysis alike: teacher-forced loss and argmax scores of a model
// (a decoder or the encoder-decoder) on task batches. B = batch rows, T = tokens, V = vocabulary.
#pragma once
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "nn/decoder.h"
#include "nn/transformer.h"
#include "tasks/bleu.h"
#include "tasks/seq2seq.h"
#include "train/collectives.h"

namespace headlab::train {

// loss: mean cross entropy per scored token. NaN where nothing was scored, and exact_match NaN
// where it does not apply (chars).
struct Scores {
  double loss = std::numeric_limits<double>::quiet_NaN();
  double token_accuracy = std::numeric_limits<double>::quiet_NaN();
  double exact_match = std::numeric_limits<double>::quiet_NaN();
  bool has_exact_match = false;
  int64_t tokens = 0;  // scored targets
};

// Scores accumulated over batches: the summed cross entropy and the argmax metrics.
struct ScoreSum {
  double loss_sum = 0;
  tasks::Metrics metrics;
  // logits: (B, T, V) for batch.inputs; targets: batch.targets as a (B, T) tensor on the logits' device.
  void add(const tasks::Batch& batch, const Tensor& logits, const Tensor& targets);
  Scores scores() const;
};

// A batch's inputs and targets as (B, T) int64 tensors on `device`.
std::pair<Tensor, Tensor> batch_tensors(const tasks::Batch& batch, Device device);
// What the model reads of a batch on `device`: the tokens, and for seq2seq batches the source and its lengths.
nn::ModelInputs model_inputs(const tasks::Batch& batch, Device device);

// The model as it stands (its head controls included) in eval mode, without gradients; the
// model's train/eval mode is restored afterwards.
Scores evaluate(nn::Model& model, const std::vector<tasks::Batch>& batches);
// Batches 0..n-1 of the task's validation stream, each (batch_size, T). With `ranks` (data parallelism: every
// rank calls it, with its replica of the model), batch i is scored by rank i mod ranks->size() and every rank
// returns the scores of them all.
Scores evaluate(nn::Model& model, const tasks::Task& task, int64_t batches, int64_t batch_size, int64_t T,
                Collectives* ranks = nullptr);

// A decoder's next-token loss over a whole token sequence (ids: a tokenized file), as the transformers
// perplexity guide computes it: windows of the model's context starting every `stride` tokens, each
// scoring only the targets no earlier window scored, so every token after the first is scored once,
// with the longest context the stride allows (stride = context: disjoint windows; smaller: more
// context, more windows).
struct TextScores {
  double loss = std::numeric_limits<double>::quiet_NaN();  // mean cross entropy per scored token
  double perplexity = std::numeric_limits<double>::quiet_NaN();
  int64_t tokens = 0;   // scored targets: ids.size() - 1
  int64_t windows = 0;  // forward passes
};
TextScores evaluate_text(nn::DecoderModel& model, const std::vector<int64_t>& ids, int64_t stride);

// An encoder-decoder's greedy decoding of every row (d2l's predict_seq2seq, batched) scored against the
// targets: exact match of the whole output (it equals the teacher-forced exact match: a row is decoded
// right iff every teacher-forced argmax is right) and d2l's BLEU (tasks::bleu, k = 2) averaged over rows.
struct DecodeScores {
  double exact_match = std::numeric_limits<double>::quiet_NaN();
  double bleu = std::numeric_limits<double>::quiet_NaN();
  int64_t rows = 0;
};
DecodeScores evaluate_decoding(nn::EncoderDecoder& model, const tasks::Seq2SeqTask& task,
                               const std::vector<tasks::Batch>& batches);

}  // namespace headlab::train
