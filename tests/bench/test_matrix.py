"""The workload matrix (benchmarks/matrix): its grid, resuming, and who won which cell."""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path
from typing import Any

import pytest

from benchmarks.matrix import ab, grid, verdict
from benchmarks.matrix.report import build
from benchmarks.matrix.runner import figures_of, harness_argv, plan
from benchmarks.matrix.store import CellStore, pending
from hiveroute.bench.command import configure, options_from_args
from hiveroute.bench.workloads import build_workload

CELLS = grid.all_cells()


def test_the_grid_has_enough_cells_each_named_once() -> None:
    names = [c.name for c in CELLS]
    assert len(names) >= 24 and len(set(names)) == len(names)
    kinds = {c.workload for c in CELLS}
    assert kinds == {"multiturn", "agentic", "trace"}
    assert {c.workload for c in CELLS if c.replicas == 2} == kinds  # replicas for a subset
    assert 0 < sum(c.replicas == 2 for c in CELLS) < len(CELLS)


def test_multiturn_cells_are_an_orthogonal_array_every_pair_of_levels_once() -> None:
    cells = [c for c in CELLS if c.workload == "multiturn" and c.name.startswith("mt-s")]
    cells = [c for c in cells if c.replicas == 1]
    dims = ("system_share", "working_set", "sessions_per_engine")
    levels = (grid.SHARED_SHARES, grid.WORKING_SETS, grid.SESSIONS_PER_ENGINE)
    assert len(cells) == 9
    for (a, la), (b, lb) in itertools.combinations(zip(dims, levels, strict=True), 2):
        pairs = sorted((c.params[a], c.params[b]) for c in cells)
        assert pairs == sorted(itertools.product(la, lb))


def test_agentic_cells_are_a_half_fraction_balanced_in_every_pair() -> None:
    cells = [c for c in CELLS if c.workload == "agentic" and c.replicas == 1]
    dims = ("fan_out", "context_tokens", "tool_gap_s", "layout")
    levels = (grid.FAN_OUTS, grid.CONTEXTS, grid.TOOL_GAPS, grid.LAYOUTS)
    assert len(cells) == 8
    for (a, la), (b, lb) in itertools.combinations(zip(dims, levels, strict=True), 2):
        pairs = sorted((c.params[a], c.params[b]) for c in cells)
        assert pairs == sorted(list(itertools.product(la, lb)) * 2)


def test_multiturn_working_set_is_the_asked_share_of_the_fleets_cache() -> None:
    for cell in CELLS:
        if cell.workload != "multiturn" or cell.name == "mt-issue22":
            continue
        p = cell.params
        distinct = p["conversation_tokens"] * (
            p["system_share"] + p["active_users"] * (1 - p["system_share"])
        )
        fleet = grid.ENGINES * cell.blocks * grid.BLOCK_SIZE
        assert distinct / fleet == pytest.approx(p["working_set"], rel=0.01)
        assert p["active_users"] == grid.ENGINES * p["sessions_per_engine"]
        # fits: the shared prompt once per engine, each session's own part once
        copies = p["conversation_tokens"] * (
            p["system_share"] * grid.ENGINES + p["active_users"] * (1 - p["system_share"])
        )
        assert cell.fits == (copies <= fleet)
        if p["working_set"] >= 1:
            assert not cell.fits


def test_a_shared_prompt_too_large_to_copy_to_every_engine_does_not_fit() -> None:
    by_name = {c.name: c for c in CELLS}
    # 0.9 of the fleet counted with its 25,600-token system prompt once, but every engine
    # serving two sessions needs that prompt beside their 51,200 own tokens: 76,800 > 64,000
    assert by_name["mt-s50-w090-u2"].params["working_set"] < 1
    assert not by_name["mt-s50-w090-u2"].fits
    assert by_name["mt-s50-w050-u32"].fits and by_name["mt-s10-w090-u32"].fits
    assert by_name["mt-issue22"].fits


