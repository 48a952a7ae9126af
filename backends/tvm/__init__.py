"""The TVM backend (MetaSchedule on llvm). Importing this package does not import TVM."""

from __future__ import annotations

from backends.tvm.backend import TVMBackend

__all__ = ["TVMBackend"]
