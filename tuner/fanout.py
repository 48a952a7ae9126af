"""Fan-out on Ray: the queue drained by daemons running as Ray tasks on a cluster.

Each task is a :class:`~tuner.daemon.Daemon` with ``once=True`` on one device of whatever node
Ray puts it on: it claims the jobs that node can run, tunes, uploads and completes them like any
daemon, so the server's queue still guarantees each key is tuned once, and Ray tasks and daemons
can drain one queue together. GPU tasks ask Ray for ``num_gpus=1`` (one per GPU of the
cluster), CPU tasks for one CPU each.

Example:
    >>> drain_on_ray("http://cache:8765", token, address="auto")  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
from typing import Any

logger = logging.getLogger(__name__)


def _drain(url: str, token: str | None, device: str, options: Any) -> list[int]:
    """One task: a daemon on this node's ``device`` until the queue has nothing it can run."""
    from dataclasses import replace

    from tunecache.client import Client
    from tunecache.errors import InvalidInput
    from tuner.daemon import Daemon

    with Client(url, token=token or "") as client:
        try:
            daemon = Daemon(client, replace(options, device=device))
            daemon.run()
        except InvalidInput as exc:  # nothing this node can run on that device, or a package
            logger.warning("ray task on %s: not tuning here: %s", device, exc)  # it lacks
            return []
    return daemon.done


def drain_on_ray(url: str, token: str | None, *, address: str | None = None,
                 trials: int = 32, cpu_tasks: int | None = None, kernels: tuple[str, ...] = (),
                 key_hashes: tuple[str, ...] | None = None,
                 max_trials: int = 1024) -> list[int]:  # fmt: skip
    """Drains the server's queue with daemons as Ray tasks; returns the record ids stored.

    Args:
        address: an existing Ray cluster (``ray://…`` or ``auto``); ``None`` starts a local one.
        cpu_tasks: CPU daemons to run (default: the cluster's CPUs); GPU daemons: one per GPU.
        kernels, key_hashes, trials, max_trials: as the daemons'
            (:class:`tuner.daemon.DaemonOptions`).
    """
    import ray

    from tuner.daemon import DaemonOptions

    options = DaemonOptions(once=True, trials=trials, max_trials=max_trials, workers=1,
                            kernels=kernels, key_hashes=key_hashes)  # fmt: skip

    # The tasks import the caller's kernels ("package.module:Class") from its directory too.
    runtime_env: dict[str, Any] = {"env_vars": {"PYTHONPATH": os.getcwd()}}
    ray.init(address=address, runtime_env=runtime_env, include_dashboard=False,
             log_to_driver=False, ignore_reinit_error=True)  # fmt: skip
    try:
        resources = ray.cluster_resources()
        task = ray.remote(_drain)
        cpus = cpu_tasks or max(1, int(resources.get("CPU", 1)))
        refs = [task.options(num_cpus=1).remote(url, token, "cpu", options) for _ in range(cpus)]
        gpus = int(resources.get("GPU", 0))
        refs += [task.options(num_gpus=1).remote(url, token, "cuda", options) for _ in range(gpus)]
        stored: list[int] = []
        for done in ray.get(refs):
            stored += done
        return stored
    finally:
        ray.shutdown()
