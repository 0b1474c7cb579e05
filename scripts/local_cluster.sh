#!/usr/bin/env bash
# A real multi-node Ray cluster on this machine: one raylet per planner node of CONFIG.
#
#   scripts/local_cluster.sh up CONFIG [PORT]   start it; prints the head address on stdout
#   scripts/local_cluster.sh down [PORT]        stop every raylet this script started
#   scripts/local_cluster.sh kill NODE [PORT]   kill one worker node's raylet (a node loss)
#   scripts/local_cluster.sh join NODE [PORT]   start that node again (it rejoins)
#
# The first planner node of the config is the head (where `pearl train --address` runs its
# driver, trainer and environment); each other planner node joins with `ray start --address`.
# Every node declares its GPU slots as custom resources, and one resource naming its planner node
# (python -m runtime.ray_runtime.ray_nodes CONFIG), exactly what a real cluster's nodes declare;
# only the resource names' meaning differs (a CPU core here, a GPU there).
# Each raylet runs under `ray start --block` in its own process group; its pid is kept in
# $STATE (one file per node), so `kill` stops that node alone and `down` stops them all.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
RAY=${RAY:-$(dirname "$PY")/ray}
cmd=${1:-}
export RAY_AUTH_MODE=disabled HF_HUB_OFFLINE=1
# a dead node is noticed in ~2 s instead of ~30 s (head's GCS health checks)
export RAY_health_check_period_ms=${RAY_health_check_period_ms:-500} RAY_health_check_failure_threshold=${RAY_health_check_failure_threshold:-3}
export RAY_health_check_initial_delay_ms=${RAY_health_check_initial_delay_ms:-0}

die() { echo "local_cluster: $*" >&2; exit 2; }

state_dir() { echo "${TMPDIR:-/tmp}/pearl-local-cluster-$1"; }

start_node() {  # start_node STATE NAME RESOURCES HEAD(1|0) PORT
  local state=$1 name=$2 res=$3 head=$4 port=$5
  local log="$state/$name.log" args=(--block --num-cpus=1 --resources="$res" --disable-usage-stats)
  if [ "$head" = 1 ]; then
    args+=(--head --port="$port" --include-dashboard=false --node-ip-address=127.0.0.1)
  else
    args+=(--address="127.0.0.1:$port" --node-ip-address=127.0.0.1 --dashboard-agent-listen-port=0)
  fi
  setsid "$RAY" start "${args[@]}" >"$log" 2>&1 &
  echo $! >"$state/$name.pid"
  # ready when the node's resources are visible in the cluster
  local want; want=$("$PY" -c 'import json,sys; print(next(iter(json.loads(sys.argv[1]))))' "$res")
  for _ in $(seq 1 120); do
    if "$PY" - "$port" "$want" <<'EOF' 2>/dev/null
import sys, ray
ray.init(address=f"127.0.0.1:{sys.argv[1]}", logging_level="ERROR", log_to_driver=False)
ok = any(n["Alive"] and sys.argv[2] in n["Resources"] for n in ray.nodes())
raise SystemExit(0 if ok else 1)
EOF
    then return 0; fi
    kill -0 "$(cat "$state/$name.pid")" 2>/dev/null || die "node $name failed to start (log: $log): $(tail -3 "$log")"
    sleep 1
  done
  die "node $name did not join within 120 s (log: $log)"
}

stop_pid() {  # stop_pid PIDFILE: the node's whole process group (ray start --block and its raylet)
  # `ray start --block` outlives a TERM by more than 10 s (measured 2026-12-05, with or without
  # a live head), so waiting long only delays the KILL that follows: 2 s of grace, then KILL
  local pid; pid=$(cat "$1")
  kill -TERM -- "-$pid" 2>/dev/null || true
  for _ in $(seq 1 4); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  kill -KILL -- "-$pid" 2>/dev/null || true
  rm -f "$1"
}

case "$cmd" in
  up)
    config=${2:-}; port=${3:-6390}
    [ -f "$config" ] || die "no config file '$config' (usage: $0 up CONFIG [PORT])"
    state=$(state_dir "$port"); mkdir -p "$state"
    [ -z "$(ls "$state"/*.pid 2>/dev/null)" ] || die "a local cluster on port $port is already up ($state); run: $0 down $port"
    nodes=$("$PY" -m runtime.ray_runtime.ray_nodes "$config") || exit 2
    first=1
    while read -r name res; do
      echo "$res" >"$state/$name.args"
      [ "$first" = 1 ] && echo "$name" >"$state/head"
      start_node "$state" "$name" "$res" "$first" "$port"
      echo "local_cluster: node $name up ($( [ $first = 1 ] && echo head || echo worker ))" >&2
      first=0
    done <<<"$nodes"
    echo "127.0.0.1:$port"
    ;;
  kill)
    name=${2:-}; port=${3:-6390}; state=$(state_dir "$port")
    [ -f "$state/$name.pid" ] || die "no running node '$name' on port $port (see $state)"
    [ "$name" != "$(cat "$state/head")" ] || die "'$name' is the head node: use '$0 down $port'"
    stop_pid "$state/$name.pid"
    echo "local_cluster: node $name killed" >&2
    ;;
  join)
    name=${2:-}; port=${3:-6390}; state=$(state_dir "$port")
    [ -f "$state/$name.args" ] || die "no node '$name' in the cluster on port $port"
    [ ! -f "$state/$name.pid" ] || die "node '$name' is already up"
    read -r res <"$state/$name.args"
    start_node "$state" "$name" "$res" 0 "$port"
    echo "local_cluster: node $name joined again" >&2
    ;;
  down)
    port=${2:-6390}; state=$(state_dir "$port")
    head=$(cat "$state/head" 2>/dev/null || true)
    for f in "$state"/*.pid; do [ -e "$f" ] && [ "$f" != "$state/$head.pid" ] && stop_pid "$f"; done  # workers first
    [ -e "$state/$head.pid" ] && stop_pid "$state/$head.pid"
    rm -rf "$state"
    echo "local_cluster: down" >&2
    ;;
  *)
    sed -n '2,16p' "$0" >&2; exit 2 ;;
esac
