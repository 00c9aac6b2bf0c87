"""PyTorch files (torch.save) in every layout and variant headlab reads, and hostile ones it must refuse
(tests/fixtures/torch_files/), written by Debian's python3-torch.

Values (what the restricted unpickler must rebuild), each checked against values.safetensors (the same tensors as
float32, written by hand):
  values.pt           a state_dict of float32, float64, float16, bfloat16, int64 and bool tensors; views sharing one
                      storage (a slice at an offset, a transpose, a strided column); a 0-dim and an empty tensor
  big_endian.pt       values.pt's float tensors with byteorder "big" and every element's bytes swapped
  nested.pt           {"model": state_dict, "optimizer": Adam's state_dict, "scheduler": StepLR's, "args": an
                      argparse.Namespace (an object headlab must skip, never build), "epoch", "losses", "config"}
Models, against tests/fixtures/gpt2_folders/reference.json (the GPT-2 twin written out in torch there):
  gpt2_bin/           GPT-2's Hugging Face folder with pytorch_model.bin instead of model.safetensors
  gpt2_bin_sharded/   the same in two shards with pytorch_model.bin.index.json
  nanogpt/ckpt.pt     nanoGPT's checkpoint: model_args, "_orig_mod." names (torch.compile), nn.Linear (out, in)
                      weights, the optimizer's state, iter_num, best_val_loss, config
  nanogpt_nobias/ckpt.pt  bias=False: no biases anywhere (the reference: the twin with zero biases, in
                      nanogpt_nobias.json)
  lens_gpt2.pt        TransformerLens's HookedTransformer state_dict with its cfg ({"cfg", "state_dict"}), the
                      weights of tests/fixtures/hooked/lens_gpt2 put back in TransformerLens's layout (its twin's
                      logits are in tests/fixtures/hooked/reference.json)
Hostile (each must be an error naming the file and the global or field, never run):
  evil_os_system.pt   the saved object is os.system("touch /tmp/headlab_pwned")
  evil_eval_entry.pt  a state_dict whose entry is builtins.eval("...")
  lying_storage.pt    a storage the pickle says has 10^12 elements; its file holds 16 bytes
  past_storage.pt     a tensor of 64 elements at offset 8 in a storage of 16
  legacy.pt           torch.save(..., _use_new_zipfile_serialization=False): the legacy format
  torchscript.pt      torch.jit.save of a Linear: a TorchScript archive

Usage: python3 tools/fixtures_torch_files.py [--out tests/fixtures/torch_files]
(needs python3-torch: scripts/install-deps.sh --python)
"""
import argparse
import collections
import io
import json
import os
import pickle
import struct
import zipfile

import torch

from fixtures_gpt2_folders import CONFIG, gpt2_logits, random_weights, write_safetensors


def values_state_dict():
    g = torch.Generator().manual_seed(3)
    base = torch.randn(6, 8, generator=g)
    sd = collections.OrderedDict()
    sd["f32"] = torch.randn(3, 4, generator=g)
    sd["f64"] = torch.randn(5, generator=g, dtype=torch.float64)
    sd["f16"] = torch.randn(2, 3, generator=g).half()
    sd["bf16"] = torch.randn(4, 2, generator=g).bfloat16()
    sd["i64"] = torch.arange(-3, 9, dtype=torch.int64).view(3, 4)
    sd["bool"] = torch.tensor([True, False, True])
    sd["base"] = base
    sd["slice"] = base[2:4]            # offset 16 in base's storage
    sd["transposed"] = base.t()        # strides (1, 8)
    sd["column"] = base[:, 3]          # stride 8, offset 3
    sd["scalar"] = torch.tensor(2.5)
    sd["empty"] = torch.zeros(0, 3)
    sd["param"] = torch.nn.Parameter(torch.randn(2, 2, generator=g))
    return sd


def as_float32(sd):
    return {k: (v.detach().to(torch.float32).contiguous()) for k, v in sd.items()}


def write_big_endian(src, dst):
    """src (a torch.save zip of float32/float64/int64 storages) rewritten as a big-endian machine saves it."""
    sizes = {}
    with zipfile.ZipFile(src) as z:
        pkl = [n for n in z.namelist() if n.endswith("data.pkl")][0]
        prefix = pkl[: -len("data.pkl")]
        # Which storage holds which element size: from the pickle's persistent ids.
        class Reader(pickle.Unpickler):
            def find_class(self, module, name):
                if module == "torch" and name.endswith("Storage"):
                    return name
                if module == "collections":
                    return collections.OrderedDict
                return lambda *a, **k: None

            def persistent_load(self, pid):
                size = {"FloatStorage": 4, "DoubleStorage": 8, "LongStorage": 8, "HalfStorage": 2,
                        "BFloat16Storage": 2, "BoolStorage": 1}[pid[1]]
                sizes[pid[2]] = size
                return None

        Reader(io.BytesIO(z.read(pkl))).load()
        with zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as out:
            for info in z.infolist():
                data = z.read(info.filename)
                rest = info.filename[len(prefix):]
                if rest.startswith("data/"):
                    n = sizes[rest[len("data/"):]]
                    data = b"".join(data[i:i + n][::-1] for i in range(0, len(data), n))
                if rest == "byteorder":
                    data = b"big"
                out.writestr(info.filename, data)
            if prefix + "byteorder" not in z.namelist():
                out.writestr(prefix + "byteorder", b"big")


