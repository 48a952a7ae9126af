"""Warm starts from the cache: neighbouring keys' winners, and their trials as a prior.

Neighbours share the kernel, backend and dtype. :func:`neighbour_configs` takes the winners on the
same architecture (another device of that arch, or this one at another shape): their configs are
tried first. :func:`neighbour_prior` reads the trials of the nearest winners on any device (other
GPUs, other shapes) — what a shared cache has and a single machine does not — as a score per
config for the strategies that model the space (``bayes``).
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Iterable, Mapping

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
            config = space.complete(Config.of(record.config))
        except InvalidInput:
            continue  # not a flat config (a MetaSchedule trace): not for this space
        if space.contains(config) and config not in configs:
            configs.append(config)
        if len(configs) == limit:
            break
    return configs


FAILED_FACTOR = 10.0  # a config that failed on a neighbour scores as 10x its slowest success


def neighbour_prior(
    client: Client, key: Key, space: SearchSpace, *, records: int = 4
) -> dict[Config, float]:
    """Scores (lower is better) of the space's configs from the trials of the ``records``
    validated winners nearest ``key``, on any device: per record, each trial's time over the
    record's best; per config, the geometric mean over the records that tried it.

    A server that cannot be reached gives no prior (logged), never an error.
    """
    try:
        found = client.list_records(kernel=key.kernel, backend=key.backend, dtype=key.dtype,
                                    winners_only=True, limit=200).items  # fmt: skip
        digest, wanted = key.digest(), key.to_json()
        nearest = sorted(
            (r for r in found if r.key_hash != digest),
            key=lambda r: closeness(wanted, r.key.model_dump(mode="json", by_alias=True)),
        )[:records]
        full = [client.get_record(r.id) for r in nearest]
    except ServerError as exc:
        logger.warning("no prior from the cache: %s", exc)
        return {}
    runs = []
    for record in full:
        times: dict[Config, float | None] = {}
        for trial in record.trials:
            try:
                config = space.complete(Config.of(trial.config))
            except InvalidInput:
                continue
            if space.contains(config):
                ok = trial.status == "ok" and trial.time_ms is not None and trial.time_ms > 0
                times[config] = trial.time_ms if ok else None
        runs.append(times)
    return relative_scores(runs)


def relative_scores(runs: Iterable[Mapping[Config, float | None]]) -> dict[Config, float]:
    """Per config, the geometric mean over the runs that measured it of its time over that
    run's best; a failure (``None``) counts as :data:`FAILED_FACTOR` times the run's slowest.
    A run with no success teaches nothing and is skipped."""
    logs: dict[Config, list[float]] = {}
    for times in runs:
        measured = [t for t in times.values() if t is not None]
        if not measured:
            continue
        best, failed = min(measured), FAILED_FACTOR * max(measured) / min(measured)
        for config, ms in times.items():
            logs.setdefault(config, []).append(math.log(failed if ms is None else ms / best))
    return {config: math.exp(statistics.fmean(v)) for config, v in logs.items()}
