#!/usr/bin/env bash
# What MC_REDIS_WAIT_REPLICAS=1 costs: the bench's fresh and replay phases on a
# Redis primary with one replica (both AOF, appendfsync always, throwaway, on
# loopback), in runs that alternate WAIT 0 and WAIT 1 so both see the same
# machine load; prints each run and the medians with their ratio.
#
#   scripts/redis-wait-cost.sh [PAIRS] [SECONDS]
#
# PAIRS (default 3) pairs of runs, SECONDS (default 5) per phase.
set -euo pipefail
cd "$(dirname "$0")/.."
PAIRS=${1:-3}
SECONDS_PER_PHASE=${2:-5}
PY=${PY:-.venv/bin/python}
WORK=$(mktemp -d /tmp/mc-wait-cost.XXXXXX)
free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PRIMARY=$(free_port)
REPLICA=$(free_port)
cleanup() {
  redis-cli -p "$PRIMARY" shutdown nosave >/dev/null 2>&1 || true
  redis-cli -p "$REPLICA" shutdown nosave >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
mkdir -p "$WORK/p" "$WORK/r"
common=(--bind 127.0.0.1 --appendonly yes --appendfsync always --save '' --daemonize yes)
redis-server --port "$PRIMARY" --dir "$WORK/p" "${common[@]}" >/dev/null
redis-server --port "$REPLICA" --dir "$WORK/r" --replicaof 127.0.0.1 "$PRIMARY" "${common[@]}" >/dev/null
for _ in $(seq 1 100); do  # until the replica's link is up (at most 10 s)
  redis-cli -p "$REPLICA" info replication 2>/dev/null | grep -q 'master_link_status:up' && break
  sleep 0.1
done
URL="redis://127.0.0.1:$PRIMARY/0"
for pair in $(seq 1 "$PAIRS"); do
  order="0 1"; [ $((pair % 2)) -eq 0 ] && order="1 0"
  for wait in $order; do
    echo "run $pair, WAIT $wait" >&2
    "$PY" -m toolkit.bench --backend redis --redis-url "$URL" --redis-wait-replicas "$wait" \
      --workloads fresh,replay --no-floors --rounds 1 --duration "$SECONDS_PER_PHASE" \
      --warmup 1 --json "$WORK/run-$pair-wait$wait.json" >/dev/null
  done
done
"$PY" - "$WORK" <<'PY'
import json, statistics, sys
from pathlib import Path

runs: dict[int, dict[str, list[float]]] = {0: {}, 1: {}}
p50: dict[int, dict[str, list[float]]] = {0: {}, 1: {}}
for path in sorted(Path(sys.argv[1]).glob("run-*.json")):
    wait = int(path.stem.rsplit("wait", 1)[1])
    phases = json.loads(path.read_text())["backends"]["redis"]["phases"]
    for name in ("fresh", "replay"):
        runs[wait].setdefault(name, []).append(phases[name]["ops_per_s"])
        p50[wait].setdefault(name, []).append(phases[name]["latency_ms"]["p50"])
print(f"{'phase':<8}{'WAIT 0 ops/s':>14}{'WAIT 1 ops/s':>14}{'1/0':>7}{'p50 ms 0 / 1':>18}  runs")
for name in ("fresh", "replay"):
    a, b = statistics.median(runs[0][name]), statistics.median(runs[1][name])
    la, lb = statistics.median(p50[0][name]), statistics.median(p50[1][name])
    each = " ".join(f"{x:.0f}/{y:.0f}" for x, y in zip(runs[0][name], runs[1][name]))
    print(f"{name:<8}{a:>14.1f}{b:>14.1f}{b / a:>7.2f}{la:>9.1f} / {lb:<7.1f}  {each}")
PY
