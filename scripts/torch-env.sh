#!/usr/bin/env bash
# torch-env.sh - cached Debian chroots with Debian's python3-torch for the
# Python suite and the examples: trixie (Debian 13: torch 2.6, Python 3.13)
# and forky (Debian's newest: torch 2.14, Python 3.14). Debian 12 ships torch
# 1.13 only and PyPI is not reachable, so each is built with debootstrap.
#
#   scripts/torch-env.sh [-s SUITE] build       build it once (SUITE: trixie,
#                                     the default, or forky) into
#                                     $CKPTKIT_TORCH_ENV (default
#                                     ~/.cache/ckptkit/torch-env for trixie,
#                                     ~/.cache/ckptkit/torch-env-SUITE otherwise)
#   scripts/torch-env.sh [-s SUITE] status      exit 0 when it is built with today's package list
#   scripts/torch-env.sh [-s SUITE] version     print "torch X, Python Y" of the environment
#   scripts/torch-env.sh [-s SUITE] run CMD...  run CMD inside it, with the repo
#                                     bind-mounted at /run.PID/repo (the
#                                     cwd), PYTHONPATH set to its python/
#
# The mirror comes from the host's apt sources (first http(s) Debian URI).
# Mounts made by `run` are always removed by an EXIT trap. Needs root.
set -euo pipefail

SUITE=trixie
if [[ ${1:-} == -s ]]; then
	SUITE=${2:?usage: $0 -s SUITE build|status|version|run CMD...}
	shift 2
fi
case $SUITE in
trixie) default_dir=$HOME/.cache/ckptkit/torch-env ;;
forky) default_dir=$HOME/.cache/ckptkit/torch-env-forky ;;
*)
	echo "torch-env: unknown suite $SUITE (trixie or forky)" >&2
	exit 2
	;;
esac
ENV_DIR=${CKPTKIT_TORCH_ENV:-$default_dir}
# Suites newer than the host's debootstrap know are built with its sid
# script (forky is the testing suite). A mirror whose Release file has
# passed its Valid-Until date (mirror snapshots) is still taken: the
# packages are checked against the signed Release all the same.
APT_OPTS="-o Acquire::Check-Valid-Until=false"
REPO=$(cd "$(dirname "$0")/.." && pwd)
# python3-pip and python3-setuptools let a test check `pip install ./python`
# offline (--no-build-isolation); mypy type-checks python/ckptkit
# (scripts/test.sh). The ready stamp holds this list: a cached environment
# built with another list is topped up in place by `build`.
PACKAGES="python3-torch python3-numpy python3-safetensors python3-pytest python3-pip python3-setuptools mypy"

mirror() {
	if [[ -n ${CKPTKIT_DEBIAN_MIRROR:-} ]]; then
		echo "$CKPTKIT_DEBIAN_MIRROR"
		return
	fi
	local m
	m=$(grep -rhoE '(URIs:|deb) +https?://[^ ]*/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null |
		awk '{print $2}' | head -n1 || true)
	echo "${m:-http://deb.debian.org/debian}"
}

build() {
	if [[ -f $ENV_DIR/.ckptkit-ready ]]; then
		if [[ $(cat "$ENV_DIR/.ckptkit-ready") == "$PACKAGES" ]]; then
			echo "torch-env: ready at $ENV_DIR" >&2
			return 0
		fi
		echo "torch-env: topping up $ENV_DIR with: $PACKAGES" >&2
		(
			mounts "$ENV_DIR"
			trap unmounts EXIT
			chroot "$ENV_DIR" /usr/bin/env DEBIAN_FRONTEND=noninteractive \
				sh -c "apt-get $APT_OPTS update -qq && apt-get $APT_OPTS install -y -qq --no-install-recommends $PACKAGES && apt-get clean" >&2
		)
		printf '%s' "$PACKAGES" >"$ENV_DIR/.ckptkit-ready"
		return 0
	fi
	if ! command -v debootstrap >/dev/null; then
		apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null
	fi
	local m tmp
	m=$(mirror)
	mkdir -p "$(dirname "$ENV_DIR")"
	tmp=$ENV_DIR.building.$$
	rm -rf "$tmp"
	local script=()
	if [[ ! -e /usr/share/debootstrap/scripts/$SUITE ]]; then
		script=(/usr/share/debootstrap/scripts/sid)
	fi
	echo "torch-env: debootstrap $SUITE from $m into $tmp" >&2
	debootstrap --variant=minbase "$SUITE" "$tmp" "$m" "${script[@]}" >&2
	cp /etc/resolv.conf "$tmp/etc/resolv.conf" 2>/dev/null || true
	(
		mounts "$tmp"
		trap unmounts EXIT
		chroot "$tmp" /usr/bin/env DEBIAN_FRONTEND=noninteractive \
			sh -c "apt-get $APT_OPTS update -qq && apt-get $APT_OPTS install -y -qq --no-install-recommends $PACKAGES && apt-get clean" >&2
		chroot "$tmp" python3 -c 'import torch, numpy, safetensors, pytest; print("torch", torch.__version__)' >&2
	)
	printf '%s' "$PACKAGES" >"$tmp/.ckptkit-ready"
	rm -rf "$ENV_DIR"
	mv "$tmp" "$ENV_DIR"
	echo "torch-env: ready at $ENV_DIR" >&2
}

