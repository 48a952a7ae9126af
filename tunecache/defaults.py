"""Default configs: what runs when nothing tuned is known.

The backend-level defaults live here, in the light vocabulary, so a client can fall back without
importing a workload or a framework. A workload may override them (Triton kernels carry their own
tutorial defaults); :meth:`workloads.base.Workload.default_config` reads this table first.
"""

from __future__ import annotations

import copy
from typing import Any

# ‖out − ref‖ / ‖ref‖ a correct kernel stays under, per dtype (DESIGN.md, "Correct first"): the
# tuner's checks of built-in and users' kernels and tunecache.triton's check of a tuned winner.
TOLERANCES: dict[str, float] = {
    "float64": 1e-9,
    "float32": 1e-4,
    "bfloat16": 2e-2,
    "float16": 5e-3,
}

BACKEND_DEFAULTS: dict[str, dict[str, Any]] = {
    "tvm": {"schedule": "default"},  # the unscheduled PrimFunc
    "inductor": {"mode": "default"},  # torch.compile without max-autotune
}


def default_config(backend: str) -> dict[str, Any] | None:
    """A copy of ``backend``'s default config, or ``None`` when it has no backend-wide one."""
    found = BACKEND_DEFAULTS.get(backend)
    return None if found is None else copy.deepcopy(found)
