"""Fetch keys through :class:`tunecache.Client` in a fresh process (used by ``tunecache demo``).

Reads ``{"server": URL, "token": T, "keys": [{"workload", "backend", "problem", "dtype"}, ...]}``
on stdin (``token``: the demo server's own, never the user's ``TUNECACHE_TOKEN``),
rebuilds every key from scratch (device fingerprint, versions, source hashes) and prints one JSON
line per key: ``{"label", "hit", "source", "record_id", "config_summary"}``.
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    from tunecache.client import Client
    from tunecache.key import key_for

    request = json.load(sys.stdin)
    with Client(request["server"], token=request["token"], timeout=5.0,
                snapshot="") as client:  # the server's answer  # fmt: skip
        for spec in request["keys"]:
            key = key_for(spec["workload"], spec["backend"], spec["problem"], spec["dtype"])
            result = client.lookup(key)
            record = result.record
            line = {
                "label": key.short(),
                "hit": result.hit,
                "source": result.source,
                "record_id": record.id if record else None,
                "config_summary": record.config_summary if record else None,
            }
            print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
