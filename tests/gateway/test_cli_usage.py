"""The CLI explains itself: defaults and policy names in --help, a version, the right usage on
a mistake, and checks that fail before any engine starts."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

import hiveroute
from hiveroute import cli, serve_command
from hiveroute.assembly import check_config
from hiveroute.config import RouterConfig
from hiveroute.errors import ConfigError
from hiveroute.routing.registry import policy_names


def options(parser: argparse.ArgumentParser, name: str) -> list[tuple[str, argparse.Action]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                found += options(sub, f"{name} {sub_name}")
        elif action.option_strings and action.dest != "help":
            found.append((name, action))
    return found


def test_every_flag_of_every_command_has_help() -> None:
    missing = [
        f"{where} {action.option_strings[0]}"
        for where, action in options(cli.build_parser(), "hiveroute")
        if not action.help
    ]
    assert missing == []


def test_serve_help_shows_defaults_and_policy_names(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["serve", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: workflow)" in text and "(default: 8080)" in text
    for name in policy_names():
        assert name in text


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"hiveroute {hiveroute.__version__}"


@pytest.mark.parametrize(
    ("argv", "usage"),
    [
        (["serve", "--polcy", "kv"], "usage: hiveroute serve"),
        (["bench", "run", "--targt", "x"], "usage: hiveroute bench run"),
        (["demo", "--workflow", "3", "--nope"], "usage: hiveroute demo"),
    ],
)
def test_a_mistyped_flag_shows_its_commands_usage(
    argv: list[str], usage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(usage) and "unrecognized arguments" in err
    assert "COMMAND" not in err  # not the top-level usage


def test_policy_and_admin_key_are_checked_before_engines_start(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    started: list[Any] = []
    monkeypatch.setattr(serve_command, "serve", lambda config: started.append(config))
    assert cli.main(["serve", "--policy", "telepathy"]) == 2  # no --engine: embedded engines
    assert "unknown policy 'telepathy'; choose one of" in capsys.readouterr().err
    assert cli.main(["serve", "--admin-key", "abc"]) == 2
    assert "admin_key needs 8 or more characters" in capsys.readouterr().err
    assert started == []
    with pytest.raises(ConfigError, match="unknown policy"):
        check_config(RouterConfig(policy="nope").validate())
    custom = {"mine": {"scorers": [{"name": "load"}]}}
    check_config(RouterConfig(policy="mine", policies=custom).validate())


def test_what_only_building_finds_stops_serve_before_engines_start(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A custom policy's plugin parameters and a tokenizer directory are found wrong only when
    the router is built: `serve` builds one first, so each worker does not find it after the
    engines started (exit 1 from the parent, the error in a worker's log)."""
    started: list[Any] = []
    monkeypatch.setattr(serve_command, "serve", lambda config: started.append(config))
    config = tmp_path / "router.yaml"
    config.write_text(
        "policy: mine\npolicies:\n  mine:\n    scorers:\n      - {name: load, bogus: 1}\n"
    )
    assert cli.main(["serve", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert (
        "policy 'mine' scorers: bad parameters for plugin 'load': "
        "got an unexpected keyword argument 'bogus'"
    ) in err
    assert "<lambda>" not in err
    assert cli.main(["serve", "--tokenizer", str(tmp_path / "no-such-model")]) == 2
    assert "no tokenizer.json in" in capsys.readouterr().err
    assert started == []
