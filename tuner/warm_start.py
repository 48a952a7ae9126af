"""Warm starts: the winners of neighbouring keys already in the cache, nearest shape first.

Neighbours share the kernel, backend and dtype, and run on the same architecture (another device
of that arch, or this one at another shape). Their configs are tried first by the strategy.
"""

from __future__ import annotations

import logging

from tunecache.client import Client
from tunecache.errors import InvalidInput, ServerError
from tunecache.key import Key
from tunecache.rules import closeness
from tunecache.space import Config, SearchSpace

logger = logging.getLogger(__name__)


def neighbour_configs(
    client: Client, key: Key, space: SearchSpace, *, limit: int = 8
) -> list[Config]:
    """Configs of validated winners near ``key`` that ``space`` contains, nearest first.

    A server that cannot be reached gives no warm start (logged), never an error.
    """
    try:
        records = client.list_records(
            kernel=key.kernel, backend=key.backend, dtype=key.dtype,
            device_arch=key.device.arch, winners_only=True, limit=200,
        ).items  # fmt: skip
    except ServerError as exc:
        logger.warning("no warm start: %s", exc)
        return []
    digest, wanted = key.digest(), key.to_json()
    ranked = sorted(
        (r for r in records if r.key_hash != digest),
        key=lambda r: closeness(wanted, r.key.model_dump(mode="json", by_alias=True)),
    )
    configs: list[Config] = []
    for record in ranked:
        try:
            config = Config.of(record.config)
        except InvalidInput:
            continue  # not a flat config (a MetaSchedule trace): not for this space
        if space.contains(config) and config not in configs:
            configs.append(config)
        if len(configs) == limit:
            break
    return configs
