#!/usr/bin/python3
"""Generate extra PyTorch 1.13 DCP test cases for interop/torchdcp.

Cases (each written to <out>/<case>/ with .metadata, __R_N.distcp and expected.json):

  partial_optim  1 rank, single_file_per_rank=True. The sparse_optim model (TinyMLP plus a
                 trainable unused_head.weight that never gets a gradient) after one AdamW
                 step, with optimizer.state.fc2.bias.exp_avg_sq DELETED from the flattened
                 state before saving: fc2.bias has step and exp_avg but lacks exp_avg_sq
                 (partial optimizer state, resume rule 2), while unused_head.weight has no
                 state at all (lazy, rule 1).
  sharded_2rank  2 gloo ranks on loopback (torch.multiprocessing.spawn),
                 single_file_per_rank=True. Two ShardedTensors built with
                 init_from_local_shards: model.emb.weight [5,4] split on dim 0 into 3+2 rows
                 and model.proj.weight [3,6] split on dim 1 into 3+3 columns; replicated
                 plain tensors model.bias [4], model.tw [3,4] (a transposed view, stored with
                 stride (1,3)) and model.conv.weight [2,3,2,2] (channels_last, stride
                 (12,1,6,3)); and the bytes item step=7. Each rank writes its own shards to
                 __<rank>_0.distcp; plain items are written by rank 0 only. After the save
                 every rank loads everything back with load_state_dict and checks it against
                 the reference tensors.
                 Also writes <out>/variants/sharded_2rank-drop-chunk.metadata: the same
                 Metadata with rank 1's chunk of model.emb.weight (offsets [3,0]) and its
                 storage_data entry removed, pickled by torch's own writer, for a
                 shard-coverage (gap) test.

How to run (Debian 12; torch 1.13 only exists as Debian's python3-torch, ~150 s):

    apt-get update && apt-get install -y python3-torch python3-numpy
    /usr/bin/python3 interop/torchdcp/testdata/gen/gen_dcp_fixtures.py \
        --out interop/torchdcp/testdata partial_optim sharded_2rank

The output is deterministic: seeds are fixed and torch.save's zip writer records no
timestamps, so a rerun reproduces every file byte for byte (checked by running twice).

Python 3.11 shim: torch 1.13's sharded_tensor/metadata.py uses
field(default=TensorProperties()), which Python 3.11 rejects, so nothing under
torch.distributed._shard imports. An import hook compiles that one module from its source
with the upstream fix (pytorch/pytorch PR #91795: default_factory=TensorProperties). The
installed file is not changed and module/class names (which end up in .metadata) are the
same. The hook is installed at module top level so spawned ranks get it too.

Keys are flattened with torch >= 2.4's flatten_state_dict rules (dicts and lists that hold
tensors or dicts are traversed, path elements joined with "."), like the existing fixtures;
torch 1.13's own planner does no flattening. Optimizer state is keyed by parameter FQN and
each group's "params" lists sorted FQNs (what FSDP.rekey_optim_state_dict produces).

expected.json (a subset of the fields of the original fixtures' manifests):
  keys[]: key, kind ("tensor"|"bytes"); tensors: dtype, shape, nbytes, sha256 (row-major
  little-endian bytes of the whole tensor) and chunks[] {offsets, sizes, file, offset,
  length, sha256, stored_stride, stored_is_contiguous}; bytes: file, offset, length, sha256_raw, python_type, value.
  absent_keys[], files{name: {size, sha256}}, partial{param, present[], missing[]}.
"""

import argparse
import hashlib
import importlib.abc
import importlib.machinery
import io
import json
import os
import pickle
import sys
import tempfile


class _Py311DataclassFix(importlib.abc.MetaPathFinder):
    """Compile torch 1.13's sharded_tensor/metadata.py with PR #91795's fix applied."""

    TARGET = "torch.distributed._shard.sharded_tensor.metadata"
    OLD = "field(default=TensorProperties())"
    NEW = "field(default_factory=TensorProperties)"

    def find_spec(self, name, path, target=None):
        if name != self.TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None:
            return None
        fix = self

        class Loader(importlib.machinery.SourceFileLoader):
            def get_code(self, fullname):
                # Never use the cached .pyc: it holds the unpatched code.
                src = self.get_data(self.path).decode()
                if fix.OLD in src:
                    src = src.replace(fix.OLD, fix.NEW)
                return compile(src, self.path, "exec", dont_inherit=True)

        spec.loader = Loader(spec.loader.name, spec.loader.path)
        return spec


