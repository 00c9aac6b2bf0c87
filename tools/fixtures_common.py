"""Shared writers for tools/make_fixtures.py: the deterministic HDF5 writer, the module-fixture
runner (forward, loss = sum(output * loss_weight), backward, write), the call conventions (each call
function's docstring is the `call` attribute and index.json's "call"), the index being built, and the
helpers the verification uses to read a fixture back. The fixture sets are in fixtures_d2l.py,
fixtures_book.py and fixtures_optim.py.
"""
import json
import os

import h5py
import numpy as np
import torch

from headlab_hdf5 import set_dset_no_attrs_hint, set_link_phase_change

# ----------------------------------------------------------------------------------------------
# HDF5 writing (deterministic: no timestamps, 1.8 file format = compact groups, small files; the
# two size-saving properties h5py 3.7 does not expose are set through headlab_hdf5, and where they
# cannot be, files are bigger with the same content).
# ----------------------------------------------------------------------------------------------


def _gcpl():
    gcpl = h5py.h5p.create(h5py.h5p.GROUP_CREATE)
    gcpl.set_obj_track_times(False)  # no timestamps: re-runs give byte-identical files
    set_link_phase_change(gcpl, 10000, 9000)  # links stay in the object header (compact)
    return gcpl


def _ensure_group(f, path):
    g = f
    for part in [p for p in path.split("/") if p]:
        if part not in g:
            h5py.h5g.create(g.id, part.encode(), gcpl=_gcpl())
        g = g[part]
    return g


def _np(t):
    if isinstance(t, torch.Tensor):
        t = t.detach().cpu()
        t = t.to(torch.float64) if t.is_floating_point() else t.to(torch.int64)
        t = t.numpy()
    a = np.asarray(t)  # (np.ascontiguousarray would turn 0-d into 1-d)
    return np.require(a.astype("<f8") if a.dtype.kind == "f" else a.astype("<i8"), requirements="C")


def _dataset(g, name, arr):
    """Contiguous float64 / int64 little-endian dataset; scalar dataspace for 0-d arrays."""
    space = h5py.h5s.create(h5py.h5s.SCALAR) if arr.ndim == 0 else h5py.h5s.create_simple(arr.shape)
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_obj_track_times(False)
    set_dset_no_attrs_hint(dcpl)  # minimal object header: halves the per-dataset cost
    ftype = h5py.h5t.IEEE_F64LE if arr.dtype.kind == "f" else h5py.h5t.STD_I64LE
    d = h5py.h5d.create(g.id, name.encode(), ftype, space, dcpl=dcpl)
    d.write(h5py.h5s.ALL, h5py.h5s.ALL, arr)


def write_h5(path, attrs, data, groups=()):
    """attrs: root attributes (str); data: {"group/.../name": tensor/array}; groups: made even if empty."""
    tmp = path + ".tmp"
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_libver_bounds(h5py.h5f.LIBVER_V18, h5py.h5f.LIBVER_V18)  # 1.8 format: compact groups
    fcpl = h5py.h5p.create(h5py.h5p.FILE_CREATE)
    fcpl.set_obj_track_times(False)  # the root group too
    set_link_phase_change(fcpl, 10000, 9000)
    fid = h5py.h5f.create(tmp.encode(), h5py.h5f.ACC_TRUNC, fapl=fapl, fcpl=fcpl)
    with h5py.File(fid) as f:
        for k in sorted(attrs):
            # fixed-length UTF-8 strings: variable-length ones would cost a 4 KiB global heap per file
            b = attrs[k].encode("utf-8")
            f.attrs.create(k, np.array(b, dtype=f"S{max(1, len(b))}"),
                           dtype=h5py.string_dtype("utf-8", max(1, len(b))))
        for grp in groups:
            _ensure_group(f, grp)
        for key in data:
            grp_path, name = key.rsplit("/", 1) if "/" in key else ("", key)
            _dataset(_ensure_group(f, grp_path), name, _np(data[key]))
    os.replace(tmp, path)

# ----------------------------------------------------------------------------------------------
# Module fixtures: the runner, its call conventions and the index (index.json's "files")
# ----------------------------------------------------------------------------------------------

INDEX = []


def params_of(model):
    """Parameters under their state_dict names (buffers such as causal masks are not parameters)."""
    return list(model.named_parameters())


