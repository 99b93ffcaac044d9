#!/usr/bin/env bash
# test-servers.sh - install, start and stop the local object-store servers the
# S3 and GCS backend tests run against (versitygw for S3, fake-gcs-server for
# GCS). Needs only Go (and gcc) on PATH.
#
#   eval "$(scripts/test-servers.sh start)"   # install if needed, start, print exports
#   trap 'scripts/test-servers.sh stop' EXIT
#   go test ./...
#
#   scripts/test-servers.sh install   # only build the binaries into the cache
#   scripts/test-servers.sh env       # print the exports of the running servers
#   scripts/test-servers.sh stop      # stop the servers by PID, remove the run dir
#   scripts/test-servers.sh status    # exit 0 when both servers (and SeaweedFS, if started) run
#   scripts/test-servers.sh pids      # print the servers' PIDs as exports (for scripts/bench.sh)
#
# Binaries go to ${CKPTKIT_CACHE:-$HOME/.cache/ckptkit}/bin/<name>-<version>,
# outside the clone, so a second run is instant. The run directory (PIDs, env
# file, server logs, the S3 posix root) is $CKPTKIT_RUN_DIR, by default
# $CKPTKIT_CACHE/run/<checksum of the clone's path>: one per clone.
# Access keys are generated per run and live only in the run dir's env file.
# Everything except the export lines goes to stderr, so eval sees only those.
#
# WITH_SEAWEEDFS=1 (with install or start) also builds and starts SeaweedFS
# (`weed mini`: master, volume, filer and S3 gateway in one process) as a
# second, distributed S3 server and exports CKPTKIT_TEST_S3_SEAWEED_URL:
#   eval "$(WITH_SEAWEEDFS=1 scripts/test-servers.sh start)"
# (not `WITH_SEAWEEDFS=1 eval "$(...)"`: that sets it for eval only, after
# the script has already run). It uses the same generated key pair as
# versitygw (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY), set in an -s3.config
# file in the run dir (mode 600); its data dir is the run dir's seaweedfs/.
# `go install` refuses the SeaweedFS module (its go.mod has a replace
# directive), so it is downloaded with `go mod download` and `./weed` is
# built in a writable copy: 5-8 minutes and ~160 MiB, once per version.
set -euo pipefail

VERSITYGW_MOD=github.com/versity/versitygw/cmd/versitygw
VERSITYGW_VER=v1.8.0
FAKEGCS_MOD=github.com/fsouza/fake-gcs-server
FAKEGCS_VER=v1.56.1
SEAWEEDFS_MOD=github.com/seaweedfs/seaweedfs
SEAWEEDFS_VER=v0.0.0-20261109003541-7506e5f91cd6
case ${WITH_SEAWEEDFS:-} in
1 | true | yes) WITH_SEAWEEDFS=1 ;;
*) WITH_SEAWEEDFS=0 ;;
esac
BUCKET=${CKPTKIT_TEST_BUCKET:-ckpt-test}
# Written into the env file: servers started with other flags (an older
# version of this script) are restarted by start, not reused.
CONFIG_MARK='# test-servers config 2 (fake-gcs-server -public-host 127.0.0.1)'

CACHE=${CKPTKIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ckptkit}
BIN_DIR=$CACHE/bin
# One run dir per clone, so CI's fresh clone and a developer's tree on the
# same machine do not stop each other's servers.
CLONE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
RUN_DIR=${CKPTKIT_RUN_DIR:-$CACHE/run/$(printf '%s' "$CLONE_DIR" | cksum | cut -d' ' -f1)}
ENV_FILE=$RUN_DIR/env.sh
READY_TIMEOUT=${CKPTKIT_READY_TIMEOUT:-30}
# weed mini starts its services one after the other.
SEAWEEDFS_READY_TIMEOUT=${CKPTKIT_SEAWEEDFS_READY_TIMEOUT:-120}

VERSITYGW_BIN=$BIN_DIR/versitygw-$VERSITYGW_VER
FAKEGCS_BIN=$BIN_DIR/fake-gcs-server-$FAKEGCS_VER
SEAWEEDFS_BIN=$BIN_DIR/weed-$SEAWEEDFS_VER

