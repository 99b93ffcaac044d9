"""Tiered-run scenarios for test_tiers.py, run as
``python tier_worker.py SCENARIO WORLD RUN_URL LOCAL_DIR OUT_DIR``: WORLD
gloo ranks on CPU (examples/torch/launch.py), each with its own local tier
LOCAL_DIR/rank-<r> (its "node"), the durable run at RUN_URL. Rank 0 writes
the results of every rank to OUT_DIR/result.pt."""

import os
import signal
import sys
import warnings

warnings.simplefilter("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples", "torch"))

from launch import launch  # noqa: E402 (sets USE_LIBUV=0)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from models import make, train  # noqa: E402

DEADLINE_S = 240
#: The run: 8 steps; a local save every 2nd, persisted every 4th.
STEPS, SAVE_EVERY, PERSIST_EVERY = 8, 2, 4


def local_url(local_dir, rank):
    return "file://" + os.path.join(local_dir, f"rank-{rank}")


def ddp(seed):
    from torch.nn.parallel import DistributedDataParallel as DDP

    m, opt, sched = make(seed)
    return m, DDP(m, find_unused_parameters=True), opt, sched


def step(dm, opt, sched, s, rank):
    """Step s of the run: its data a function of s and the rank alone, so a
    resumed run goes on as the straight one did."""
    train(dm, opt, sched, 1, route=None, seed=1000 * s + rank)


def state(m, opt):
    names = {id(p): n for n, p in m.named_parameters()}
    out = {"model." + k: v.detach().clone() for k, v in m.state_dict().items()}
    for p, st in opt.state.items():
        for k, v in st.items():
            if torch.is_tensor(v):
                out[f"optim.{names[id(p)]}.{k}"] = v.detach().clone()
    out["lr"] = opt.param_groups[0]["lr"]
    return out


def run(rank, world, scenario, url, local_dir, out):
    import ckptkit
    import ckptkit.torch as ct

    local = local_url(local_dir, rank)
    result = {}
    if scenario == "save":
        # The straight run, saving as it goes; its final state is what every
        # resumed run must end with.
        m, dm, opt, sched = ddp(0)
        try:
            ct.save(url, dm, opt, step=0, scheduler=sched, local=local, async_save=True)
        except ckptkit.UsageError as e:
            result["async_refused"] = str(e)
        for s in range(1, STEPS + 1):
            step(dm, opt, sched, s, rank)
            if s % SAVE_EVERY == 0 and s < STEPS:
                ct.save(url, dm, opt, step=s, scheduler=sched, local=local, persist_every=PERSIST_EVERY)
        ct.close()
        result["state"] = state(m, opt)
    elif scenario == "killed":
        # The straight run, saving every 2nd step up to and including the
        # last; right after the save of step 8 (committed locally, rank 0's
        # persist of it started in the background) every rank is SIGKILLed:
        # the persist in flight dies with rank 0, nothing waits for it.
        m, dm, opt, sched = ddp(0)
        for s in range(1, STEPS + 1):
            step(dm, opt, sched, s, rank)
            if s % SAVE_EVERY == 0:
                ct.save(url, dm, opt, step=s, scheduler=sched, local=local, persist_every=PERSIST_EVERY)
            if s == PERSIST_EVERY:
                ct.close()  # step 4 is durable before the kill, whatever the load
        os.kill(os.getpid(), signal.SIGKILL)
    elif scenario == "resume":
        m, dm, opt, sched = ddp(99)
        rep = ct.resume(url, dm, opt, scheduler=sched, local=local)
        result.update(tier=rep.tier, tier_why=rep.tier_why, step=rep.step,
                      skipped=[(s.url, s.why) for s in rep.skipped])
        for s in range(rep.step + 1, STEPS + 1):
            step(dm, opt, sched, s, rank)
        result["state"] = state(m, opt)
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    results = [None] * world
    dist.all_gather_object(results, result)
    if rank == 0:
        torch.save(results, os.path.join(out, "result.pt"))


def main():
    scenario, world, url, local_dir, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    os.makedirs(out, exist_ok=True)
    codes = launch(world, run, (scenario, url, local_dir, out), deadline_s=DEADLINE_S)
    if scenario == "killed":
        if codes != [-signal.SIGKILL] * world:
            raise SystemExit(f"ranks exited with {codes}, want every one SIGKILLed")
    elif any(c != 0 for c in codes):
        raise SystemExit(f"ranks exited with {codes}")


if __name__ == "__main__":
    main()
