#!/usr/bin/env bash
# lint.sh - gofmt, go vet and staticcheck over the module; exits non-zero on
# any finding. `make lint` runs it, and scripts/test.sh (so `make test` and
# CI) runs it before the tests.
#
# staticcheck is pinned (STATICCHECK_VERSION) and installed once with
# `go install` from the module proxy into the same cache as the test
# servers: ${CKPTKIT_CACHE:-$HOME/.cache/ckptkit}/bin/staticcheck-<version>.
set -euo pipefail
cd "$(dirname "$0")/.."

STATICCHECK_VERSION=${STATICCHECK_VERSION:-v0.8.2}
CACHE=${CKPTKIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ckptkit}
BIN_DIR=$CACHE/bin
STATICCHECK=$BIN_DIR/staticcheck-$STATICCHECK_VERSION

log() { printf 'lint: %s\n' "$*" >&2; }

status=0

# gofmt: tracked files and new ones not yet added (ignored files excluded).
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	mapfile -t files < <(git ls-files --cached --others --exclude-standard -- '*.go')
else
	mapfile -t files < <(find . -name '*.go' -not -path './.git/*')
fi
existing=()
for f in "${files[@]}"; do [[ -f $f ]] && existing+=("$f"); done
if ((${#existing[@]})); then
	unformatted=$(gofmt -l "${existing[@]}")
	if [[ -n $unformatted ]]; then
		log "gofmt: these files need formatting (run gofmt -w):"
		printf '%s\n' "$unformatted" >&2
		status=1
	fi
fi

if ! go vet ./...; then
	log "go vet reported problems"
	status=1
fi

if [[ ! -x $STATICCHECK ]]; then
	mkdir -p "$BIN_DIR"
	tmp=$(mktemp -d "$BIN_DIR/.install-staticcheck.XXXXXX")
	log "installing staticcheck $STATICCHECK_VERSION into $BIN_DIR"
	if ! GOBIN=$tmp GOFLAGS=-buildvcs=false go install "honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION" >&2; then
		rm -rf "$tmp"
		log "go install staticcheck@$STATICCHECK_VERSION failed"
		exit 1
	fi
	mv -f "$tmp/staticcheck" "$STATICCHECK"
	rm -rf "$tmp"
fi
if ! "$STATICCHECK" ./...; then
	log "staticcheck reported problems"
	status=1
fi

if ((status == 0)); then
	log "gofmt, go vet and staticcheck: clean"
fi
exit "$status"
