"""What the harness reads of its child processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hiveroute.bench.procs import tree_cpu_seconds

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="CPU is read from /proc")

# a grandchild that does a fixed amount of work, says so, and then sleeps: its CPU time is the
# same on a busy machine as on an idle one, only later
BUSY = "import sys, time\nsum(range(20_000_000))\nprint('done', flush=True)\ntime.sleep(60)\n"


def test_a_process_tree_counts_the_cpu_of_its_descendants(tmp_path: Path) -> None:
    script = tmp_path / "busy.py"
    script.write_text(BUSY)
    # a shell that starts the busy grandchild and waits: its own CPU is almost nothing
    parent = subprocess.Popen(
        ["/bin/sh", "-c", f"{sys.executable} {script}; sleep 60"], stdout=subprocess.PIPE
    )
    try:
        assert parent.stdout is not None
        assert parent.stdout.readline().strip() == b"done"
        used = tree_cpu_seconds(parent.pid)
        assert used is not None and used >= 0.1  # twenty million additions, at least
        with open(f"/proc/{parent.pid}/stat") as f:
            own = f.read().rsplit(")", 1)[1].split()
        own_s = (int(own[11]) + int(own[12])) / os.sysconf("SC_CLK_TCK")
        assert own_s < used / 2  # most of it is the grandchild's
    finally:
        parent.kill()
        parent.wait()
    assert tree_cpu_seconds(parent.pid) is None  # gone
