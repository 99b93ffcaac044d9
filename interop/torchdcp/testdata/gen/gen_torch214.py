"""Writes testdata/torch2.14/: DCP checkpoints written by torch 2.14 itself
(torch's dcp.save with its FileSystemWriter, not ckptkit's writer), with the
optimizers whose per-parameter state is not Adam's: Adafactor, Muon + AdamW
(two optimizers, one merged state), SGD with momentum, and Adafactor with
one slot of one parameter missing. README.md there says what each holds.

    bash scripts/torch-env.sh -s forky run python3 interop/torchdcp/testdata/gen/gen_torch214.py

It needs a torch with torch.optim.Adafactor and torch.optim.Muon (forky's
2.14.1). The layout is the one of the torch 2.6 fixtures
(interop/torchdcp/testdata/torch2.6) without a scheduler (each item costs about
1.5 KB here): dcp.save({"model": ..., "optimizer": ..., "step": N}) with the model and optimizer state from
torch.distributed.checkpoint.state_dict.get_state_dict (optimizer state
keyed by parameter FQN: optimizer.state.<fqn>.<slot>,
optimizer.param_groups.<i>.<field>), one process, FileSystemWriter's
defaults (one __0_0.distcp). The checkpoint path given to the writer is
relative (it is recorded in .metadata's storage_meta.checkpoint_id).
Tensor values are deterministic (fixed seeds); .metadata's save_id is a
fresh uuid each run.

expected.json per case: keys[] (key, kind; tensors: dtype, shape, sha256 of
the contiguous little-endian bytes; bytes items: python_type, value),
lazy_params (FQNs listed in the param groups without any saved state),
missing_keys (the partial case), expected_verdict.
"""

import hashlib
import json
import os
import shutil
import sys
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.utils.serialization import config as serialization_config

warnings.simplefilter("ignore")

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.normpath(os.path.join(HERE, "..", "torch2.14"))
STEPS = 3
PARTIAL_PARAM = "experts.0.weight"
PARTIAL_SLOT = "col_var"


class TinyMoE(torch.nn.Module):
    """The smallest MoE-shaped model: embed, two experts, head. Every token
    goes to expert 0, so expert 1 is never run and never gets a gradient."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(4, 4)
        self.experts = torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)])
        self.head = torch.nn.Linear(4, 2, bias=False)

    def forward(self, x):
        return self.head(self.experts[0](torch.relu(self.embed(x))))


def _opts(opt):
    return opt if isinstance(opt, list) else [opt]


def trained(make_opt):
    torch.manual_seed(214)
    model = TinyMoE()
    opt = make_opt(model)
    g = torch.Generator().manual_seed(7)
    for _ in range(STEPS):
        x, y = torch.randn(8, 4, generator=g), torch.randn(8, 2, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), y)
        for o in _opts(opt):
            o.zero_grad()
        loss.backward()
        for o in _opts(opt):
            o.step()
    return model, opt


def matrices(m):
    return [p for p in m.parameters() if p.ndim == 2]


def vectors(m):
    return [p for p in m.parameters() if p.ndim != 2]


CASES = {
    "adafactor": (
        lambda m: torch.optim.Adafactor(m.parameters(), lr=0.01),
        "Adafactor (lr 0.01) after 3 steps: matrices hold step, row_var, col_var; vectors hold step, variance.",
    ),
    "muon_adamw": (
        lambda m: [torch.optim.Muon(matrices(m), lr=0.02), torch.optim.AdamW(vectors(m), lr=0.01)],
        "Muon (lr 0.02) for the 2-D weights + AdamW (lr 0.01) for the biases, after 3 steps, as one merged "
        "optimizer state (get_state_dict(model, [muon, adamw])): param group 0 is Muon's (matrices: "
        "momentum_buffer), param group 1 AdamW's (vectors: step, exp_avg, exp_avg_sq).",
    ),
    "sgd_momentum": (
        lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9),
        "SGD (lr 0.05, momentum 0.9) after 3 steps: every parameter with state holds momentum_buffer.",
    ),
    "sgd_momentum_nocrc": (
        lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9),
        "sgd_momentum's state saved with torch.utils.serialization.config.save.compute_crc32 = False (torch "
        ">= 2.7): every zip entry of every torch.save item records CRC-32 0 (no checksum).",
    ),
    "adafactor_partial": (
        lambda m: torch.optim.Adafactor(m.parameters(), lr=0.01),
        f"adafactor's state with optimizer.state.{PARTIAL_PARAM}.{PARTIAL_SLOT} deleted before dcp.save: "
        f"{PARTIAL_PARAM} holds step and row_var but lacks {PARTIAL_SLOT} (partial optimizer state).",
    ),
}


def sha(t):
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()


def jsonable(v):
    if isinstance(v, (tuple, list)):
        return [jsonable(x) for x in v]
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    return repr(v)


def write(case):
    make_opt, description = CASES[case]
    model, opt = trained(make_opt)
    msd, osd = get_state_dict(model, opt)
    missing = []
    if case == "adafactor_partial":
        del osd["state"][PARTIAL_PARAM][PARTIAL_SLOT]
        missing = [f"optimizer.state.{PARTIAL_PARAM}.{PARTIAL_SLOT}"]
    sd = {"model": msd, "optimizer": osd, "step": STEPS}
    listed = [f for g in osd["param_groups"] for f in g["params"]]
    lazy = sorted(f for f in listed if not osd["state"].get(f))
    flat, _ = flatten_state_dict(sd)
    shutil.rmtree(os.path.join(OUT, case), ignore_errors=True)
    cwd = os.getcwd()
    os.chdir(OUT)
    save_config = serialization_config.save
    crc = save_config.compute_crc32
    save_config.compute_crc32 = not case.endswith("_nocrc")
    try:
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(case, thread_count=1), no_dist=True)
    finally:
        save_config.compute_crc32 = crc
        os.chdir(cwd)
    keys = []
    for k, v in flat.items():
        if torch.is_tensor(v):
            keys.append({"key": k, "kind": "tensor", "dtype": str(v.dtype).removeprefix("torch."),
                         "shape": list(v.shape), "sha256": sha(v)})
        else:
            keys.append({"key": k, "kind": "bytes", "python_type": type(v).__name__, "value": jsonable(v)})
    expected = {
        "case": case,
        "description": description + " Model: embed Linear(4,4), experts.0 and experts.1 Linear(4,4), head "
                       "Linear(4,2,bias=False); every token goes to expert 0, so experts.1 never got a gradient "
                       "and has no optimizer state. No scheduler; \"step\": 3.",
        "writer": f"torch {torch.__version__} dcp.save + FileSystemWriter (Python {sys.version.split()[0]})",
        "keys": keys,
        "lazy_params": lazy,
        "missing_keys": missing,
        "expected_verdict": "partial" if missing else "resumable",
    }
    with open(os.path.join(OUT, case, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")
    size = sum(os.path.getsize(os.path.join(OUT, case, n)) for n in os.listdir(os.path.join(OUT, case)))
    print(f"{case}: {len(keys)} keys, lazy {lazy}, {size} bytes", file=sys.stderr)


def main():
    for feature in ("Adafactor", "Muon"):
        if not hasattr(torch.optim, feature):
            sys.exit(f"this torch ({torch.__version__}) has no torch.optim.{feature}")
    os.makedirs(OUT, exist_ok=True)
    for case in sys.argv[1:] or CASES:
        write(case)


if __name__ == "__main__":
    main()