# MOUNTED lists the mount points this invocation made, so that concurrent
# runs (several worktrees) never unmount each other's.
MOUNTED=()

mounts() {
	local root=$1
	mount -t proc proc "$root/proc" && MOUNTED+=("$root/proc")
	mount --rbind /dev "$root/dev" && MOUNTED+=("$root/dev")
	mount --make-rslave "$root/dev"
}

unmounts() {
	local i
	# Newest first; lazy, so a straggling process cannot keep a mount alive.
	for ((i = ${#MOUNTED[@]} - 1; i >= 0; i--)); do
		umount -l "${MOUNTED[i]}" 2>/dev/null || true
		# rmdir removes only the empty mount points left behind.
		if [[ ${MOUNTED[i]} == */run.* ]]; then rmdir "${MOUNTED[i]}" 2>/dev/null || true; fi
	done
	MOUNTED=()
}

run() {
	if [[ ! -f $ENV_DIR/.ckptkit-ready ]]; then
		echo "torch-env: not built (run: $0 build)" >&2
		return 2
	fi
	local root=$ENV_DIR
	# torch's process-based async checkpointing resolves the host name.
	cp /etc/hosts "$root/etc/hosts" 2>/dev/null || true
	# Per-invocation mount point: the repo at /run.PID/repo (cwd).
	local inside=/run.$$
	mkdir -p "$root$inside/repo"
	trap unmounts EXIT
	MOUNTED+=("$root$inside" "$root$inside/repo")
	mounts "$root"
	mount --bind "$REPO" "$root$inside/repo" && MOUNTED+=("$root$inside/repo")
	# The chroot sees the host's network namespace, so the S3/GCS test
	# servers on 127.0.0.1 are reachable with the host's URLs.
	local status=0 v
	local -a pass=()
	# Every variable of README's environment table (and the rest of the
	# AWS_*, GOOGLE_* and CKPTKIT_* families), except those set below for
	# inside the chroot. A path a variable names must be visible there.
	for v in $(compgen -v); do
		case $v in
		CKPTKIT_FIXTURES | CKPTKIT_CKPT_BIN | CKPTKIT_TORCH_SUITE | CKPTKIT_TORCH_ENV) continue ;;
		AWS_* | GOOGLE_* | CLOUDSDK_* | CKPTKIT_* | STORAGE_EMULATOR_HOST | WITH_SEAWEEDFS | CI) ;;
		*) continue ;;
		esac
		if [[ -n ${!v:-} ]]; then
			pass+=("$v=${!v}")
		fi
	done
	chroot "$root" /usr/bin/env -i \
		CKPTKIT_TORCH_SUITE="$SUITE" PATH=/usr/local/bin:/usr/bin:/bin HOME=/tmp LANG=C.UTF-8 USE_LIBUV=0 \
		PYTHONPATH=$inside/repo/python PYTHONDONTWRITEBYTECODE=1 \
		CKPTKIT_CKPT_BIN=$inside/repo/bin/ckpt \
		"${pass[@]}" \
		sh -c 'cd "$0" && exec "$@"' "$inside/repo" "$@" || status=$?
	return "$status"
}

case ${1:-} in
build) build ;;
status) [[ -f $ENV_DIR/.ckptkit-ready && $(cat "$ENV_DIR/.ckptkit-ready") == "$PACKAGES" ]] ;;
version) run python3 -c 'import sys, torch; print(f"torch {torch.__version__}, Python {sys.version.split()[0]}")' 2>/dev/null ;;
run)
	shift
	run "$@"
	;;
*)
	echo "usage: $0 [-s trixie|forky] build|status|version|run CMD..." >&2
	exit 2
	;;
esac
