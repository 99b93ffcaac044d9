#!/usr/bin/env bash
# kill_and_resume.sh RUN_BASE_URL [TRAINER FLAGS...] - the example's
# kill-and-resume check (docs/TORCH.md): an uninterrupted 2-rank run, then
# runs killed with SIGKILL after step 5 and resumed on 2 ranks and on 1 rank;
# all three must end with bit-identical weights. Further flags (--async) go
# to every run. Run it in the torch environment:
#   scripts/torch-env.sh run bash examples/torch/kill_and_resume.sh file:///tmp/moe
set -euo pipefail
base=${1:?usage: kill_and_resume.sh RUN_BASE_URL [TRAINER FLAGS...]}
shift
train="python3 $(dirname "$0")/moe_train.py --steps 12 --save-every 3 $*"
digest() { sed -n 's/.*weights sha256 \([0-9a-f]*\).*/\1/p' | tail -n1; }

echo "== uninterrupted, 2 ranks"
ref=$($train --url "$base/full" --world 2 | tee /dev/stderr | digest)

for resume_world in 2 1; do
	run=$base/killed-2to$resume_world
	echo "== 2 ranks, killed after step 5"
	$train --url "$run" --world 2 --kill-at 5 >&2 || echo "(exit $?)" >&2
	echo "== resumed on $resume_world rank(s)"
	got=$($train --url "$run" --world "$resume_world" | tee /dev/stderr | digest)
	if [[ -z $ref || -z $got ]]; then
		echo "2 -> $resume_world: no weights digest in the trainer's output (ref '$ref', got '$got')" >&2
		exit 1
	elif [[ $got == "$ref" ]]; then
		echo "2 -> $resume_world: bit-identical to the uninterrupted run ($got)"
	else
		echo "2 -> $resume_world: DIFFERENT: $got vs $ref" >&2
		exit 1
	fi
done
