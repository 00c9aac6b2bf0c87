// Attention maps: every head's weights for one input.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nn/decoder.h"
#include "nn/transformer.h"

namespace headlab::analysis {

// ------------------------------------------------------------------------------------------------
// Attention maps for one input: one kind of attention (a decoder's, or one of an encoder-decoder's three),
// every layer and head, queries by keys.
struct AttentionMaps {
  std::string kind = "attention";               // "attention" (a decoder), "encoder self-attention", ...
  std::vector<std::string> layer_names;         // "L0", ... (a decoder); "enc.L0", "dec.L0", "cross.L0"
  std::vector<int64_t> ids;                     // (T) the queries' tokens
  std::vector<int64_t> key_ids;                 // (S) the keys' tokens: ids itself for self-attention
  int64_t layers = 0, heads = 0, T = 0, S = 0;  // heads: the original n_heads
  int64_t kv_heads = 0;                         // key/value heads (grouped-query: fewer; 0 or heads: one per head)
  std::vector<float> weights;                   // (layers, heads, T, S); NaN for pruned heads
  std::vector<std::vector<int64_t>> kept;       // per layer, the original indices present
};
AttentionMaps attention_maps(nn::DecoderModel& model, const std::vector<int64_t>& ids);
// Maps with the text of their queries and keys, as the files show them.
struct AttentionText {
  std::string group;  // its name in a file of several kinds: "encoder", "decoder", "cross" ("": a decoder's)
  const AttentionMaps* maps = nullptr;
  std::vector<std::string> tokens, key_tokens;  // (T), (S); key_tokens empty: the queries' (self-attention)
};
// The keys' text for maps whose queries read `tokens`: key_tokens, or tokens itself when empty (self-
// attention); throws, naming `who`, unless the counts are the maps' T and S and every layer has a name.
const std::vector<std::string>& checked_key_tokens(const char* who, const AttentionMaps& maps,
                                                   const std::vector<std::string>& tokens,
                                                   const std::vector<std::string>& key_tokens);
// An encoder-decoder's three kinds for one source and decoder input (bos, target tokens...), teacher
// forced: encoder self-attention (S x S), decoder self-attention (T x T), cross-attention (T x S).
std::vector<AttentionMaps> attention_maps(nn::EncoderDecoder& model, const std::vector<int64_t>& source,
                                          const std::vector<int64_t>& decoder_input);

}  // namespace headlab::analysis
