"""Requests/s of a router at 1 and 2 workers when nothing else on the machine costs much.

    python -m benchmarks.router_scaling [--targets hiveroute:workflow,smg] [--workers 1,2]
        [--words 4000] [--seconds 6] [--reps 3]

On a 2-core machine `router_cpu`'s engines and load generator (Python, aiohttp) share a core
with the router's second worker and take most of it, so its 2-worker figure measures the
machine. Here the load is `wrk` (C, 1 thread, 32 connections, the same agentic chat bodies and
workflow headers, from a Lua script) and the engines are two `nginx` servers answering every
completion with the same small JSON at once; both cost tens of microseconds a request, so the
router's workers have the cores. 1 worker: the router on core 1, wrk and nginx on core 0;
2 workers: the router on both cores, wrk and nginx still on core 0. The router's CPU (all its
processes: hiveroute's workers and their parent, which serves the state they share) over the
requests answered is its CPU ms per request. Peers run at their defaults, on core 1 for
"1 worker" and on both cores for "2" (their runtime takes a thread a core it may use).

Needs Debian's `wrk` and `nginx-light` (`apt-get install wrk nginx-light`). Writes
benchmarks/results/NAME.{md,json} (`--name`, default router_scaling).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.agentic_bodies import agentic_bodies
from benchmarks.cli import comma_ints, comma_list
from benchmarks.instant_engine import pin, stop_all, wait_http
from benchmarks.report import publish
from benchmarks.router_cpu import TARGETS, Running, Target, start_target
from hiveroute import runtime
from hiveroute.runtime import free_port

CLIENTS = 32
TITLE = "Router requests/s at 1 and 2 workers, with a load and engines that cost little"

ANSWER = json.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "x"},
                "finish_reason": "length",
            }
        ],
        "usage": {"prompt_tokens": 8, "completion_tokens": 1, "total_tokens": 9},
    }
)
MODELS = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]})

NGINX_CONF = """
daemon off;
master_process off;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body;
  proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/fastcgi;
  uwsgi_temp_path {dir}/uwsgi;
  scgi_temp_path {dir}/scgi;
  client_max_body_size 64m;
  keepalive_requests 100000000;
  keepalive_timeout 600s;
  default_type application/json;
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    location = /health {{ return 200 '{models}'; }}
    location = /v1/models {{ return 200 '{models}'; }}
    location = /metrics {{
      default_type text/plain;
      return 200 'vllm:num_requests_running 0\\nvllm:num_requests_waiting 0\\n';
    }}
    location / {{ return 200 '{answer}'; }}
  }}
}}
"""

# One thread's state: the bodies and headers, read from a file of lines
# "workflow<TAB>agent<TAB>role<TAB>body" (JSON bodies hold no raw tabs or newlines).
WRK_SCRIPT = """
local requests = {}
local n = 0
local i = 0
init = function(args)
  for line in io.lines("%s") do
    local wf, agent, role, body = line:match("^([^\\t]*)\\t([^\\t]*)\\t([^\\t]*)\\t(.*)$")
    local headers = {["Host"] = wrk.headers["Host"], ["Content-Type"] = "application/json",
                     ["X-Workflow-Id"] = wf, ["X-Agent-Id"] = agent, ["X-Agent-Role"] = role}
    n = n + 1
    requests[n] = wrk.format("POST", "/v1/chat/completions", headers, body)
  end
end
request = function()
  i = i + 1
  return requests[(i - 1) %% n + 1]
