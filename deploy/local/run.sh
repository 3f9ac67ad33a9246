#!/usr/bin/env bash
# hiveroute on one machine, no containers: engines plus the router, stopped together by Ctrl-C.
#
#   deploy/local/run.sh                       # 2 simulated engines and the router on :8080
#   deploy/local/run.sh --engines 4           # 4 simulated engines
#   deploy/local/run.sh --vllm                # 1 real vLLM engine with a tiny random-weight model
#   deploy/local/run.sh --vllm --model DIR    # ... with a model of your own (a local directory)
#   deploy/local/run.sh --policy kv --port 9000 -- --log-level debug   # after --: router flags
#
# Simulated engines listen on 8100, 8101, ... with KV events on 5557, 5558, ...; a real vLLM
# on 8000 with KV events on 5557. The router reads deploy/local/hiveroute.yaml, and its engine
# list comes from here. Environment:
#   HIVEROUTE            the hiveroute command (default: `hiveroute` on PATH, else python -m hiveroute)
#   PYTHON               python with hiveroute installed (default: python3)
#   HIVEROUTE_VLLM_PYTHON  python of the vLLM environment (default: ~/.cache/hiveroute/vllm-venv)
#   HIVEROUTE_CONFIG     the router's config file (default: deploy/local/hiveroute.yaml)
#   VLLM_ARGS            vLLM's extra flags (default for the CPU: --gpu-memory-utilization 0.1 ...)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-python3}
if [ -n "${HIVEROUTE:-}" ]; then
  read -r -a hiveroute <<<"$HIVEROUTE"
elif command -v hiveroute >/dev/null; then
  hiveroute=(hiveroute)
else
  hiveroute=("$PYTHON" -m hiveroute)
fi
config=${HIVEROUTE_CONFIG:-$here/hiveroute.yaml}

engines=2
vllm=0
model=""
policy=""
port=8080
router_args=()

usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "run.sh: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --engines) [ $# -ge 2 ] || die "--engines needs a number"; engines=$2; shift 2 ;;
    --vllm) vllm=1; shift ;;
    --model) [ $# -ge 2 ] || die "--model needs a directory"; model=$2; shift 2 ;;
    --policy) [ $# -ge 2 ] || die "--policy needs a name"; policy=$2; shift 2 ;;
    --port) [ $# -ge 2 ] || die "--port needs a number"; port=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; router_args=("$@"); break ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
[[ $engines =~ ^[1-9][0-9]*$ ]] || die "--engines must be a positive number, got '$engines'"
[[ $port =~ ^[0-9]+$ ]] || die "--port must be a number, got '$port'"
[ -f "$config" ] || die "no config file at $config"

pids=()
cleanup() {
  trap - EXIT INT TERM
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# wait_http URL SECONDS PID: until URL answers 200; fails when PID ends or time is up.
wait_http() {
  "$PYTHON" - "$1" "$2" "$3" <<'PY'
import os, sys, time, urllib.request
url, deadline, pid = sys.argv[1], time.monotonic() + float(sys.argv[2]), int(sys.argv[3])

def alive() -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True

while time.monotonic() < deadline:
    if not alive():
        sys.exit(f"the process serving {url} has ended")
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            if r.status == 200:
                sys.exit(0)
    except OSError:
        pass
    time.sleep(0.5)
sys.exit(f"no answer from {url} in {sys.argv[2]}s")
PY
}

engine_flags=()
if [ "$vllm" = 1 ]; then
  vllm_python=${HIVEROUTE_VLLM_PYTHON:-$HOME/.cache/hiveroute/vllm-venv/bin/python}
  [ -x "$vllm_python" ] || die "no vLLM at $vllm_python (run scripts/ensure-vllm, or set HIVEROUTE_VLLM_PYTHON)"
  if [ -z "$model" ]; then
    echo "building the tiny random-weight model (cached after the first time)..."
    model=$(HIVEROUTE_VLLM_PYTHON=$vllm_python "$PYTHON" -m hiveroute.engines.vllm_local)
  fi
  echo "starting vLLM on :8000 with $model (KV events on tcp://127.0.0.1:5557)"
  # On a CPU-only build, --gpu-memory-utilization is the share of host memory vLLM reserves.
  read -r -a vllm_args <<<"${VLLM_ARGS:---gpu-memory-utilization 0.1 --max-model-len 8192}"
  HF_HUB_OFFLINE=1 "$vllm_python" -m vllm.entrypoints.openai.api_server \
    --model "$model" --host 127.0.0.1 --port 8000 \
    --enable-prefix-caching --enable-prompt-tokens-details \
    --kv-events-config '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","topic":"kv-events"}' \
    "${vllm_args[@]}" &
  pids+=($!)
  wait_http http://127.0.0.1:8000/health 600 $!
  engine_flags=(--engine "http://127.0.0.1:8000,events=tcp://127.0.0.1:5557")
else
  "${hiveroute[@]}" sim --help >/dev/null 2>&1 || die "'${hiveroute[*]} sim' is not available in this installation"
  echo "starting $engines simulated engine(s) on :8100.. (KV events on :5557..)"
  "${hiveroute[@]}" sim --engines "$engines" --base-port 8100 --events-base-port 5557 &
  pids+=($!)
  for ((i = 0; i < engines; i++)); do
    wait_http "http://127.0.0.1:$((8100 + i))/health" 60 "${pids[-1]}"
    engine_flags+=(--engine "http://127.0.0.1:$((8100 + i)),events=tcp://127.0.0.1:$((5557 + i))")
  done
fi

policy_flags=()
[ -n "$policy" ] && policy_flags=(--policy "$policy")
echo "starting the router on :$port with $config"
"${hiveroute[@]}" serve --config "$config" --port "$port" "${engine_flags[@]}" \
  "${policy_flags[@]}" "${router_args[@]}" &
pids+=($!)
wait_http "http://127.0.0.1:$port/health" 60 $!
cat <<MSG

hiveroute is up: http://127.0.0.1:$port/v1 (OpenAI-compatible), /health, /metrics
  curl -s http://127.0.0.1:$port/v1/models
Ctrl-C stops everything.
MSG
wait -n "${pids[@]}" || true
echo "a process ended; stopping the rest" >&2