@pytest.mark.parametrize("cell", CELLS, ids=lambda c: c.name)
def test_every_cells_arguments_are_accepted_by_the_bench(cell: grid.Cell) -> None:
    parser = argparse.ArgumentParser()
    configure(parser)
    for router in plan(cell, ["hiveroute:workflow", "smg"]):
        argv = harness_argv(cell, router, 1, 0.5, Path("/tmp/unused"))
        args = parser.parse_args(argv)
        options = options_from_args(args, argv)
        assert options.seed == 1 and options.router_replicas == (
            cell.replicas if router != "ideal" else 1
        )
        workload = build_workload(cell.workload, args, 1, "ns")
        assert next(iter(workload.units()))  # it has work, and sizes that fit


def test_the_time_scale_scales_rates_gaps_durations_and_the_simulator_together() -> None:
    cell = next(c for c in CELLS if c.name == "ag-f2-c4k-g5-role")
    slow = harness_argv(cell, "smg", 0, 1.0, Path("o"))
    assert slow[slow.index("--workflow-rate") + 1] == "0.5"
    fast = harness_argv(cell, "smg", 0, 0.5, Path("o"))
    assert fast[fast.index("--workflow-rate") + 1] == "1"  # 0.5/s modelled, twice as fast
    assert fast[fast.index("--tool-gap") + 1] == "exp:2.5"
    assert fast[fast.index("--duration") + 1] == "60"
    assert "time_scale=0.5" in fast
    logged = harness_argv(cell, "hiveroute:kv", 0, 0.5, Path("o"), "info")
    assert logged[logged.index("--router-log-level") + 1] == "info"
    ideal = harness_argv(cell, "ideal", 0, 0.5, Path("o"))
    assert ideal[ideal.index("--num-engines") + 1] == "1"
    assert f"num_blocks={4 * cell.blocks}" in ideal and "time_scale=0.125" in ideal


def test_plan_adds_referenced_contexts_in_role_first_cells_and_the_ideal_where_it_fits() -> None:
    by_name = {c.name: c for c in CELLS}
    role = by_name["ag-f2-c4k-g5-role"]
    assert plan(role, ["hiveroute:workflow", "smg"]) == [
        "hiveroute:workflow",
        "smg",
        "hiveroute:workflow+refs",
    ]
    assert "hiveroute:workflow+refs" not in plan(
        by_name["ag-f2-c4k-g0.2-context"], ["hiveroute:workflow"]
    )
    replicated = by_name["ag-f8-c4k-g0.2-role-x2"]
    assert plan(replicated, ["hiveroute:workflow"]) == [
        "hiveroute:workflow",
        "hiveroute:workflow+refs",
    ]
    assert plan(role, ["hiveroute:workflow"], refs=False) == ["hiveroute:workflow"]
    assert plan(by_name["mt-s00-w050-u2"], ["smg"]) == ["smg", "ideal"]
    assert plan(by_name["mt-s00-w130-u32"], ["smg"]) == ["smg"]
    refs = harness_argv(role, "hiveroute:workflow+refs", 0, 0.5, Path("o"))
    assert "--context-refs" in refs and refs[refs.index("--target") + 1] == "hiveroute:workflow"
    assert "--router-state" not in refs  # one replica: its own memory is shared enough
    # two replicas reference a context registered with one of them: they share a Redis
    shared = harness_argv(replicated, "hiveroute:workflow+refs", 0, 0.5, Path("o"))
    assert shared[shared.index("--router-state") + 1] == "redis"
    inline = harness_argv(replicated, "hiveroute:workflow", 0, 0.5, Path("o"))
    assert "--router-state" not in inline  # the default policy in the router's default state


def test_cells_are_selected_by_name_or_prefix() -> None:
    assert [c.name for c in grid.select(CELLS, ["tr-0", "mt-s50*"])][:1] == ["mt-s50-w050-u32"]
    assert {c.workload for c in grid.select(CELLS, ["tr-*"])} == {"trace"}
    with pytest.raises(ValueError, match="unknown cells: nope"):
        grid.select(CELLS, ["nope"])


