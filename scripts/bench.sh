#!/usr/bin/env bash
# bench.sh - build and run ckptbench (bench/cmd/ckptbench): prints the results
# table and writes bench/results.json. `make bench` runs it.
#
#   scripts/bench.sh                     # ~1 GiB, 3 runs per figure (a few minutes)
#   scripts/bench.sh --size 64MiB        # quick check
#   BENCH_SERVERS=1 scripts/bench.sh     # also start the S3/GCS test servers
#   scripts/bench.sh --only meta --profile-dir /tmp/prof
#   scripts/bench.sh --only torch        # the PyTorch comparison alone
#
# Any argument is passed to ckptbench (see `ckptbench -h`); `--only torch`
# runs only the PyTorch comparison (below). The S3 and GCS
# figures run when CKPTKIT_TEST_S3_URL / CKPTKIT_TEST_GCS_URL are set, for
# example by `eval "$(scripts/test-servers.sh start)"`; otherwise they print
# "skipped" rows. bench/dcp_compare.sh (PyTorch DCP comparison) is separate.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$ROOT"
BIN_DIR=$(mktemp -d "${TMPDIR:-/tmp}/ckptbench-bin.XXXXXX")
trap 'rm -rf "$BIN_DIR"' EXIT

# With BENCH_SERVERS=1: use the clone's running test servers when they answer
# (never stopping them); otherwise start private ones in a throw-away run
# dir and stop exactly those at exit.
if [[ ${BENCH_SERVERS:-0} == 1 && -z ${CKPTKIT_TEST_S3_URL:-} ]]; then
	if bash scripts/test-servers.sh status >/dev/null 2>&1; then
		eval "$(bash scripts/test-servers.sh env)"
	else
		export CKPTKIT_RUN_DIR=$BIN_DIR/servers
		eval "$(bash scripts/test-servers.sh start)"
		trap 'bash scripts/test-servers.sh stop >/dev/null 2>&1 || true; rm -rf "$BIN_DIR"' EXIT
	fi
fi

# When the URLs under test are the test servers', tell ckptbench their PIDs:
# the S3/GCS figures then add the servers' CPU time (they share the cores).
if [[ -n ${CKPTKIT_TEST_S3_URL:-} ]] && bash scripts/test-servers.sh status >/dev/null 2>&1 &&
	[[ $(bash scripts/test-servers.sh env) == *"CKPTKIT_TEST_S3_URL='$CKPTKIT_TEST_S3_URL'"* ]]; then
	eval "$(bash scripts/test-servers.sh pids)"
fi

echo "bench: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
if [[ "$*" != "--only torch" ]]; then
	go build -o "$BIN_DIR/ckptbench" ./bench/cmd/ckptbench
	"$BIN_DIR/ckptbench" --json bench/results.json "$@"
fi

# --- PyTorch: ckptkit.torch's StorageWriter/StorageReader against torch's
# FileSystemWriter/FileSystemReader and the single-copy limit (the
# "physical" row), ~1 GiB, in every torch environment that exists (trixie:
# torch 2.6; forky: the newest; scripts/torch-env.sh build; docs/TORCH.md).
# The save/load comparison of every environment runs first, then the async
# and training-loop rows: those write tens of GiB, and the shared disk is
# still busy with them (writeback, discards) for a while after, which would
# land in the next environment's comparison.
# BENCH_TORCH_RUNS (default 8: an even count, so each side saves second equally often) runs each; results in
# bench/torch_results-SUITE.json (comparison) and bench/torch_async-SUITE.json.
suites=()
for suite in trixie forky; do
	if bash scripts/torch-env.sh -s "$suite" status; then
		suites+=("$suite")
	else
		echo "bench: torch comparison on $suite skipped: no torch environment (bash scripts/torch-env.sh -s $suite build)" >&2
	fi
done
((${#suites[@]})) && make -s python
for suite in "${suites[@]}"; do
	sync
	echo "bench: torch comparison on $suite ($(bash scripts/torch-env.sh -s "$suite" version)), load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
	bash scripts/torch-env.sh -s "$suite" run python3 bench/torch_bench.py --runs "${BENCH_TORCH_RUNS:-8}" \
		--async-saves 0 --loop-steps 0 --json "bench/torch_results-$suite.json"
done
for suite in "${suites[@]}"; do
	echo "bench: torch async and training-loop rows on $suite, load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
	bash scripts/torch-env.sh -s "$suite" run python3 bench/torch_bench.py --no-compare \
		--json "bench/torch_async-$suite.json"
done