sys.meta_path.insert(0, _Py311DataclassFix())

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.distributed._shard.checkpoint as dcp  # noqa: E402
from torch.distributed._shard import sharded_tensor  # noqa: E402
from torch.distributed._shard.metadata import ShardMetadata  # noqa: E402
from torch.distributed._shard.checkpoint.metadata import TensorStorageMetadata  # noqa: E402

CASES = ("partial_optim", "sharded_2rank")

DESCRIPTIONS = {
    "partial_optim": (
        "The sparse_optim model (TinyMLP fc1 Linear(8,16), norm LayerNorm(16), fc2 Linear(16,4), "
        "plus a trainable unused_head.weight Linear(16,3,bias=False) that never gets a gradient) "
        "after one AdamW step and StepLR.step(), flattened with torch>=2.4 key rules, with "
        "optimizer.state.fc2.bias.exp_avg_sq deleted before saving: fc2.bias has step and exp_avg "
        "but lacks exp_avg_sq (partial optimizer state); unused_head.weight has no state at all."
    ),
    "sharded_2rank": (
        "2 gloo ranks (torch.multiprocessing.spawn, loopback), single_file_per_rank=True. "
        "ShardedTensors from init_from_local_shards: model.emb.weight [5,4] float32 split on dim 0 "
        "(rank 0 rows 0-2, rank 1 rows 3-4) and model.proj.weight [3,6] float32 split on dim 1 "
        "(rank 0 columns 0-2, rank 1 columns 3-5); a replicated plain tensor model.bias [4] and "
        "the int step=7 (written by rank 0 only). Each rank's shards are in __<rank>_0.distcp."
    ),
}


# ---------------------------------------------------------------- flattening


def _has_tensor_or_dict(v):
    if isinstance(v, dict):
        return True
    if isinstance(v, list):
        return any(isinstance(x, torch.Tensor) or _has_tensor_or_dict(x) for x in v)
    return False


def flatten(obj, prefix=""):
    """torch>=2.4 flatten_state_dict key rules: dicts always traversed, lists only when they
    hold tensors or collections that must be traversed; tuples and other values are leaves."""
    out = {}
    if isinstance(obj, dict):
        items = [(str(k), v) for k, v in obj.items()]
    elif isinstance(obj, list) and _has_tensor_or_dict(obj):
        items = [(str(i), v) for i, v in enumerate(obj)]
    else:
        return {prefix: obj}
    for k, v in items:
        key = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict) or (isinstance(v, list) and _has_tensor_or_dict(v)):
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out


# ------------------------------------------------------------ process group


def init_pg(rank, world, init_file):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    store = dist.FileStore(init_file, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)


# --------------------------------------------------------------- the models


class TinyMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.fc2 = torch.nn.Linear(16, 4)
        self.unused_head = torch.nn.Linear(16, 3, bias=False)

    def forward(self, x):
        return self.fc2(torch.relu(self.norm(self.fc1(x))))  # unused_head: no gradient


def partial_optim_state():
    torch.manual_seed(1234)
    model = TinyMLP()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    x, y = torch.randn(5, 8), torch.randn(5, 4)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    sched.step()

    # Optimizer state keyed by parameter FQN (what FSDP.rekey_optim_state_dict gives).
    names = {id(p): n for n, p in model.named_parameters()}
    osd = opt.state_dict()
    id_to_name = {}
    for group, sgroup in zip(opt.param_groups, osd["param_groups"]):
        for p, pid in zip(group["params"], sgroup["params"]):
            id_to_name[pid] = names[id(p)]
    state = {id_to_name[pid]: dict(s) for pid, s in osd["state"].items()}
    groups = []
    for g in osd["param_groups"]:
        g = dict(g)
        g["params"] = sorted(id_to_name[pid] for pid in g["params"])
        groups.append(g)
    assert "unused_head.weight" not in state, "unused_head must have no lazy state"
    sd = {
        "model": model.state_dict(),
        "optimizer": {"state": state, "param_groups": groups},
        "step": 1,
        "scheduler": sched.state_dict(),
    }
    flat = flatten(sd)
    del flat["optimizer.state.fc2.bias.exp_avg_sq"]  # the partial save
    return flat