def test_the_store_resumes_only_what_is_missing_or_failed(tmp_path: Path) -> None:
    store = CellStore(tmp_path / "matrix")
    info = {"workload": "multiturn", "fits": True}
    store.record("a", info, "smg", 0, {"status": "ok", "hit_rate": 0.5})
    store.record("a", info, "sglang", 0, {"status": "failed", "error": "did not start"})
    plan_ = {"a": ["smg", "sglang"], "b": ["smg"]}
    assert pending(store, ["a", "b"], plan_, [0, 1]) == [
        ("a", "sglang", 0),
        ("a", "smg", 1),
        ("a", "sglang", 1),
        ("b", "smg", 0),
        ("b", "smg", 1),
    ]
    again = CellStore(tmp_path / "matrix")  # a new process reads what the last one wrote
    assert again.load("a")["runs"]["smg/s0"]["hit_rate"] == 0.5
    assert again.load("a")["fits"] is True
    assert not list((tmp_path / "matrix").glob("*.tmp"))


def fig(median: float, spread: float = 0.0) -> verdict.Figure:
    return verdict.Figure(median, spread, 3)


def test_won_tied_lost_by_the_seed_spread() -> None:
    classify = verdict.classify
    # higher is better: a clear winner
    assert classify({"a": fig(0.8, 0.01), "b": fig(0.7, 0.01)}, True) == {"a": "won", "b": "lost"}
    # b within a's spread of the best: both tie; c is far behind
    figs = {"a": fig(0.8, 0.05), "b": fig(0.77, 0.0), "c": fig(0.5, 0.1)}
    assert classify(figs, True) == {"a": "tied", "b": "tied", "c": "lost"}
    # the runner-up's own spread counts too
    assert classify({"a": fig(0.8, 0.0), "b": fig(0.75, 0.06)}, True) == {"a": "tied", "b": "tied"}
    # lower is better (TTFT)
    assert classify({"a": fig(0.2, 0.01), "b": fig(0.1, 0.01)}, False) == {"a": "lost", "b": "won"}
    # one seed: only equal figures tie
    one = {
        "a": verdict.Figure(0.5, 0, 1),
        "b": verdict.Figure(0.5, 0, 1),
        "c": verdict.Figure(0.4, 0, 1),
    }
    assert classify(one, True) == {"a": "tied", "b": "tied", "c": "lost"}
    assert classify({}, True) == {}


def cell(name: str, runs: list[tuple[str, int, dict[str, Any]]], **extra: Any) -> dict[str, Any]:
    return {
        "cell": name,
        **extra,
        "runs": {f"{r}/s{s}": {"router": r, "seed": s, "status": "ok", **f} for r, s, f in runs},
    }


def test_figures_are_medians_and_ranges_of_the_successful_seeds() -> None:
    c = cell("x", [("smg", s, {"hit_rate": v}) for s, v in enumerate((0.5, 0.7, 0.6))])
    c["runs"]["smg/s3"] = {"router": "smg", "seed": 3, "status": "failed", "hit_rate": 0.0}
    f = verdict.figures(c, "hit_rate")["smg"]
    assert (f.median, f.spread, f.seeds) == (0.6, pytest.approx(0.2), 3)


def test_tally_counts_cells_and_leaves_the_ideal_out() -> None:
    cells = [
        cell(
            "x",
            [
                ("a", 0, {"hit_rate": 0.9}),
                ("b", 0, {"hit_rate": 0.5}),
                ("ideal", 0, {"hit_rate": 1.0}),
            ],
        ),
        cell("y", [("a", 0, {"hit_rate": 0.4}), ("b", 0, {"hit_rate": 0.4})]),
        cell("z", [("a", 0, {"hit_rate": 0.1}), ("b", 0, {"hit_rate": 0.3})]),
    ]
    assert verdict.tally(cells, "hit_rate") == {
        "a": {"won": 1, "tied": 1, "lost": 1},
        "b": {"won": 1, "tied": 1, "lost": 1},
    }


