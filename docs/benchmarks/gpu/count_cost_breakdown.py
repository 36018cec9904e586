"""Where a counted generation's time goes on the GPU: patches this copy's ranks/counting.py so
that each rank prints, to stderr, the seconds of the counting pass, of each profiler session's
start, stop and trace export, then leaves the file as it was after the run.

    python3 docs/benchmarks/gpu/count_cost_breakdown.py -- <pytest arguments>

Written for the two-pass count of 2026-12-02 (a counted, then a profiled generation); since the
count became one pass (2026-12-06 evening) its patches no longer match and it stops unpatched.
"""

import subprocess
import sys
from pathlib import Path

TARGET = Path("pytest_distperf/ranks/counting.py")
PATCHES = [
    (
        "    counter = WorkCounter()\n    with counter:\n        generation(counter.mark)\n",
        "    import time as _t\n    _a = _t.perf_counter()\n    counter = WorkCounter()\n"
        "    with counter:\n        generation(counter.mark)\n"
        "    print(f'COUNT counting-pass {_t.perf_counter() - _a:.3f}', file=sys.stderr)\n",
    ),
    (
        '    profiled = profile_kernels(generation) if prompt.device.type == "cuda" else None\n',
        "    _a = _t.perf_counter()\n"
        '    profiled = profile_kernels(generation) if prompt.device.type == "cuda" else None\n'
        "    print(f'COUNT profile-pass {_t.perf_counter() - _a:.3f}', file=sys.stderr)\n",
    ),
    (
        "        torch.cuda.synchronize()  # a kernel still running when the session stops"
        " is lost\n"
        "        session.stop()\n",
        "        import time as _t\n        torch.cuda.synchronize()\n"
        "        _a = _t.perf_counter()\n"
        "        session.stop()\n"
        "        print(f'COUNT stop {_t.perf_counter() - _a:.3f}', file=sys.stderr)\n"
        "        _a = _t.perf_counter()\n",
    ),
    (
        "        found[phase] = (found[phase][0] + kernels, found[phase][1] + seconds)\n",
        "        print(f'COUNT export {_t.perf_counter() - _a:.3f} kernels {kernels}',"
        " file=sys.stderr)\n"
        "        found[phase] = (found[phase][0] + kernels, found[phase][1] + seconds)\n",
    ),
]

original = TARGET.read_text()
patched = original
for old, new in PATCHES:
    if old not in patched:
        sys.exit(f"patch anchor not found: {old!r}")
    patched = patched.replace(old, new)
TARGET.write_text(patched)
try:
    args = sys.argv[sys.argv.index("--") + 1 :]
    sys.exit(subprocess.call([sys.executable, "-m", "pytest", *args]))
finally:
    TARGET.write_text(original)
