"""How a report names the code it measured."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hiveroute.bench.environment import COMMIT_ENV, git_commit


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_a_checkout_is_named_by_its_commit_and_marked_dirty_by_changes_where_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(COMMIT_ENV, "not-this")  # a checkout answers for itself
    (tmp_path / "router").mkdir()
    (tmp_path / "router" / "code.py").write_text("x = 1\n")
    (tmp_path / "notes.md").write_text("notes\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    head = _git(tmp_path, "rev-parse", "--short", "HEAD")
    assert git_commit(tmp_path) == head
    (tmp_path / "untracked.txt").write_text("new\n")  # untracked files do not count
    assert git_commit(tmp_path) == head
    (tmp_path / "notes.md").write_text("changed\n")
    assert git_commit(tmp_path) == head + "+dirty"
    assert git_commit(tmp_path, dirty_paths=("router",)) == head  # not the code measured
    (tmp_path / "router" / "code.py").write_text("x = 2\n")
    assert git_commit(tmp_path, dirty_paths=("router",)) == head + "+dirty"


def test_a_copy_without_git_is_named_by_whoever_made_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(COMMIT_ENV, raising=False)
    assert git_commit(tmp_path) is None
    monkeypatch.setenv(COMMIT_ENV, "abc1234")
    assert git_commit(tmp_path) == "abc1234"
