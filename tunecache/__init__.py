"""tunecache: a team-shared auto-tuning cache for GPU kernels.

The client side is light: importing it pulls in no server, no tuner and no deep-learning framework.

Keys are built from :mod:`tunecache` alone, for built-in kernels and users' own
(``"package.module:qualname"``), on the device the kernel runs on.

Example:
    >>> import tunecache
    >>> key = tunecache.key_for("matmul", "tvm", {"M": 64, "N": 64, "K": 64}, "float32")
    >>> with tunecache.Client("http://127.0.0.1:8765") as client:  # doctest: +SKIP
    ...     result = client.lookup(key, default={"schedule": "default"})
    ...     result.config
"""

from __future__ import annotations

__version__ = "0.1.0"

from tunecache import builtin  # noqa: F401  # registers the built-in kernels
from tunecache.client import Client
from tunecache.device import Device, DeviceFingerprint, DeviceLimits
from tunecache.errors import (
    CheckUnavailable,
    InvalidInput,
    ServerError,
    TunecacheError,
    TuningError,
)
from tunecache.http import Timeout
from tunecache.kernels import KernelSpec, get_kernel
from tunecache.key import Key, key_for
from tunecache.lookup import LookupResult
from tunecache.resolver import RecordsSource, Resolver, SnapshotSource
from tunecache.server_source import ServerSource

__all__ = [
    "CheckUnavailable",
    "Client",
    "Device",
    "DeviceFingerprint",
    "DeviceLimits",
    "InvalidInput",
    "KernelSpec",
    "Key",
    "LookupResult",
    "RecordsSource",
    "Resolver",
    "ServerError",
    "ServerSource",
    "SnapshotSource",
    "Timeout",
    "TunecacheError",
    "TuningError",
    "__version__",
    "get_kernel",
    "key_for",
]