def test_targets_name_the_cells_that_miss_them() -> None:
    d = verdict.DEFAULT
    good = {
        "hit_rate": 0.8,
        "ttft_mean": 0.100,
        "ttft_p99": 0.5,
        "engine_requests": [10, 10, 9, 11],
    }
    peer = {
        "hit_rate": 0.8,
        "ttft_mean": 0.100,
        "ttft_p99": 0.5,
        "engine_requests": [10, 10, 10, 10],
    }
    bad = {"hit_rate": 0.6, "ttft_mean": 0.106, "ttft_p99": 0.5, "engine_requests": [37, 1, 1, 1]}
    ideal = {"hit_rate": 0.82}
    cells = [
        cell("ok", [(d, 0, good), ("smg", 0, peer), ("ideal", 0, ideal)], fits=True),
        cell(
            "miss",
            [
                (d, 0, bad),
                ("smg", 0, peer),
                ("sglang", 0, {**peer, "ttft_mean": 0.2}),
                ("ideal", 0, ideal),
            ],
            fits=True,
        ),
    ]
    results = {c.target: (c.met, c.judged, c.misses) for c in verdict.targets(cells, 4)}
    hit = results["hit rate never behind the best peer by more than the seed spread"]
    assert hit[:2] == (False, 2) and hit[2][0].startswith("miss (0.600 vs smg 0.800)")
    assert results["ttft_mean at most 1.05 x the best peer's"][2] == ["miss (106 vs smg 100 ms)"]
    assert results["ttft_p99 at most 1.05 x the best peer's"][:2] == (True, 2)
    fair = results["no engine below half its fair share"]
    assert fair[0] is False and fair[2] == ["miss ([37, 1, 1, 1])"]
    ideal_check = results["hit rate >= 95 % of the one-cache ideal where the working set fits"]
    assert ideal_check[0] is False and ideal_check[2][0].startswith("miss (73%")
    assert len(results) == 9  # every target has a row


def test_starved_is_below_half_the_fair_share_counting_engines_that_got_nothing() -> None:
    assert verdict.starved({"engine_requests": [30, 30, 30, 9]}, 4)  # 9 < 99 / 8
    assert not verdict.starved({"engine_requests": [30, 30, 30, 13]}, 4)
    assert verdict.starved({"engine_requests": [40, 40, 40]}, 4)  # the fourth got none
    assert not verdict.starved({"engine_requests": []}, 4)


def test_agentic_targets_use_downstream_ttft_and_workflow_time() -> None:
    d = verdict.DEFAULT
    cells = [
        cell(
            f"ag{i}",
            [
                (d, 0, {"downstream_ttft_mean": 0.1, "workflow_s_mean": w}),
                ("smg", 0, {"downstream_ttft_mean": r, "workflow_s_mean": 5.0}),
            ],
            workload="agentic",
        )
        for i, (r, w) in enumerate([(0.2, 4.0), (0.1, 6.0), (0.14, 4.0)])
    ]
    results = {c.target: c for c in verdict.targets(cells, 4)}
    down = results["agentic: median (best peer / default) downstream-agent TTFT >= 1.3"]
    assert down.met is True and down.judged == 3 and down.detail == "median ratio 1.40 over 3 cells"
    assert down.misses == ["ag1 1.00"]  # the cells below 1.3 are named even when the median is met
    wf = results["agentic: workflow completion time below the best peer's in most cells"]
    assert wf.met is True and wf.detail == "2 of 3" and wf.misses[0].startswith("ag1")


def test_run_figures_come_from_the_summary_and_the_records() -> None:
    summary = {
        "workload": "agentic",
        "requests": 4,
        "ok": 3,
        "errors": 1,
        "cut": 0,
        "hit_rate": 0.5,
        "ttft_s_mean": 0.2,
        "ttft_s_p50": 0.1,
        "ttft_s_p99": 0.9,
        "tpot_s_mean": 0.004,
        "engine_ttft_s_mean": 0.15,
        "unit_s_mean": 3.0,
        "engine_requests": {"engine1": 2.0, "engine0": 1.0},
    }
    requests = [
        {"agent_role": "planner", "ttft_s": 1.0},
        {"agent_role": "executor", "ttft_s": 0.2},
        {"agent_role": "validator", "ttft_s": 0.4},
        {"agent_role": "executor", "ttft_s": 9.0, "error": "HTTP 500"},
    ]
    figures = figures_of(summary, requests)
    assert figures["downstream_ttft_mean"] == pytest.approx(0.3)
    assert figures["engine_requests"] == [1, 2] and figures["workflow_s_mean"] == 3.0
    assert figures["engine_ttft_mean"] == 0.15 and figures["ttft_mean"] == 0.2
    assert figures["tpot_mean"] == 0.004
    assert figures_of({**summary, "workload": "trace"}, [])["workflow_s_mean"] is None


