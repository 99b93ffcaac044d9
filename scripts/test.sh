#!/usr/bin/env bash
# test.sh - the whole test suite, as `make test` and .ci/run run it.
# Runs scripts/lint.sh first (gofmt, go vet, staticcheck: any finding fails
# the run before a test starts), with the servers' install and the torch
# environments' preparation beside it. Starts the local S3 (versitygw) and GCS
# (fake-gcs-server) servers with scripts/test-servers.sh (installed by `go install` into a cache outside the
# clone), runs every Go test, prints the conformance matrix, and stops the
# servers on exit. Extra arguments go to `go test` (e.g. -short, -run X).
set -euo pipefail
cd "$(dirname "$0")/.."

# The torch environments the Python suite runs in (scripts/torch-env.sh;
# trixie: torch 2.6, forky: the newest torch Debian ships); pick with
# CKPTKIT_TORCH_SUITES (default both; CKPTKIT_TORCH_SUITES=trixie runs one).
suites=(${CKPTKIT_TORCH_SUITES:-trixie forky})

# prepare_env SUITE: the environment is current, or is built (topped up in
# place when built with an older package list). With CI=true a missing one
# is built; otherwise only one that exists is topped up.
prepare_env() {
	local suite=$1 env_dir=$HOME/.cache/ckptkit/torch-env
	[[ $suite == trixie ]] || env_dir=$env_dir-$suite
	bash scripts/torch-env.sh -s "$suite" status ||
		{ [[ "${CI:-}" == "true" || -f $env_dir/.ckptkit-ready ]] && bash scripts/torch-env.sh -s "$suite" build; }
}

# On a fresh machine the servers' install (several minutes of compiling),
# the torch environments' builds (downloading and unpacking packages) and
# lint (staticcheck's install, go vet) are independent: the first two run in
# the background while lint runs, and are waited for before the tests (the
# Go tests check the environments too: internal/readme). Each is a no-op
# when its result is cached.
prep_dir=$(mktemp -d)
trap 'rm -rf "$prep_dir"' EXIT
bash scripts/test-servers.sh install >"$prep_dir/servers.log" 2>&1 &
install_pid=$!
env_pids=()
for suite in "${suites[@]}"; do
	prepare_env "$suite" >"$prep_dir/$suite.log" 2>&1 &
	env_pids+=($!)
done
# wait_envs: wait for the environments' preparation; env_ready[i] says
# whether suites[i]'s environment is ready.
env_ready=()
wait_envs() {
	local i
	for i in "${!suites[@]}"; do
		if wait "${env_pids[$i]}"; then
			env_ready[$i]=1
		else
			env_ready[$i]=0
			[[ -s $prep_dir/${suites[$i]}.log ]] && tail -n 30 "$prep_dir/${suites[$i]}.log" >&2
		fi
	done
}
if ! bash scripts/lint.sh; then
	wait "$install_pid" || true
	wait_envs
	exit 1
fi

if [[ -x scripts/test-servers.sh || -f scripts/test-servers.sh ]]; then
	wait "$install_pid" || true # a failed install fails start below
	cat "$prep_dir/servers.log" >&2
	if servers_env=$(bash scripts/test-servers.sh start); then
		eval "$servers_env"
		trap 'bash scripts/test-servers.sh stop >/dev/null 2>&1 || true; rm -rf "$prep_dir"' EXIT
	elif [[ "${CI:-}" == "true" ]]; then
		echo "test.sh: the S3/GCS test servers failed to start (CI=true makes that fatal)" >&2
		exit 1
	else
		echo "test.sh: S3/GCS test servers did not start; their tests will skip" >&2
	fi
fi

wait_envs

# Conformance rows are appended here by each backend's test package and
# printed after the run (go test hides a passing package's output).
export CKPTKIT_CONFORMANCE_SUMMARY=${CKPTKIT_CONFORMANCE_SUMMARY:-$(mktemp)}
set +e
go test -count=1 -timeout 30m "$@" ./...
status=$?
# Every fuzz target for a bounded time (scripts/fuzz.sh; make reliability
# runs them longer). CKPTKIT_FUZZTIME=0 skips them.
if [[ "${CKPTKIT_FUZZTIME:-3s}" != 0 ]]; then
	echo
	echo "== fuzz targets (${CKPTKIT_FUZZTIME:-3s} each) =="
	bash scripts/fuzz.sh "${CKPTKIT_FUZZTIME:-3s}" || status=1
fi
set -e
if [[ -s $CKPTKIT_CONFORMANCE_SUMMARY ]]; then
	echo
	echo "== conformance matrix (backend x case) =="
	cat "$CKPTKIT_CONFORMANCE_SUMMARY"
fi
# --- Python suite: libckptkit + python/ckptkit, run inside each torch
# environment prepared above, with the S3/GCS servers above. With CI=true a
# failed set-up fails the run; otherwise a missing environment skips its
# suite, loudly.
py_status=0
built=
ran=()
for i in "${!suites[@]}"; do
	suite=${suites[$i]}
	if [[ ${env_ready[$i]} == 1 ]]; then
		if [[ -z $built ]]; then
			if make -s python && CGO_ENABLED=0 go build -o bin/ckpt ./cmd/ckpt &&
				CGO_ENABLED=0 go build -o bin/plugins/fsplugin ./plugins/examples/fsplugin &&
				bash scripts/wheel.sh -s "$suite" >/dev/null; then
				built=ok
			else
				built=failed
			fi
		fi
		if [[ $built != ok ]]; then
			py_status=1
			break
		fi
		version=$(bash scripts/torch-env.sh -s "$suite" version || echo "torch ?")
		echo
		echo "== Python suite ($suite: $version) =="
		suite_status=0
		if [[ $suite == trixie ]]; then
			# The binding's type hints (python/pyproject.toml [tool.mypy]),
			# checked with the Debian package against this torch's hints.
			echo "== mypy --strict python/ckptkit ($suite) =="
			bash scripts/torch-env.sh -s trixie run mypy --strict --config-file python/pyproject.toml \
				--cache-dir /tmp/ckptkit-mypy-cache python/ckptkit || suite_status=$?
		fi
		bash scripts/torch-env.sh -s "$suite" run python3 -m pytest -q -p no:cacheprovider python/tests || suite_status=$?
		ran+=("$suite ($version): exit $suite_status")
		[[ $suite_status -eq 0 ]] || py_status=$suite_status
	elif [[ "${CI:-}" == "true" ]]; then
		echo "test.sh: the $suite torch environment could not be built (CI=true makes that fatal)" >&2
		py_status=1
	else
		echo >&2
		echo "test.sh: *** SKIPPING the Python suite on $suite: no torch environment (build it once: bash scripts/torch-env.sh -s $suite build) ***" >&2
	fi
done
if [[ ${#ran[@]} -gt 0 ]]; then
	echo
	echo "== Python suites run =="
	printf '%s\n' "${ran[@]}"
fi
if [[ $status -eq 0 ]]; then
	status=$py_status
fi
exit "$status"