def sharded_reference():
    g = torch.Generator().manual_seed(99)
    return {
        "model.emb.weight": torch.randn(5, 4, generator=g),
        "model.proj.weight": torch.randn(3, 6, generator=g),
        "model.bias": torch.randn(4, generator=g),
        # Strided plain tensors: storage numel == numel, so DCP's _trim keeps the strides.
        "model.tw": torch.randn(4, 3, generator=g).t(),
        "model.conv.weight": torch.randn(2, 3, 2, 2, generator=g).to(memory_format=torch.channels_last),
    }


PLAIN = ("model.bias", "model.tw", "model.conv.weight")


# (key, dim, per-rank (lo, hi)) of the sharded tensors
SHARDS = [
    ("model.emb.weight", 0, [(0, 3), (3, 5)]),
    ("model.proj.weight", 1, [(0, 3), (3, 6)]),
]


def make_sharded(ref, dim, spans, rank, fill):
    full = ref
    lo, hi = spans[rank]
    local = full.narrow(dim, lo, hi - lo).clone() if fill else torch.zeros_like(full.narrow(dim, lo, hi - lo))
    offsets = [0] * full.dim()
    offsets[dim] = lo
    md = ShardMetadata(shard_offsets=offsets, shard_sizes=list(local.shape), placement=f"rank:{rank}/cpu")
    shards = [sharded_tensor.Shard(local, md)]
    return sharded_tensor.init_from_local_shards(shards, *full.shape)


def worker(rank, world, case, out, init_file):
    init_pg(rank, world, init_file)
    writer = dcp.FileSystemWriter(out, single_file_per_rank=True)
    if case == "partial_optim":
        dcp.save_state_dict(partial_optim_state(), writer)
    elif case == "sharded_2rank":
        ref = sharded_reference()
        sd = {k: make_sharded(ref[k], dim, spans, rank, True) for k, dim, spans in SHARDS}
        for k in PLAIN:
            sd[k] = ref[k]
        sd["step"] = 7
        dcp.save_state_dict(sd, writer)
        dist.barrier()
        # Load back with torch itself and compare with the reference.
        back = {k: make_sharded(ref[k], dim, spans, rank, False) for k, dim, spans in SHARDS}
        for k in PLAIN:
            back[k] = torch.zeros(ref[k].shape)
        dcp.load_state_dict(back, dcp.FileSystemReader(out))
        for k, dim, spans in SHARDS:
            lo, hi = spans[rank]
            got = back[k].local_shards()[0].tensor
            assert torch.equal(got, ref[k].narrow(dim, lo, hi - lo)), k
        for k in PLAIN:
            assert torch.equal(back[k], ref[k]), k
    else:
        raise ValueError(case)
    dist.barrier()
    dist.destroy_process_group()


# ------------------------------------------------------------ expected.json


def sha(b):
    return hashlib.sha256(b).hexdigest()


def tensor_bytes(t):
    return t.detach().contiguous().numpy().tobytes()


def jsonable(v):
    if isinstance(v, tuple):
        return {"__tuple__": [jsonable(x) for x in v]}
    if isinstance(v, list):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    return v


