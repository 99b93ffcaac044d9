"""A small MoE trainer that checkpoints through ckptkit.torch.save and
resumes with ckptkit.torch.resume (docs/TORCH.md).

    python3 examples/torch/moe_train.py --url file:///tmp/run --world 2 --steps 12 --save-every 3

One expert receives no tokens for the first --warmup steps (the router is
bypassed), so its AdamW state is lazily absent in early checkpoints. The
global batch of every step is fixed by the step number and split into two
shards; each rank computes the gradients of its shards and the ranks sum
them (gloo all_reduce), so 2 ranks and 1 rank compute bit-identical updates
and a run can be resumed on another world size. --kill-at S sends SIGKILL
to every rank after step S; running the same command again resumes from the
newest committed checkpoint. --async saves in the background
(ckptkit.torch.save(..., async_save=True), staged within --staging-bytes
while the next step's forward and backward run, the update waiting for
it): training goes on while the checkpoint is written, and the weights are
the same bit for bit.
"""

import argparse
import hashlib
import os
import signal
import sys
import warnings

warnings.simplefilter("ignore")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from launch import launch  # noqa: E402 (sets USE_LIBUV=0 for Debian's torch 2.6)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

SHARDS = 2  # the global batch is always split into 2 shards
DEADLINE_S = 600


