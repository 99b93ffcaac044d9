"""Save and load the same ~1 GiB state with ckptkit.torch's StorageWriter /
StorageReader (file://, CRC32C on every item) and with torch's own
FileSystemWriter / FileSystemReader (defaults), on the same disk,
alternating, in one run; prints the figures and the ratios (torch time /
ckptkit time: >= 1.0 means ckptkit is at least as fast).

One untimed save and load per side come first (one-time costs). Every
timed save starts with no writeback pending (os.sync() first, not
timed) and after --settle seconds of rest (default 3), so neither side
pays for the other's or the previous run's: on this machine's virtual
disk a save right after the other side's ran up to 4x slower even after
os.sync() (the host is still writing the guest's flushed data).

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

Then the training-loop rows (--loop-steps N, default 8; 0 skips them; --only-loop
runs only these): a loop whose step reads the whole state ("forward and backward":
a sum over every tensor) and then writes it ("optimizer step": add_ on every
tensor), saving every step and every 4 steps, in each mode:

  sync      ckptkit.torch.save, synchronous (DCP through StorageWriter)
  blocking  ckptkit.torch.save(async_save="blocking"): returns once staged
  overlap   ckptkit.torch.save(async_save=True): returns once planned; the
            loop calls wait_staged() right before the update
  dcp-ckptkit / dcp-fs   dcp.async_save with DefaultStager(use_async_staging=True)
            into ckptkit's StorageWriter / torch's FileSystemWriter (one stager
            and one writer for the run); the loop waits on staging_completion
            before the update and on the previous upload before the next save
            (torchtitan's loop; torch >= 2.9)

ckptkit's async modes stage into a prefaulted pool of --loop-staging-bytes
(default the state + 64 MiB). Per mode and cadence it prints the stall per save
(the loop blocked by saving: the call, the wait for staging, the wait for the
previous save; not the wait for the last save after the loop), the stall over
the synchronous save time, the median compute time of the steps that ran while
a save was staging and of the others, and the peak RSS above the state.

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


def _commit_seconds(h):
    """An AsyncSave's seconds from start to commit (its result: a dict, or
    the typed SaveResult)."""
    r = h.result
    return r["seconds"] if isinstance(r, dict) else r.seconds


LOOP_MODES = ("sync", "blocking", "overlap", "dcp-ckptkit", "dcp-fs")


def _dcp_stager():
    """torch's DefaultStager with background staging on the CPU, or None
    when this torch has none."""
    try:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    except ImportError:
        return None
    return DefaultStager(StagingOptions(use_pinned_memory=False, use_shared_memory=False, use_async_staging=True,
                                        use_non_blocking_copy=False))


def loop_rows(sd, work, steps, every, mode, staging_bytes):
    """One training loop of steps steps saving every `every` steps in mode
    (LOOP_MODES); returns its figures, or None when this torch lacks the
    mode."""
    from torch import nn

    stager = _dcp_stager() if mode.startswith("dcp-") else None
    if mode.startswith("dcp-") and stager is None:
        return None
    ts = [v for v in sd.values() if torch.is_tensor(v)]
    m = nn.Module()
    for k, v in sd.items():
        if torch.is_tensor(v):
            m.register_buffer(k.replace(".", "_"), v)
    root = os.path.join(work, f"loop-{mode}-{every}")
    os.makedirs(root)
    url = "file://" + root
    writer = None
    if mode == "dcp-ckptkit":
        writer = StorageWriter(url + "/first")
    elif mode == "dcp-fs":
        writer = dcp.FileSystemWriter(os.path.join(root, "first"))

    def compute():
        acc = 0.0
        for t in ts:
            acc += float(t.sum())
        return acc

    def update():
        with torch.no_grad():
            for t in ts:
                t.add_(1.0)

    stalls, staging_waits, overlapped, other, save_times = [], [], [], [], []
    staged = None  # what resolves once the newest save stops reading the state
    pending = None  # the newest save (AsyncSave, or DCP's upload future)
    done_dirs = []
    base = rss_bytes()
    with PeakRSS() as peak:
        if mode in ("blocking", "overlap"):
            # The process's saver, made (and its pool faulted in) once
            # before the loop, as a job makes it at its start.
            ct._async.saver_for(staging_bytes, mode == "overlap", True)
        t_start = time.perf_counter()
        for step in range(1, steps + 1):
            busy = staged is not None and not staged.done()
            t0 = time.perf_counter()
            compute()
            (overlapped if busy else other).append(time.perf_counter() - t0)
            if staged is not None:
                t0 = time.perf_counter()
                staged.result()
                waited = time.perf_counter() - t0
                staging_waits.append(waited)
                stalls[-1] += waited
                staged = None
            update()
            if step % every:
                continue
            name = f"step-{step:08d}"
            t0 = time.perf_counter()
            if mode == "sync":
                ct.save(url, m, step=step)
                save_times.append(time.perf_counter() - t0)
            elif mode in ("blocking", "overlap"):
                h = ct.save(url, m, step=step, async_save=True if mode == "overlap" else "blocking",
                            staging_bytes=staging_bytes, prefault=True)
                if pending is not None:  # committed before this save started
                    pending.wait()
                    save_times.append(_commit_seconds(pending))
                pending, staged = h, (h.staged if mode == "overlap" else None)
            else:
                if pending is not None:
                    pending.result()
                    save_times.append(time.perf_counter() - pending.started)
                resp = dcp.async_save(sd, checkpoint_id=url + "/" + name if mode == "dcp-ckptkit" else os.path.join(root, name),
                                      storage_writer=writer, async_stager=stager)
                pending, staged = resp.upload_completion, resp.staging_completion
                pending.started = t0
            stalls.append(time.perf_counter() - t0)
            # The checkpoint before the one just started is committed:
            # remove it (outside the timed parts) to bound the disk used.
            for d in done_dirs[:-1]:
                shutil.rmtree(d, ignore_errors=True)
            done_dirs = done_dirs[-1:] + [os.path.join(root, name)]
        loop_seconds = time.perf_counter() - t_start
        t0 = time.perf_counter()
        if isinstance(pending, ct.AsyncSave):
            pending.wait()
            save_times.append(_commit_seconds(pending))
        elif pending is not None:
            pending.result()
            save_times.append(time.perf_counter() - pending.started)
        final_wait = time.perf_counter() - t0
    if stager is not None:
        stager.close()
    ct.close()  # the process's saver and its pool
    shutil.rmtree(root, ignore_errors=True)
    return {"mode": mode, "every": every, "steps": steps, "saves": len(stalls), "stalls": stalls,
            "staging_waits": staging_waits, "save_seconds": save_times, "final_wait": final_wait,
            "compute_overlapped": overlapped, "compute_other": other, "loop_seconds": loop_seconds,
            "peak_rss_above_state": peak.peak - base}


def med(v):
    return statistics.median(v) if v else float("nan")


def fmt(x):
    return "-" if x != x else f"{x:.3f}"


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
    ap.add_argument("--loop-steps", type=int, default=8, help="steps per training-loop row (0: skip them)")
    ap.add_argument("--loop-modes", default=",".join(LOOP_MODES), help="the training-loop modes to run")
    ap.add_argument("--loop-staging-bytes", type=int, default=0,
                    help="staging budget of the loop rows' async modes (default: the state + 64 MiB)")
    ap.add_argument("--only-loop", action="store_true", help="run the training-loop rows only")
    ap.add_argument("--settle", type=float, default=3.0,
                    help="seconds of rest after os.sync() before each timed save of the comparison")
    ap.add_argument("--no-compare", action="store_true", help="skip the save/load comparison (the async and loop rows only)")
    args = ap.parse_args()
    if args.only_loop:
        return main_loop(args)
    wopts, ropts = {}, {}
    if args.part_size:
        wopts["part_size"] = args.part_size
    if args.concurrency:
        wopts["concurrency"] = ropts["concurrency"] = args.concurrency
    sd = state(args.bytes)
    nbytes = sum(v.numel() * v.element_size() for v in sd.values() if torch.is_tensor(v))
    out = {"bytes": nbytes, "torch": torch.__version__}
    if not args.no_compare:
        out.update(compare(args, sd, nbytes, wopts, ropts))
    if args.async_saves:
        work = tempfile.mkdtemp(prefix="torch-bench-async-", dir=args.dir)
        try:
            rows, above = async_rows(sd, work, args.async_saves, args.staging_bytes)
        finally:
            shutil.rmtree(work, ignore_errors=True)
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
    if args.loop_steps:
        out["loop"] = run_loop(args, sd, nbytes)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


def compare(args, sd, nbytes, wopts, ropts):
    """The save/load comparison: torch's FileSystemWriter/Reader against
    StorageWriter/Reader and the physical row, alternating; prints the table
    and returns its figures."""
    work = tempfile.mkdtemp(prefix="torch-bench-", dir=args.dir)
    res = {k: [] for k in ("torch_save", "ckptkit_save", "torch_load", "ckptkit_load", "physical_load")}
    load_before = open("/proc/loadavg").read().split()[0]
    pbufs = {}
    stats = {}
    try:
        # One untimed save and load per side first: the first call of each
        # pays one-time costs (imports, thread pools, the library's load).
        for side in ("torch", "ckptkit"):
            d = os.path.join(work, f"warm-{side}")
            if side == "torch":
                dcp.save(sd, storage_writer=dcp.FileSystemWriter(d))
                dcp.load(zeros_like(sd), storage_reader=dcp.FileSystemReader(d))
            else:
                dcp.save(sd, storage_writer=StorageWriter("file://" + d, **wopts))
                dcp.load(zeros_like(sd), storage_reader=StorageReader("file://" + d, **ropts))
            shutil.rmtree(d)
        for run in range(args.runs):
            # Alternate which side goes first, so neither always gets a warmer page cache.
            order = ["torch", "ckptkit"] if run % 2 == 0 else ["ckptkit", "torch"]
            for side in order:
                d = os.path.join(work, f"{side}-{run}")
                # No writeback pending when a timed save starts (outside the
                # timing): the previous run's deletions and the other side's
                # writeback would otherwise land in whichever save comes
                # next (on a disk mounted with discard they cost seconds).
                os.sync()
                time.sleep(args.settle)
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
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    gib = nbytes / (1 << 30)
    load_after = open("/proc/loadavg").read().split()[0]
    print(f"torch {torch.__version__} DCP vs ckptkit.torch: {nbytes / (1 << 20):.0f} MiB in {len(sd) - 2} tensors, "
          f"{args.runs} runs (alternating, {args.settle:g} s rest before each save), dir {args.dir}, {os.cpu_count()} cores, load average {load_before} -> {load_after}")
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
    return out


def main_loop(args):
    sd = state(args.bytes)
    nbytes = sum(v.numel() * v.element_size() for v in sd.values() if torch.is_tensor(v))
    out = {"bytes": nbytes, "torch": torch.__version__, "loop": run_loop(args, sd, nbytes)}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


def run_loop(args, sd, nbytes):
    """The training-loop rows: every mode, saving every step and every 4
    steps; prints the table and returns the rows."""
    budget = args.loop_staging_bytes or nbytes + (64 << 20)
    modes = [m for m in args.loop_modes.split(",") if m]
    work = tempfile.mkdtemp(prefix="torch-bench-loop-", dir=args.dir)
    rows = []
    load_before = open("/proc/loadavg").read().split()[0]
    try:
        for every in (1, 4):
            for mode in modes:
                r = loop_rows(sd, work, args.loop_steps * every, every, mode, budget)
                if r is not None:
                    r["load_average"] = open("/proc/loadavg").read().split()[0]
                    rows.append(r)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load_after = open("/proc/loadavg").read().split()[0]
    print(f"training loop, torch {torch.__version__}: {nbytes / (1 << 20):.0f} MiB state, a step reading it all "
          f"(compute) then writing it all (update); {args.loop_steps} saves per row; ckptkit async pool "
          f"{budget >> 20} MiB prefaulted; dir {args.dir}; load average {load_before} -> {load_after}")
    print(f"{'mode':<13}{'every':>6}{'stall/save s, median [min, max]':>34}{'stall/sync save':>16}{'save s':>8}"
          f"{'staging wait':>13}{'compute ovl / other s':>23}{'step s':>8}{'peak RSS+':>10}{'final':>7}")
    sync_save = {r["every"]: med(r["save_seconds"]) for r in rows if r["mode"] == "sync"}
    for r in rows:
        ratio = med(r["stalls"]) / sync_save[r["every"]] if r["every"] in sync_save else float("nan")
        r["stall_over_sync_save"] = ratio
        print(f"{r['mode']:<13}{r['every']:>6}{spread(r['stalls']):>34}{ratio:>15.3f}x{med(r['save_seconds']):>8.2f}"
              f"{fmt(med(r['staging_waits'])):>13}{fmt(med(r['compute_overlapped'])):>11} / {fmt(med(r['compute_other'])):<9}"
              f"{r['loop_seconds'] / r['steps']:>8.3f}"
              f"{r['peak_rss_above_state'] / (1 << 20):>8.0f}Mi{r['final_wait']:>7.2f}")
    return rows


if __name__ == "__main__":
    main()
