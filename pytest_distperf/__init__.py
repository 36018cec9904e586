"""pytest-distperf: distributed-performance regression tests for LLM inference."""

__version__ = "0.1.0"
