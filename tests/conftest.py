from __future__ import annotations

# Imported once here, before any in-process pytester run: pytester restores sys.modules after
# each run, and a second import of torch (or of numpy's C extensions, which LitGPT's import pulls
# in through scipy) in the same process crashes it.
import numpy.fft  # noqa: F401
import torch  # noqa: F401
