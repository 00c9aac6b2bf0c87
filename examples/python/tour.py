"""What TransformerLens's main demo does, on headlab: tokens, logits, one head's attention pattern, an
ablation through a hook, and direct logit attribution of every head, from a GPT-2 folder or a headlab
checkpoint.

    PYTHONPATH=build/python python3 examples/python/tour.py gpt2/ \
        "When Mary and John went to the store, John gave a drink to" " Mary" " John"

(a character-level checkpoint takes single characters as the answer and the wrong token).
"""
import sys

import numpy as np

import headlab

path, prompt, answer, wrong = sys.argv[1:5]
model = headlab.load(path)
cfg = model.config
L, H = cfg["n_layers"], cfg["n_heads"]
tokens = model.to_tokens(prompt)
answer_id, wrong_id = (int(model.to_tokens(s)[0, -1]) for s in (answer, wrong))
print(f"model: {path}, {L} layers x {H} heads; {tokens.shape[1]} tokens: {model.to_str_tokens(tokens)}")

# Logits, and what the model predicts next.
logits, cache = model.run_with_cache(tokens, names=["ln_final.hook_normalized", f"blocks.{L - 1}.hook_resid_post"] +
                                     [f"blocks.{l}.attn.hook_z" for l in range(L)] +
                                     [f"blocks.{L - 1}.attn.hook_pattern"])
last = logits[0, -1]
top = np.argsort(-last)[:5]
print("top next tokens:", [(model.to_string(np.array([t])), round(float(last[t]), 3)) for t in top])
diff = float(last[answer_id] - last[wrong_id])
print(f"logit difference {answer!r} - {wrong!r}: {diff:.4f}")

# One head's attention: where the last token looks in the last layer's first head.
pattern = cache[f"blocks.{L - 1}.attn.hook_pattern"][0, 0, -1]
words = model.to_str_tokens(tokens)
looks = np.argsort(-pattern)[:3]
print(f"L{L - 1}H0 from the last token attends to:", [(words[k], round(float(pattern[k]), 3)) for k in looks])

# Ablation through a hook: each head of the last layer zeroed, the logit difference again.
for h in range(H):
    def zero(z, name, h=h):
        z[:, :, h, :] = 0
    ablated = model.run_with_hooks(tokens, {f"blocks.{L - 1}.attn.hook_z": zero})[0, -1]
    print(f"zero-ablating L{L - 1}H{h}: logit difference {float(ablated[answer_id] - ablated[wrong_id]):+.4f}")

# Direct logit attribution: each head's output at the last position through the final LayerNorm with
# its scale frozen, along W_U[answer] - W_U[wrong].
sd = model.state_dict()
resid = cache[f"blocks.{L - 1}.hook_resid_post"][0, -1]
scale = np.sqrt(resid.var() + 1e-5)
gamma = sd["final_norm.scale"] if "final_norm.scale" in sd else sd["final_norm.weight"]
head_w = sd["out_head.weight"] if "out_head.weight" in sd else sd["tok_emb.weight"]
direction = gamma * (head_w[answer_id] - head_w[wrong_id])
dla = np.zeros((L, H))
for l in range(L):
    z = cache[f"blocks.{l}.attn.hook_z"][0, -1]  # (H, D)
    W_O = sd[f"trf_blocks.{l}.att.out_proj.weight"]  # (C, H*D)
    D = z.shape[1]
    for h in range(H):
        out = W_O[:, h * D:(h + 1) * D] @ z[h]
        dla[l, h] = (out - out.mean()) / scale @ direction
print("direct logit attribution (layer x head):")
print(np.array2string(dla, precision=3, suppress_small=True))
best = np.unravel_index(np.argmax(np.abs(dla)), dla.shape)
print(f"largest: L{best[0]}H{best[1]} {dla[best]:+.3f}")
