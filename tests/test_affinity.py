"""Keeping a timed call's threads apart (:mod:`tunecache.affinity`), on this machine's real
threads: where each may run inside the block, and that every one gets its mask back."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from tunecache import affinity

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2,
    reason="per-thread affinity through /proc, on two cores or more",
)


def _parked() -> tuple[threading.Thread, threading.Event, list[int]]:
    stop, ids = threading.Event(), []

    def park() -> None:
        ids.append(threading.get_native_id())
        stop.wait(30)

    thread = threading.Thread(target=park, daemon=True)
    thread.start()
    while not ids:
        pass
    return thread, stop, ids


def test_the_timing_thread_keeps_its_core_and_the_others_get_the_rest() -> None:
    cores = set(os.sched_getaffinity(0))
    helper, stop, ids = _parked()
    try:
        with affinity.apart() as here:
            assert here in cores
            assert os.sched_getaffinity(0) == {here}
            assert os.sched_getaffinity(ids[0]) == cores - {here}
            late, late_stop, late_ids = _parked()  # started inside: the timing thread's mask
            assert os.sched_getaffinity(late_ids[0]) == {here}
        assert os.sched_getaffinity(0) == cores
        assert os.sched_getaffinity(ids[0]) == cores
        assert os.sched_getaffinity(late_ids[0]) == cores  # unknown before: the caller's own
        late_stop.set()
        late.join()
    finally:
        stop.set()
        helper.join()


def test_a_thread_with_its_own_mask_gets_it_back() -> None:
    cores = sorted(os.sched_getaffinity(0))
    helper, stop, ids = _parked()
    try:
        os.sched_setaffinity(ids[0], {cores[-1]})
        with affinity.apart():
            pass
        assert os.sched_getaffinity(ids[0]) == {cores[-1]}
    finally:
        stop.set()
        helper.join()
