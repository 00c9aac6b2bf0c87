"""Small random sparse autoencoders in SAELens's on-disk layout, with SAELens's encode and decode written out
in numpy float64 (tests/fixtures/sae/).

sae_lens is not a Debian package, so the maths is its SAE classes' (sae_lens/sae.py of v5.11.0,
sae_lens/saes/{standard,topk,jumprelu}_sae.py of v6.18.0), written out here:
  sae_in = x - b_dec * apply_b_dec_to_input        (normalize_activations "none": no run-time scaling)
  pre    = sae_in @ W_enc + b_enc                   hook_sae_acts_pre
  standard: f = relu(pre)
  topk:     f = relu of the k largest pre, 0 elsewhere (torch.topk over pre, then ReLU on the values)
  jumprelu: f = relu(pre) * (pre > threshold)
  recons = f @ W_dec + b_dec                        hook_sae_recons (= hook_sae_output without the error term)

Each folder holds cfg.json (json.dump of the SAE config's to_dict(), as SAE.save_model writes it: no indent,
no final newline) and sae_weights.safetensors (F32: W_enc (d_in, d_sae), W_dec (d_sae, d_in), b_enc (d_sae),
b_dec (d_in), and jumprelu's threshold (d_sae), stored as the threshold, not its log). Cases, each pair with the
same weights and inputs, so the two layouts must load to the same SAE:
  relu_v5, relu_v6           architecture "standard", apply_b_dec_to_input true
  topk_v5, topk_v6           k 4: v5 spells it architecture "topk", activation_fn_str "topk",
                             activation_fn_kwargs {"k": 4}; v6 a top-level "k" (rescale_acts_by_decoder_norm
                             false); one input row is b_dec, so pre = b_enc there, with only 2 positive entries:
                             fewer than k features fire on it
  jumprelu_v5, jumprelu_v6   Gemma Scope's: apply_b_dec_to_input false, positive per-feature thresholds placed
                             0.01 above or below one input's pre-activation; v5's normalize_activations is null,
                             as SAELens v5 saves a Gemma Scope SAE it loaded
  transcoder_v6,             SAELens's transcoders (sae_lens/saes/transcoder.py): "transcoder" (relu) and
  jumprelu_transcoder_v6     "jumprelu_transcoder", d_out 6 (W_dec (d_sae, 6), b_dec (6)), hook_name_out; the
                             input never has b_dec subtracted although apply_b_dec_to_input is saved true
                             (SAEConfig's default, which Transcoder.process_sae_in ignores)
v5 is the flat layout (model and hook fields top-level, SAELens v3 to v5); v6 moves them under "metadata",
whose sae_lens_version >= 6.0.0 is what tells SAELens the layout.

reference.safetensors: per case, <case>.x (5, d_in), <case>.acts_pre, <case>.acts_post (5, d_sae) and
<case>.recons (5, d_in), float64 results stored as F32.

Usage: /usr/bin/python3 tools/fixtures_sae.py [--out tests/fixtures/sae]
(needs python3-numpy and python3-torch, for the safetensors writer: scripts/install-deps.sh --python)
"""
import argparse
import json
import os

import numpy as np
import torch

from fixtures_gpt2_folders import write_safetensors

D_IN, D_SAE, K, ROWS, D_OUT = 8, 24, 4, 5, 6
# A value of pre this far from a threshold (or from the k-th largest) is on the same side in float32.
MARGIN = 4e-3


def f32(a):
    return np.asarray(a, dtype=np.float32).astype(np.float64)  # float32 values, computed on in float64


def encode(arch, w, x, apply_b_dec):
    pre = ((x - w["b_dec"]) if apply_b_dec else x) @ w["W_enc"] + w["b_enc"]
    if arch == "standard":
        post = np.maximum(pre, 0)
    elif arch == "topk":
        post = np.zeros_like(pre)
        top = np.argsort(-pre, axis=-1, kind="stable")[:, :K]
        np.put_along_axis(post, top, np.maximum(np.take_along_axis(pre, top, -1), 0), -1)
    else:
        post = np.maximum(pre, 0) * (pre > w["threshold"])
    return pre, post


