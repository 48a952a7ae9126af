"""Default configs: what runs when nothing tuned is known.

The backend-level defaults live here, in the light vocabulary, so a client can fall back without
importing a workload or a framework. A workload may override them (Triton kernels carry their own
tutorial defaults); :meth:`workloads.base.Workload.default_config` reads this table first.
"""

from __future__ import annotations

import copy
from typing import Any

BACKEND_DEFAULTS: dict[str, dict[str, Any]] = {
    "tvm": {"schedule": "default"},  # the unscheduled PrimFunc
    "inductor": {"mode": "default"},  # torch.compile without max-autotune
}


def default_config(backend: str) -> dict[str, Any] | None:
    """A copy of ``backend``'s default config, or ``None`` when it has no backend-wide one."""
    found = BACKEND_DEFAULTS.get(backend)
    return None if found is None else copy.deepcopy(found)
