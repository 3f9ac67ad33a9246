"""`state` given a bad Redis URL: a clear message and exit status 2, not a traceback."""

from __future__ import annotations

import pytest

from hiveroute.cli import main


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis://127.0.0.1:1/0?timeout_s=abc", "timeout_s must be seconds in (0, 60]"),
        ("redis://127.0.0.1:1/0?probe_s=0", "probe_s must be seconds in (0, 600]"),
        ("redis://127.0.0.1:1/0?prefix=a%20b", "prefix must be at most 128 characters"),
        ("mysql://127.0.0.1/0", "state must be 'memory' or a redis://"),
    ],
)
def test_bad_state_urls_are_refused_with_a_message(
    url: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["serve", "--state", url, "--engine", "http://127.0.0.1:9", "--port", "0"])
    assert status == 2
    assert message in capsys.readouterr().err
