"""What TransformerLens's main demo does, on headlab: tokens, logits, one head's attention pattern, an
ablation through a hook, and direct logit attribution of every head (the cache's stack_head_results and
logit_attrs: the final norm frozen at the final stream, whatever norm the model has), from a model folder, a
headlab checkpoint or a llama2.c checkpoint with its tokenizer.

    PYTHONPATH=build/python python3 examples/python/tour.py gpt2/ \
        "When Mary and John went to the store, John gave a drink to" " Mary" " John"
    PYTHONPATH=build/python python3 examples/python/tour.py ../shared/models/stories260K/stories260K.bin \
        "Tim and Lily went to the park. Lily gave the ball to" " Tim" " Lily" ../shared/models/stories260K/tok512.bin

(a character-level checkpoint takes single characters as the answer and the wrong token).
"""
import sys

import numpy as np

import headlab

path, prompt, answer, wrong = sys.argv[1:5]
model = headlab.load(path, tokenizer=sys.argv[5] if len(sys.argv) > 5 else "")
cfg = model.config
L, H = cfg["n_layers"], cfg["n_heads"]
tokens = model.to_tokens(prompt)
answer_id, wrong_id = model.to_single_token(answer), model.to_single_token(wrong)
print(f"model: {path}, {L} layers x {H} heads; {tokens.shape[1]} tokens: {model.to_str_tokens(tokens)}")

# Logits, and what the model predicts next.
logits, cache = model.run_with_cache(tokens)
last = logits[0, -1]
top = np.argsort(-last)[:5]
print("top next tokens:", [(model.to_string(np.array([t])), round(float(last[t]), 3)) for t in top])
diff = float(last[answer_id] - last[wrong_id])
print(f"logit difference {answer!r} - {wrong!r}: {diff:.4f}")

# One head's attention: where the last token looks in the last layer's first head.
pattern = cache["pattern", L - 1][0, 0, -1]
words = model.to_str_tokens(tokens)
looks = np.argsort(-pattern)[:3]
print(f"L{L - 1}H0 from the last token attends to:", [(words[k], round(float(pattern[k]), 3)) for k in looks])

# Ablation through a hook: each head of the last layer zeroed, the logit difference again.
for h in range(H):
    def zero(z, name, h=h):
        z[:, :, h, :] = 0
    ablated = model.run_with_hooks(tokens, {f"blocks.{L - 1}.attn.hook_z": zero})[0, -1]
    print(f"zero-ablating L{L - 1}H{h}: logit difference {float(ablated[answer_id] - ablated[wrong_id]):+.4f}")

# Direct logit attribution: each head's result at the last position through the final norm with its scale
# frozen at the final stream, along W_U[answer] - W_U[wrong].
heads, labels = cache.stack_head_results(pos_slice=-1, return_labels=True)  # (L*H, batch, d_model)
dla = cache.logit_attrs(heads, answer_id, wrong_id, pos_slice=-1)[:, 0]
print("direct logit attribution (layer x head):")
print(np.array2string(dla.reshape(L, H), precision=3, suppress_small=True))
best = int(np.argmax(np.abs(dla)))
print(f"largest: {labels[best]} {dla[best]:+.3f}")
