#!/usr/bin/env bash
# reliability.sh - the issue 16 reliability campaign at full size, as
# `make reliability` runs it: starts the S3/GCS test servers, runs
# internal/reliability with CKPTKIT_RELIABILITY=full (SIGKILL points on fs,
# S3 and GCS, two writers on one run, single-bit flips, S3 and GCS requests
# faulted through internal/testkit/faultproxy, the hostile corpus, killed uploads
# on S3 and GCS and gc),
# then every fuzz target for FUZZTIME each (default 10m), and prints the
# table docs/RELIABILITY.md publishes. Writes it to $CKPTKIT_RELIABILITY_REPORT
# (default reliability-report.md in the clone, ignored by git).
set -euo pipefail
cd "$(dirname "$0")/.."

FUZZTIME=${FUZZTIME:-10m}
report=${CKPTKIT_RELIABILITY_REPORT:-$PWD/reliability-report.md}

servers_env=$(bash scripts/test-servers.sh start)
eval "$servers_env"
trap 'bash scripts/test-servers.sh stop >/dev/null 2>&1 || true' EXIT

status=0
# A run that records no row (a build failure, an early panic) must not
# print the previous run's table as its own.
: >"$report"
CKPTKIT_RELIABILITY=full CKPTKIT_RELIABILITY_REPORT=$report \
	go test -count=1 -timeout 3h -v ./internal/reliability >"$report.log" 2>&1 || status=$?
grep -E '^(--- |FAIL|ok )' "$report.log" || true

echo >>"$report"
bash scripts/fuzz.sh "$FUZZTIME" >>"$report" || status=1
echo
cat "$report"
exit "$status"