class Expert(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.w_in = nn.Linear(d, h)
        self.w_out = nn.Linear(h, d)

    def forward(self, x):
        return self.w_out(torch.relu(self.w_in(x)))


class MoE(nn.Module):
    def __init__(self, d=16, h=32, experts=4, out=4):
        super().__init__()
        self.embed = nn.Linear(d, d)
        self.router = nn.Linear(d, experts)
        self.experts = nn.ModuleList([Expert(d, h) for _ in range(experts)])
        self.head = nn.Linear(d, out)

    def forward(self, x, force=None):
        h = self.embed(x)
        gate = torch.softmax(self.router(h), dim=-1)
        choice = gate.argmax(dim=-1) if force is None else torch.full((h.shape[0],), force, dtype=torch.long)
        y = torch.zeros_like(h)
        for i, e in enumerate(self.experts):
            sel = choice == i
            if sel.any():  # an expert without tokens is not run: no gradient
                y[sel] = e(h[sel]) * gate[sel, i : i + 1]
        return self.head(y)


def batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(64, 16, generator=g), torch.randn(64, 4, generator=g)


def train_step(model, opt, sched, step, warmup, rank, world, before_update=None):
    x, y = batch(step)
    n = x.shape[0] // SHARDS
    mine = [s for s in range(SHARDS) if s % world == rank]
    params = list(model.parameters())
    grads = [None] * len(params)
    for s in mine:
        model.zero_grad(set_to_none=True)
        # The router is bypassed during warmup: only experts 0 and 1 get tokens.
        force = (s % 2) if step < warmup else None
        loss = ((model(x[s * n : (s + 1) * n], force=force) - y[s * n : (s + 1) * n]) ** 2).mean()
        loss.backward()
        for i, p in enumerate(params):
            if p.grad is not None:
                grads[i] = p.grad.clone() if grads[i] is None else grads[i] + p.grad
    # Which parameters got a gradient on any rank, then the gradient sums.
    has = torch.tensor([g is not None for g in grads], dtype=torch.int32)
    if world > 1:
        dist.all_reduce(has)
    for i, p in enumerate(params):
        if has[i] == 0:
            p.grad = None  # never touched: AdamW keeps no state for it
            continue
        g = grads[i] if grads[i] is not None else torch.zeros_like(p)
        if world > 1:
            dist.all_reduce(g)
        p.grad = g / SHARDS
    if before_update is not None:
        # The asynchronous save of the previous step may still be copying
        # the weights and optimizer state: the update waits for it.
        before_update()
    opt.step()
    sched.step()


def weights_digest(model):
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def run(rank, world, args):
    import ckptkit.torch as ct

    torch.manual_seed(0)
    model = MoE()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    start = 0
    rep = ct.resume(args.url, model, opt, scheduler=sched, load_optimizer=not args.no_load_optim)
    if rep is not None:
        start = rep.step
        if rank == 0:
            print(f"resumed {rep.url} at step {rep.step} (world {world}); optimizer loaded: {rep.optimizer_loaded}; "
                  f"lazy: {len(rep.lazy_params)} parameters{' e.g. ' + ', '.join(rep.lazy_params[:2]) if rep.lazy_params else ''}",
                  flush=True)
    elif rank == 0:
        print(f"no checkpoint under {args.url}: starting at step 0 (world {world})", flush=True)
    pending = None  # the asynchronous save in flight
    for step in range(start, args.steps):
        # Forward and backward only read the state, so they overlap the
        # staging of the save before; the update waits for it.
        train_step(model, opt, sched, step, args.warmup, rank, world,
                   before_update=pending.wait_staged if pending is not None else None)
        done = step + 1
        if done % args.save_every == 0:
            if args.async_save:
                if pending is not None:
                    pending.wait()  # committed by now, as a rule; raises its error if it failed
                # Returns once planned; the state is staged while the next
                # step's forward and backward run (train_step waits for it
                # before the update).
                pending = ct.save(args.url, model, opt, step=done, scheduler=sched,
                                  save_optimizer=not args.no_save_optim, async_save=True,
                                  staging_bytes=args.staging_bytes)
                what = f"saving {pending.url}"
            else:
                what = "saved " + ct.save(args.url, model, opt, step=done, scheduler=sched,
                                          save_optimizer=not args.no_save_optim)
            if rank == 0:
                print(f"step {done:3d}  lr {opt.param_groups[0]['lr']:.6f}  {what}", flush=True)
        elif rank == 0:
            print(f"step {done:3d}  lr {opt.param_groups[0]['lr']:.6f}", flush=True)
        if done == args.kill_at:
            if pending is not None:
                # Deterministic for the kill-and-resume check: the kill finds
                # the last save committed, not half-written (which a resume
                # would skip for the one before it).
                pending.wait()
            if rank == 0:
                print(f"killing every rank with SIGKILL after step {done}", flush=True)
            dist.barrier() if world > 1 else None
            os.kill(os.getpid(), signal.SIGKILL)
    if pending is not None:
        url = pending.wait()
        if rank == 0:
            print(f"committed {url} (save stalled training {pending.result['stall_seconds']:.3f} s, "
                  f"took {pending.result['seconds']:.3f} s)", flush=True)
    if rank == 0:
        print(f"final step {args.steps} lr {opt.param_groups[0]['lr']:.6f} weights sha256 {weights_digest(model)}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True, help="run URL (file://, s3://, gs://, mem:// within one process, plugins)")
    ap.add_argument("--world", type=int, default=2, choices=[1, 2])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--save-every", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=4, help="steps during which the router is bypassed")
    ap.add_argument("--kill-at", type=int, default=0, help="SIGKILL every rank after this step")
    ap.add_argument("--no-save-optim", action="store_true", help="save iteration and scheduler, not the optimizer")
    ap.add_argument("--no-load-optim", action="store_true", help="resume iteration and scheduler, start the optimizer fresh")
    ap.add_argument("--async", dest="async_save", action="store_true",
                    help="save in the background (ckptkit.torch.save(..., async_save=True))")
    ap.add_argument("--staging-bytes", type=int, default=None,
                    help="the async saver's staging budget in bytes (default: the Go core's, 512 MiB)")
    args = ap.parse_args()
    codes = launch(args.world, run, (args,), deadline_s=DEADLINE_S)
    if any(c == -signal.SIGKILL for c in codes):
        print(f"ranks killed (exit codes {codes})", flush=True)
        sys.exit(137)
    if any(c != 0 for c in codes):
        sys.exit(f"ranks failed (exit codes {codes})")


if __name__ == "__main__":
    main()
