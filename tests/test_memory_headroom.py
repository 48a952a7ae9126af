"""A shape is measured against a CPU's memory less headroom, not all of it.

A matmul needing 22.6 GiB on a 23.5 GiB box was claimed and tuned until memory ran out. The
decision is tested with stated figures and a shape near this machine's total; nothing big is
allocated (reaching the tune fails the test). Against the total, not what is free at a moment: a
daemon fails a job it refuses, and a moment of someone else's use spent all its attempts.
"""

from __future__ import annotations

import importlib
import math
import os
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.factories import claimed_job, make_record
from tunecache import key_for
from tunecache.errors import InvalidInput, ServerError
from tunecache.key import Key
from tunecache.schemas import RecordPublic
from tunecache.strict import SERVED
from tunecache.verification import VerifyTask
from workloads import get_workload

GIB = 2**30


def total_ram() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def near_total_shape() -> dict[str, int]:
    """A square matmul whose inputs and output need about 90% of this machine's total memory."""
    side = math.isqrt(int(0.9 * total_ram()) // 36)  # 3 float32 arrays, each also in float64
    shape = {"M": side, "N": side, "K": side}
    assert 0.8 * total_ram() < get_workload("matmul").memory_needed(shape, "float32") < total_ram()
    return shape


def test_a_need_under_the_total_but_over_its_headroom_is_refused_naming_both() -> None:
    from tuner.tune import MEMORY_HEADROOM, memory_problem

    why = memory_problem(int(22.6 * GIB), int(23.5 * GIB), "cpu")
    assert why is not None
    assert "need 22.6 GiB" in why and "has 23.5 GiB" in why and "at most 80 %, 18.8 GiB" in why
    assert 0 < MEMORY_HEADROOM < 1
    assert memory_problem(10 * GIB, int(23.5 * GIB), "cpu") is None
    assert memory_problem(10 * GIB, 0, "cpu") is None  # unknown: not refused here
    # A GPU's memory is the tune's own: 70 of 80 GiB fits, 90 does not.
    assert memory_problem(70 * GIB, 80 * GIB, "cuda") is None
    assert memory_problem(90 * GIB, 80 * GIB, "cuda") == (
        "its inputs and output need 90 GiB; this cuda device has 80 GiB: a smaller shape"
    )


def test_check_memory_refuses_a_shape_near_the_total() -> None:
    from tuner.tune import check_memory

    with pytest.raises(InvalidInput, match="of which a tune uses at most"):
        check_memory(key_for("matmul", "tvm", near_total_shape(), "float32"))


class NoRun:
    """Stands for what would run the kernel: reaching it fails the test, never allocating."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the shape was run ({name})")


def test_a_daemon_fails_a_job_over_its_memory_and_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The job fails, saying why, before any tune; the daemon is not stopped."""
    tune_module = importlib.import_module("tuner.tune")  # the package's ``tune`` is the function

    # Past the checks the search would start: reaching it fails the test, never allocating.
    def started(*args: Any) -> Any:
        raise AssertionError("the tune started")

    monkeypatch.setattr(tune_module, "_emitter", started)
    from tuner.daemon import Daemon, DaemonOptions

    key = key_for("matmul", "tvm", near_total_shape(), "float32")
    job = claimed_job(key)

    class Server:  # what the daemon asks of its client, at a boundary we own
        url = "http://127.0.0.1:9"

        def __init__(self) -> None:
            self.failed: list[tuple[int, str]] = []

        def list_records(self, **query: Any) -> Any:
            raise ServerError("not asked here")

        def fail_job(self, job_id: int, worker: str, error: str) -> None:
            self.failed.append((job_id, error))

    server = Server()
    daemon = Daemon(server, DaemonOptions(backends=("tvm",)))  # type: ignore[arg-type]
    assert daemon.work(job, harness=NoRun()) is False  # type: ignore[arg-type]
    assert daemon.failed == [7] and len(server.failed) == 1
    assert "of which a tune uses at most" in server.failed[0][1]


def _leased(key: Key) -> VerifyTask:
    body = make_record(key, config={"schedule": "default"}).model_dump(mode="json", by_alias=True)
    stored = {**body, "id": 7, "key_hash": "0" * 64, "created_at": "2026-01-01T00:00:00Z"}
    return VerifyTask(record=RecordPublic.model_validate(stored, context=SERVED),
                      lease_expires_at=datetime.now(UTC))  # fmt: skip


def test_a_verifier_gives_back_a_record_over_its_memory() -> None:
    from tunecache import Client
    from tuner.verify import Verifier, VerifierOptions

    key = key_for("matmul", "tvm", near_total_shape(), "float32")
    with Client("http://127.0.0.1:9") as client:
        verifier = Verifier(client, VerifierOptions(backends=("tvm",)))
        finding = verifier.finding(_leased(key), NoRun())  # type: ignore[arg-type]
    assert finding.outcome == "unverifiable", finding
    assert finding.error is not None and "of which a tune uses at most" in finding.error
