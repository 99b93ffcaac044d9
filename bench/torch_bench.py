"""Save and load the same ~1 GiB state with ckptkit.torch's StorageWriter /
StorageReader (file://, CRC32C on every item) and with torch's own
FileSystemWriter / FileSystemReader (defaults), on the same disk,
alternating, in one run; prints the figures and the ratios (torch time /
ckptkit time: >= 1.0 means ckptkit is at least as fast).

    scripts/torch-env.sh run python3 bench/torch_bench.py [--bytes N] [--runs 3] [--dir /tmp] [--json FILE]

`make bench` runs it when the torch environment exists (docs/PERFORMANCE.md).
"""

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
import warnings

warnings.simplefilter("ignore")

import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402

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
    args = ap.parse_args()
    wopts, ropts = {}, {}
    if args.part_size:
        wopts["part_size"] = args.part_size
    if args.concurrency:
        wopts["concurrency"] = ropts["concurrency"] = args.concurrency
    sd = state(args.bytes)
    nbytes = sum(v.numel() * v.element_size() for v in sd.values() if torch.is_tensor(v))
    work = tempfile.mkdtemp(prefix="torch-bench-", dir=args.dir)
    res = {k: [] for k in ("torch_save", "ckptkit_save", "torch_load", "ckptkit_load")}
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
            for side in order:
                d = os.path.join(work, f"{side}-{run}")
                out = zeros_like(sd)
                if side == "torch":
                    res["torch_load"].append(timed(lambda: dcp.load(out, storage_reader=dcp.FileSystemReader(d))))
                else:
                    res["ckptkit_load"].append(timed(lambda: dcp.load(out, storage_reader=StorageReader("file://" + d, **ropts))))
                assert all(torch.equal(out[k], sd[k]) for k in sd if torch.is_tensor(sd[k]))
            for side in order:
                shutil.rmtree(os.path.join(work, f"{side}-{run}"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    gib = nbytes / (1 << 30)
    print(f"torch DCP vs ckptkit.torch: {nbytes / (1 << 20):.0f} MiB in {len(sd) - 2} tensors, {args.runs} runs (alternating), "
          f"dir {args.dir}, {os.cpu_count()} cores, load {open('/proc/loadavg').read().split()[0]}")
    print(f"{'figure':<22}{'median s':>10}{'GiB/s':>8}   runs")
    for k in res:
        print(f"{k:<22}{med[k]:>10.3f}{gib / med[k]:>8.2f}   {' '.join(f'{x:.3f}' for x in res[k])}")
    ratios = {"save": med["torch_save"] / med["ckptkit_save"], "load": med["torch_load"] / med["ckptkit_load"]}
    # Each run's pair ran back to back, so its ratio is less exposed to the
    # load of a shared machine than the medians are.
    paired = {op: statistics.median(t / c for t, c in zip(res[f"torch_{op}"], res[f"ckptkit_{op}"])) for op in ("save", "load")}
    ratios.update({f"paired_{k}": v for k, v in paired.items()})
    print(f"ratio torch/ckptkit (medians): save {ratios['save']:.2f}x, load {ratios['load']:.2f}x; "
          f"median of per-run ratios: save {paired['save']:.2f}x, load {paired['load']:.2f}x "
          f"(goal >= 1.0x, CRC32C checks on)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bytes": nbytes, "runs": res, "median": med, "ratios": ratios, "torch": torch.__version__}, f, indent=1)


if __name__ == "__main__":
    main()