class Evil:
    def __init__(self, f, arg):
        self.f, self.arg = f, arg

    def __reduce__(self):
        return (self.f, (self.arg,))


def zip_with_pickle(path, obj_bytes, storages=None):
    """A torch.save-shaped archive: archive/data.pkl = obj_bytes, archive/data/<key> = bytes."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", obj_bytes)
        z.writestr("archive/byteorder", b"little")
        for key, data in (storages or {}).items():
            z.writestr("archive/data/" + key, data)
        z.writestr("archive/version", b"3\n")


class StoragePickler(pickle.Pickler):
    """Pickles a tensor as torch.save does, with the storage size and the tensor's offset and size we choose."""

    def __init__(self, f, numel, offset, size):
        super().__init__(f, protocol=2)
        self.numel, self.offset, self.size = numel, offset, size

    def persistent_id(self, obj):
        if isinstance(obj, FakeStorage):
            return ("storage", torch.FloatStorage, "0", "cpu", self.numel)
        return None


class FakeStorage:
    pass


class FakeTensor:
    def __init__(self, pickler):
        self.p = pickler

    def __reduce__(self):
        p = self.p
        return (torch._utils._rebuild_tensor_v2,
                (FakeStorage(), p.offset, (p.size,), (1,), False, collections.OrderedDict()))


def hostile_storage(path, numel, offset, size, data):
    buf = io.BytesIO()
    p = StoragePickler(buf, numel, offset, size)
    p.dump(collections.OrderedDict([("w", FakeTensor(p))]))
    zip_with_pickle(path, buf.getvalue(), {"0": data})


def nanogpt_state_dict(w, bias):
    """GPT-2's weights under nanoGPT's names: nn.Linear (out, in), "_orig_mod." from torch.compile."""
    sd = collections.OrderedDict()
    for k, v in w.items():
        linear = k.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight"))
        if not bias and k.endswith(".bias"):
            continue
        sd["_orig_mod.transformer." + k] = v.t().contiguous() if linear else v.clone()
    sd["_orig_mod.lm_head.weight"] = sd["_orig_mod.transformer.wte.weight"]  # nanoGPT ties them: one storage
    return sd


def nanogpt_checkpoint(w, bias):
    sd = nanogpt_state_dict(w, bias)
    model_args = dict(n_layer=CONFIG["n_layer"], n_head=CONFIG["n_head"], n_embd=CONFIG["n_embd"],
                      block_size=CONFIG["n_positions"], bias=bias, vocab_size=CONFIG["vocab_size"], dropout=0.0)
    params = [p for k, p in sd.items() if k != "_orig_mod.lm_head.weight"]
    params = [torch.nn.Parameter(p.clone()) for p in params]
    opt = torch.optim.AdamW(params, lr=1e-3)
    sum((p * p).sum() for p in params).backward()
    opt.step()
    return {"model": sd, "optimizer": opt.state_dict(), "model_args": model_args, "iter_num": 5000,
            "best_val_loss": torch.tensor(1.4697), "config": {"dataset": "shakespeare", "compile": True}}


def read_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        out[name] = torch.frombuffer(bytearray(raw[8 + n + b:8 + n + end]), dtype=torch.float32).view(e["shape"])
    return out


