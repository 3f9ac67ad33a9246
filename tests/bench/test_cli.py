"""`hiveroute bench` and `hiveroute demo` refuse bad arguments with a clear message."""

from __future__ import annotations

import pytest

from hiveroute.bench.command import options_from_args
from hiveroute.bench.targets import TargetSpec, best_policy
from hiveroute.cli import build_parser, main
from hiveroute.errors import ConfigError


@pytest.mark.parametrize(
    "argv",
    [
        ["bench"],
        ["bench", "run", "--workload", "nope"],
        ["bench", "run", "--tool-gap", "poisson:1"],
        ["bench", "run", "--workflows", "0"],
        ["bench", "run", "--duration", "-1"],
        ["bench", "run", "--mode", "sideways"],
        ["bench", "run", "--engines", "tpu"],
        ["bench", "compare", "--slices", "0"],
        ["bench", "run", "--sim-option", "novalue"],
        ["bench", "run", "--system-share", "1.5"],
        ["bench", "run", "--request-rate", "-3"],
        ["demo", "--num-engines", "0"],
    ],
)
def test_argument_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv,message",
    [
        (["bench", "run", "--target", "nginx"], "unknown target 'nginx'"),
        (["bench", "run", "--target", "hiveroute:fastest"], "unknown hiveroute policy"),
        (["bench", "run", "--target", "sglang:kv"], "sglang has no policy 'kv'"),
        (["bench", "run", "--target", "engine:kv"], "takes no policy"),
        (
            ["bench", "run", "--target", "hiveroute:session", "--target", "hiveroute:session"],
            "given twice",
        ),
        (["bench", "run", "--workload", "trace", "--trace", "/nonexistent.jsonl"], "cannot read"),
        (
            ["bench", "run", "--workload", "multiturn", "--system-share", "0.1"],
            "--system-share needs --conversation-tokens",
        ),
        (
            ["bench", "run", "--workload", "multiturn", "--active-users", "20"],
            "--active-users and --request-rate go together",
        ),
        (
            ["bench", "run", "--target", "smg", "--context-refs"],
            "--context-refs needs hiveroute targets (no context API): smg:cache_aware",
        ),
        (
            ["bench", "run", "--context-refs", "--router-replicas", "2"],
            "the replicas must share their state; add --router-state redis",
        ),
        (
            ["bench", "run", "--target", "smg", "--router-state", "redis"],
            "no hiveroute target is given",
        ),
        (
            ["bench", "run", "--router-replicas", "17"],
            "--router-replicas must be between 1 and 16, got 17",
        ),
    ],
)
def test_bad_targets_and_inputs_exit_2_with_a_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: object
) -> None:
    assert main([*argv, "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


def test_defaults_and_target_parsing() -> None:
    args = build_parser().parse_args(["bench", "compare"])
    options = options_from_args(args, ["hiveroute", "bench", "compare"])
    assert [t.label for t in options.targets] == [f"hiveroute:{best_policy()}"]
    assert options.workloads == ["agentic"] and options.slices == 3
    assert options.router_replicas == 1 and options.router_state == "memory"
    shared = ["bench", "run", "--context-refs", "--router-replicas", "2", "--router-state", "redis"]
    options = options_from_args(build_parser().parse_args(shared), ["hiveroute", *shared])
    assert options.router_replicas == 2 and options.router_state == "redis"
    assert TargetSpec.parse("sglang").label == "sglang:cache_aware"
    assert TargetSpec.parse("vllm-router:round_robin").policy == "round_robin"
    assert TargetSpec.parse("hiveroute").label == "hiveroute:round_robin"
    with pytest.raises(ConfigError):
        TargetSpec.parse("")


def test_router_replicas_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["bench", "run", "--router-replicas", "0"])
    assert exited.value.code == 2
    assert "expected a positive integer" in capsys.readouterr().err


def test_sim_options_are_typed() -> None:
    args = build_parser().parse_args(
        ["bench", "run", "--sim-option", "num_blocks=4000", "--sim-option", "time-scale=0.5"]
    )
    assert dict(args.sim_option) == {"num_blocks": 4000, "time_scale": 0.5}


def test_vllm_model_shape_is_checked() -> None:
    import argparse

    from hiveroute.bench.command import _model_shape

    assert _model_shape("8x512") == (8, 512)
    for bad in ("8", "x512", "8x100", "0x256", "axb"):
        with pytest.raises(argparse.ArgumentTypeError, match="LAYERSxHIDDEN"):
            _model_shape(bad)
