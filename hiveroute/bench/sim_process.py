"""Run a simulated fleet in its own process for the harness (`python -m hiveroute.bench.sim_process`).

The simulator in its own process keeps its work off the driver's event loop, so the driver's
clock measures the target, not the harness. Prints one JSON line ``{"specs": [...], "urls":
[...]}`` once the engines listen, then runs until stdin closes or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys

from hiveroute import runtime


async def _main(args: argparse.Namespace) -> int:
    from hiveroute.sim import SimConfig, SimFleet
    from hiveroute.sim.fleet import settle_collector

    options = json.loads(args.options) if args.options else {}
    config = SimConfig(
        engines=args.engines,
        base_port=0,
        events_base_port=0,
        block_size=args.block_size,
        preset=args.preset,
        **options,
    )
    fleet = SimFleet(config)
    await fleet.start()
    settle_collector()  # as `hiveroute sim` does
    try:
        specs = list(fleet.engine_spec_texts())
        urls = [engine.url for engine in fleet.engines]
        print(json.dumps({"specs": specs, "urls": urls}), flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

        async def stdin_closed() -> None:
            while await reader.read(4096):
                pass
            stop.set()

        watcher = asyncio.create_task(stdin_closed())
        await stop.wait()
        watcher.cancel()
    finally:
        await fleet.stop()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m hiveroute.bench.sim_process")
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--preset", default="llama-8b-h100")
    parser.add_argument("--options", default="", help="more SimConfig fields, as JSON")
    return runtime.run(_main(parser.parse_args()))  # uvloop, as `hiveroute sim` runs


if __name__ == "__main__":
    raise SystemExit(main())
