"""Start WORLD gloo ranks on CPU for a function, with the quirks of Debian's
torch 2.6 handled: USE_LIBUV=0 before init_process_group, a FileStore
rendezvous, a deadline per rank (SIGALRM), and os._exit after the last
barrier (2-rank gloo teardown can hang). Used by moe_train.py and by the
Python suite's multi-rank tests."""

import os
import signal
import sys
import tempfile
import traceback

os.environ.setdefault("USE_LIBUV", "0")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402


def _rank_main(rank, world, fn, args, rdzv, deadline_s):
    signal.alarm(deadline_s)
    try:
        if world > 1:
            dist.init_process_group("gloo", init_method="file://" + rdzv, rank=rank, world_size=world)
        fn(rank, world, *args)
        if world > 1:
            dist.barrier()
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def launch(world, fn, args=(), deadline_s=600):
    """Run fn(rank, world, *args) on world spawned ranks (a process group
    when world > 1) and return their exit codes (-9 for a SIGKILLed rank)."""
    rdzv = os.path.join(tempfile.mkdtemp(prefix="ckptkit-rdzv-"), "store")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank_main, args=(r, world, fn, args, rdzv, deadline_s)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(deadline_s + 10)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    return [p.exitcode for p in procs]