def manifest(case, out, world):
    md = dcp.FileSystemReader(out).read_metadata()
    storage = {(idx.fqn, tuple(idx.offset) if idx.offset is not None else None): info for idx, info in md.storage_data.items()}

    def item(info):
        with open(os.path.join(out, info.relative_path), "rb") as f:
            f.seek(info.offset)
            return f.read(info.length)

    keys = []
    for key, smd in md.state_dict_metadata.items():
        if isinstance(smd, TensorStorageMetadata):
            full = torch.zeros(tuple(smd.size), dtype=smd.properties.dtype)
            chunks = []
            for ch in smd.chunks:
                info = storage[(key, tuple(ch.offsets))]
                t = torch.load(io.BytesIO(item(info)))
                view = full
                for d, (o, s) in enumerate(zip(ch.offsets, ch.sizes)):
                    view = view.narrow(d, o, s)
                view.copy_(t)
                chunks.append({
                    "offsets": list(ch.offsets), "sizes": list(ch.sizes),
                    "file": info.relative_path, "offset": info.offset, "length": info.length,
                    "sha256": sha(tensor_bytes(t)), "stored_stride": list(t.stride()),
                    "stored_is_contiguous": t.is_contiguous(),
                })
            raw = tensor_bytes(full)
            keys.append({
                "key": key, "kind": "tensor", "dtype": str(smd.properties.dtype).removeprefix("torch."),
                "shape": list(smd.size), "nbytes": len(raw), "sha256": sha(raw), "chunks": chunks,
            })
        else:
            info = storage[(key, None)]
            b = item(info)
            v = torch.load(io.BytesIO(b))
            keys.append({
                "key": key, "kind": "bytes", "file": info.relative_path, "offset": info.offset,
                "length": info.length, "sha256_raw": sha(b),
                "python_type": f"{type(v).__module__}.{type(v).__qualname__}", "value": jsonable(v),
            })
    files = {}
    for name in sorted(os.listdir(out)):
        if name == "expected.json":
            continue
        with open(os.path.join(out, name), "rb") as f:
            b = f.read()
        files[name] = {"size": len(b), "sha256": sha(b)}
    doc = {
        "case": case,
        "description": DESCRIPTIONS[case],
        "generator": "interop/torchdcp/testdata/gen/gen_dcp_fixtures.py",
        "writer": {
            "torch_version": torch.__version__,
            "python": sys.version.split()[0],
            "dcp_module": "torch.distributed._shard.checkpoint",
            "save_api": "torch.distributed._shard.checkpoint.save_state_dict + FileSystemWriter(single_file_per_rank=True)",
            "py311_shim_applied": True,
        },
        "world_size": world,
        "files": files,
        "keys": keys,
    }
    if case == "partial_optim":
        doc["absent_keys"] = [
            "optimizer.state.fc2.bias.exp_avg_sq",
            "optimizer.state.unused_head.weight.step",
            "optimizer.state.unused_head.weight.exp_avg",
            "optimizer.state.unused_head.weight.exp_avg_sq",
        ]
        doc["partial"] = {
            "param": "fc2.bias",
            "present": ["optimizer.state.fc2.bias.exp_avg", "optimizer.state.fc2.bias.step"],
            "missing": ["optimizer.state.fc2.bias.exp_avg_sq"],
        }
        doc["lazy_params"] = ["unused_head.weight"]
        for k in doc["absent_keys"]:
            assert k not in md.state_dict_metadata, k
    if case == "sharded_2rank":
        ref = sharded_reference()
        for k in keys:
            if k["key"] in ref:
                assert k["sha256"] == sha(tensor_bytes(ref[k["key"]])), k["key"]
        strides = {k["key"]: k["chunks"][0]["stored_stride"] for k in keys if k["kind"] == "tensor"}
        assert strides["model.tw"] == [1, 3], strides
        assert strides["model.conv.weight"] == [12, 1, 6, 3], strides
        write_drop_chunk(md, os.path.join(os.path.dirname(out), "variants"))
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


def write_drop_chunk(md, variants):
    """Pickle md with rank 1's chunk of model.emb.weight removed (a gap at rows 3-4)."""
    tsm = md.state_dict_metadata["model.emb.weight"]
    drop = [c for c in tsm.chunks if list(c.offsets) == [3, 0]]
    assert len(drop) == 1
    tsm.chunks = [c for c in tsm.chunks if list(c.offsets) != [3, 0]]
    for idx in [i for i in md.storage_data if i.fqn == "model.emb.weight" and list(i.offset) == [3, 0]]:
        del md.storage_data[idx]
    os.makedirs(variants, exist_ok=True)
    with open(os.path.join(variants, "sharded_2rank-drop-chunk.metadata"), "wb") as f:
        pickle.dump(md, f)  # what FileSystemWriter.finish does


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="testdata directory; each case goes to <out>/<case>/")
    ap.add_argument("cases", nargs="+", choices=CASES)
    args = ap.parse_args()
    for case in args.cases:
        out = os.path.join(args.out, case)
        os.makedirs(out, exist_ok=True)
        for name in os.listdir(out):  # a clean case directory
            os.remove(os.path.join(out, name))
        world = 2 if case == "sharded_2rank" else 1
        with tempfile.TemporaryDirectory() as tmp:
            init_file = os.path.join(tmp, "pg-init")
            mp.spawn(worker, args=(world, case, out, init_file), nprocs=world, join=True)
        manifest(case, out, world)
        print(f"{case}: wrote {out}")


if __name__ == "__main__":
    main()
