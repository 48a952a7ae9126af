"""Metrics when several worker processes serve one port: prometheus_client's multiprocess mode.

``tunecache serve --workers N`` (N > 1) runs N uvicorn worker processes, and a scrape reaches one
of them. So that every scrape sees the whole server, :func:`worker_metrics_dir` sets
``PROMETHEUS_MULTIPROC_DIR`` before uvicorn spawns the workers. prometheus_client picks its value
class when it is first imported, from that variable: in each (freshly spawned) worker, counters
and histograms then live in memory-mapped files of that worker in the directory, and
:func:`generate_latest` sums every worker's files at scrape time.

A worker that died, and the worker uvicorn started in its place, leave their files behind, and
their counts stay in the sums: counters never go down, as Prometheus expects of them (so nothing
here calls ``prometheus_client.multiprocess.mark_process_dead``, which only matters for "live"
gauges, and we have none in files). Gauges read from the database at scrape time never go
through the files: the answering worker adds them once.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

from prometheus_client import CollectorRegistry, values
from prometheus_client import generate_latest as _generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from cache_server.settings import PROMETHEUS_DIR_ENV, prometheus_dir, set_prometheus_dir

ENV: Final = PROMETHEUS_DIR_ENV


def multiprocess_dir() -> str | None:
    """The directory this process's counters and histograms are written to, or ``None`` when
    they live in memory (the variable was not set when prometheus_client was imported)."""
    if not getattr(values.ValueClass, "_multiprocess", False):
        return None
    return prometheus_dir()


def generate_latest(path: str, *collectors: Collector) -> bytes:
    """Every worker's counters and histograms in ``path``, summed, then ``collectors`` (read
    by this process alone), in the Prometheus text format."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=path)
    for collector in collectors:
        registry.register(collector)
    return _generate_latest(registry)


@contextmanager
def worker_metrics_dir() -> Iterator[str]:
    """Sets ``PROMETHEUS_MULTIPROC_DIR`` for worker processes started in the block: a fresh
    private directory, removed (with the workers' files) at the end of the block (a process
    killed outright leaves it in the temporary directory).

    When the variable is already set, that directory is used as it is and left in place: its
    owner must empty it between runs of the server, or old counts add to the new ones.

    Raises:
        NotADirectoryError: The variable names no directory.
    """
    if (given := user_metrics_dir()) is not None:
        yield given
        return
    path = tempfile.mkdtemp(prefix="tunecache-metrics-")
    set_prometheus_dir(path)
    try:
        yield path
    finally:
        set_prometheus_dir(None)
        shutil.rmtree(path, ignore_errors=True)


def user_metrics_dir() -> str | None:
    """The user's ``PROMETHEUS_MULTIPROC_DIR``, checked, or ``None`` when unset.

    Raises:
        NotADirectoryError: The variable names no directory.
    """
    given = prometheus_dir()
    if given is not None and not os.path.isdir(given):
        raise NotADirectoryError(f"{ENV}={given!r} is not a directory")
    return given
