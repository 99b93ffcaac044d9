#!/usr/bin/env bash
# dcp_compare.sh - save and load the same ~1 GiB synthetic model (193 float32
# tensors, from `ckptbench spec`) with PyTorch DCP (torch 1.13's
# torch.distributed._shard.checkpoint or torch 2.x's
# torch.distributed.checkpoint; FileSystemWriter with single_file_per_rank=True
# and sync_files=True, in one process without a process group) and with
# ckptkit (`ckptbench dcp`, one rank, default and Transactional load modes), on the same disk,
# alternating the two, and print the ratios (DCP time / ckptkit time).
# Goals: ckptkit >= 2x DCP on save, >= 3x on the default-mode load.
#
#   bench/dcp_compare.sh [--size 1GiB] [--runs 3] [--dir /tmp]
#
# Optional: it needs Debian's /usr/bin/python3 with torch (apt-get install -y
# python3-torch python3-numpy: torch 1.13 on Debian 12), or the torch 2.6
# environment of scripts/torch-env.sh (built once, cached); with neither it
# prints one line and exits 0.
set -euo pipefail

SIZE=1GiB RUNS=3 DIR=${TMPDIR:-/tmp}
while [[ $# -gt 0 ]]; do
	case $1 in
	--size) SIZE=$2; shift 2 ;;
	--runs) RUNS=$2; shift 2 ;;
	--dir) DIR=$2; shift 2 ;;
	*) echo "usage: $0 [--size 1GiB] [--runs 3] [--dir /tmp]" >&2; exit 2 ;;
	esac
done

# Torch from the host's /usr/bin/python3 (Debian 12: torch 1.13), or else
# from the torch 2.6 environment of scripts/torch-env.sh, which runs Python
# in a chroot with the repository bind-mounted as its working directory:
# then the scratch directory lives in the repository (same disk) and Python
# is given paths relative to it.
PY=/usr/bin/python3
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
if "$PY" -c "import torch" >/dev/null 2>&1; then
	PYRUN=("$PY")
	WORK=$(mktemp -d "$DIR/dcp-compare.XXXXXX")
	PWORK=$WORK
