"""Writes testdata/ckptkit_run: a run of checkpoints written by
ckptkit.torch.save (DCP with ckptkit's per-save object names and integrity
objects), for the CLI's copy and gc tests.

    scripts/torch-env.sh run python3 interop/torchdcp/testdata/gen/gen_ckptkit_run.py

- step-00000002 .. step-00000008: committed saves (every 2 steps) of a tiny
  model with Adam and a StepLR scheduler.
- step-00000008 also holds the data and integrity objects of an abandoned
  save of the same step (killed before its .metadata was written, then
  saved again): a tag no committed .metadata references.
- step-00000010 holds only the objects of an abandoned save (no .metadata).
"""
import os
import shutil
import sys
import tempfile

import torch

import ckptkit.torch as ct

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "ckptkit_run")


def abandoned(step, into):
    """Saves step into a scratch run and moves its objects, all but the
    .metadata, into the prefix into: what a save killed before its commit
    leaves behind."""
    with tempfile.TemporaryDirectory() as scratch:
        src = ct.save(scratch, model, opt, step=step, scheduler=sched)
        os.makedirs(into, exist_ok=True)
        for name in os.listdir(src):
            if name != ".metadata":
                shutil.copyfile(os.path.join(src, name), os.path.join(into, name))


torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=0.0)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
shutil.rmtree(OUT, ignore_errors=True)
run = os.path.abspath(OUT)
for step in range(1, 11):
    loss = model(torch.randn(5, 4)).pow(2).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
    if step == 8:
        abandoned(step, os.path.join(run, "step-00000008"))
    if step == 10:
        abandoned(step, os.path.join(run, "step-00000010"))
    elif step % 2 == 0:
        ct.save(run, model, opt, step=step, scheduler=sched)
print(sorted(os.listdir(run)), file=sys.stderr)
