"""`hiveroute sim`: N simulated vLLM engines in one process until Ctrl-C."""

from __future__ import annotations

import argparse
import logging
import re

from hiveroute import runtime
from hiveroute.errors import ConfigError
from hiveroute.sim.config import SimConfig
from hiveroute.sim.faults import FaultKnobs
from hiveroute.sim.fleet import SimFleet, settle_collector
from hiveroute.sim.presets import DEFAULT_PRESET, PRESETS

_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}  # fmt: skip


def parse_bytes(text: str) -> int:
    """'54GB', '8GiB', '1e9' or '123456' as a number of bytes."""
    match = re.fullmatch(r"\s*([0-9.eE+]+)\s*([kKmMgGtT]i?)?[bB]?\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size like 54GB or 8GiB")
    unit = (match.group(2) or "").lower()
    try:
        return int(float(match.group(1)) * _UNITS[unit])
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a size like 54GB or 8GiB") from None


def configure(parser: argparse.ArgumentParser) -> None:
    d = SimConfig()
    f = FaultKnobs()
    a = parser.add_argument
    a("--engines", type=int, default=d.engines, help="how many engines (default %(default)s)")
    a("--host", default=d.host, help="address to listen on (default %(default)s)")
    a("--base-port", type=int, default=d.base_port, help="HTTP port of engine 0; 0: free ports")
    a("--events-base-port", type=int, default=d.events_base_port,
      help="KV-event PUB port of engine 0; 0: free ports")  # fmt: skip
    a("--replay-base-port", type=int, default=None,
      help="KV-event replay port of engine 0 (default: events base port + 100)")  # fmt: skip
    a("--block-size", type=int, default=d.block_size, help="tokens per KV block (default 16)")
    a("--preset", default=d.preset, choices=sorted(PRESETS),
      help=f"cost model and capacity (default {DEFAULT_PRESET})")  # fmt: skip
    a("--model", default=None, help="model name served (default: the preset's)")
    a("--tokenizer", default=None, metavar="DIR",
      help="directory with tokenizer.json (+ chat template); default: built-in tokenizer")  # fmt: skip
    a("--num-blocks", type=int, default=None, help="KV blocks per engine (overrides --kv-memory)")
    a("--kv-memory", type=parse_bytes, default=None, metavar="SIZE",
      help="KV-cache memory per engine, e.g. 54GB (default: the preset's)")  # fmt: skip
    a("--max-num-seqs", type=int, default=None, help="most requests running at once")
    a("--max-num-batched-tokens", type=int, default=None, help="token budget per step")
    a("--max-model-len", type=int, default=None, help="longest prompt + output")
    a(
        "--scheduling-policy",
        default=d.scheduling_policy,
        choices=("fcfs", "priority"),
        help="priority: honour each request's priority (lower first), as vLLM does",
    )
    a("--no-chunked-prefill", action="store_true", help="admit a prompt only whole")
    a("--no-prefix-caching", action="store_true", help="never reuse cached blocks")
    a("--no-prompt-tokens-details", action="store_true",
      help="omit usage.prompt_tokens_details (as vLLM without --enable-prompt-tokens-details)")  # fmt: skip
    a("--no-kv-events", action="store_true", help="publish no KV events")
    a("--event-topic", default=d.event_topic, help="ZMQ topic of KV events")
    a("--legacy-events", action="store_true", help="encode events as arrays (vLLM < 0.9)")
    a("--default-max-tokens", type=int, default=d.default_max_tokens,
      help="answer length when a request sets no max_tokens")  # fmt: skip
    a("--time-scale", type=float, default=d.time_scale,
      help="wall seconds per modelled second (0.1: ten times faster)")  # fmt: skip
    a("--seed", type=int, default=d.seed, help="seed of the fault generators")
    a(
        "--fail-fraction",
        type=float,
        default=f.fail_fraction,
        help="fault: share of requests failed",
    )
    a("--fail-status", type=int, default=f.fail_status, help="fault: HTTP status of failures")
    a("--stall-first-token", type=float, default=f.stall_first_token_s, metavar="SECONDS",
      help="fault: wait before a request may be scheduled")  # fmt: skip
    a("--drop-fraction", type=float, default=f.drop_fraction,
      help="fault: share of streams whose connection is cut")  # fmt: skip
    a("--drop-after-tokens", type=int, default=f.drop_after_tokens,
      help="fault: tokens sent before a dropped stream is cut")  # fmt: skip
    a(
        "--log-level",
        default="info",
        choices=("debug", "info", "warning", "error"),
        help="log level (stderr)",
    )


def config_from_args(args: argparse.Namespace) -> SimConfig:
    faults = FaultKnobs(
        fail_fraction=args.fail_fraction,
        fail_status=args.fail_status,
        stall_first_token_s=args.stall_first_token,
        drop_fraction=args.drop_fraction,
        drop_after_tokens=args.drop_after_tokens,
        seed=args.seed,
    )
    return SimConfig(
        engines=args.engines,
        host=args.host,
        base_port=args.base_port,
        events_base_port=args.events_base_port,
        replay_base_port=args.replay_base_port,
        block_size=args.block_size,
        preset=args.preset,
        model=args.model,
        tokenizer=args.tokenizer,
        num_blocks=args.num_blocks,
        kv_memory_bytes=args.kv_memory,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        scheduling_policy=args.scheduling_policy,
        enable_chunked_prefill=not args.no_chunked_prefill,
        enable_prefix_caching=not args.no_prefix_caching,
        enable_prompt_tokens_details=not args.no_prompt_tokens_details,
        kv_events=not args.no_kv_events,
        event_topic=args.event_topic,
        legacy_event_encoding=args.legacy_events,
        default_max_tokens=args.default_max_tokens,
        time_scale=args.time_scale,
        seed=args.seed,
        faults=faults,
    ).validate()


async def _serve(config: SimConfig) -> None:
    from hiveroute.gateway.server import wait_for_shutdown_signal

    fleet = SimFleet(config)
    await fleet.start()
    settle_collector()
    try:
        for text in fleet.engine_spec_texts():
            print(f"--engine {text}", flush=True)
        await wait_for_shutdown_signal()
    finally:
        await fleet.stop()


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = config_from_args(args)
    if config.engines > 1024:
        raise ConfigError("--engines above 1024 is not supported in one process")
    try:
        runtime.run(_serve(config))
    except OSError as exc:
        print(f"hiveroute sim: {exc}")
        return 1
    return 0
