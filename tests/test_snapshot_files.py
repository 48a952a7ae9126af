"""A snapshot path that is not a regular file (a FIFO, a device, a directory) is refused at
once with one warning, never waited on; a symlink to a snapshot still answers."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.factories import knobs, make_key, make_record
from tunecache import InvalidInput, Resolver, SnapshotSource
from tunecache.lookup import LookupResult
from tunecache.snapshot import SnapshotFilters, load_snapshot, render_snapshot, save_snapshot

DEFAULT = {"schedule": "default"}
ARCH = "cpu-avx2"  # tests.factories.CPU's
WITHIN_S = 5.0  # far past what refusing takes; a blocked read never returns


def lookups_within(path: Path, count: int = 3) -> list[LookupResult]:
    """``count`` lookups through a snapshot at ``path``, failing the test should they not all
    return within ``WITHIN_S`` (the thread is left behind, blocked)."""
    results: list[LookupResult] = []

    def look() -> None:
        resolver = Resolver([SnapshotSource(path)])
        results.extend(resolver.resolve(make_key(), default=DEFAULT) for _ in range(count))

    thread = threading.Thread(target=look, daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(WITHIN_S)
    assert not thread.is_alive(), f"the lookup blocked on {path} for {WITHIN_S} s"
    assert time.monotonic() - started < WITHIN_S
    return results


def snapshot_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.WARNING and "snapshot" in r.getMessage()]  # fmt: skip


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_refused_at_once_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """It blocked the first lookup until the process was killed (no writer ever came)."""
    fifo = tmp_path / "winners.json"
    os.mkfifo(fifo)
    try:
        with caplog.at_level(logging.WARNING):
            results = lookups_within(fifo)
    finally:  # a reader blocked in open() (before the fix) is let go
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert [(r.source, r.config) for r in results] == [("default", DEFAULT)] * 3
    (warning,) = snapshot_warnings(caplog)
    assert str(fifo) in warning and "not a regular file (a FIFO)" in warning


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero here")
def test_a_device_is_refused_without_reading_it(caplog: pytest.LogCaptureFixture) -> None:
    """``/dev/zero`` was read to the 256 MiB bound (0.4 s, 310 MB) before it was refused."""
    with caplog.at_level(logging.WARNING):
        results = lookups_within(Path("/dev/zero"))
    assert [r.source for r in results] == ["default"] * 3
    (warning,) = snapshot_warnings(caplog)
    assert "not a regular file (a character device)" in warning
    with pytest.raises(InvalidInput, match="not a regular file"):
        load_snapshot(Path("/dev/zero"))


def test_a_directory_is_refused_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        results = lookups_within(tmp_path)
    assert [r.source for r in results] == ["default"] * 3
    assert len(snapshot_warnings(caplog)) == 1


@pytest.mark.skipif(sys.platform == "win32", reason="symlinks need privileges there")
def test_a_symlink_to_a_snapshot_still_answers(tmp_path: Path) -> None:
    key = make_key()
    body, _ = render_snapshot(SnapshotFilters(device_arch=ARCH),
                              [make_record(key, config=knobs(5))])  # fmt: skip
    target = tmp_path / "real" / "winners.json"
    save_snapshot(target, json.loads(body))
    link = tmp_path / "winners.json"
    link.symlink_to(target)
    (found,) = lookups_within(link, count=1)
    assert (found.source, found.config) == ("snapshot", knobs(5))
    assert load_snapshot(link).records[0].config == knobs(5)