log() { printf 'test-servers: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# install_one MODULE@VERSION TARGET LOGFILE: go install into a private GOBIN,
# then move the binary into place under its versioned name.
install_one() {
	local pkg=$1 target=$2 logf=$3 tmp
	[[ -x $target ]] && return 0
	tmp=$(mktemp -d "$BIN_DIR/.install.XXXXXX")
	if ! GOBIN=$tmp GOFLAGS=-buildvcs=false go install "$pkg" >"$logf" 2>&1; then
		rm -rf "$tmp"
		log "go install $pkg failed; see $logf"
		tail -n 20 "$logf" >&2 || true
		return 1
	fi
	mv -f "$tmp"/* "$target"
	rm -rf "$tmp"
}

# install_seaweedfs: download the SeaweedFS module (outside any module, so
# the clone's go.mod and go.sum stay untouched), build ./weed in a writable
# copy of it (the module cache is read-only) and move the binary into place.
install_seaweedfs() {
	[[ -x $SEAWEEDFS_BIN ]] && return 0
	command -v go >/dev/null || die "go is not on PATH"
	mkdir -p "$BIN_DIR"
	local t0=$SECONDS logf=$BIN_DIR/install-seaweedfs.log tmp json dir
	log "building SeaweedFS $SEAWEEDFS_VER into $BIN_DIR (first run only, 5-8 minutes)"
	tmp=$(mktemp -d "${TMPDIR:-/tmp}/ckptkit-seaweedfs.XXXXXX")
	if ! json=$(cd "$tmp" && GOWORK=off GOFLAGS=-mod=mod go mod download -json "$SEAWEEDFS_MOD@$SEAWEEDFS_VER" 2>"$logf"); then
		printf '%s\n' "$json" >>"$logf"
		rm -rf "$tmp"
		tail -n 20 "$logf" >&2 || true
		die "go mod download $SEAWEEDFS_MOD@$SEAWEEDFS_VER failed; see $logf"
	fi
	dir=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p' <<<"$json")
	[[ -n $dir && -d $dir ]] || { rm -rf "$tmp"; die "go mod download printed no module directory: $json"; }
	cp -R "$dir" "$tmp/src"
	chmod -R u+w "$tmp/src"
	# Built next to its final name, so the rename into place is atomic.
	if ! (cd "$tmp/src" && GOWORK=off GOFLAGS=-buildvcs=false go build -ldflags='-s -w' -o "$SEAWEEDFS_BIN.tmp.$$" ./weed) >>"$logf" 2>&1; then
		rm -rf "$tmp" "$SEAWEEDFS_BIN.tmp.$$"
		tail -n 20 "$logf" >&2 || true
		die "building SeaweedFS failed; see $logf"
	fi
	mv -f "$SEAWEEDFS_BIN.tmp.$$" "$SEAWEEDFS_BIN"
	rm -rf "$tmp"
	log "built SeaweedFS in $((SECONDS - t0))s"
}

cmd_install() {
	command -v go >/dev/null || die "go is not on PATH"
	mkdir -p "$BIN_DIR"
	[[ $WITH_SEAWEEDFS == 1 ]] && install_seaweedfs
	if [[ -x $VERSITYGW_BIN && -x $FAKEGCS_BIN ]]; then
		return 0
	fi
	local t0=$SECONDS pids=() rc=0
	log "installing servers into $BIN_DIR (first run only: several minutes on a fresh machine, mostly compiling)"
	install_one "$VERSITYGW_MOD@$VERSITYGW_VER" "$VERSITYGW_BIN" "$BIN_DIR/install-versitygw.log" & pids+=($!)
	install_one "$FAKEGCS_MOD@$FAKEGCS_VER" "$FAKEGCS_BIN" "$BIN_DIR/install-fake-gcs-server.log" & pids+=($!)
	for p in "${pids[@]}"; do wait "$p" || rc=1; done
	[[ $rc == 0 ]] || die "server install failed"
	log "installed in $((SECONDS - t0))s"
}

# free_port prints a TCP port on 127.0.0.1 that nothing listens on now.
free_port() {
	local p
	for _ in $(seq 1 200); do
		p=$((20000 + RANDOM % 40000))
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			echo "$p"
			return 0
		fi
	done
	die "no free port found"
}

# wait_http URL PID NAME LOG [TIMEOUT]: poll until the server answers HTTP
# (any status).
wait_http() {
	local url=$1 pid=$2 name=$3 logf=$4 timeout=${5:-$READY_TIMEOUT}
	local deadline=$((SECONDS + timeout))
	while ((SECONDS < deadline)); do
		kill -0 "$pid" 2>/dev/null || { tail -n 20 "$logf" >&2 || true; die "$name exited during startup; see $logf"; }
		if curl_like "$url"; then return 0; fi
		sleep 0.1
	done
	tail -n 20 "$logf" >&2 || true
	die "$name not ready after ${timeout}s; see $logf"
}

# http_status URL: print the HTTP status of a GET of URL (000 when nothing
# answers).
http_status() {
	local url=$1
	if command -v curl >/dev/null; then
		curl -s -o /dev/null --max-time 2 -w '%{http_code}' "$url" || true
		return
	fi
	local hostport=${url#http://}
	hostport=${hostport%%/*}
	local path=/${url#http://*/}
	local host=${hostport%:*} port=${hostport##*:} line=
	if { exec 3<>"/dev/tcp/$host/$port"; } 2>/dev/null; then
		printf 'GET %s HTTP/1.0\r\nHost: %s\r\n\r\n' "$path" "$hostport" >&3
		IFS= read -r -t 2 line <&3 || true
		exec 3>&-
	fi
	line=$(awk '{print $2}' <<<"$line")
	echo "${line:-000}"
}

# curl_like URL: true when an HTTP server answers on URL. Uses curl when
# present, else a raw request over bash's /dev/tcp.
curl_like() {
	local url=$1
	if command -v curl >/dev/null; then
		curl -s -o /dev/null --max-time 1 "$url"
		return
	fi
	local hostport=${url#http://}
	hostport=${hostport%%/*}
	local path=/${url#http://*/}
	local host=${hostport%:*} port=${hostport##*:} line
	{ exec 3<>"/dev/tcp/$host/$port"; } 2>/dev/null || return 1
	printf 'GET %s HTTP/1.0\r\nHost: %s\r\n\r\n' "$path" "$hostport" >&3
	IFS= read -r -t 1 line <&3 || true
	exec 3>&-
	[[ $line == HTTP/* ]]
}

# spawn NAME CMD...: start CMD in its own session, logging to NAME.log, and
# record its PID (written by the process itself, so it is right whether or
# not setsid had to fork) in NAME.pid.
spawn() {
	local name=$1 pidf=$RUN_DIR/$1.pid
	shift
	rm -f "$pidf"
	setsid bash -c 'echo $$ >"$0.tmp" && mv "$0.tmp" "$0" && exec "$@"' "$pidf" "$@" \
		>"$RUN_DIR/$name.log" 2>&1 </dev/null &
	for _ in $(seq 1 100); do
		[[ -s $pidf ]] && return 0
		sleep 0.05
	done
	die "$name did not start"
}

pid_alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

cmd_start() {
	if pid_alive "$RUN_DIR/versitygw.pid" && pid_alive "$RUN_DIR/fake-gcs-server.pid" && [[ -f $ENV_FILE ]] &&
		grep -qx "$CONFIG_MARK" "$ENV_FILE" &&
		{ [[ $WITH_SEAWEEDFS == 0 ]] || pid_alive "$RUN_DIR/seaweedfs.pid"; }; then
		log "servers already running (run dir $RUN_DIR)"
		cat "$ENV_FILE"
		return 0
	fi
	cmd_stop
	rm -rf "$RUN_DIR"
	cmd_install
	local t0=$SECONDS
	mkdir -p "$RUN_DIR"
	chmod 700 "$RUN_DIR"
	local s3root=$RUN_DIR/s3root
	mkdir -p "$s3root/$BUCKET"

	local access secret
	access=ck$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')
	secret=$(od -An -N20 -tx1 /dev/urandom | tr -d ' \n')

	local s3port gcsport
	s3port=$(free_port)
	gcsport=$(free_port)
	while [[ $gcsport == "$s3port" ]]; do gcsport=$(free_port); done

	# Whatever fails from here on stops what was started.
	trap cmd_stop EXIT

	# versitygw reads its keys from the environment so they stay out of ps.
	ROOT_ACCESS_KEY=$access ROOT_SECRET_KEY=$secret \
		spawn versitygw "$VERSITYGW_BIN" --port "127.0.0.1:$s3port" posix "$s3root"
	# -public-host without a port: the emulator serves media downloads
	# (GET /<bucket>/<object>, where the Go client reads object bytes) only
	# to requests whose Host matches it, and a host without a port matches
	# 127.0.0.1 on any port, so downloads also work through a proxy in
	# front of it (internal/testkit/faultproxy, the reliability campaign's faults
	# class). Upload session URIs are built from each request's Host, so
	# they point back at the proxy too.
	spawn fake-gcs-server "$FAKEGCS_BIN" -scheme http -host 127.0.0.1 -port "$gcsport" \
		-public-host 127.0.0.1 -backend memory -log-level warn

	wait_http "http://127.0.0.1:$s3port/" "$(cat "$RUN_DIR/versitygw.pid")" versitygw "$RUN_DIR/versitygw.log"
	wait_http "http://127.0.0.1:$gcsport/storage/v1/b" "$(cat "$RUN_DIR/fake-gcs-server.pid")" fake-gcs-server "$RUN_DIR/fake-gcs-server.log"

	# The GCS bucket is made through the emulator's JSON API.
	create_gcs_bucket "$gcsport"

	umask 077
	cat >"$ENV_FILE" <<ENV
$CONFIG_MARK
export CKPTKIT_TEST_S3_URL='s3://$BUCKET?endpoint=127.0.0.1:$s3port&insecure=true&path_style=true&region=us-east-1'
export AWS_ACCESS_KEY_ID='$access'
export AWS_SECRET_ACCESS_KEY='$secret'
export AWS_REGION='us-east-1'
export CKPTKIT_TEST_GCS_URL='gs://$BUCKET'
export STORAGE_EMULATOR_HOST='127.0.0.1:$gcsport'
ENV
	if [[ $WITH_SEAWEEDFS == 1 ]]; then
		start_seaweedfs "$access" "$secret" "$s3port" "$gcsport"
	fi
	trap - EXIT
	log "started versitygw on 127.0.0.1:$s3port and fake-gcs-server on 127.0.0.1:$gcsport in $((SECONDS - t0))s (logs in $RUN_DIR)"
	cat "$ENV_FILE"
}

# start_seaweedfs ACCESS SECRET USED_PORT...: start `weed mini` with every
# port it listens on chosen free, wait until its S3 gateway answers and the
# bucket exists, and append its URL to the env file.
start_seaweedfs() {
	local access=$1 secret=$2 t0=$SECONDS
	shift 2
	local used=" $* " names=(master master_grpc volume volume_grpc filer filer_grpc s3 s3_grpc admin admin_grpc) n p
	declare -A port
	for n in "${names[@]}"; do
		p=$(free_port)
		while [[ $used == *" $p "* ]]; do p=$(free_port); done
		used+="$p "
		port[$n]=$p
	done
	local dir=$RUN_DIR/seaweedfs cfg=$RUN_DIR/seaweedfs-s3.json
	mkdir -p "$dir"
	# Static keys: the same pair as versitygw, so one AWS_* pair serves both.
	(
		umask 077
		cat >"$cfg" <<JSON
{
  "identities": [
    {
      "name": "ckptkit-test",
      "credentials": [{"accessKey": "$access", "secretKey": "$secret"}],
      "actions": ["Admin", "Read", "List", "Tagging", "Write"]
    }
  ]
}
JSON
	)
	chmod 600 "$cfg"
	# Unix sockets go to the run dir when its path is short enough for one.
	local sockets=()
	if ((${#dir} < 90)); then
		sockets=(-filer.localSocket="$dir/filer.sock" -s3.localSocket="$dir/s3.sock")
	fi
	spawn seaweedfs "$SEAWEEDFS_BIN" -logtostderr mini -dir="$dir" \
		-ip=127.0.0.1 -ip.bind=127.0.0.1 -master.telemetry=false \
		-master.port="${port[master]}" -master.port.grpc="${port[master_grpc]}" \
		-volume.port="${port[volume]}" -volume.port.grpc="${port[volume_grpc]}" \
		-filer.port="${port[filer]}" -filer.port.grpc="${port[filer_grpc]}" \
		-s3.port="${port[s3]}" -s3.port.grpc="${port[s3_grpc]}" \
		-admin.port="${port[admin]}" -admin.port.grpc="${port[admin_grpc]}" -admin.port.legacy=0 \
		-s3.port.iceberg=0 -s3.port.lance=0 -webdav=false -admin.ui=false \
		"${sockets[@]}" -s3.config="$cfg" -bucket="$BUCKET"
	local pid logf=$RUN_DIR/seaweedfs.log
	pid=$(cat "$RUN_DIR/seaweedfs.pid")
	wait_http "http://127.0.0.1:${port[s3]}/" "$pid" seaweedfs "$logf" "$SEAWEEDFS_READY_TIMEOUT"
	# weed mini creates the bucket (-bucket) once all its services run; the
	# filer's HTTP API shows it as the directory /buckets/<bucket>/.
	local deadline=$((SECONDS + SEAWEEDFS_READY_TIMEOUT))
	until [[ $(http_status "http://127.0.0.1:${port[filer]}/buckets/$BUCKET/") == 200 ]]; do
		kill -0 "$pid" 2>/dev/null || { tail -n 20 "$logf" >&2 || true; die "seaweedfs exited during startup; see $logf"; }
		((SECONDS < deadline)) || { tail -n 20 "$logf" >&2 || true; die "seaweedfs did not create bucket $BUCKET in ${SEAWEEDFS_READY_TIMEOUT}s; see $logf"; }
		sleep 0.2
	done
	(
		umask 077
		echo "export CKPTKIT_TEST_S3_SEAWEED_URL='s3://$BUCKET?endpoint=127.0.0.1:${port[s3]}&insecure=true&path_style=true&region=us-east-1'" >>"$ENV_FILE"
	)
	log "started seaweedfs (weed mini) with S3 on 127.0.0.1:${port[s3]}, filer on 127.0.0.1:${port[filer]} in $((SECONDS - t0))s"
}

create_gcs_bucket() {
	local port=$1 body="{\"name\":\"$BUCKET\"}" status line
	if command -v curl >/dev/null; then
		status=$(curl -s -o /dev/null -w '%{http_code}' -X POST -H 'Content-Type: application/json' \
			-d "$body" "http://127.0.0.1:$port/storage/v1/b?project=ckptkit-test")
	else
		exec 3<>"/dev/tcp/127.0.0.1/$port"
		printf 'POST /storage/v1/b?project=ckptkit-test HTTP/1.0\r\nHost: 127.0.0.1:%s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s' \
			"$port" "${#body}" "$body" >&3
		IFS= read -r -t 5 line <&3 || true
		exec 3>&-
		status=$(awk '{print $2}' <<<"$line")
	fi
	case $status in
	200 | 409) ;;
	*) die "creating GCS bucket $BUCKET failed (HTTP $status)" ;;
	esac
}

# stop_one NAME [TENTHS]: SIGTERM, wait up to TENTHS/10 s (default 5 s),
# then SIGKILL.
stop_one() {
	local name=$1 pidf=$RUN_DIR/$1.pid pid tenths=${2:-50}
	[[ -f $pidf ]] || return 0
	pid=$(cat "$pidf")
	if kill -0 "$pid" 2>/dev/null; then
		kill "$pid" 2>/dev/null || true
		for _ in $(seq 1 "$tenths"); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
		log "stopped $name (pid $pid)"
	fi
	rm -f "$pidf"
}

# cmd_stop stops the servers and removes their data, the env file and the
# SeaweedFS S3 config (both hold the run's keys); the logs stay until the
# next start.
cmd_stop() {
	[[ -d $RUN_DIR ]] || return 0
	stop_one versitygw
	stop_one fake-gcs-server
	stop_one seaweedfs 150
	rm -rf "$RUN_DIR/s3root" "$RUN_DIR/seaweedfs" "$RUN_DIR/seaweedfs-s3.json" "$ENV_FILE"
}

cmd_env() {
	[[ -f $ENV_FILE ]] || die "servers are not running; run: eval \"\$(scripts/test-servers.sh start)\""
	cat "$ENV_FILE"
}

# cmd_pids prints the running servers' PIDs as exports (scripts/bench.sh
# adds the servers' CPU time to the S3/GCS figures with them).
cmd_pids() {
	pid_alive "$RUN_DIR/versitygw.pid" && echo "export CKPTBENCH_S3_SERVER_PID=$(cat "$RUN_DIR/versitygw.pid")"
	pid_alive "$RUN_DIR/fake-gcs-server.pid" && echo "export CKPTBENCH_GCS_SERVER_PID=$(cat "$RUN_DIR/fake-gcs-server.pid")"
	return 0
}

# cmd_status also requires SeaweedFS when it was started (or is asked for).
cmd_status() {
	pid_alive "$RUN_DIR/versitygw.pid" && pid_alive "$RUN_DIR/fake-gcs-server.pid" || return 1
	if [[ $WITH_SEAWEEDFS == 1 || -f $RUN_DIR/seaweedfs.pid ]]; then
		pid_alive "$RUN_DIR/seaweedfs.pid"
	fi
}

case ${1:-} in
install) cmd_install ;;
start) cmd_start ;;
stop) cmd_stop ;;
env) cmd_env ;;
status) cmd_status ;;
pids) cmd_pids ;;
*)
	echo "usage: $0 install|start|stop|env|status|pids" >&2
	exit 2
	;;
esac
