#!/usr/bin/env bash
# A fleet on one machine: redis-server, N `specula serve` replicas and nginx in front of them
# (deploy/nginx/nginx.conf.template), all on loopback, each with its own config, pid file and log
# under one directory. Never the system's services. docs/fleet.md explains the routing.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
TEMPLATE="$ROOT/deploy/nginx/nginx.conf.template"

usage() {
  cat <<'EOF'
usage: scripts/fleet.sh up N --model PATH [flags] [-- SERVE_FLAGS...]
       scripts/fleet.sh weight W [--dir DIR]
       scripts/fleet.sh down [--dir DIR]
       scripts/fleet.sh status [--dir DIR]

up starts redis-server (a unix socket), N replicas of `specula serve` and nginx, on 127.0.0.1, and
returns once every one is ready; anything that fails stops what was started. down stops them
(replicas get SIGTERM and drain). status shows each process and its health. weight sets the
canary's share of sessions to W percent and reloads nginx gracefully (0: none; 100: all).

  --dir DIR             the fleet's configs, pid files and logs (default $SPECULA_FLEET_DIR, else
                        /tmp/specula-fleet-$USER); one fleet per directory
  --model PATH          the model every replica serves (required for up)
  --canary-model PATH   a canary: M more replicas serve this model, and nginx sends them
  --canary-replicas M   --canary-weight percent of the sessions, split by a hash of X-Session-Id
  --canary-weight W     (default M 1, W 10; docs/fleet.md, "A canary"), under the stable model's name
  --http-port P         nginx's HTTP port, the OpenAI API (default 8080)
  --grpc-port P         nginx's gRPC port (default 50050)
  --base-port B         replica i listens on HTTP B+2i and gRPC B+2i+1 (default 18000)
  --no-redis            no Redis: the replicas keep their KV to themselves (no --kv-store)
  --redis-maxmemory M   Redis's memory bound, evicting least recently used blocks (default 1gb)
  --max-fails N         nginx's passive health check: N failures within --fail-timeout-s mark a
  --fail-timeout-s S    replica down for S seconds, then one request probes it (default 2 and 5)
  --read-timeout-s S    nginx's wait for a replica's next byte; above the longest generation (600)
  --nginx-workers N     nginx worker processes (default 1: the cores belong to the replicas)
  --specula BIN         the binary (default: build/release/specula, else specula on PATH)
  --ready-timeout-s S   how long a replica may take to load (default 180)
  -- SERVE_FLAGS...     passed to every replica, e.g. -- --tokenizer T --max-queue-len 64
EOF
}

die() {
  echo "[fleet] error: $*" >&2
  exit 2
}
say() { echo "[fleet] $*" >&2; }

DIR="${SPECULA_FLEET_DIR:-/tmp/specula-fleet-${USER:-$(id -un)}}"
MODEL="" HTTP_PORT=8080 GRPC_PORT=50050 BASE_PORT=18000 REDIS=1 REDIS_MAXMEMORY=1gb
MAX_FAILS=2 FAIL_TIMEOUT=5 READ_TIMEOUT=600 WORKERS=1 SPECULA="" READY_TIMEOUT=180
CANARY_MODEL="" CANARY_REPLICAS="" CANARY_WEIGHT=10
SERVE_FLAGS=()

is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }

parse_flags() {
  while [ $# -gt 0 ]; do
    case "$1" in
      --) shift; SERVE_FLAGS=("$@"); return ;;
      --no-redis) REDIS=0; shift; continue ;;
      -h|--help) usage; exit 0 ;;
    esac
    [ $# -ge 2 ] || die "$1: needs a value (see --help)"
    case "$1" in
      --dir) DIR="$2" ;;
      --model) MODEL="$2" ;;
      --http-port) HTTP_PORT="$2" ;;
      --grpc-port) GRPC_PORT="$2" ;;
      --base-port) BASE_PORT="$2" ;;
      --redis-maxmemory) REDIS_MAXMEMORY="$2" ;;
      --max-fails) MAX_FAILS="$2" ;;
      --fail-timeout-s) FAIL_TIMEOUT="$2" ;;
      --read-timeout-s) READ_TIMEOUT="$2" ;;
      --nginx-workers) WORKERS="$2" ;;
      --specula) SPECULA="$2" ;;
      --ready-timeout-s) READY_TIMEOUT="$2" ;;
      --canary-model) CANARY_MODEL="$2" ;;
      --canary-replicas) CANARY_REPLICAS="$2" ;;
      --canary-weight) CANARY_WEIGHT="$2" ;;
      *) die "unknown flag '$1' (flags for the replicas go after --; see --help)" ;;
    esac
    shift 2
  done
}