end
"""


def need(program: str) -> str:
    found = shutil.which(program)
    if found is None:
        raise SystemExit(f"{program} is missing: apt-get install wrk nginx-light")
    return found


def start_nginx(work: Path, port: int) -> subprocess.Popen[bytes]:
    here = work / f"nginx-{port}"
    here.mkdir(parents=True, exist_ok=True)
    conf = here / "nginx.conf"
    conf.write_text(NGINX_CONF.format(dir=here, port=port, answer=ANSWER, models=MODELS))
    return subprocess.Popen(
        [need("nginx"), "-c", str(conf), "-p", str(here)],
        stdout=subprocess.DEVNULL,
        stderr=open(here / "stderr.log", "wb"),
        preexec_fn=lambda: pin(0),
    )


def write_requests(path: Path, words: int, count: int) -> None:
    lines = []
    for body, headers in agentic_bodies(words, count):
        fields = [headers["X-Workflow-Id"], headers["X-Agent-Id"], headers["X-Agent-Role"]]
        lines.append("\t".join([*fields, body.decode()]))
    path.write_text("\n".join(lines) + "\n")


def run_wrk(url: str, script: Path, seconds: float) -> dict[str, float]:
    """wrk on core 0 for `seconds`: requests/s and failures (non-2xx, socket errors)."""
    wrk = [need("wrk"), "-t", "1", "-c", str(CLIENTS), "-d", f"{seconds:g}s", "--timeout", "30s"]
    done = subprocess.run(
        [*wrk, "-s", str(script), url],
        capture_output=True,
        text=True,
        preexec_fn=lambda: pin(0),
        check=False,
    )
    out = done.stdout
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed ({done.returncode}):\n{out}\n{done.stderr}")
    rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
    total = re.search(r"(\d+) requests in", out)
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if rate is None or total is None:
        raise RuntimeError(f"wrk printed no rate:\n{out}\n{done.stderr}")
    failures = int(bad.group(1)) if bad else 0
    failures += sum(int(g) for g in sock.groups()) if sock else 0
    return {"req_per_s": float(rate.group(1)), "requests": int(total.group(1)), "errors": failures}


async def measure(
    target: Target, workers: int, engines: list[str], script: Path, args: argparse.Namespace,
    logs: Path,
) -> dict[str, Any]:  # fmt: skip
    running: Running = await start_target(target, engines, workers, logs, True)
    try:
        url = running.urls[0]
        await asyncio.to_thread(run_wrk, url, script, 2.0)  # warm-up
        cpu0 = running.cpu()
        load = await asyncio.to_thread(run_wrk, url, script, args.seconds)
        cpu = running.cpu() - cpu0
    finally:
        stop_all(running.procs)
    answered = load["requests"] - load["errors"]
    return {
        "target": target.name,
        "workers": workers,
        **load,
        "cpu_ms_per_req": cpu * 1000 / answered if answered else float("nan"),
        "cpu_cores": cpu / args.seconds,
    }


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    pin(0)
    logs = Path(args.log_dir)
    logs.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        ports = [free_port(), free_port()]
        nginx = [start_nginx(work, p) for p in ports]
        engines = [f"http://127.0.0.1:{p}" for p in ports]
        bodies = work / "requests.tsv"
        write_requests(bodies, args.words, 256)
        script = work / "agentic.lua"
        script.write_text(WRK_SCRIPT % bodies)
        try:
            for url in engines:
                await wait_http(f"{url}/health")
            for rep in range(args.reps):
                for name in args.targets:
                    target = TARGETS[name]
                    for workers in args.workers:
                        row = await measure(target, workers, engines, script, args, logs)
                        row["rep"] = rep
                        rows.append(row)
                        print(
                            f"rep {rep} {name:22s} w={workers}  {row['req_per_s']:8.1f} req/s  "
                            f"{row['cpu_ms_per_req']:.3f} CPU ms/req  {row['cpu_cores']:.2f} "
                            f"cores  errors={row['errors']}",
                            flush=True,
                        )
        finally:
            stop_all(nginx)
    return rows


def report(args: argparse.Namespace, rows: list[dict[str, Any]]) -> str:
    lines = [
        f"- machine: this machine has {os.cpu_count()} cores, shared with other work",
        f"- load: wrk, 1 thread, {CLIENTS} connections, {args.words}-word agentic chat bodies with "
        "workflow and agent headers (8 workflows x 4 agents, 256 bodies); engines: two nginx "
        "answering at once; both on core 0",
        f"- {args.seconds} s measured per run after 2 s of warm-up; medians of {args.reps} "
        "repetitions",
        "",
        "| target | workers | req/s | CPU ms/req | cores used | errors |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    keys = sorted({(r["target"], r["workers"]) for r in rows}, key=lambda k: (k[0], k[1]))
    medians: dict[tuple[str, int], float] = {}
    for target, workers in keys:
        mine = [r for r in rows if r["target"] == target and r["workers"] == workers]
        rate = statistics.median(r["req_per_s"] for r in mine)
        medians[(target, workers)] = rate
        cpu = statistics.median(r["cpu_ms_per_req"] for r in mine)
        cores = statistics.median(r["cpu_cores"] for r in mine)
        errors = sum(r["errors"] for r in mine)
        lines.append(f"| {target} | {workers} | {rate:.0f} | {cpu:.3f} | {cores:.2f} | {errors} |")
    lines += ["", "Requests/s with 2 workers over 1 (medians, same run):", ""]
    for target in sorted({k[0] for k in keys}):
        if (target, 1) in medians and (target, 2) in medians:
            lines.append(f"- {target}: {medians[(target, 2)] / medians[(target, 1)]:.2f}x")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--targets", type=comma_list, default="hiveroute:round_robin,hiveroute:workflow,smg"
    )
    parser.add_argument(
        "--workers", type=comma_ints, default="1,2", help="worker counts for hiveroute"
    )
    parser.add_argument("--words", type=int, default=4000)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--name", default="router_scaling")
    parser.add_argument("--log-dir", default="/tmp/hiveroute-router-scaling")
    args = parser.parse_args()
    need("wrk")
    need("nginx")
    runtime.use_fastest_event_loop()
    rows = asyncio.run(run(args))
    publish(args.name, TITLE, report(args, rows), rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
