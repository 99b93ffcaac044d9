"""Multi-rank scenarios for test_dist.py, run as
``python dist_worker.py SCENARIO WORLD RUN_URL OUT_DIR``: WORLD gloo ranks on
CPU started by examples/torch/launch.py. Rank 0 writes its results to
OUT_DIR/result.pt."""

import os
import sys
import warnings

warnings.simplefilter("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples", "torch"))

from launch import launch  # noqa: E402 (sets USE_LIBUV=0)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from models import TinyMoE, make, train  # noqa: E402

DEADLINE_S = 240


def _dtensor_api():
    try:
        from torch.distributed.tensor import Shard, distribute_tensor
        from torch.distributed.device_mesh import init_device_mesh
    except ImportError:  # torch 2.4
        from torch.distributed._tensor import Shard, distribute_tensor
        from torch.distributed.device_mesh import init_device_mesh
    return Shard, distribute_tensor, init_device_mesh


def sharded_moe(seed):
    """A TinyMoE whose parameters are DTensors sharded on dim 0 over all
    ranks (the FSDP2 layout), and an AdamW over them."""
    Shard, distribute_tensor, init_device_mesh = _dtensor_api()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(seed)
    m = TinyMoE()
    for mod in m.modules():
        for name, p in list(mod.named_parameters(recurse=False)):
            setattr(mod, name, torch.nn.Parameter(distribute_tensor(p.detach().clone(), mesh, [Shard(0)])))
    opt = torch.optim.AdamW(m.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    return m, opt, sched, mesh


def fsdp2_moe(seed):
    """A TinyMoE sharded by FSDP2's fully_shard (each expert, then the whole
    model) on a CPU mesh over all ranks, with AdamW and StepLR as make(),
    trained one step to find out whether this torch build runs FSDP2 on CPU
    (torch 2.6's does not: 'Stream' object has no attribute
    'record_event'): (model, opt, sched) or the reason it does not."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import fully_shard
        except ImportError as e:
            return f"no fully_shard: {e}"
    _, _, init_device_mesh = _dtensor_api()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(seed)
    m = TinyMoE()
    try:
        for e in m.experts:
            fully_shard(e, mesh=mesh)
        fully_shard(m, mesh=mesh)
        m(torch.zeros(2, 8), route=0).sum().backward()  # the first unshard/reshard
    except Exception as e:  # noqa: BLE001 - the feature test
        return f"fully_shard does not run on a CPU mesh here: {type(e).__name__}: {e}"
    m.zero_grad(set_to_none=True)
    opt = torch.optim.AdamW(m.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    return m, opt, sched


def step_sharded(m, opt, sched, mesh, steps):
    """AdamW steps with fixed gradients for every parameter but experts.1
    (which so has no state: lazily absent)."""
    Shard, distribute_tensor, _ = _dtensor_api()
    g = torch.Generator().manual_seed(123)
    for _ in range(steps):
        for n, p in m.named_parameters():
            full = torch.randn(p.shape, generator=g)
            p.grad = None if n.startswith("experts.1.") else distribute_tensor(full, mesh, [Shard(0)])
        opt.step()
        sched.step()


def full_state(m, opt):
    """Full (gathered) model and optimizer tensors by FQN."""
    names = {id(p): n for n, p in m.named_parameters()}
    out = {}
    for k, v in m.state_dict().items():
        out["model." + k] = v.full_tensor() if hasattr(v, "full_tensor") else v.detach().clone()
    for p, st in opt.state.items():
        for k, v in st.items():
            out[f"optim.{names[id(p)]}.{k}"] = v.full_tensor() if hasattr(v, "full_tensor") else v.detach().clone()
    return out


def run(rank, world, scenario, url, out):
    import ckptkit.torch as ct

    result = {}
    if scenario == "dtensor-save":
        m, opt, sched, mesh = sharded_moe(0)
        step_sharded(m, opt, sched, mesh, 3)
        ct.save(url, m, opt, step=3, scheduler=sched)
        result = full_state(m, opt)
        result["lr"] = opt.param_groups[0]["lr"]
    elif scenario == "dtensor-save-async":
        # Step 3 saved in the background while the next steps change every
        # shard, then step 6; the ranks' Go savers coordinate through the
        # store. The result is the step-3 state.
        m, opt, sched, mesh = sharded_moe(0)
        step_sharded(m, opt, sched, mesh, 3)
        h3 = ct.save(url, m, opt, step=3, scheduler=sched, async_save=True)
        result = full_state(m, opt)
        h3.wait_staged()  # the state is copied before the next updates
        result["lr"] = opt.param_groups[0]["lr"]
        step_sharded(m, opt, sched, mesh, 3)
        h6 = ct.save(url, m, opt, step=6, scheduler=sched, async_save=True)
        h6.wait()
        h3.wait()
    elif scenario == "dtensor-resume":
        m, opt, sched, mesh = sharded_moe(99)
        rep = ct.resume(url, m, opt, scheduler=sched)
        result = full_state(m, opt)
        result.update(step=rep.step, lazy=sorted(rep.lazy_params), lr=opt.param_groups[0]["lr"],
                      skipped=[(s["url"], s["reason"]) for s in rep.skipped])
    elif scenario in ("fsdp2-save", "fsdp2-resume"):
        got = fsdp2_moe(0 if scenario == "fsdp2-save" else 99)
        if isinstance(got, str):
            result = {"unsupported": got}
        else:
            m, opt, sched = got
            if scenario == "fsdp2-save":
                train(m, opt, sched, 3, route=0)  # expert 1 gets no token: lazily absent
                ct.save(url, m, opt, step=3, scheduler=sched)
                result = full_state(m, opt)
                result["lr"] = opt.param_groups[0]["lr"]
            else:
                rep = ct.resume(url, m, opt, scheduler=sched)
                result = full_state(m, opt)
                result.update(step=rep.step, lazy=sorted(rep.lazy_params), lr=opt.param_groups[0]["lr"])
    elif scenario == "ddp-save":
        from torch.nn.parallel import DistributedDataParallel as DDP

        m, opt, sched = make(0)
        dm = DDP(m, find_unused_parameters=True)
        train(dm, opt, sched, 3, route=None, seed=10 + rank)  # different data per rank
        ct.save(url, dm, opt, step=3, scheduler=sched)
        result = full_state(m, opt)
    elif scenario == "ddp-resume":
        from torch.nn.parallel import DistributedDataParallel as DDP

        m, opt, sched = make(42)
        dm = DDP(m, find_unused_parameters=True)
        rep = ct.resume(url, dm, opt, scheduler=sched)
        result = full_state(m, opt)
        result.update(step=rep.step, lazy=sorted(rep.lazy_params))
    elif scenario in ("dcp-overwrite-killed", "dcp-overwrite"):
        result = dcp_overwrite(rank, url, kill=scenario == "dcp-overwrite-killed")
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    dist.barrier()
    if rank == 0:
        torch.save(result, os.path.join(out, "result.pt"))


def dcp_overwrite(rank, url, kill):
    """ckptkit.torch.StorageWriter on every rank. kill: a checkpoint of
    sharded state, then an overwrite during which rank 1 is SIGKILLed once
    a data object of it has landed (the job dies). Otherwise: the same
    overwrite, committing; rank 0 reports the objects left and whether a
    load is bit-identical."""
    import torch.distributed.checkpoint as dcp

    from ckptkit.torch import StorageReader, StorageWriter
    from test_dcp_writer import _FailAfterFirstObject, _committed_keys, _keys

    def load():
        m2, _, _, _ = sharded_moe(99)
        sd = {"model": m2.state_dict()}
        dcp.load(sd, storage_reader=StorageReader(url))
        return {k: v.full_tensor() for k, v in sd["model"].items()}

    m, opt, sched, mesh = sharded_moe(0)
    if kill:
        dcp.save({"model": m.state_dict()}, storage_writer=StorageWriter(url, part_size=1))
        dist.barrier()
        step_sharded(m, opt, sched, mesh, 2)
        planner = _FailAfterFirstObject(url, kill=True, prefix="__1_") if rank == 1 else None
        dcp.save({"model": m.state_dict()}, planner=planner, storage_writer=StorageWriter(url, part_size=1, overwrite=True))
        return {}
    step_sharded(m, opt, sched, mesh, 2)
    dcp.save({"model": m.state_dict()}, storage_writer=StorageWriter(url, part_size=1, overwrite=True))
    dist.barrier()
    out = {"keys": sorted(_keys(url)), "committed": sorted(_committed_keys(url))}
    want = {k: v.full_tensor() for k, v in m.state_dict().items()}
    got = load()
    out["equal"] = want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    return out


def main():
    scenario, world, url, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    os.makedirs(out, exist_ok=True)
    if world == 1 and scenario.endswith("resume-plain"):
        import ckptkit.torch as ct

        m, opt, sched = make(7)
        rep = ct.resume(url, m, opt, scheduler=sched)
        res = full_state(m, opt)
        res.update(step=rep.step, lazy=sorted(rep.lazy_params), lr=opt.param_groups[0]["lr"])
        torch.save(res, os.path.join(out, "result.pt"))
        return
    codes = launch(world, run, (scenario, url, out), deadline_s=DEADLINE_S)
    if any(c != 0 for c in codes):
        raise SystemExit(f"ranks exited with {codes}")


if __name__ == "__main__":
    main()
