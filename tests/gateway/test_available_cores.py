"""How many workers `serve` starts by default: one per core the process may use, where a
container's CPU quota (cgroup v1 or v2) counts as well as the CPUs it may run on."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from hiveroute.config import MAX_WORKERS, RouterConfig, default_workers, load_config
from hiveroute.runtime import available_cores, cgroup_cpu_quota


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_v2_quota_in_the_process_own_cgroup_is_read_in_cores(tmp_path: Path) -> None:
    write(tmp_path / "proc", "0::/\n")
    write(tmp_path / "cg" / "cpu.max", "150000 100000\n")
    assert cgroup_cpu_quota(tmp_path / "cg", tmp_path / "proc") == 1.5


def test_an_unlimited_v2_cgroup_has_no_quota(tmp_path: Path) -> None:
    write(tmp_path / "proc", "0::/\n")
    write(tmp_path / "cg" / "cpu.max", "max 100000\n")
    assert cgroup_cpu_quota(tmp_path / "cg", tmp_path / "proc") is None


def test_the_smallest_quota_of_the_cgroup_and_its_ancestors_applies(tmp_path: Path) -> None:
    # on a host, /proc/self/cgroup names the process's cgroup below the root
    write(tmp_path / "proc", "0::/kubepods/pod1/c1\n")
    write(tmp_path / "cg" / "kubepods" / "cpu.max", "max 100000\n")
    write(tmp_path / "cg" / "kubepods" / "pod1" / "cpu.max", "100000 100000\n")
    write(tmp_path / "cg" / "kubepods" / "pod1" / "c1" / "cpu.max", "300000 100000\n")
    assert cgroup_cpu_quota(tmp_path / "cg", tmp_path / "proc") == 1.0


def test_a_v1_cpu_controller_quota_is_read_from_its_own_hierarchy(tmp_path: Path) -> None:
    write(tmp_path / "proc", "4:memory:/x\n2:cpu,cpuacct:/docker/abc\n1:name=systemd:/\n")
    group = tmp_path / "cg" / "cpu,cpuacct" / "docker" / "abc"
    write(group / "cpu.cfs_quota_us", "250000\n")
    write(group / "cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_quota(tmp_path / "cg", tmp_path / "proc") == 2.5


def test_a_v1_quota_of_minus_one_is_no_limit(tmp_path: Path) -> None:
    write(tmp_path / "proc", "1:cpu:/\n")
    write(tmp_path / "cg" / "cpu" / "cpu.cfs_quota_us", "-1\n")
    write(tmp_path / "cg" / "cpu" / "cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_quota(tmp_path / "cg", tmp_path / "proc") is None


def test_without_cgroups_there_is_no_quota(tmp_path: Path) -> None:
    assert cgroup_cpu_quota(tmp_path / "cg", tmp_path / "no-such-file") is None


def test_available_cores_rounds_a_quota_up_and_never_exceeds_the_affinity(
    tmp_path: Path,
) -> None:
    affinity = len(os.sched_getaffinity(0))
    write(tmp_path / "proc", "0::/\n")
    write(tmp_path / "cg" / "cpu.max", "50000 100000\n")  # half a core
    assert available_cores(cgroup_root=tmp_path / "cg", proc_cgroup=tmp_path / "proc") == 1
    write(tmp_path / "cg" / "cpu.max", f"{(affinity + 4) * 100000} 100000\n")
    assert available_cores(cgroup_root=tmp_path / "cg", proc_cgroup=tmp_path / "proc") == affinity


def test_serve_defaults_to_one_worker_per_available_core_at_most_eight() -> None:
    expected = min(available_cores(), MAX_WORKERS)
    if not hasattr(socket, "SO_REUSEPORT"):
        expected = 1
    assert default_workers() == expected
    assert RouterConfig().workers == expected
    assert load_config({}, env={}).workers == expected


def test_a_flag_or_the_environment_overrides_the_default() -> None:
    assert load_config({}, env={"HIVEROUTE_WORKERS": "1"}).workers == 1
    assert load_config({"workers": 3}, env={"HIVEROUTE_WORKERS": "1"}).workers == 3
