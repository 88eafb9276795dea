"""tools/benchmark.py: a count that would time nothing (``train --steps 0`` printed a ratio of 0 measured steps and
exited 0) is one line naming the option, before any model is built."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCHMARK = os.path.join(ROOT, "tools", "benchmark.py")
CONFIG = os.path.join(ROOT, "configs", "demo", "rn50_demo.yaml")


@pytest.mark.parametrize("kind,option,value,least", [
    ("train", "--steps", 0, 1), ("train", "--rounds", 0, 1), ("train", "--warmup", -1, 0),
    ("profile", "--steps", 0, 1), ("profile", "--top", 0, 1),
])
def test_a_count_that_times_nothing_is_one_line(kind, option, value, least):
    # data.root points nowhere: the old code got past the arguments and failed (or ran) elsewhere
    proc = subprocess.run([sys.executable, BENCHMARK, kind, "-c", CONFIG, option, str(value), "-o",
                           "model.name=resnet18_bottleneck_tiny", "data.root=/nonexistent/never_read"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == f"error: benchmark {kind} {option} {value}: must be {least} or more"
