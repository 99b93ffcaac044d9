"""Writes testdata/step0: DCP checkpoints saved before the first optimizer
step (the optimizer's param groups, no state yet), for the step-0 resume
tests (issue 30).

    scripts/torch-env.sh run python3 interop/torchdcp/testdata/gen/gen_step0.py

- step0/torch: torch's own FileSystemWriter, with get_optimizer_state_dict's
  layout (params listing fqns) and an empty state.
- step0/ckptkit: ckptkit.torch.save(..., step=0) (its StorageWriter, with
  the integrity object).

The model is Linear(4, 3) -> ReLU -> Linear(3, 2) with AdamW; the step
item is 0.
"""
import os
import shutil
import tempfile

import torch
import torch.distributed.checkpoint as dcp

import ckptkit.torch as ct

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "step0")

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
opt = torch.optim.AdamW(model.parameters(), lr=0.01)
names = [n for n, _ in model.named_parameters()]

shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)

groups = [dict(g, params=names) for g in opt.state_dict()["param_groups"]]
dcp.save({"model": model.state_dict(), "optimizer": {"state": {}, "param_groups": groups}, "step": 0},
         storage_writer=dcp.FileSystemWriter(os.path.join(OUT, "torch")))

with tempfile.TemporaryDirectory() as run:
    src = ct.save("file://" + run, model, opt, step=0)
    shutil.copytree(src[len("file://"):], os.path.join(OUT, "ckptkit"))
print("wrote", OUT)
