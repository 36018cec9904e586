from __future__ import annotations

# Imported once here, before any in-process pytester run: pytester restores sys.modules after
# each run, and a second import of torch in the same process crashes it.
import torch  # noqa: F401
