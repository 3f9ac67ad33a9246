"""The benchmarks' shared command-line types (benchmarks/cli.py)."""

import argparse

import pytest

from benchmarks.cli import comma_floats, comma_ints, comma_list


def test_comma_lists_drop_blanks_and_spaces() -> None:
    assert comma_list(" smg, sglang,,") == ["smg", "sglang"]
    assert comma_list("") == []
    assert comma_ints("0, 1,2,") == [0, 1, 2]
    assert comma_floats("0.8,1.2") == [0.8, 1.2]


def test_a_bad_item_is_an_argparse_error_naming_the_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = argparse.ArgumentParser(prog="bench")
    parser.add_argument("--seeds", type=comma_ints, default="0,1,2")
    assert parser.parse_args([]).seeds == [0, 1, 2]  # a string default is parsed too
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["--seeds", "0,one"])
    assert exited.value.code == 2
    assert "argument --seeds: expected whole numbers, comma-separated: '0,one'" in (
        capsys.readouterr().err
    )
