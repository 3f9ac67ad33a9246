"""A serving process takes its startup objects out of the cyclic collector's scans, and still
collects the garbage cycles that requests make afterwards, with its young generation sized for
the requests in flight. (In a child process: freezing and the thresholds are for the process's
whole life, which a test process must not inherit.)"""

import subprocess
import sys
import textwrap


def test_startup_objects_are_frozen_and_later_cycles_still_collected() -> None:
    script = textwrap.dedent(
        """
        import gc, weakref
        from hiveroute.runtime import SERVING_YOUNG_THRESHOLD, freeze_startup_objects

        class Node:
            pass

        startup = Node(); startup.me = startup  # a cycle still in use at startup
        freeze_startup_objects()
        assert gc.get_freeze_count() > 1000, gc.get_freeze_count()
        tracked = len(gc.get_objects())  # what a full collection still scans

        later = Node(); later.me = later  # garbage made while serving
        ref = weakref.ref(later)
        del later
        in_flight = [[] for _ in range(SERVING_YOUNG_THRESHOLD // 2)]  # fewer than a pass needs
        assert ref() is not None, "a young pass ran before the threshold"
        in_flight += [[] for _ in range(SERVING_YOUNG_THRESHOLD)]  # more: the young pass runs
        assert ref() is None, "a cycle made after startup was not collected by the young pass"
        assert startup.me is startup
        print(tracked)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) < 1000  # the collector now scans only what came after
