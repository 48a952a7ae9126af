"""A record's display claims only what was measured as it says: a verifier re-times the config,
never the baselines, so a verified record's speedups are marked as its uploader's (and not
believed where the two times disagree past the flag ratio, either way); the noise shown is the
shown timing's (the verifier's); a ratio of two medians says it has no spread; an upload naming
a baseline twice is refused."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer
from tests.factories import AUTH, CPU, knobs, make_key, make_record
from tests.test_trust import token
from tunecache import Client
from tunecache.measured import BaselineModel, ConditionsModel, Speedup, TimingModel
from tunecache.schemas import STORED, RecordCreate, RecordPublic, VerificationPublic
from tunecache.timing import versus
from tunecache.verification import VerificationCreate
from tunecache_cli.get import describe

REPO = Path(__file__).resolve().parents[1]
NOTE = "(the uploader's measurements, not re-timed by the verifier)"
BUSY = "other processes used 1.90 cores"


def noisy(ms: float) -> TimingModel:
    return TimingModel(median_ms=ms, min_ms=ms, max_ms=ms * 1.5, iqr_ms=ms * 0.3, repeats=20,
                       noisy=True, conditions=ConditionsModel(others_cpu=1.9, noise=[BUSY]))  # fmt: skip


def claimed(ms: float = 0.0766) -> RecordCreate:
    """The audit's upload: 500x faster than torch eager (495-505x, 10 interleaved rounds)."""
    record = make_record(make_key(m=64), time_ms=ms, config=knobs(1))
    (eager,) = record.baselines
    ratio = Speedup(median=500.0, low=495.0, high=505.0, rounds=10)
    return record.model_copy(update={"baselines": [eager.model_copy(update={"speedup": ratio})]})


def verified(record: RecordCreate, timing: TimingModel, device: str = "v") -> RecordPublic:
    """``record`` as a server returns it once a verifier passed it, timed at ``timing`` on
    ``device`` (by name)."""
    check = VerificationPublic(passed=True, verifier="verifier-1", device_name=device,
                               verified_at=datetime.now(UTC), timing=timing,
                               time_ratio=timing.median_ms / record.timing.median_ms)  # fmt: skip
    return RecordPublic.model_validate({**record.model_dump(), "id": 1, "key_hash": "0" * 64,
                                        "created_at": datetime.now(UTC), "status": "verified",
                                        "verification": check.model_dump()})  # fmt: skip


def test_a_verifiers_time_beside_the_uploaders_speedups_says_whose_they_are() -> None:
    """``get`` printed "time 0.0766 ms (..., the verifier)" over "500.00x faster than torch
    eager (495.00-505.00x)", as if the verifier had measured the speedup too."""
    record = verified(claimed(), claimed(0.08).timing)  # the verifier agrees on the time
    assert (
        versus(record, than="torch eager")
        == f"500.00x faster than torch eager (495.00-505.00x) {NOTE}"
    )
    assert f"500.00x faster than torch eager (495.00-505.00x) {NOTE}" in describe(record)
    assert NOTE not in versus(claimed(), than="torch eager")  # the uploader's own, unverified


@pytest.mark.parametrize("verifier_ms", [0.0766 * 13, 0.0766 / 13])
def test_speedups_are_not_believed_when_the_times_disagree_either_way(verifier_ms: float) -> None:
    """Only an uploader over 20 % faster than the verifier lost its speedups: one 13x slower
    than the verifier measured on its very device kept its ratio to eager. On another device
    of the arch, a faster verifier's time leaves the uploader's own comparison, marked so."""
    uploader = claimed()
    record = verified(uploader, claimed(verifier_ms).timing, uploader.key.device.name)
    assert record.comparisons() == [] and record.speedup() is None
    assert versus(record) == "-" and "500.00x" not in describe(record)
    elsewhere = verified(uploader, claimed(0.0766 / 13).timing, "a faster device of the arch")
    assert versus(elsewhere, than="torch eager").endswith(NOTE)


def test_the_verifiers_noise_is_the_noise_shown() -> None:
    """A verifier's noisy timing, the one shown and ranked, read as clean: ``noise()`` read
    only the uploader's timing."""
    record = verified(claimed(), noisy(0.08))
    assert record.noisy and record.noise() == [f"verifier: {BUSY}"]
    assert f"timing     noisy: verifier: {BUSY}" in describe(record)
    quiet = verified(claimed().model_copy(update={"timing": noisy(0.0766)}), claimed(0.08).timing)
    assert not quiet.noisy  # the uploader's noisy time is not the one shown


def test_a_ratio_of_two_medians_says_it_has_no_spread() -> None:
    """A Triton drop-in record's "4.60x faster than the default config" had no interval and no
    note; the default config as the winner itself is the same measurement, no ratio."""
    record = make_record(make_key(m=64), time_ms=1.0)
    default = BaselineModel(name="default_config", timing=make_record(time_ms=4.6).timing)
    record = record.model_copy(update={"baselines": [default]})
    assert versus(record, "default_config", than="the default config") == (
        "4.60x faster than the default config (medians timed apart, no spread)"
    )
    itself = record.model_copy(update={"baselines": [default.model_copy(
        update={"timing": record.timing})]})  # fmt: skip
    assert versus(itself, "default_config") == "1.00x (the same)"


def test_a_baseline_named_twice_is_refused_and_never_shown(server: LiveServer) -> None:
    """The dashboard showed two torch_eager rows, one a false 1000x."""
    record = make_record(make_key(m=64), time_ms=1.0)
    fake = BaselineModel(name="torch_eager", timing=make_record(time_ms=1000.0).timing)
    body: dict[str, Any] = record.model_dump(mode="json", by_alias=True)
    body["baselines"].append(fake.model_dump(mode="json"))
    answer = httpx.post(f"{server.url}/v1/records", json=body, headers=AUTH, timeout=30)
    assert answer.status_code == 422, answer.text
    assert ["body", "baselines"] in [e["loc"][:2] for e in answer.json()["errors"]]
    assert "torch_eager" in answer.text
    stored = RecordPublic.model_validate({**body, "id": 1, "key_hash": "0" * 64,
                                          "created_at": datetime.now(UTC)}, context=STORED)  # fmt: skip
    assert stored.comparisons() == [] and versus(stored) == "-"  # one stored before: neither


def test_records_show_marks_a_verified_records_speedup_and_noise(server: LiveServer) -> None:
    """The audit's reproduction on a live server: ``records show`` of a verified record."""
    url = server.url
    with Client(url) as client:
        uploaded = client.upload(claimed())
    with Client(url, token=token(url, "verifier-1", "verify")) as client:
        task = client.claim_verification("v1", device_arch=CPU.arch, backends=["tvm"])
        assert task is not None and task.record.id == uploaded.record_id
        finding = VerificationCreate(worker="v1", outcome="passed", device_name="v",
                                     timing=noisy(0.08), validation=claimed().validation)  # fmt: skip
        assert client.submit_verification(uploaded.record_id, finding).status == "verified"
    shown = subprocess.run(
        [sys.executable, "-m", "tunecache_cli", "records", "show", str(uploaded.record_id),
         "--server", url],
        capture_output=True, text=True, timeout=120, cwd=REPO, env=dict(os.environ),
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert f"(495.00-505.00x) {NOTE}" in shown.stdout
    assert f"noisy: verifier: {BUSY}" in shown.stdout
    html = httpx.get(f"{url}/ui/records/{uploaded.record_id}", timeout=30).text
    assert "not re-timed by the verifier" in html and f"verifier: {BUSY}" in html