def run_module(out_dir, fname, module, config, description, model, call, inputs, gates=None,
               seed=0, perturb=()):
    """Forward with the given inputs, loss = sum(output * loss_weight), backward, write the file.

    call(model, inputs, gates) -> output; model.attention_weights is stored when present.
    inputs: {name: tensor}; float tensors get gradients, int64 ones (valid_lens, idx) do not.
    """
    model.eval()  # dropout p = 0 anyway; eval keeps dropout from touching the RNG
    torch.manual_seed(seed + 7919)
    with torch.no_grad():  # move affine params off their ones/zeros init so swaps would show
        for nm, p in model.named_parameters():
            if nm.split(".")[-1] in perturb:
                p.add_(0.3 * torch.randn_like(p))
    leaves = {}
    for k, v in inputs.items():
        if v is not None and v.is_floating_point():
            v = v.detach().clone().requires_grad_(True)
        leaves[k] = v
    g = None
    if gates is not None:
        g = torch.as_tensor(gates, dtype=torch.float64).clone().requires_grad_(True)
    params = params_of(model)
    init = {f"params/{n}": p.detach().clone() for n, p in params}
    out = call(model, leaves, g)
    loss_weight = torch.randn(out.shape)
    (out * loss_weight).sum().backward()
    data = dict(init)
    for k, v in leaves.items():
        if v is not None:
            data[f"inputs/{k}"] = v
    if g is not None:
        data["inputs/gates"] = g
    data["inputs/loss_weight"] = loss_weight
    data["outputs/output"] = out
    if getattr(model, "attention_weights", None) is not None:
        data["outputs/attention_weights"] = model.attention_weights
    for k, v in leaves.items():
        if v is not None and v.is_floating_point():
            assert torch.isfinite(v.grad).all()
            data[f"grads/inputs/{k}"] = v.grad
    if g is not None:
        data["grads/inputs/gates"] = g.grad
    for n, p in params:
        gr = p.grad if p.grad is not None else torch.zeros_like(p)
        assert torch.isfinite(gr).all()
        data[f"grads/params/{n}"] = gr
    for k, v in data.items():
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            assert torch.isfinite(v).all(), (fname, k)
    attrs = {"module": module, "config": json.dumps(config, sort_keys=True),
             "description": description, "call": call.__doc__}
    write_h5(os.path.join(out_dir, fname), attrs, data, groups=("params", "inputs", "outputs", "grads/params"))
    INDEX.append({"file": fname, "kind": "module", "module": module, "config": config,
                  "call": call.__doc__, "description": description})


def call_qkv(m, i, g):
    """module(queries, keys, values, valid_lens)"""
    return m(i["queries"], i["keys"], i["values"], i.get("valid_lens"))


def call_qkv_gates(m, i, g):
    """module(queries, keys, values, valid_lens, gates)"""
    return m(i["queries"], i["keys"], i["values"], i.get("valid_lens"), g)


def call_xxx_gates(m, i, g):
    """module(x, x, x, valid_lens, gates)"""
    return m(i["x"], i["x"], i["x"], i.get("valid_lens"), g)


def call_x(m, i, g):
    """module(x)"""
    return m(i["x"])


def call_x_gates(m, i, g):
    """module(x, gates)"""
    return m(i["x"], g)


def call_idx(m, i, g):
    """module(idx)"""
    return m(i["idx"])



def call_masked_softmax(m, i, g):
    """masked_softmax(x, valid_lens)"""
    return m(i["x"], i.get("valid_lens"))


def vl(v):
    return None if v is None else torch.tensor(v, dtype=torch.int64)



# d2l's Transformer (tools/fixtures_transformer.py): decoder states are built inside the call, from
# enc_outputs / enc_valid_lens with an empty cache, as d2l's init_state does.


def call_x_y(m, i, g):
    """module(x, y)"""
    return m(i["x"], i["y"])


def call_x_valid_lens(m, i, g):
    """module(x, valid_lens)"""
    return m(i["x"], i.get("valid_lens"))


def call_x_enc(m, i, g):
    """module(x, enc_outputs, enc_valid_lens)"""
    return m(i["x"], [i["enc_outputs"], i.get("enc_valid_lens"), [None] * (m.i + 1)])[0]


def call_idx_valid_lens(m, i, g):
    """module(idx, valid_lens)"""
    return m(i["idx"], i.get("valid_lens"))


def call_idx_enc(m, i, g):
    """module(idx, enc_outputs, enc_valid_lens)"""
    return m(i["idx"], m.init_state(i["enc_outputs"], i.get("enc_valid_lens")))[0]


def call_enc_dec_gates(m, i, g):
    """module(enc_X, dec_X, enc_valid_lens, gates)"""
    return m(i["enc_X"], i["dec_X"], i.get("enc_valid_lens"), g)[0]


def call_enc_dec_masked_ce(m, i, g):
    """masked_ce(module(enc_X, dec_X, enc_valid_lens), label, label_valid_len)"""
    from fixtures_transformer import masked_ce  # (it imports this module)
    return masked_ce(m(i["enc_X"], i["dec_X"], i.get("enc_valid_lens"))[0], i["label"], i["label_valid_len"])


CALL_FNS = {fn.__doc__: fn for fn in (call_qkv, call_qkv_gates, call_xxx_gates, call_x, call_x_gates, call_idx,
                                      call_masked_softmax, call_x_y, call_x_valid_lens, call_x_enc,
                                      call_idx_valid_lens, call_idx_enc, call_enc_dec_gates,
                                      call_enc_dec_masked_ce)}


# ----------------------------------------------------------------------------------------------
# Reading a fixture back (make_fixtures.verify and the per-kind verifiers)
# ----------------------------------------------------------------------------------------------


def read_group(f, group):
    if group not in f:
        return {}
    return {k: torch.from_numpy(np.asarray(f[group][k][()])) for k in f[group]}  # (0-d: np.float64)


def assert_close(a, b, what):
    assert a.shape == b.shape and torch.allclose(a, b, rtol=1e-12, atol=1e-13), what


def load_params(model, params):
    missing, unexpected = model.load_state_dict(params, strict=False)
    assert not unexpected and all(k.endswith("mask") for k in missing), (missing, unexpected)

