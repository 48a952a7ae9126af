"""tunecache: a team-shared auto-tuning cache for GPU kernels.

The client side is light: importing it pulls in no server, no tuner and no deep-learning framework.

Example:
    >>> import tunecache
    >>> with tunecache.Client("http://127.0.0.1:8765") as client:  # doctest: +SKIP
    ...     result = client.lookup(key, default={"schedule": "default"})
    ...     result.config
"""

from __future__ import annotations

__version__ = "0.1.0"

from tunecache.client import Client, LookupResult, Timeout
from tunecache.device import DeviceFingerprint
from tunecache.errors import InvalidInput, ServerError, TunecacheError, TuningError
from tunecache.key import Key

__all__ = [
    "Client",
    "DeviceFingerprint",
    "InvalidInput",
    "Key",
    "LookupResult",
    "ServerError",
    "Timeout",
    "TunecacheError",
    "TuningError",
    "__version__",
]
