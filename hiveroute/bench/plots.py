"""PNG plots of a run (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hiveroute.bench.records import LoadSample, RequestRecord


def available() -> bool:
    """Whether matplotlib (the `bench` extra) is installed; without it runs write no PNGs."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def ttft_cdf(records: Sequence[RequestRecord], workloads: Sequence[str], path: Path) -> None:
    """TTFT CDF per target, one panel per workload."""
    plt = _pyplot()
    from matplotlib.ticker import FuncFormatter, NullFormatter

    fig, axes = plt.subplots(1, len(workloads), figsize=(6 * len(workloads), 4), squeeze=False)
    for ax, workload in zip(axes[0], workloads, strict=True):
        targets = sorted({r.target for r in records if r.workload == workload})
        for target in targets:
            values = sorted(
                r.ttft_s * 1000
                for r in records
                if r.workload == workload and r.target == target and r.ok and r.ttft_s is not None
            )
            if values:
                ys = [(i + 1) / len(values) for i in range(len(values))]
                ax.step(values, ys, where="post", label=target)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel("time to first token (ms, log)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"TTFT CDF: {workload}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def hit_rate(cells: Sequence[dict[str, Any]], path: Path) -> None:
    """Prefix-cache hit rate (cached / prompt tokens) per target, one panel per workload."""
    plt = _pyplot()
    workloads = list(dict.fromkeys(c["workload"] for c in cells))
    fig, axes = plt.subplots(
        1, len(workloads), figsize=(max(5.0, 0.9 * len(cells)), 4), squeeze=False
    )
    for ax, workload in zip(axes[0], workloads, strict=True):
        mine = [c for c in cells if c["workload"] == workload]
        values = [(c.get("hit_rate") or 0.0) * 100 for c in mine]
        ax.bar(range(len(mine)), values, color=[f"C{i}" for i in range(len(mine))])
        ax.set_xticks(range(len(mine)), [c["target"] for c in mine], rotation=30, ha="right")
        ax.tick_params(axis="x", labelsize=7)
        ax.set_ylim(0, 100)
        ax.set_ylabel("cached / prompt tokens (%)")
        ax.set_title(f"prefix-cache hit rate: {workload}")
        for i, v in enumerate(values):
            ax.text(i, v + 1, f"{v:.0f}%", ha="center", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def engine_load(loads: Sequence[tuple[str, LoadSample]], path: Path) -> None:
    """Requests on each engine (running + waiting) over time, one panel per target."""
    plt = _pyplot()
    targets = sorted({t for t, _ in loads})
    if not targets:
        return
    fig, axes = plt.subplots(len(targets), 1, figsize=(8, 2.4 * len(targets)), squeeze=False)
    for ax, target in zip(axes[:, 0], targets, strict=True):
        engines = sorted({s.engine for t, s in loads if t == target})
        for engine in engines:
            points = [
                (s.t_s, s.running + s.waiting)
                for t, s in loads
                if t == target and s.engine == engine
            ]
            ax.plot([p[0] for p in points], [p[1] for p in points], label=engine, lw=1)
        ax.set_title(target, fontsize=9)
        ax.set_ylabel("requests")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("time since the run started (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