def test_the_report_is_built_from_cell_files_alone(tmp_path: Path) -> None:
    d = verdict.DEFAULT
    cells = [
        cell(
            "mt-a",
            [
                (
                    r,
                    s,
                    {
                        "hit_rate": h + s / 100,
                        "ttft_mean": 0.1,
                        # the engines' own TTFT: recorded by this seed's run only
                        "engine_ttft_mean": 0.06 if s == 0 else None,
                        "ttft_p50": 0.05,
                        "ttft_p99": 0.3,
                        "tpot_mean": 0.004 if r == d else 0.005,
                        "engine_requests": [5, 5, 5, 5],
                        "errors": 0,
                    },
                )
                for r, h in ((d, 0.7), ("smg", 0.6))
                for s in range(3)
            ],
            workload="multiturn",
        ),
    ]
    text = build(cells, 4, tmp_path, "header")
    # won on hit rate and time per output token, tied on TTFT, no downstream agents
    assert "| hiveroute:workflow | 1/0/0 | 0/1/0 | 0/1/0 | 1/0/0 | – |" in text
    assert "| mt-a | hiveroute:workflow | 3/3 | 71.0% ±1.0% | 100 ±0 | 60 | 50 |" in text
    assert "| 300 ±0 | 4.00 ±0.00 | 5-5-5-5 /" in text
    assert (tmp_path / "matrix_hit_rate.png").exists()
    assert f"({tmp_path.name}/matrix_hit_rate.png)" in text


def test_with_refs_judges_the_default_by_its_referenced_runs_where_it_has_them() -> None:
    d = verdict.DEFAULT
    cells = [
        cell(
            "role",
            [
                (d, 0, {"downstream_ttft_mean": 0.3}),
                (d + "+refs", 0, {"downstream_ttft_mean": 0.1}),
                ("smg", 0, {"downstream_ttft_mean": 0.2}),
            ],
            workload="agentic",
        ),
        cell(
            "context",
            [(d, 0, {"downstream_ttft_mean": 0.1}), ("smg", 0, {"downstream_ttft_mean": 0.2})],
            workload="agentic",
        ),
    ]
    swapped = verdict.with_refs(cells)
    assert verdict.figures(swapped[0], "downstream_ttft_mean")[d].median == 0.1
    assert set(verdict.figures(swapped[0], "downstream_ttft_mean")) == {d, "smg"}
    assert swapped[1] == cells[1]
    checks = {c.target: c for c in verdict.targets(cells, 4)}
    plain = checks["agentic: median (best peer / default) downstream-agent TTFT >= 1.3"]
    refs = checks[
        "agentic: median (best peer / default) downstream-agent TTFT >= 1.3 (+refs in role-first cells)"
    ]
    assert "median ratio 1.33" in plain.detail and "median ratio 2.00" in refs.detail


def test_summarize_only_rebuilds_the_report_beside_the_cell_files(tmp_path: Path) -> None:
    from benchmarks.matrix.__main__ import main

    store = CellStore(tmp_path / "m")
    store.record("tr-0", {"workload": "trace"}, "smg", 0, {"status": "ok", "hit_rate": 0.2})
    assert main(["--summarize-only", "--results", str(tmp_path / "m")]) == 0
    text = (tmp_path / "m.md").read_text()
    assert "| tr-0 | smg | 1/1 | 20.0%" in text and "(m/matrix_hit_rate.png)" in text
    # --list runs nothing and counts what is left: tr-0 has 7 routers, one done
    assert (
        main(["--list", "--cells", "tr-0", "--seeds", "0", "--results", str(tmp_path / "m")]) == 0
    )
    assert store.load("tr-0")["runs"].keys() == {"smg/s0"}


