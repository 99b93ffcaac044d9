"""Save and load the same ~1 GiB state with ckptkit.torch's StorageWriter /
StorageReader (file://, CRC32C on every item) and with torch's own
FileSystemWriter / FileSystemReader (defaults), on the same disk,
alternating, in one run; prints the figures and the ratios (torch time /
ckptkit time: >= 1.0 means ckptkit is at least as fast).

The "physical" row is the single-copy limit of a load: the data files
ckptkit wrote, each read with one unchecked readinto (one thread, file by
file) into preallocated, touched tensors of the files' sizes; its ratio is
physical time / ckptkit load time. The loads (torch, ckptkit, physical)
take turns going first, run by run.

    scripts/torch-env.sh run python3 bench/torch_bench.py [--bytes N] [--runs 3] [--dir /tmp] [--json FILE]

Then the asynchronous rows: --async-saves saves (default 5) of the same state
through ckptkit.torch.save, synchronous and with async_save=True
(--staging-bytes, default the Go saver's), the two modes alternating save by
save, a "training step" that changes every tensor after each save; it prints
the stall per save (how long save blocked the loop), the save time (start to
commit), the peak RSS above the state during the async saves, and the ratio
async stall / sync save time (--async-saves 0 skips them).

`make bench` runs it when the torch environment exists (docs/PERFORMANCE.md).
"""

import argparse
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
import warnings

warnings.simplefilter("ignore")

import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402

import ckptkit.torch as ct  # noqa: E402
from ckptkit.torch import StorageReader, StorageWriter  # noqa: E402


