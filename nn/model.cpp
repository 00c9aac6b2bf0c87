// The model a config section describes.
#include "nn/model.h"

#include "nn/gpt.h"
#include "nn/transformer.h"

namespace headlab::nn {

bool is_encoder_decoder(const nlohmann::json& c) {
  return c.is_object() && c.contains("arch") && c.at("arch") == "encoder-decoder";
}

std::shared_ptr<Model> make_model(const nlohmann::json& c) {
  if (is_encoder_decoder(c)) return std::make_shared<EncoderDecoder>(TransformerConfig::from_json(c));
  return std::make_shared<GPTModel>(GPTConfig::from_json(c));
}

double num_parameters(const nlohmann::json& c) {
  return is_encoder_decoder(c) ? TransformerConfig::from_json(c).num_parameters()
                               : GPTConfig::from_json(c).num_parameters();
}

}  // namespace headlab::nn