# ---- processes and ports

# Running, and not a zombie: nginx daemonizes, and where nothing reaps orphans (a container's init)
# its exited master lingers.
pid_alive() {
  [ -n "$1" ] && kill -0 "$1" 2>/dev/null && [ "$(ps -o stat= -p "$1" 2>/dev/null | cut -c1)" != Z ]
}
pid_of() { [ -f "$DIR/$1.pid" ] && tr -dc '0-9' <"$DIR/$1.pid" || true; }

# Whether 127.0.0.1:$1 can be bound now as a server binds it (SO_REUSEADDR: a closed connection's
# TIME_WAIT does not hold the port, a listener does).
port_free() {
  python3 - "$1" <<'EOF'
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(1)
EOF
}

check_port() {  # $1 port, $2 what it is for (a flag)
  is_uint "$1" && [ "$1" -ge 1 ] && [ "$1" -le 65535 ] || die "$2: '$1' is not a port"
  port_free "$1" || die "$2: port $1 on 127.0.0.1 is taken ($(port_owner "$1")); pick another"
}

port_owner() {
  local line
  line="$(ss -ltnpH "sport = :$1" 2>/dev/null | head -1 | grep -o 'users:(("[^"]*",pid=[0-9]*' || true)"
  [ -n "$line" ] && echo "by ${line#users:((}" | tr -d '"' || echo "by another process"
}

# The pids this directory's fleet has running, one "name pid" per line.
running() {
  local f name pid
  for f in "$DIR"/*.pid; do
    [ -e "$f" ] || continue
    name="$(basename "$f" .pid)"
    pid="$(pid_of "$name")"
    if pid_alive "$pid"; then echo "$name $pid"; fi
  done
}

# Stops processes by name: SIGTERM to all of them at once (a replica drains), then SIGKILL to
# those still running after $1 seconds.
stop_names() {
  local grace="$1" name pid left waited=0
  shift
  local -A pids=()
  for name in "$@"; do
    pid="$(pid_of "$name")"
    if pid_alive "$pid"; then
      kill -TERM "$pid" 2>/dev/null || true
      pids[$name]="$pid"
    elif [ -f "$DIR/$name.pid" ]; then
      say "$name (pid ${pid:-?}) was not running"
    fi
  done
  while :; do
    left=0
    for name in "${!pids[@]}"; do pid_alive "${pids[$name]}" && left=$((left + 1)); done
    [ "$left" -gt 0 ] && [ "$waited" -lt $((grace * 10)) ] || break
    sleep 0.1
    waited=$((waited + 1))
  done
  for name in "${!pids[@]}"; do
    if pid_alive "${pids[$name]}"; then
      say "$name (pid ${pids[$name]}) still running after ${grace} s: SIGKILL"
      kill -KILL "${pids[$name]}" 2>/dev/null || true
    fi
    say "stopped $name (pid ${pids[$name]})"
  done
  for name in "$@"; do rm -f "$DIR/$name.pid"; done
}

stop_all() {
  local f replicas=()
  for f in "$DIR"/replica-*.pid; do
    [ -e "$f" ] && replicas+=("$(basename "$f" .pid)")
  done
  stop_names 10 nginx
  stop_names 35 "${replicas[@]}"  # above the replicas' default --drain-timeout-s (30)
  stop_names 10 redis
}

# A system nginx (Debian's package starts one on port 80 where its service may run) is none of
# this fleet's business: it is left alone, and said so.
note_system_nginx() {
  local ours pid cmd
  ours="$(pid_of nginx)"
  for pid in $(pgrep -x nginx 2>/dev/null || true); do
    [ "$pid" = "$ours" ] && continue
    pid_alive "$pid" || continue
    [ "$(ps -o ppid= -p "$pid" | tr -d ' ')" = "1" ] || continue  # a master, not a worker
    cmd="$(tr '\0' ' ' </proc/"$pid"/cmdline 2>/dev/null || true)"
    [[ "$cmd" == *" -p "* && "$cmd" != *"/etc/nginx"* ]] && continue  # another fleet's
    say "a system nginx is running (master pid $pid: $cmd): left alone;" \
      "this fleet's nginx has its own config, pid file and ports"
  done
}

# ---- up

find_specula() {
  if [ -n "$SPECULA" ]; then
    [ -x "$SPECULA" ] || die "--specula: '$SPECULA' is not an executable file"
  elif [ -x "$ROOT/build/release/specula" ]; then
    SPECULA="$ROOT/build/release/specula"
  elif command -v specula >/dev/null; then
    SPECULA="$(command -v specula)"
  else
    die "no specula binary: build it (scripts/build.sh) or give --specula BIN"
  fi
}

# Everything is checked before anything starts: a bad count, flag, file or port leaves nothing
# running.
check_up() {
  local n="$1" i
  is_uint "$n" && [ "$n" -ge 1 ] || die "replica count: '$n' is not an integer >= 1"
  [ "$n" -le 32 ] || die "replica count: $n is more than 32 (one machine's fleet)"
  [ -n "$MODEL" ] || die "--model: required (the model every replica serves)"
  [ -e "$MODEL" ] || die "--model: '$MODEL': no such file"
  [ -r "$MODEL" ] && [ ! -d "$MODEL" ] || die "--model: '$MODEL' is not a readable file"
  check_canary
  local pair value
  for pair in "$MAX_FAILS --max-fails" "$FAIL_TIMEOUT --fail-timeout-s" "$READ_TIMEOUT --read-timeout-s" \
              "$WORKERS --nginx-workers" "$READY_TIMEOUT --ready-timeout-s"; do
    value="${pair%% *}"
    is_uint "$value" && [ "$value" -ge 1 ] || die "${pair#* }: '$value' is not an integer >= 1"
  done
  find_specula
  command -v nginx >/dev/null || die "no nginx: install Debian's (scripts/install_deps.sh does)"
  [ "$REDIS" = 0 ] || command -v redis-server >/dev/null || die "no redis-server: install it, or --no-redis"
  [ -f "$TEMPLATE" ] || die "missing $TEMPLATE"
  if [ -n "$(running)" ]; then
    die "a fleet is already running in $DIR ($(running | tr '\n' ' ')); stop it with: $0 down --dir $DIR"
  fi
  check_port "$HTTP_PORT" --http-port
  check_port "$GRPC_PORT" --grpc-port
  n=$((n + CANARY_REPLICAS))
  is_uint "$BASE_PORT" && [ $((BASE_PORT + 2 * n - 1)) -le 65535 ] || die "--base-port: '$BASE_PORT' leaves no room for $n replicas"
  for ((i = 0; i < n; i++)); do
    check_port $((BASE_PORT + 2 * i)) "--base-port (replica $i's HTTP port)"
    check_port $((BASE_PORT + 2 * i + 1)) "--base-port (replica $i's gRPC port)"
  done
}

is_weight() { [[ "$1" =~ ^[0-9]+(\.[0-9]{1,2})?$ ]] && awk -v w="$1" 'BEGIN { exit !(w >= 0 && w <= 100) }'; }

# The canary's flags: all or none (a weight or count without a model is an error, not ignored).
check_canary() {
  if [ -z "$CANARY_MODEL" ]; then
    [ -z "$CANARY_REPLICAS" ] || die "--canary-replicas: needs --canary-model"
    [ "$CANARY_WEIGHT" = 10 ] || die "--canary-weight: needs --canary-model"
    CANARY_REPLICAS=0
    return 0
  fi
  [ -e "$CANARY_MODEL" ] || die "--canary-model: '$CANARY_MODEL': no such file"
  [ -r "$CANARY_MODEL" ] && [ ! -d "$CANARY_MODEL" ] || die "--canary-model: '$CANARY_MODEL' is not a readable file"
  CANARY_REPLICAS="${CANARY_REPLICAS:-1}"
  is_uint "$CANARY_REPLICAS" && [ "$CANARY_REPLICAS" -ge 1 ] || die "--canary-replicas: '$CANARY_REPLICAS' is not an integer >= 1"
  is_weight "$CANARY_WEIGHT" || die "--canary-weight: '$CANARY_WEIGHT' is not a percentage from 0 to 100 (at most 2 decimals)"
}

# Runs "$@" detached (its own session: a terminal's ^C does not reach it), its output to $DIR/$1.log
# and its command line, which is its configuration, to $DIR/$1.cmd.
launch() {
  local name="$1"
  shift
  printf '%q ' "$@" >"$DIR/$name.cmd"
  echo >>"$DIR/$name.cmd"
  setsid "$@" >"$DIR/$name.log" 2>&1 </dev/null &
  echo $! >"$DIR/$name.pid"
}

fail_up() {
  say "error: $*"
  say "stopping what was started"
  stop_all
  exit 1
}

start_redis() {
  [ "$REDIS" = 1 ] || return 0
  launch redis redis-server --port 0 --unixsocket "$DIR/redis.sock" --unixsocketperm 700 --save "" \
    --appendonly no --dir "$DIR" --maxmemory "$REDIS_MAXMEMORY" --maxmemory-policy allkeys-lru
  local waited=0
  until [ -S "$DIR/redis.sock" ]; do
    pid_alive "$(pid_of redis)" || fail_up "redis-server exited: $(tail -3 "$DIR/redis.log")"
    [ "$waited" -lt 100 ] || fail_up "redis-server did not open $DIR/redis.sock in 10 s"
    sleep 0.1
    waited=$((waited + 1))
  done
  say "redis-server: unix://$DIR/redis.sock (pid $(pid_of redis))"
}

# Replicas 0 .. n-1 serve --model; the canary's, n .. n+M-1, --canary-model.
start_replicas() {
  local stable="$1" n=$(($1 + CANARY_REPLICAS)) i store=() model
  [ "$REDIS" = 1 ] && store=(--kv-store "unix://$DIR/redis.sock")
  # Clients name the model in requests: the canary answers to the stable model's name (--model as
  # given) unless the replicas' flags set --served-model-name for all.
  local name=(--served-model-name "$MODEL")
  [[ " ${SERVE_FLAGS[*]} " == *" --served-model-name "* ]] && name=()
  for ((i = 0; i < n; i++)); do
    model="$MODEL"
    [ "$i" -ge "$stable" ] && model="$CANARY_MODEL"
    launch "replica-$i" "$SPECULA" serve --model "$model" --host 127.0.0.1 --http-port $((BASE_PORT + 2 * i)) \
      --grpc-port $((BASE_PORT + 2 * i + 1)) --replica-id "replica-$i" "${store[@]}" \
      ${name[@]+"${name[@]}"} "${SERVE_FLAGS[@]}"
  done
  local deadline=$((SECONDS + READY_TIMEOUT)) pending
  while :; do
    pending=0
    for ((i = 0; i < n; i++)); do
      grep -q ': ready' "$DIR/replica-$i.log" 2>/dev/null && continue
      pid_alive "$(pid_of "replica-$i")" || fail_up "replica $i exited: $(tail -5 "$DIR/replica-$i.log")"
      pending=$((pending + 1))
    done
    [ "$pending" = 0 ] && break
    [ "$SECONDS" -lt "$deadline" ] || fail_up "$pending replicas not ready after $READY_TIMEOUT s (--ready-timeout-s); logs in $DIR"
    sleep 0.2
  done
  local canary=""
  [ "$CANARY_REPLICAS" -gt 0 ] && canary=" (the canary: replica-$stable on, $CANARY_WEIGHT% of the sessions)"
  say "$n replicas ready$canary: HTTP 127.0.0.1:$BASE_PORT.. (step 2), gRPC one above each"
}

# The servers of an upstream block, one line each: replicas [$1, $2), their HTTP (offset 0) or gRPC
# (offset 1) ports.
upstream_lines() {
  local from="$1" to="$2" offset="$3" i
  for ((i = from; i < to; i++)); do
    printf '    server 127.0.0.1:%d max_fails=%d fail_timeout=%ds;  # replica-%d\n' \
      $((BASE_PORT + 2 * i + offset)) "$MAX_FAILS" "$FAIL_TIMEOUT" "$i"
  done
}

# The canary's upstreams and the split of sessions between the two versions (empty without one).
canary_block() {
  local stable="$1" n=$(($1 + CANARY_REPLICAS)) kind
  [ "$CANARY_REPLICAS" -gt 0 ] || return 0
  echo "  # The canary (scripts/fleet.sh --canary-model): its replicas in upstreams of their own, and each"
  echo "  # session's version chosen by split_clients, a MurmurHash2 of the session id: the first W% of"
  echo "  # the hash range goes to the canary, so a session stays on one version while W holds, and a"
  echo "  # change of W moves only the sessions whose hash it crosses. Without an id, the request id."
  for kind in http grpc; do
    echo "  upstream specula_${kind}_canary {"
    echo "    zone specula_${kind}_canary 256k;"
    echo "    hash \$http_x_session_id consistent;"
    upstream_lines "$stable" "$n" "$([ "$kind" = http ] && echo 0 || echo 1)"
    echo "    keepalive 64;"
    echo "  }"
  done
  # shellcheck disable=SC2016  # nginx's variables, written as they are
  echo '  map $http_x_session_id $specula_split_key { "" $request_id; default $http_x_session_id; }'
  for kind in http grpc; do
    if awk -v w="$CANARY_WEIGHT" 'BEGIN { exit !(w > 0) }'; then
      echo "  split_clients \$specula_split_key \$specula_${kind}_pool { ${CANARY_WEIGHT}% specula_${kind}_canary; * specula_${kind}; }"
    else
      echo "  split_clients \$specula_split_key \$specula_${kind}_pool { * specula_${kind}; }  # weight 0"
    fi
  done
}

render_nginx() {
  local n="$1" user_line=""
  # As root, nginx's workers drop to nobody: they own the temporary files' directory, and may pass
  # through the fleet's (a log reopened with `nginx -s reopen`).
  mkdir -p "$DIR/tmp"
  if [ "$(id -u)" = 0 ]; then
    user_line="user nobody nogroup;"
    chown nobody:nogroup "$DIR/tmp"
    chmod a+x "$DIR"
  fi
  local http grpc
  http="$(upstream_lines 0 "$n" 0)"
  grpc="$(upstream_lines 0 "$n" 1)"
  local canary http_pool=specula_http grpc_pool=specula_grpc
  canary="$(canary_block "$n")"
  if [ "$CANARY_REPLICAS" -gt 0 ]; then
    # shellcheck disable=SC2016  # nginx's variables, written as they are
    http_pool='$specula_http_pool' grpc_pool='$specula_grpc_pool'
  fi
  local conf
  conf="$(<"$TEMPLATE")"
  conf="${conf//@USER_LINE@/$user_line}"
  conf="${conf//@WORKERS@/$WORKERS}"
  conf="${conf//@DIR@/$DIR}"
  conf="${conf//@HTTP_SERVERS@/$http}"
  conf="${conf//@GRPC_SERVERS@/$grpc}"
  conf="${conf//@CANARY@/$canary}"
  conf="${conf//@HTTP_POOL@/$http_pool}"
  conf="${conf//@GRPC_POOL@/$grpc_pool}"
  conf="${conf//@HTTP_LISTEN@/127.0.0.1:$HTTP_PORT}"
  conf="${conf//@GRPC_LISTEN@/127.0.0.1:$GRPC_PORT}"
  conf="${conf//@READ_TIMEOUT@/$READ_TIMEOUT}"
  printf '%s\n' "$conf" >"$DIR/nginx.conf"
}

start_nginx() {
  local n="$1" out
  render_nginx "$n"
  out="$(nginx -t -q -p "$DIR" -c "$DIR/nginx.conf" -e "$DIR/error.log" 2>&1)" ||
    fail_up "nginx refused $DIR/nginx.conf: $out"
  nginx -p "$DIR" -c "$DIR/nginx.conf" -e "$DIR/error.log" 2>>"$DIR/error.log" ||
    fail_up "nginx did not start: $(tail -3 "$DIR/error.log")"
  local waited=0
  until [ -s "$DIR/nginx.pid" ] && ! port_free "$HTTP_PORT"; do
    [ "$waited" -lt 100 ] || fail_up "nginx did not listen on $HTTP_PORT in 10 s: $(tail -3 "$DIR/error.log")"
    sleep 0.1
    waited=$((waited + 1))
  done
  say "nginx: HTTP 127.0.0.1:$HTTP_PORT, gRPC 127.0.0.1:$GRPC_PORT (pid $(pid_of nginx), $DIR/nginx.conf)"
}

# The fleet's addresses, and what `weight` needs to render nginx.conf again. REPLICAS counts every
# replica, the canary's (the last CANARY_REPLICAS) included.
write_env() {
  local stable="$1" n=$(($1 + CANARY_REPLICAS)) i
  {
    echo "REPLICAS=$n"
    echo "STABLE_REPLICAS=$stable"
    echo "CANARY_REPLICAS=$CANARY_REPLICAS"
    [ "$CANARY_REPLICAS" -gt 0 ] && echo "CANARY_WEIGHT=$CANARY_WEIGHT"
    echo "HTTP=127.0.0.1:$HTTP_PORT"
    echo "GRPC=127.0.0.1:$GRPC_PORT"
    for ((i = 0; i < n; i++)); do
      echo "REPLICA_${i}_HTTP=127.0.0.1:$((BASE_PORT + 2 * i))"
      echo "REPLICA_${i}_GRPC=127.0.0.1:$((BASE_PORT + 2 * i + 1))"
    done
    [ "$REDIS" = 1 ] && echo "REDIS=unix://$DIR/redis.sock"
    local name
    for name in BASE_PORT MAX_FAILS FAIL_TIMEOUT READ_TIMEOUT WORKERS; do echo "$name=${!name}"; done
  } >"$DIR/fleet.env"
}

cmd_up() {
  [ $# -ge 1 ] || die "up: the replica count is missing (usage: $0 up N --model PATH)"
  local n="$1"
  shift
  parse_flags "$@"
  check_up "$n"
  mkdir -p "$DIR"
  DIR="$(cd "$DIR" && pwd)"
  rm -f "$DIR"/*.log "$DIR"/*.cmd "$DIR/fleet.env"
  note_system_nginx
  trap 'fail_up "interrupted"' INT TERM
  start_redis
  start_replicas "$n"
  start_nginx "$n"
  trap - INT TERM
  write_env "$n"
  say "up: http://127.0.0.1:$HTTP_PORT and grpc://127.0.0.1:$GRPC_PORT; stop with: $0 down --dir $DIR"
}

# ---- weight: the canary's share, changed live

env_value() { grep "^$1=" "$DIR/fleet.env" | head -1 | cut -d= -f2-; }

cmd_weight() {
  [ $# -ge 1 ] || die "weight: the percentage is missing (usage: $0 weight W [--dir DIR])"
  local w="$1" name
  shift
  parse_flags "$@"
  is_weight "$w" || die "weight: '$w' is not a percentage from 0 to 100 (at most 2 decimals)"
  [ -f "$DIR/fleet.env" ] || die "no fleet up in $DIR"
  pid_alive "$(pid_of nginx)" || die "nginx is not running in $DIR"
  [ "$(env_value CANARY_REPLICAS)" -gt 0 ] 2>/dev/null || die "the fleet in $DIR has no canary (up --canary-model)"
  for name in BASE_PORT MAX_FAILS FAIL_TIMEOUT READ_TIMEOUT WORKERS CANARY_REPLICAS; do
    printf -v "$name" '%s' "$(env_value "$name")"
  done
  HTTP_PORT="$(env_value HTTP | cut -d: -f2)"
  GRPC_PORT="$(env_value GRPC | cut -d: -f2)"
  CANARY_WEIGHT="$w"
  cp "$DIR/nginx.conf" "$DIR/nginx.conf.before"
  render_nginx "$(env_value STABLE_REPLICAS)"
  local out
  if ! out="$(nginx -t -q -p "$DIR" -c "$DIR/nginx.conf" -e "$DIR/error.log" 2>&1)"; then
    mv "$DIR/nginx.conf.before" "$DIR/nginx.conf"
    die "nginx refused the new configuration (the old one stays): $out"
  fi
  # A reload is asynchronous: the master starts new workers, then tells the old ones to stop
  # accepting (they finish what they have). Return once the new workers are there, and the old ones
  # have had a moment to close their listening sockets, so the next request sees the new split.
  local master old_workers waited=0
  master="$(pid_of nginx)"
  old_workers=" $(pgrep -P "$master" | tr '\n' ' ')"
  nginx -p "$DIR" -c "$DIR/nginx.conf" -e "$DIR/error.log" -s reload
  until pgrep -P "$master" | grep -qvxF -f <(tr ' ' '\n' <<<"$old_workers" | grep .); do
    [ "$waited" -lt 100 ] || die "nginx did not start new workers within 10 s: $(tail -3 "$DIR/error.log")"
    sleep 0.1
    waited=$((waited + 1))
  done
  sleep 0.3
  rm -f "$DIR/nginx.conf.before"
  sed -i "s/^CANARY_WEIGHT=.*/CANARY_WEIGHT=$w/" "$DIR/fleet.env"
  say "canary weight $w%: nginx reloaded (new connections split anew; requests in flight finish where they are)"
}

# ---- down, status

cmd_down() {
  parse_flags "$@"
  [ -d "$DIR" ] || { say "no fleet in $DIR"; return 0; }
  [ -n "$(running)" ] || say "nothing running in $DIR"
  stop_all
  rm -f "$DIR/fleet.env" "$DIR/redis.sock"
}

health_of() {  # $1 host:port: the HTTP status of GET /health, or "unreachable"
  python3 - "$1" <<'EOF'
import sys, urllib.request, urllib.error
try:
    print(urllib.request.urlopen(f"http://{sys.argv[1]}/health", timeout=2).status)
except urllib.error.HTTPError as e:
    print(e.code)
except Exception:
    print("unreachable")
EOF
}

cmd_status() {
  parse_flags "$@"
  [ -f "$DIR/fleet.env" ] || { say "no fleet up in $DIR"; return 1; }
  local name pid state addr bad=0
  for name in nginx redis $(cd "$DIR" && ls replica-*.pid 2>/dev/null | sed 's/\.pid$//' | sort -V); do
    [ "$name" = redis ] && [ ! -f "$DIR/redis.pid" ] && continue
    pid="$(pid_of "$name")"
    state="down"
    pid_alive "$pid" && state="running"
    [ "$state" = running ] || bad=1
    case "$name" in
      nginx) addr="$(grep '^HTTP=' "$DIR/fleet.env" | cut -d= -f2)" ;;
      replica-*) addr="$(grep "^REPLICA_${name#replica-}_HTTP=" "$DIR/fleet.env" | cut -d= -f2)" ;;
      *) addr="" ;;
    esac
    if [ -n "$addr" ]; then
      printf '%-11s %-8s pid %-8s %-16s health %s\n' "$name" "$state" "${pid:--}" "$addr" "$(health_of "$addr")"
    else
      printf '%-11s %-8s pid %-8s\n' "$name" "$state" "${pid:--}"
    fi
  done
  return "$bad"
}

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  weight) shift; cmd_weight "$@" ;;
  down) shift; cmd_down "$@" ;;
  status) shift; cmd_status "$@" ;;
  -h|--help|help) usage ;;
  *) usage >&2; exit 2 ;;
esac