def test_compare_judges_one_router_across_two_result_sets_by_the_tie_rule() -> None:
    from benchmarks.matrix.compare import compare_cell

    r = "hiveroute:workflow"
    a = cell("x", [(r, s, {"hit_rate": h, "ttft_mean": t}) for s, h, t in ((0, 0.80, 0.030),
              (1, 0.82, 0.031), (2, 0.81, 0.032))])  # fmt: skip
    # b: hit rate within a's spread, TTFT clearly lower; another router's runs are ignored
    b = cell("x", [(r, 0, {"hit_rate": 0.815, "ttft_mean": 0.020}),
                   ("smg", 0, {"hit_rate": 0.1, "ttft_mean": 0.5})])  # fmt: skip
    found = compare_cell(a, b, r)
    assert {m: v[2] for m, v in found.items()} == {"hit_rate": "tied", "ttft_mean": "better"}
    assert found["ttft_mean"][0].seeds == 3 and found["ttft_mean"][1].median == 0.020
    # figures that print alike tie even with no spread; a clear loss is worse
    a1 = cell("x", [(r, 0, {"hit_rate": 0.8640, "ttft_mean": 0.0300})])
    b1 = cell("x", [(r, 0, {"hit_rate": 0.8642, "ttft_mean": 0.0400})])
    assert {m: v[2] for m, v in compare_cell(a1, b1, r).items()} == {
        "hit_rate": "tied",
        "ttft_mean": "worse",
    }
    # the router's CPU per request: less is better, and tenths of a ms that print alike tie
    a2 = cell("x", [(r, 0, {"router_cpu_ms": 9.1}), (r, 1, {"router_cpu_ms": 9.3})])
    b2 = cell("x", [(r, 0, {"router_cpu_ms": 6.0}), (r, 1, {"router_cpu_ms": 6.2})])
    assert compare_cell(a2, b2, r)["router_cpu_ms"][2] == "better"
    a3 = cell("x", [(r, 0, {"router_cpu_ms": 9.12})])
    b3 = cell("x", [(r, 0, {"router_cpu_ms": 9.08})])
    assert compare_cell(a3, b3, r)["router_cpu_ms"][2] == "tied"
    # time per output token: a placement that keeps TTFT but slows decoding is worse
    a4 = cell("x", [(r, 0, {"ttft_mean": 0.100, "tpot_mean": 0.00356})])
    b4 = cell("x", [(r, 0, {"ttft_mean": 0.100, "tpot_mean": 0.00513})])
    assert {m: v[2] for m, v in compare_cell(a4, b4, r).items()} == {
        "ttft_mean": "tied",
        "tpot_mean": "worse",
    }


def test_compare_pairs_runs_by_seed_where_the_seeds_range_hides_a_loss() -> None:
    from benchmarks.matrix.compare import compare_cell, paired, paired_row

    r = "hiveroute:workflow"
    # seeds are workloads of very different load: b is 10 % slower in every one of them
    base = {0: 0.100, 1: 0.200, 2: 0.150}
    a = cell("x", [(r, s, {"ttft_mean": t}) for s, t in base.items()])
    b = cell("x", [(r, s, {"ttft_mean": t * 1.1}) for s, t in base.items() if s != 1]
             + [(r, 1, {"status": "failed", "ttft_mean": 0.01})])  # fmt: skip
    assert compare_cell(a, b, r)["ttft_mean"][2] == "tied"  # within the seeds' range
    assert [s for s, _, _ in paired(a, b, r, "ttft_mean")] == [0, 2]  # failed runs left out
    row = paired_row("x", a, b, r)
    assert row is not None and "0 of 2, ×1.100" in row
    # a reference figure of 0 (no prompt token cached) counts in the tally, not in the ratio
    zero = cell("x", [(r, 0, {"hit_rate": 0.0}), (r, 1, {"hit_rate": 0.0})])
    some = cell("x", [(r, 0, {"hit_rate": 0.1}), (r, 1, {"hit_rate": 0.0})])
    row = paired_row("x", zero, some, r)
    assert row is not None and "| 1 of 2 |" in row


def test_ab_runs_every_cell_and_seed_once_each_side_going_first_by_turns() -> None:
    order = ab.turns(["a", "b"], [0, 1])
    assert [(c, s) for c, s, _ in order] == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]
    assert [first for _, _, first in order] == [True, False, True, False]
