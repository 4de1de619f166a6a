"""plumbing/memory.py's keep_freed_memory: the memory of a freed array is the next one's, no fresh pages."""
import os
import subprocess
import sys

import pytest

from conftest import ROOT

FAULTS = """import resource, sys
sys.path.insert(0, {root!r})
import numpy as np
from plumbing.memory import keep_freed_memory
kept = {keep} and keep_freed_memory()
faults = []
for _ in range(4):  # a step's array of 64 MB, made, written and freed
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    np.ones(1 << 24, np.float32)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(kept, min(faults[1:]))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and getrusage's page faults (Linux)")
def test_kept_freed_memory_makes_the_next_array_without_fresh_pages():
    said = {}
    for keep in (False, True):
        r = subprocess.run([sys.executable, "-c", FAULTS.format(root=ROOT, keep=keep)], capture_output=True, text=True,
                           env={**os.environ, "MALLOC_MMAP_MAX_": "", "MALLOC_TRIM_THRESHOLD_": ""})
        assert r.returncode == 0, r.stderr
        said[keep] = r.stdout.split()
    assert said[True][0] == "True", "keep_freed_memory() found no glibc mallopt on Linux"
    assert int(said[False][1]) >= 32 > int(said[True][1]), said  # 64 MB: at least 32 fresh pages (2 MB ones)