def weights(arch, seed, d_out=D_IN):
    """float32-valued weights and inputs (x: ROWS rows) for one architecture."""
    rng = np.random.default_rng(seed)
    w = {"W_enc": f32(rng.normal(0, 0.5, (D_IN, D_SAE))), "W_dec": f32(rng.normal(0, 0.4, (D_SAE, d_out))),
         "b_enc": f32(rng.normal(0, 0.2, D_SAE)), "b_dec": f32(rng.normal(0, 0.3, d_out))}
    x = f32(rng.normal(0, 1.0, (ROWS, D_IN)))
    if arch == "topk":
        # b_enc mostly negative and x[-1] = b_dec: that row's pre is b_enc itself, with 2 positive entries.
        b = -np.abs(w["b_enc"]) - 0.02
        b[[3, 17]] = [0.15, 0.3]
        w["b_enc"], x[-1] = f32(b), w["b_dec"]
        pre = encode(arch, w, x, True)[0]
        s = -np.sort(-pre, axis=-1)
        # the k-th largest clear of the next (where it is negative ReLU zeroes either)
        assert np.all((s[:, K - 1] - s[:, K] > MARGIN) | (s[:, K - 1] < -MARGIN)) and (pre[-1] > 0).sum() == 2
    if arch == "jumprelu":
        pre = encode("standard", w, x, False)[0]
        thr = np.full(D_SAE, 0.1)
        for j in range(D_SAE):
            # feature j: the threshold 0.01 under (even j: that input fires) or over (odd j: it does not) one
            # input's positive pre, the median one first, so that other inputs fire and others are cut too
            cand = np.sort(pre[pre[:, j] > 0.02, j])
            for v in sorted(cand, key=lambda v: abs(v - cand[len(cand) // 2])):
                t = float(np.float32(v - 0.01 if j % 2 == 0 else v + 0.01))
                if np.all(np.abs(pre[:, j] - t) > MARGIN):
                    thr[j] = t
                    break
        w["threshold"] = f32(thr)
        assert np.all(np.abs(pre - w["threshold"]) > MARGIN) and np.all(w["threshold"] > 0)
    return w, x


def cfg_v5(arch):
    """SAEConfig.to_dict() of sae_lens/sae.py v5.11.0, key for key."""
    jump = arch == "jumprelu"
    hook, layer = {"standard": ("blocks.0.hook_resid_pre", 0), "topk": ("blocks.1.hook_mlp_out", 1),
                   "jumprelu": ("blocks.1.hook_resid_post", 1)}[arch]
    return {"architecture": arch, "d_in": D_IN, "d_sae": D_SAE, "dtype": "float32", "device": "cpu",
            "model_name": "gemma-2-2b" if jump else "gpt2", "hook_name": hook, "hook_layer": layer,
            "hook_head_index": None, "activation_fn_str": "topk" if arch == "topk" else "relu",
            "activation_fn_kwargs": {"k": K} if arch == "topk" else {}, "apply_b_dec_to_input": not jump,
            "finetuning_scaling_factor": False, "sae_lens_training_version": None if jump else "5.11.0",
            "prepend_bos": True, "dataset_path": "monology/pile-uncopyrighted" if jump else "Skylion007/openwebtext",
            "dataset_trust_remote_code": True, "context_size": 1024 if jump else 128,
            "normalize_activations": None if jump else "none", "neuronpedia_id": None,
            "model_from_pretrained_kwargs": {}, "seqpos_slice": [None]}


def cfg_v6(arch):
    """SAEConfig.to_dict() of sae_lens/saes/sae.py v6.18.0: the dataclass fields, metadata, architecture last."""
    old = cfg_v5(arch)
    c = {"d_in": D_IN, "d_sae": D_SAE, "dtype": "float32", "device": "cpu",
         "apply_b_dec_to_input": old["apply_b_dec_to_input"], "normalize_activations": "none",
         "reshape_activations": "none"}
    if arch == "jumprelu":
        # what handle_pre_6_0_config makes of the Gemma Scope loader's config
        c["metadata"] = {"sae_lens_version": "6.18.0", "sae_lens_training_version": None, "model_name": "gemma-2-2b",
                         "hook_name": old["hook_name"], "hook_head_index": None, "prepend_bos": True,
                         "dataset_path": old["dataset_path"], "context_size": 1024, "neuronpedia_id": None}
    else:
        # what LanguageModelSAETrainingRunner._set_sae_metadata records
        c["metadata"] = {"sae_lens_version": "6.18.0", "sae_lens_training_version": "6.18.0",
                         "dataset_path": old["dataset_path"], "hook_name": old["hook_name"], "model_name": "gpt2",
                         "model_class_name": "HookedTransformer", "hook_head_index": None, "context_size": 128,
                         "seqpos_slice": [None], "model_from_pretrained_kwargs": {}, "prepend_bos": True,
                         "exclude_special_tokens": False, "sequence_separator_token": "bos",
                         "disable_concat_sequences": False}
    if arch == "topk":
        c.update(k=K, rescale_acts_by_decoder_norm=False)
    c["architecture"] = arch
    return c


def cfg_transcoder(arch):
    """TranscoderConfig.to_dict() of sae_lens/saes/transcoder.py: SAEConfig's, then the output hook's fields."""
    c = cfg_v6(arch)
    c["apply_b_dec_to_input"] = True  # SAEConfig's default; a transcoder ignores it
    c["metadata"]["hook_name"] = "blocks.1.ln2.hook_normalized"
    c["architecture"] = {"standard": "transcoder", "jumprelu": "jumprelu_transcoder"}[arch]
    c.update(d_out=D_OUT, hook_name_out="blocks.1.hook_mlp_out", hook_layer_out=1, hook_head_index_out=None)
    return c


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", "sae"))
    args = ap.parse_args()
    reference, cases = {}, []
    for seed, (name, arch) in enumerate((("relu", "standard"), ("topk", "topk"), ("jumprelu", "jumprelu"))):
        w, x = weights(arch, 700 + seed)
        pre, post = encode(arch, w, x, arch != "jumprelu")
        recons = post @ w["W_dec"] + w["b_dec"]
        for layout, cfg in (("v5", cfg_v5(arch)), ("v6", cfg_v6(arch))):
            cases.append((f"{name}_{layout}", cfg, w, x, pre, post, recons))
    for seed, (name, arch) in enumerate((("transcoder", "standard"), ("jumprelu_transcoder", "jumprelu"))):
        w, x = weights(arch, 710 + seed, D_OUT)
        pre, post = encode(arch, w, x, False)
        cases.append((f"{name}_v6", cfg_transcoder(arch), w, x, pre, post, post @ w["W_dec"] + w["b_dec"]))
    for case, cfg, w, x, pre, post, recons in cases:
        folder = os.path.join(args.out, case)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "cfg.json"), "w") as f:
            json.dump(cfg, f)
        write_safetensors(os.path.join(folder, "sae_weights.safetensors"),
                          {k: torch.from_numpy(v.astype(np.float32)) for k, v in w.items()}, "F32")
        for key, v in (("x", x), ("acts_pre", pre), ("acts_post", post), ("recons", recons)):
            reference[f"{case}.{key}"] = torch.from_numpy(v.astype(np.float32))
    write_safetensors(os.path.join(args.out, "reference.safetensors"), reference, "F32")


if __name__ == "__main__":
    main()