def transformerlens_state_dict(w, section):
    """headlab's names back in TransformerLens's HookedTransformer layout (the inverse of the reader's mapping)."""
    C, H, D = section["emb_dim"], section["n_heads"], section["head_dim"]
    sd = collections.OrderedDict([("embed.W_E", w["tok_emb.weight"]), ("pos_embed.W_pos", w["pos_emb.weight"])])
    for l in range(section["n_layers"]):
        b, o = f"blocks.{l}.", f"trf_blocks.{l}."
        sd[b + "ln1.w"], sd[b + "ln1.b"] = w[o + "norm1.weight"], w[o + "norm1.bias"]
        for tl, ours in (("Q", "W_query"), ("K", "W_key"), ("V", "W_value")):
            sd[b + "attn.W_" + tl] = w[o + "att." + ours + ".weight"].view(H, D, C).permute(0, 2, 1).contiguous()
            sd[b + "attn.b_" + tl] = w[o + "att." + ours + ".bias"].view(H, D)
        sd[b + "attn.W_O"] = w[o + "att.out_proj.weight"].t().contiguous().view(H, D, C)
        sd[b + "attn.b_O"] = w[o + "att.out_proj.bias"]
        sd[b + "attn.IGNORE"] = torch.tensor(-1e5)
        sd[b + "ln2.w"], sd[b + "ln2.b"] = w[o + "norm2.weight"], w[o + "norm2.bias"]
        sd[b + "mlp.W_in"], sd[b + "mlp.b_in"] = w[o + "ff.layers.0.weight"].t().contiguous(), w[o + "ff.layers.0.bias"]
        sd[b + "mlp.W_out"], sd[b + "mlp.b_out"] = w[o + "ff.layers.2.weight"].t().contiguous(), w[o + "ff.layers.2.bias"]
    sd["ln_final.w"], sd["ln_final.b"] = w["final_norm.weight"], w["final_norm.bias"]
    sd["unembed.W_U"], sd["unembed.b_U"] = w["out_head.weight"].t().contiguous(), w["out_head.bias"]
    return sd


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", "torch_files"))
    args = ap.parse_args()
    out = args.out
    os.makedirs(out, exist_ok=True)
    path = lambda *p: os.path.join(out, *p)  # noqa: E731

    sd = values_state_dict()
    torch.save(sd, path("values.pt"))
    write_safetensors(path("values.safetensors"), as_float32(sd), "F32")
    write_big_endian(path("values.pt"), path("big_endian.pt"))

    import argparse as ap_module
    g = torch.Generator().manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(5, 3, generator=g)).sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10)
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                "args": ap_module.Namespace(lr=0.01, name="run"), "epoch": 7, "losses": [1.5, 0.25],
                "config": {"p": 113, "d_model": 128, "fn_name": "add"}}, path("nested.pt"))
    write_safetensors(path("nested.safetensors"), as_float32(model.state_dict()), "F32")

    # GPT-2 as a Hugging Face folder of .bin files, from the gpt2_folders fixture's weights.
    w, _ = random_weights(1234)
    prefixed = collections.OrderedDict(("transformer." + k, v) for k, v in w.items())
    config = json.load(open(os.path.join(here, "..", "tests", "fixtures", "gpt2_folders", "lm_head_model",
                                         "config.json")))
    for name, shards in (("gpt2_bin", 1), ("gpt2_bin_sharded", 2)):
        os.makedirs(path(name), exist_ok=True)
        json.dump(config, open(path(name, "config.json"), "w"), indent=2)
        if shards == 1:
            torch.save(prefixed, path(name, "pytorch_model.bin"))
            continue
        names, weight_map = list(prefixed), {}
        for s in range(shards):
            file = f"pytorch_model-{s + 1:05d}-of-{shards:05d}.bin"
            torch.save(collections.OrderedDict((n, prefixed[n]) for n in names[s::shards]), path(name, file))
            weight_map.update({n: file for n in names[s::shards]})
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map},
                  open(path(name, "pytorch_model.bin.index.json"), "w"), indent=2, sort_keys=True)

    for name, bias in (("nanogpt", True), ("nanogpt_nobias", False)):
        os.makedirs(path(name), exist_ok=True)
        torch.save(nanogpt_checkpoint(w, bias), path(name, "ckpt.pt"))
    zero_bias = {k: (torch.zeros_like(v) if k.endswith(".bias") else v) for k, v in w.items()}
    ids = torch.tensor(json.load(open(os.path.join(here, "..", "tests", "fixtures", "gpt2_folders",
                                                   "reference.json")))["ids"])
    json.dump({"ids": ids.tolist(), "logits": gpt2_logits(zero_bias, ids).tolist()},
              open(path("nanogpt_nobias.json"), "w"))

    hooked = os.path.join(here, "..", "tests", "fixtures", "hooked")
    section = json.load(open(os.path.join(hooked, "reference.json")))["lens_gpt2"]["section"]
    cfg = {"d_model": section["emb_dim"], "n_heads": section["n_heads"], "d_head": section["head_dim"],
           "n_layers": section["n_layers"], "n_ctx": section["context_length"], "d_vocab": section["vocab_size"],
           "act_fn": "gelu_new", "normalization_type": "LN", "positional_embedding_type": "standard", "eps": 1e-5}
    torch.save({"cfg": cfg, "state_dict": transformerlens_state_dict(
        read_safetensors(os.path.join(hooked, "lens_gpt2.safetensors")), section)}, path("lens_gpt2.pt"))

    # Hostile files.
    import builtins
    zip_with_pickle(path("evil_os_system.pt"), pickle.dumps(Evil(os.system, "touch /tmp/headlab_pwned"), protocol=2))
    zip_with_pickle(path("evil_eval_entry.pt"),
                    pickle.dumps(collections.OrderedDict([("w", Evil(builtins.eval, "open('/tmp/headlab_pwned', 'w')"))]), protocol=2))
    hostile_storage(path("lying_storage.pt"), 10 ** 12, 0, 4, b"\0" * 16)
    hostile_storage(path("past_storage.pt"), 16, 8, 64, b"\0" * 64)
    torch.save(collections.OrderedDict([("w", torch.ones(2))]), path("legacy.pt"), _use_new_zipfile_serialization=False)
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), path("torchscript.pt"))


if __name__ == "__main__":
    main()