def state(total, n=64):
    """n float32 tensors of total bytes in all, plus a few small items."""
    per = total // n // 4
    g = torch.Generator().manual_seed(0)
    sd = {f"layer{i}.weight": torch.randn(per // 1024, 1024, generator=g) for i in range(n)}
    sd["step"] = 100
    sd["lr"] = 0.001
    return sd


def zeros_like(sd):
    return {k: torch.zeros_like(v) if torch.is_tensor(v) else v for k, v in sd.items()}


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
    """Samples the process's RSS every millisecond while running."""

    def __init__(self):
        self.peak = rss_bytes()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, rss_bytes())

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def async_rows(sd, work, saves, staging_bytes):
    """Sync vs async ckptkit.torch.save of sd, alternating, with a training
    step (every tensor changed) after each save."""
    from torch import nn

    m = nn.Module()
    for k, v in sd.items():
        if torch.is_tensor(v):
            m.register_buffer(k.replace(".", "_"), v)
    sync_url, async_url = "file://" + os.path.join(work, "sync"), "file://" + os.path.join(work, "async")

    def step():
        with torch.no_grad():
            for t in m.buffers():
                t.add_(1.0)

    out = {"sync_save": [], "async_stall": [], "async_save": []}
    base = rss_bytes()
    pending = None
    with PeakRSS() as peak:
        for i in range(1, saves + 1):
            for mode in (("sync", "async") if i % 2 else ("async", "sync")):
                if mode == "sync":
                    if pending is not None:  # the sync save would wait for it: not its time
                        pending.wait()
                    out["sync_save"].append(timed(lambda: ct.save(sync_url, m, step=i)))
                else:
                    t0 = time.perf_counter()
                    h = ct.save(async_url, m, step=i, async_save=True, staging_bytes=staging_bytes)
                    out["async_stall"].append(time.perf_counter() - t0)
                    if pending is not None:  # ended before this save started
                        pending.wait()
                        out["async_save"].append(pending.result.seconds)
                    pending = h
                step()
        pending.wait()
        out["async_save"].append(pending.result.seconds)
    return out, peak.peak - base


def spread(v):
    return f"{statistics.median(v):.3f} [{min(v):.3f}, {max(v):.3f}]"


def spread_ratio(num, den):
    """median(num) / median(den) and [min, max] of the per-run ratios."""
    per = [a / b for a, b in zip(num, den)]
    return f"{statistics.median(num) / statistics.median(den):.2f}x [{min(per):.2f}, {max(per):.2f}]"


def physical_read(d, bufs):
    """Read every data file under d whole into its preallocated buffer
    (bufs: file name -> uint8 tensor of its size), one unchecked readinto each."""
    for name, buf in bufs.items():
        mv = memoryview(buf.numpy()).cast("B")
        with open(os.path.join(d, name), "rb", buffering=0) as f:
            n = f.readinto(mv)
        if n != len(mv):
            raise RuntimeError(f"{name}: read {n} of {len(mv)} bytes")


def physical_buffers(d, old):
    """Preallocated, touched uint8 tensors for the data files under d (old
    ones reused when the sizes match)."""
    out = {}
    for name in sorted(os.listdir(d)):
        if name.endswith(".distcp"):
            size = os.path.getsize(os.path.join(d, name))
            buf = old.get(name)
            if buf is None or buf.numel() != size:
                buf = torch.empty(size, dtype=torch.uint8)
                buf.fill_(0)
            out[name] = buf
    return out


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bytes", type=int, default=int(os.environ.get("CKPTKIT_BENCH_BYTES", 1 << 30)))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", default=os.environ.get("CKPTKIT_BENCH_DIR", tempfile.gettempdir()))
    ap.add_argument("--json", default="")
    ap.add_argument("--part-size", type=int, default=0, help="StorageWriter part_size (default: its default)")
    ap.add_argument("--concurrency", type=int, default=0, help="StorageWriter/Reader concurrency (default: theirs)")
    ap.add_argument("--async-saves", type=int, default=5, help="saves per mode of the async rows (0: skip them)")
    ap.add_argument("--staging-bytes", type=int, default=None, help="async staging budget (default: the Go saver's)")
    args = ap.parse_args()
    wopts, ropts = {}, {}
    if args.part_size:
        wopts["part_size"] = args.part_size
    if args.concurrency:
        wopts["concurrency"] = ropts["concurrency"] = args.concurrency
    sd = state(args.bytes)
    nbytes = sum(v.numel() * v.element_size() for v in sd.values() if torch.is_tensor(v))
    work = tempfile.mkdtemp(prefix="torch-bench-", dir=args.dir)
    res = {k: [] for k in ("torch_save", "ckptkit_save", "torch_load", "ckptkit_load", "physical_load")}
    load_before = open("/proc/loadavg").read().split()[0]
    pbufs = {}
    stats = {}
    try:
        for run in range(args.runs):
            # Alternate which side goes first, so neither always gets a warmer page cache.
            order = ["torch", "ckptkit"] if run % 2 == 0 else ["ckptkit", "torch"]
            for side in order:
                d = os.path.join(work, f"{side}-{run}")
                if side == "torch":
                    res["torch_save"].append(timed(lambda: dcp.save(sd, storage_writer=dcp.FileSystemWriter(d))))
                else:
                    res["ckptkit_save"].append(timed(lambda: dcp.save(sd, storage_writer=StorageWriter("file://" + d, **wopts))))
            pbufs = physical_buffers(os.path.join(work, f"ckptkit-{run}"), pbufs)
            loads = ["torch", "ckptkit", "physical"]
            loads = loads[run % 3:] + loads[:run % 3]
            for side in loads:
                if side == "physical":
                    d = os.path.join(work, f"ckptkit-{run}")
                    res["physical_load"].append(timed(lambda: physical_read(d, pbufs)))
                    continue
                d = os.path.join(work, f"{side}-{run}")
                out = zeros_like(sd)
                if side == "torch":
                    res["torch_load"].append(timed(lambda: dcp.load(out, storage_reader=dcp.FileSystemReader(d))))
                else:
                    reader = StorageReader("file://" + d, **ropts)
                    res["ckptkit_load"].append(timed(lambda: dcp.load(out, storage_reader=reader)))
                    stats = reader.last_read_stats
                assert all(torch.equal(out[k], sd[k]) for k in sd if torch.is_tensor(sd[k]))
                del out
            for side in order:
                shutil.rmtree(os.path.join(work, f"{side}-{run}"))
        if args.async_saves:
            rows, above = async_rows(sd, work, args.async_saves, args.staging_bytes)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    gib = nbytes / (1 << 30)
    load_after = open("/proc/loadavg").read().split()[0]
    print(f"torch {torch.__version__} DCP vs ckptkit.torch: {nbytes / (1 << 20):.0f} MiB in {len(sd) - 2} tensors, "
          f"{args.runs} runs (alternating), dir {args.dir}, {os.cpu_count()} cores, load average {load_before} -> {load_after}")
    print(f"{'figure':<16}{'median s [min, max]':>28}{'GiB/s':>8}   runs")
    for k in res:
        print(f"{k:<16}{spread(res[k]):>28}{gib / med[k]:>8.2f}   {' '.join(f'{x:.3f}' for x in res[k])}")
    ratios = {"save": med["torch_save"] / med["ckptkit_save"], "load": med["torch_load"] / med["ckptkit_load"],
              "load_vs_physical": med["physical_load"] / med["ckptkit_load"]}
    # Each run's pair ran back to back, so its ratio is less exposed to the
    # load of a shared machine than the medians are.
    paired = {op: statistics.median(t / c for t, c in zip(res[f"torch_{op}"], res[f"ckptkit_{op}"])) for op in ("save", "load")}
    ratios.update({f"paired_{k}": v for k, v in paired.items()})
    print("ratios (median / median [min, max] of the per-run ratios; CRC32C checks on):")
    print(f"  save, FileSystemWriter / ckptkit (goal >= 1.5x):     {spread_ratio(res['torch_save'], res['ckptkit_save'])}")
    print(f"  load, FileSystemReader / ckptkit (goal >= 1.2x):     {spread_ratio(res['torch_load'], res['ckptkit_load'])}")
    print(f"  load, physical / ckptkit (goal >= 0.85x):            {spread_ratio(res['physical_load'], res['ckptkit_load'])}")
    if stats:
        print(f"  last ckptkit load: {stats.get('in_place_items')} items ({stats.get('in_place_bytes', 0) >> 20} MiB) read in place, "
              f"{stats.get('buffered_items')} items ({stats.get('buffered_bytes', 0) >> 10} KiB) buffered, "
              f"{stats.get('calls')} read calls, seconds " + ", ".join(f"{k} {v:.4f}" for k, v in stats.get('seconds', {}).items()))
    out = {"bytes": nbytes, "runs": res, "median": med, "ratios": ratios, "torch": torch.__version__,
           "load_average": [load_before, load_after], "reader_stats": stats}
    if args.async_saves:
        budget = args.staging_bytes or ct._async.default_staging_bytes()
        print(f"async ckptkit.torch.save: {args.async_saves} saves per mode (alternating), a step changing every tensor "
              f"after each, staging budget {budget >> 20} MiB, load {open('/proc/loadavg').read().split()[0]}")
        print(f"{'figure':<22}{'median s [min, max]':>28}")
        print(f"{'sync save':<22}{spread(rows['sync_save']):>28}")
        print(f"{'async stall':<22}{spread(rows['async_stall']):>28}")
        print(f"{'async save':<22}{spread(rows['async_save']):>28}")
        ratio = statistics.median(rows["async_stall"]) / statistics.median(rows["sync_save"])
        print(f"async stall / sync save time: {ratio:.3f}x (medians); peak RSS above the state during the saves "
              f"{above / (1 << 20):.0f} MiB (budget {budget >> 20} MiB)")
        out["async"] = {"runs": rows, "stall_over_sync_save": ratio, "peak_rss_above_state": above, "budget": budget}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
