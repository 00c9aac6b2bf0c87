// d2l.ai 10.7 (the Transformer), its shape checks in headlab: the position-wise FFN, add & norm, an
// encoder block, the encoder, a decoder block, and the whole encoder-decoder decoding greedily.
// Differences from the chapter: AddNorm normalises the last axis only (d2l's examples also try
// [100, 24]; its training uses [num_hiddens]), and the blocks take their sizes as one BlockSizes.
#include <iostream>

#include "nn/transformer.h"
using namespace headlab;

int main() {
  manual_seed(0);
  nn::PositionWiseFFN ffn(4, 4, 8);
  ffn.eval();
  std::cout << "ffn(ones(2, 3, 4))[0]: " << shape_str(ffn(ones({2, 3, 4})).select(0, 0).shape()) << "\n";  // (3, 8)

  nn::AddNorm add_norm(4, 0.5);
  add_norm.eval();
  std::cout << "add_norm(X, X): " << shape_str(add_norm.forward(ones({2, 3, 4}), ones({2, 3, 4})).shape()) << "\n";

  nn::BlockSizes s;  // d2l: EncoderBlock(24, 24, 24, 24, [24], 24, 48, 8, 0.5)
  s.key_size = s.query_size = s.value_size = s.num_hiddens = s.norm_shape = s.ffn_num_input = 24;
  s.ffn_num_hiddens = 48;
  s.num_heads = 8;
  s.dropout = 0.5;
  const Tensor X = ones({2, 100, 24}), valid_lens = tensor(std::vector<int64_t>{3, 2}, {2});
  nn::TransformerEncoderBlock encoder_blk(s);
  encoder_blk.eval();
  std::cout << "encoder_blk(X, valid_lens): " << shape_str(encoder_blk.forward(X, valid_lens).shape()) << "\n";

  nn::TransformerConfig c;  // d2l: TransformerEncoder(200, 24, 24, 24, 24, [24], 24, 48, 8, 2, 0.5)
  c.src_vocab_size = c.tgt_vocab_size = 200;
  c.num_hiddens = 24;
  c.ffn_num_hiddens = 48;
  c.num_heads = 8;
  c.num_layers = 2;
  c.dropout = 0.5;
  nn::TransformerEncoder encoder(c);
  encoder.eval();
  const Tensor ids = full({2, 100}, 1, DType::i64);
  std::cout << "encoder(ones(2, 100), valid_lens): " << shape_str(encoder.forward(ids, valid_lens).shape()) << "\n";

  nn::TransformerDecoderBlock decoder_blk(s, 0);
  decoder_blk.eval();
  nn::DecoderState state;  // d2l: [encoder_blk(X, valid_lens), valid_lens, [None]]
  state.enc_outputs = encoder_blk.forward(X, valid_lens);
  state.enc_valid_lens = valid_lens;
  state.key_values.resize(1);
  std::cout << "decoder_blk(X, state)[0]: " << shape_str(decoder_blk.forward(X, state).shape()) << "\n";

  nn::EncoderDecoder net(c);  // untrained: the tokens are arbitrary, the loop is predict_seq2seq's
  std::cout << net.repr().substr(0, 400) << "...\n";
  const auto out = nn::greedy_decode(net, ids.narrow(1, 0, 5), valid_lens, /*bos_id=*/1, /*eos_id=*/2, /*max_steps=*/6);
  std::cout << "greedy_decode, row 0: " << out[0].size() << " tokens, " << net.num_parameters() << " parameters\n";
}
