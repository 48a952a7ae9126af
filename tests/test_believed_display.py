"""A record's display claims only what was measured as it says: a verifier re-times the config,
never the baselines, so a verified record's speedups are marked as its uploader's (and not
believed where the two times disagree past the flag ratio, either way); the noise shown is the
shown timing's (the verifier's); a ratio of two medians says it has no spread; an upload naming
a baseline twice is refused."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer
from tests.factories import AUTH, CPU, knobs, make_key, make_record, timing
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
    eager = eager.model_copy(update={"timing": timing(ms * 500), "speedup": ratio})
    return record.model_copy(update={"baselines": [eager]})


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
    # What the verifier said (in its figures' words: 1.9 cores), then what its figures say and
    # it did not: a spread of 30 %.
    said = ["verifier: other processes used 1.9 cores", "verifier: spread 30% of the median"]
    assert record.noisy and record.noise() == said
    assert f"timing     noisy: {'; '.join(said)}" in describe(record)
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
    assert "noisy: verifier: other processes used 1.9 cores" in shown.stdout
    html = httpx.get(f"{url}/ui/records/{uploaded.record_id}", timeout=30).text
    assert (
        "not re-timed by the verifier" in html
        and "verifier: other processes used 1.9 cores" in html
    )


def _visible(html: str) -> str:
    """What a reader sees of ``html`` without hovering: the text, tags (and their titles) gone,
    spaces run together."""
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


def _index_row(html: str, record_id: int) -> str:
    """The index's table row that links to record ``record_id``."""
    for row in re.findall(r"<tr class=.*?</tr>", html, flags=re.S):
        if f'/ui/records/{record_id}"' in row:
            return str(row)
    raise AssertionError(f"no row of record {record_id}")


def test_the_index_names_the_verifier_as_verifier_and_the_uploader_as_uploader(
    server: LiveServer,
) -> None:
    """The audit's t3: a verifier "ver" passed a record of the write token "mallory", timing it
    on amd-epyc-other. The index's Status cell read "verified by mallory" (the uploader shown
    as if it had verified), the real line only in a hover title, and the Device cell named the
    key's device beside a time the verifier took on another machine. Both now say it in view."""
    url = server.url
    with Client(url, token=token(url, "mallory", "write")) as client:
        uploaded = client.upload(claimed())
    with Client(url, token=token(url, "ver", "verify")) as client:
        task = client.claim_verification("vbox", device_arch=CPU.arch, backends=["tvm"])
        assert task is not None and task.record.id == uploaded.record_id
        finding = VerificationCreate(worker="vbox", outcome="passed", device_name="amd-epyc-other",
                                     timing=claimed(0.08).timing,
                                     validation=claimed().validation)  # fmt: skip
        assert client.submit_verification(uploaded.record_id, finding).status == "verified"
    html = httpx.get(f"{url}/", params={"all": "true"}, timeout=30).text
    row = _visible(_index_row(html, uploaded.record_id))
    assert "verified by mallory" not in row
    assert "verified by ver on amd-epyc-other" in row and "uploaded by mallory" in row
    assert "measured on amd-epyc-other" in row  # the time's machine, not the key's device
    page = _visible(httpx.get(f"{url}/ui/records/{uploaded.record_id}", timeout=30).text)
    assert "measured on amd-epyc-other" in page
    # A record timed on its key's own device names no other machine.
    with Client(url) as client:
        plain = client.upload(make_record(make_key(m=128), time_ms=0.5, config=knobs(2)))
    html = httpx.get(f"{url}/", params={"all": "true"}, timeout=30).text
    assert "measured on" not in _visible(_index_row(html, plain.record_id))


def _near_one(median: float, low: float, high: float, rounds: int = 5) -> RecordCreate:
    """A record whose interleaved comparison with torch eager read ``median`` (``low``-``high``)."""
    record = make_record(make_key(m=64), time_ms=1.0)
    (eager,) = record.baselines
    ratio = Speedup(median=median, low=low, high=high, rounds=rounds)
    return record.model_copy(update={"baselines": [eager.model_copy(update={"speedup": ratio})]})


def test_a_speedup_called_faster_never_reads_1_00() -> None:
    """The audit's t5: a 1.004x speedup (1.001-1.007x) read "1.00x faster (1.00-1.01x)" in
    ``get``, ``records`` and the dashboard: faster than itself, at the digits shown. A ratio
    called faster or slower is shown with the digits that tell it from 1; one whose interval
    holds 1 is still the same within noise."""
    from cache_server.dashboard.templating import vs

    faster = _near_one(1.004, 1.001, 1.007)
    assert versus(faster, than="torch eager") == "1.004x faster than torch eager (1.001-1.007x)"
    assert vs(faster, "torch_eager") == "1.004× faster (1.001-1.007×)"
    assert "1.004x faster than torch eager (1.001-1.007x)" in describe(faster)
    slower = _near_one(1 / 1.004, 1 / 1.007, 1 / 1.001)
    assert versus(slower) == "1.004x slower (1.001-1.007x)"
    same = _near_one(1.004, 0.994, 1.009)
    assert versus(same) == "the same within noise (median 1.00x, 0.99-1.01x)"
    assert versus(_near_one(2.0, 1.9, 2.1)) == "2.00x faster (1.90-2.10x)"  # as before
    apart = make_record(make_key(m=64), time_ms=1.0)  # eager's median over the winner's: 2x
    (eager,) = apart.baselines
    tiny = apart.model_copy(update={"baselines": [eager.model_copy(update={
        "timing": apart.timing.model_copy(update={"median_ms": 1.006})})]})  # fmt: skip
    assert versus(tiny).startswith("1.01x faster")  # no more digits than it takes


def test_the_confidence_of_an_interval_is_what_its_rounds_give() -> None:
    """The distribution-free interval of the median of 5 rounds is their whole range, which
    holds the median 93.8 % of the time, not 95 % (tunecache.interleave.median_interval)."""
    from tunecache import believed
    from tunecache.interleave import median_interval

    for n in range(1, 40):
        low, _ = median_interval(list(range(n)))
        below = sum(math.comb(n, i) for i in range(low + 1)) / 2**n  # P(Binomial(n, 1/2) < k)
        assert believed.coverage(n) == pytest.approx(1 - 2 * below), n
    assert believed.coverage(5) == pytest.approx(0.9375)
    assert believed.interval_label(5) == "93.8 % interval (the whole range of 5 rounds)"
    assert believed.interval_label(15) == "95 % interval"
    assert believed.interval_label(6) == "95 % interval"  # 96.9 %: at least 95
