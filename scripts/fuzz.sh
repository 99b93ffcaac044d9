#!/usr/bin/env bash
# fuzz.sh TIME - runs every fuzz target of the module for TIME each
# (go test -fuzz ... -fuzztime TIME) and prints one markdown table row per
# target. Exits non-zero on a finding (go test saves the input under the
# package's testdata/fuzz), on a target that fails twice without one, and
# on a target name that matches no fuzz test (go test -fuzz would pass).
# make test runs it for a few seconds per target, make reliability
# (scripts/reliability.sh) for FUZZTIME.
set -euo pipefail
cd "$(dirname "$0")/.."

time=${1:-5s}
# Every input that finds new coverage is minimised before fuzzing goes on,
# by a minimiser quadratic in the input's length, for up to 60 s by default:
# on pickles and zips, where removing any byte loses the new coverage, that
# is the whole 60 s per new input with no executions counted (FuzzUnpickle
# sat at 0 execs/s). A bound in executions keeps minimisation short however
# loaded the machine is; a finding is still saved (minimised less).
minimize=${FUZZMINIMIZE:-10000x}
# Workers per target (default: GOMAXPROCS); FUZZPARALLEL=1 leaves cores free.
parallel=()
if [[ -n "${FUZZPARALLEL:-}" ]]; then
	parallel=(-parallel "$FUZZPARALLEL")
fi
# The targets: metadata decode+validate, the DCP unpickler (.metadata and
# item pickles), DCP torch.save zip items, the safetensors header convert
# writes, the plugin status frames and shared-memory frames, and the
# CRC-32C folding path against hash/crc32.
targets=(
	"./metadata FuzzDecode"
	"./interop/torchdcp FuzzUnpickle"
	"./interop/torchdcp FuzzDecodeTensor"
	"./convert/safetensors FuzzHeader"
	"./plugins/internal/wire FuzzDetail"
	"./plugins/internal/wire FuzzFrames"
	"./internal/crc32c FuzzUpdate"
)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
echo "| fuzz target | time | result |"
echo "| --- | --- | --- |"
# saved lists the inputs go test has saved for target $2 of package $1.
saved() { ls "$1/testdata/fuzz/$2" 2>/dev/null || true; }
for t in "${targets[@]}"; do
	read -r pkg name <<<"$t"
	# go test -fuzz passes when no target matches: make sure it exists.
	listed=$(go test -list "^${name}\$" "$pkg" 2>&1 || true)
	if ! grep -qx "$name" <<<"$listed"; then
		status=1
		echo "| $pkg $name | $time | NO SUCH FUZZ TARGET |"
		continue
	fi
	before=$(saved "$pkg" "$name")
	ok=0
	for attempt in 1 2; do
		if go test -run '^$' -fuzz "^${name}\$" -fuzztime "$time" -fuzzminimizetime "$minimize" "${parallel[@]}" "$pkg" >"$log" 2>&1; then
			ok=1
			break
		fi
		# A finding is an input saved under testdata/fuzz. A failure that
		# saved none is the fuzzing engine's own (go test -fuzz can end with
		# "context deadline exceeded" when -fuzztime runs out while a worker
		# is still minimising a new input): tried once more.
		[[ "$(saved "$pkg" "$name")" == "$before" ]] || break
		echo "fuzz: $pkg $name failed without saving an input (attempt $attempt):" >&2
		tail -5 "$log" >&2
	done
	if ((ok)); then
		# A short run can end during the baseline, before any "execs:" line.
		execs=$(grep -o 'execs: [0-9]*' "$log" | tail -1 | cut -d' ' -f2 || true)
		note=""
		((attempt == 1)) || note=", on a second run after an engine error"
		echo "| $pkg $name | $time | no finding (${execs:-?} execs$note) |"
	elif [[ "$(saved "$pkg" "$name")" != "$before" ]]; then
		status=1
		echo "| $pkg $name | $time | FINDING (input saved under $pkg/testdata/fuzz) |"
		tail -20 "$log" >&2
	else
		status=1
		echo "| $pkg $name | $time | FAILED twice without saving an input (see the log above) |"
		tail -20 "$log" >&2
	fi
done
exit "$status"
