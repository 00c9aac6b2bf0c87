"""Small random BERT folders in the Hugging Face layout (BertForMaskedLM), in the variants real files come in, and
PyTorch's masked-LM logits for each (tests/fixtures/bert_folders/).

transformers is not a Debian package, so BertForMaskedLM's maths is written out here in torch from its definition,
in float64: the word, position and token-type (type 0) embeddings summed and layer-normed; per layer, self-attention
with biases over every position, softmax(q k^T / sqrt(D) + the attention mask's additive form: 0 for a real key,
the dtype's minimum for padding), attention.output.dense, then LayerNorm(that + the layer's input)
(attention.output.LayerNorm), the MLP intermediate.dense -> exact GELU -> output.dense, LayerNorm(that + its input)
(output.LayerNorm); the head cls.predictions: transform.dense -> exact GELU -> transform.LayerNorm, then the decoder
(the word embeddings unless tie_word_embeddings is false) plus cls.predictions.bias. The safetensors writer and the
rounding to values float16 and bfloat16 both hold exactly are fixtures_gpt2_folders.py's.

Variants (each its own sizes and weights; reference.json holds each one's ids, valid lengths and logits):
  mlm_tied/        4 heads, hidden 32, model.safetensors, F32
  mlm_gamma_bin/   2 heads, hidden 24, pytorch_model.bin as the original BERT conversions save it: LayerNorm.gamma /
                   beta, the position_ids buffer, BertForPreTraining's pooler and seq_relationship head, the decoder's
                   weight (the word embeddings again) and bias
  mlm_untied_bf16/ 4 heads, hidden 32, intermediate 64, tie_word_embeddings false (cls.predictions.decoder.weight its
                   own), type_vocab_size 1, BF16
logits: row 1 padded after 11 tokens (attention_mask 0 there); logits_full: no mask. Each folder has a vocab.txt of
its 80 tokens (the specials, a-z, ##a-##z, punctuation and common words: any lowercase text can be cut into them);
mlm_tied's has a tokenizer_config.json (do_lower_case true).

Usage: python3 tools/fixtures_bert_folders.py [--out tests/fixtures/bert_folders]
(needs python3-torch: scripts/install-deps.sh --python)
"""
import argparse
import json
import math
import os

import torch

from fixtures_gpt2_folders import representable, write_weights

VARIANTS = {
    "mlm_tied": dict(heads=4, hidden=32, inter=48, types=2, tied=True, dtype="F32", bin=False),
    "mlm_gamma_bin": dict(heads=2, hidden=24, inter=40, types=2, tied=True, dtype="F32", bin=True),
    "mlm_untied_bf16": dict(heads=4, hidden=32, inter=64, types=1, tied=False, dtype="BF16", bin=False),
}
LAYERS, POSITIONS, VOCAB, EPS = 2, 16, 80, 1e-12


def random_weights(v, seed):
    g = torch.Generator().manual_seed(seed)
    C, F = v["hidden"], v["inter"]

    def rnd(*shape, scale=0.2):
        return representable(torch.randn(*shape, generator=g) * scale)

    def norm(name):
        w[name + ".weight"], w[name + ".bias"] = representable(1 + rnd(C, scale=0.1)), rnd(C, scale=0.1)

    def linear(name, out, inp):
        w[name + ".weight"], w[name + ".bias"] = rnd(out, inp), rnd(out, scale=0.1)

    w = {"bert.embeddings.word_embeddings.weight": rnd(VOCAB, C),
         "bert.embeddings.position_embeddings.weight": rnd(POSITIONS, C, scale=0.1),
         "bert.embeddings.token_type_embeddings.weight": rnd(v["types"], C, scale=0.1)}
    norm("bert.embeddings.LayerNorm")
    for i in range(LAYERS):
        p = f"bert.encoder.layer.{i}."
        for name in ("query", "key", "value"):
            linear(p + "attention.self." + name, C, C)
        linear(p + "attention.output.dense", C, C)
        norm(p + "attention.output.LayerNorm")
        linear(p + "intermediate.dense", F, C)
        linear(p + "output.dense", C, F)
        norm(p + "output.LayerNorm")
    linear("cls.predictions.transform.dense", C, C)
    norm("cls.predictions.transform.LayerNorm")
    w["cls.predictions.bias"] = rnd(VOCAB, scale=0.1)
    if not v["tied"]:
        w["cls.predictions.decoder.weight"] = rnd(VOCAB, C)
    return w


