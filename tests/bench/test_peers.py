"""Peer routers are launched with the flags their own launchers take, in their default policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from hiveroute.bench.peers import PEERS, peer_argv, peer_python
from hiveroute.bench.targets import TargetSpec
from hiveroute.errors import ConfigError


def test_smg_is_a_target_in_its_default_policy() -> None:
    spec = TargetSpec.parse("smg")
    assert (spec.kind, spec.policy, spec.label) == ("smg", "cache_aware", "smg:cache_aware")
    assert TargetSpec.parse("smg:prefix_hash").policy == "prefix_hash"
    with pytest.raises(ConfigError, match="smg has no policy 'kv'"):
        TargetSpec.parse("smg:kv")


def test_smg_launch_arguments(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HIVEROUTE_CACHE_DIR", str(tmp_path))
    smg = PEERS["smg"]
    assert (smg.package, smg.version) == ("smg", "1.13.0")
    python = peer_python(smg)
    assert python == tmp_path / "peers" / "smg" / "bin" / "python"  # its own venv
    urls = ["http://127.0.0.1:8101", "http://127.0.0.1:8102"]
    argv = peer_argv(smg, python, 30001, 29001, urls, smg.default_policy)
    assert argv[:3] == [str(python), "-m", "smg.launch_router"]
    flags = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert flags["--host"] == "127.0.0.1" and flags["--port"] == "30001"
    assert argv[argv.index("--worker-urls") + 1 : argv.index("--policy")] == urls
    assert argv[argv.index("--policy") + 1] == "cache_aware"
    # its metrics port defaults to 29000 like the others': set, so that two can run at once
    assert argv[argv.index("--prometheus-port") + 1] == "29001"
    # smg 1.13.0's --log-level takes debug, info, warn, error (not "warning")
    assert argv[argv.index("--log-level") + 1] == "warn"


@pytest.mark.parametrize("name", sorted(PEERS))
def test_every_peer_is_pinned_and_its_default_policy_is_one_it_has(name: str) -> None:
    peer = PEERS[name]
    assert peer.version.count(".") == 2
    assert peer.default_policy in peer.policies
    assert TargetSpec.parse(name).policy == peer.default_policy