elif bash "$ROOT/scripts/torch-env.sh" status >/dev/null 2>&1; then
	PYRUN=(bash "$ROOT/scripts/torch-env.sh" run python3)
	WORK=$(mktemp -d "$ROOT/.dcp-compare.XXXXXX")
	PWORK=${WORK#"$ROOT"/}
	cd "$ROOT"
else
	echo "dcp_compare: skipped: $PY cannot import torch and scripts/torch-env.sh is not built (install: apt-get update && apt-get install -y python3-torch python3-numpy, ~150 s; or scripts/torch-env.sh build)"
	exit 0
fi
trap 'rm -rf "$WORK"' EXIT
(cd "$ROOT" && go build -o "$WORK/ckptbench" ./bench/cmd/ckptbench)
"$WORK/ckptbench" spec --size "$SIZE" >"$WORK/spec.json"

# The DCP side: one save (fresh directory) and one load per invocation,
# printed as JSON {"save": s, "load": s}.
cat >"$WORK/dcp_run.py" <<'PY'
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import shutil
import sys
import time

# torch 1.13's sharded_tensor/metadata.py declares
# `field(default=TensorProperties())`, which Python 3.11 rejects (mutable
# default). Patch that one declaration in memory, at import time, into the
# default_factory form torch 2.0 uses; the installed file is untouched.
# (torch 2.x already has that form: its source is compiled unchanged.)
TARGET = "torch.distributed._shard.sharded_tensor.metadata"


class _PatchLoader(importlib.machinery.SourceFileLoader):
    # Always compile from the patched source (never the cached bytecode).
    def get_code(self, fullname):
        source = self.get_data(self.path)
        fixed = source.replace(b"field(default=TensorProperties())", b"field(default_factory=TensorProperties)")
        return compile(fixed, self.path, "exec", dont_inherit=True)


class _PatchFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.origin is None:
            return None
        return importlib.util.spec_from_file_location(name, spec.origin, loader=_PatchLoader(name, spec.origin))


sys.meta_path.insert(0, _PatchFinder())

import torch  # noqa: E402

if int(torch.__version__.split(".")[0]) >= 2:
    import torch.distributed.checkpoint as dcp  # noqa: E402

    # Without a process group DCP 2.x saves and loads in this process only.
    def save_sd(sd, w):
        dcp.save(sd, storage_writer=w)

    def load_sd(sd, r):
        dcp.load(sd, storage_reader=r)
else:
    import torch.distributed._shard.checkpoint as dcp  # noqa: E402

    def save_sd(sd, w):
        dcp.save_state_dict(sd, w, no_dist=True)

    def load_sd(sd, r):
        dcp.load_state_dict(sd, r, no_dist=True)

spec_path, work = sys.argv[1], sys.argv[2]
with open(spec_path) as f:
    spec = json.load(f)
torch.manual_seed(0)
src = {t["key"]: torch.rand(*t["shape"], dtype=torch.float32) for t in spec}
ck = os.path.join(work, "dcp-ckpt")
shutil.rmtree(ck, ignore_errors=True)
os.makedirs(ck)
t0 = time.perf_counter()
save_sd(src, dcp.FileSystemWriter(ck, single_file_per_rank=True, sync_files=True))
save = time.perf_counter() - t0
dst = {t["key"]: torch.empty(*t["shape"], dtype=torch.float32) for t in spec}
for v in dst.values():
    v.zero_()
t0 = time.perf_counter()
load_sd(dst, dcp.FileSystemReader(ck))
load = time.perf_counter() - t0
for k in list(src)[::16]:
    if not torch.equal(src[k], dst[k]):
        raise SystemExit(f"DCP load of {k} differs from what was saved")
shutil.rmtree(ck)
print(json.dumps({"save": save, "load": load, "tensors": len(spec), "torch": torch.__version__}))
PY

echo "dcp_compare: $SIZE, $RUNS runs each, alternating; $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for i in $(seq 1 "$RUNS"); do
	"${PYRUN[@]}" "$PWORK/dcp_run.py" "$PWORK/spec.json" "$PWORK" | tail -n 1 >>"$WORK/dcp.jsonl"
	"$WORK/ckptbench" dcp --dir "$WORK" --size "$SIZE" --runs 1 >>"$WORK/ckptkit.jsonl"
	echo "dcp_compare: run $i: DCP $(tail -1 "$WORK/dcp.jsonl") ckptkit $(tail -1 "$WORK/ckptkit.jsonl" | cut -c1-120)" >&2
done

"$PY" - "$WORK/dcp.jsonl" "$WORK/ckptkit.jsonl" "$(cut -d' ' -f1-3 /proc/loadavg)" <<'PY'
import json
import statistics
import sys

dcp = [json.loads(l) for l in open(sys.argv[1])]
ck = [json.loads(l) for l in open(sys.argv[2])]
print(f"{'figure':<28}{'ckptkit s':>24}{'DCP s':>24}{'ratio (DCP/ckptkit)':>26}  goal    met?")
for op, goal in (("save", 2.0), ("load", 3.0), ("load_transactional", None)):
    a = [c[op]["median"] for c in ck]
    b = [d[op.replace("_transactional", "")] for d in dcp]
    pairs = [y / x for x, y in zip(a, b)]
    ratio = statistics.median(b) / statistics.median(a)
    fmt = lambda xs: f"{statistics.median(xs):.2f} [{min(xs):.2f}, {max(xs):.2f}]"
    print(f"{op + ' (' + str(ck[0]['tensors']) + ' tensors)':<28}{fmt(a):>24}{fmt(b):>24}"
          f"{f'{ratio:.2f} [{min(pairs):.2f}, {max(pairs):.2f}]':>26}  " +
          (f">= {goal}  {'yes' if ratio >= goal else 'NO'}" if goal else "-       (extra row)"))
print(f"ckptkit load modes: {ck[0]['load_mode']} (default), {ck[0]['load_transactional_mode']} (Transactional); DCP loads in one pass")
print(f"load average at the end: {sys.argv[3]}")
PY