def bert_logits(v, w, ids, mask=None):
    """BertForMaskedLM's forward in eval mode, float64: ids (B, T), mask (B, T) of 1 / 0 or None -> (B, T, V)."""
    w = {k: t.double() for k, t in w.items()}
    H, C = v["heads"], v["hidden"]
    D = C // H
    B, T = ids.shape
    ln = torch.nn.functional.layer_norm
    gelu = torch.nn.functional.gelu  # the exact (erf) form: hidden_act "gelu"

    def lin(x, name):
        return x @ w[name + ".weight"].T + w[name + ".bias"]

    def norm(x, name):
        return ln(x, (C,), w[name + ".weight"], w[name + ".bias"], EPS)

    x = (w["bert.embeddings.word_embeddings.weight"][ids] + w["bert.embeddings.position_embeddings.weight"][:T] +
         w["bert.embeddings.token_type_embeddings.weight"][0])
    x = norm(x, "bert.embeddings.LayerNorm")
    additive = torch.zeros(B, 1, 1, T, dtype=torch.float64)
    if mask is not None:
        additive = (1.0 - mask.double()).view(B, 1, 1, T) * torch.finfo(torch.float64).min
    for i in range(LAYERS):
        p = f"bert.encoder.layer.{i}."

        def heads(name):
            return lin(x, p + "attention.self." + name).view(B, T, H, D).transpose(1, 2)

        q, k, vv = heads("query"), heads("key"), heads("value")
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D) + additive, dim=-1)
        o = (att @ vv).transpose(1, 2).reshape(B, T, C)
        x = norm(lin(o, p + "attention.output.dense") + x, p + "attention.output.LayerNorm")
        h = gelu(lin(x, p + "intermediate.dense"))
        x = norm(lin(h, p + "output.dense") + x, p + "output.LayerNorm")
    t = norm(gelu(lin(x, "cls.predictions.transform.dense")), "cls.predictions.transform.LayerNorm")
    decoder = w.get("cls.predictions.decoder.weight", w["bert.embeddings.word_embeddings.weight"])
    return t @ decoder.T + w["cls.predictions.bias"]


def config_json(v):
    c = {"architectures": ["BertForMaskedLM"], "model_type": "bert", "hidden_size": v["hidden"],
         "num_hidden_layers": LAYERS, "num_attention_heads": v["heads"], "intermediate_size": v["inter"],
         "vocab_size": VOCAB, "max_position_embeddings": POSITIONS, "type_vocab_size": v["types"],
         "hidden_act": "gelu", "layer_norm_eps": EPS, "hidden_dropout_prob": 0.1,
         "attention_probs_dropout_prob": 0.1, "position_embedding_type": "absolute", "pad_token_id": 0,
         "torch_dtype": "float32" if v["dtype"] == "F32" else "bfloat16"}
    if not v["tied"]:
        c["tie_word_embeddings"] = False
    return json.dumps(c, indent=2) + "\n"


SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)]
WORDS = ["the", "cat", "dog", "sat", "on", "mat", "ran", "is", "and", "to", "of", "in", "it", "was", "he", "she",
         "big", "red"]
VOCABULARY = SPECIALS + LETTERS + ["##" + c for c in LETTERS] + list(".,!?'") + WORDS
assert len(VOCABULARY) == VOCAB


def write(d, v, w):
    if not v["bin"]:
        write_weights(d, w, v["dtype"])
        return
    # torch.save's zip archive with the original conversions' names and what BertForPreTraining saves beside them
    sd = {}
    for name, t in w.items():
        if "LayerNorm" in name:
            name = name.replace(".weight", ".gamma").replace(".bias", ".beta")
        sd[name] = t
    C = v["hidden"]
    sd["bert.embeddings.position_ids"] = torch.arange(POSITIONS).view(1, -1)
    sd["bert.pooler.dense.weight"], sd["bert.pooler.dense.bias"] = torch.zeros(C, C), torch.zeros(C)
    sd["cls.seq_relationship.weight"], sd["cls.seq_relationship.bias"] = torch.zeros(2, C), torch.zeros(2)
    sd["cls.predictions.decoder.weight"] = w["bert.embeddings.word_embeddings.weight"]
    sd["cls.predictions.decoder.bias"] = w["cls.predictions.bias"]
    torch.save(sd, os.path.join(d, "pytorch_model.bin"))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", "bert_folders"))
    args = ap.parse_args()
    g = torch.Generator().manual_seed(23)
    ids = torch.randint(1, VOCAB, (2, POSITIONS), generator=g)
    valid = [POSITIONS, 11]
    mask = torch.ones(2, POSITIONS, dtype=torch.int64)
    mask[1, valid[1]:] = 0
    ids[1, valid[1]:] = 0  # the pad token
    reference = {}
    for seed, (name, v) in enumerate(VARIANTS.items()):
        w = random_weights(v, 400 + seed)
        d = os.path.join(args.out, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            f.write(config_json(v))
        write(d, v, w)
        with open(os.path.join(d, "vocab.txt"), "w") as f:
            f.write("\n".join(VOCABULARY) + "\n")
        if name == "mlm_tied":
            with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
                f.write(json.dumps({"do_lower_case": True, "tokenizer_class": "BertTokenizer"}) + "\n")
        reference[name] = {"ids": ids.tolist(), "valid_lens": valid, "logits": bert_logits(v, w, ids, mask).tolist(),
                           "logits_full": bert_logits(v, w, ids).tolist()}
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump(reference, f)
        f.write("\n")


if __name__ == "__main__":
    main()
