"""A record's figures must agree with each other before anyone is shown them as fact.

An audit uploaded, with a write token, records whose numbers contradict themselves: a 19x
speedup beside medians of 0.5 ms over 1.0 ms, a check "passed" at an error of 0.5 against a
tolerance of 0.01, ``noisy: false`` beside other processes at 1.99 cores and a spread of 33 %.
Each was stored and shown as fact (the validated one served too). Now the first two are refused
(422 naming the field), a served one the client refuses, and noise the figures show is shown
whatever the uploader says. Through a real server on loopback and the CLI.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer
from tests.factories import AUTH, CPU, make_key, make_record
from tunecache import Client, Key
from tunecache.schemas import ConditionsModel, RecordCreate, TimingModel
from tunecache.strict import SERVED

REPO = Path(__file__).resolve().parents[1]


def body(record: RecordCreate) -> dict[str, Any]:
    return record.model_dump(mode="json", by_alias=True)


def upload(server: LiveServer, data: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/records", json=data, headers=AUTH, timeout=30)


def with_eager(data: dict[str, Any], winner_ms: float, eager_ms: float, speedup: float) -> None:
    """``data``'s winner at ``winner_ms`` and a torch eager baseline at ``eager_ms``, both with
    spreads wide enough to hold ``speedup`` in the min/max bound, compared over five rounds."""
    spread = {"min_ms": 0.05, "max_ms": 20.0, "iqr_ms": 0.0, "repeats": 20}
    data["timing"] = {"median_ms": winner_ms, **spread}
    data["baselines"] = [{"name": "torch_eager", "timing": {"median_ms": eager_ms, **spread},
                          "speedup": {"median": speedup, "low": speedup * 0.95,
                                      "high": speedup * 1.05, "rounds": 5}}]  # fmt: skip


def test_a_speedup_far_from_its_medians_ratio_is_refused_and_one_near_it_stored(
    server: LiveServer,
) -> None:
    refused = body(make_record(make_key(m=64)))
    with_eager(refused, winner_ms=1.0, eager_ms=0.5, speedup=19.0)  # the audit's: 0.5x shown 19x
    answer = upload(server, refused)
    assert answer.status_code == 422, answer.text
    assert "baselines" in answer.text and "median time (0.5 ms) over the winner's (1 ms)" in (
        answer.text
    )
    slower = body(make_record(make_key(m=65)))
    with_eager(slower, winner_ms=0.009, eager_ms=0.0045, speedup=3.0)  # `best` showed both
    assert upload(server, slower).status_code == 422

    stored = body(make_record(make_key(m=66)))
    with_eager(stored, winner_ms=1.0, eager_ms=1.5, speedup=1.4)  # a median of ratios: near
    answer = upload(server, stored)
    assert answer.status_code == 201, answer.text


def passed_at(data: dict[str, Any], error: float, check_tolerance: float,
              tolerance: float) -> dict[str, Any]:  # fmt: skip
    validation = data["validation"]
    validation["checks"][0].update(rel_error=error, tolerance=check_tolerance, passed=True)
    validation.update(max_rel_error=error, tolerance=tolerance, passed=True)
    return data


def test_a_check_passed_over_its_tolerance_is_refused(server: LiveServer) -> None:
    over = passed_at(body(make_record(make_key(m=67))), 0.5, 0.01, 0.01)
    answer = upload(server, over)
    assert answer.status_code == 422, answer.text
    assert "validation.checks[0] passed with relative error 0.5 over its tolerance 0.01" in (
        answer.text
    )
    # Checks within their own tolerance, the report's tighter than their error.
    loose = passed_at(body(make_record(make_key(m=68))), 0.9, 1.0, 0.001)
    answer = upload(server, loose)
    assert answer.status_code == 422 and "max_rel_error 0.9 over its tolerance 0.001" in (
        answer.text
    ), answer.text
    within = passed_at(body(make_record(make_key(m=69))), 0.009, 0.01, 0.01)
    assert upload(server, within).status_code == 201


def test_a_served_record_whose_figures_say_it_failed_is_not_used(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A server (or what sits before it) answers with one, or stored it before the check."""
    key = make_key(m=64)
    data = passed_at(body(make_record(key)), 0.5, 1e-4, 1e-4)
    answer = {"record": {**data, "id": 7, "key_hash": "0" * 64,
                         "created_at": "2026-01-01T00:00:00Z"}}  # fmt: skip

    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=answer)

    default = {"schedule": "knobs", "tile_i": 99, "tile_j": 8}
    with Client("http://hostile.test", transport=httpx.MockTransport(handle), token="") as client:
        result = client.lookup(key, default=default)
    assert (result.source, result.config) == ("default", default)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("record #7" in w and "its figures say it failed" in w for w in warned), warned
    # The answer itself is well-formed: only the check above refused it.
    from tunecache.schemas import LookupResponse

    LookupResponse.model_validate(answer, context=SERVED)


def quiet_said(others_cpu: float, spread: float) -> TimingModel:
    """A timing whose uploader said it was not noisy, with these conditions and spread."""
    return TimingModel(median_ms=1.0, min_ms=0.8, max_ms=1.6, iqr_ms=spread, repeats=20,
                       noisy=False, conditions=ConditionsModel(others_cpu=others_cpu,
                                                               cpu_mhz_before=2600.0,
                                                               cpu_mhz_after=2600.0))  # fmt: skip


def cli(server: LiveServer, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tunecache_cli", *args, "--server", server.url],
                          capture_output=True, text=True, timeout=300, cwd=REPO,
                          env=dict(os.environ))  # fmt: skip


def test_noise_its_figures_show_is_shown_whatever_its_uploader_said(server: LiveServer) -> None:
    key = make_key(m=70)
    record = make_record(key).model_copy(update={"timing": quiet_said(1.99, 0.33)})
    with Client(server.url) as client:
        stored = client.get_record(client.upload(record).record_id)
    assert not stored.timing.noisy  # as uploaded
    assert stored.noisy and stored.noise()[:2] == [
        "winner: spread 33% of the median",
        "winner: other processes used 2.0 cores",
    ]
    shown = cli(server, "records", "show", str(stored.id))
    assert shown.returncode == 0, shown.stderr
    assert "noisy: winner: spread 33% of the median; winner: other processes used 2.0 cores" in (
        shown.stdout
    ), shown.stdout
    page = httpx.get(f"{server.url}/ui/records/{stored.id}").text
    assert 'class="badge bad noisy"' in page and "other processes used 2.0 cores" in page

    # On a GPU other processes' CPU use is no noise (the GPU timed it); a narrow spread none.
    gpu: Key = dataclasses.replace(key, device=dataclasses.replace(CPU, kind="cuda"))
    quiet = make_record(gpu).model_copy(update={"timing": quiet_said(1.99, 0.02)})
    assert quiet.noise() == [] and not quiet.noisy
    assert make_record(key).model_copy(update={"timing": quiet_said(1.99, 0.02)}).noisy


def said_noise(others_cpu: float, spread: float, *reasons: str) -> RecordCreate:
    """A record whose timing's measurer gave ``reasons``, beside these figures."""
    timing = quiet_said(others_cpu, spread).model_copy(update={"noisy": True})
    assert timing.conditions is not None
    said = timing.conditions.model_copy(update={"noise": list(reasons)})
    return make_record(make_key()).model_copy(
        update={"timing": timing.model_copy(update={"conditions": said})}
    )


def test_a_reason_its_figures_give_is_said_once_in_their_words() -> None:
    """Named once: the measurer saw 1.4539 cores ("1.5"), stored 1.45 reads "1.4"; and a stated
    figure hides none its figures show (a review: "spread 1%" hid a spread of 50 %)."""
    assert said_noise(1.45, 0.02, "other processes used 1.5 cores").noise() == [
        "winner: other processes used 1.4 cores"
    ]
    lying = said_noise(1.99, 0.5, "spread 1% of the median", "other processes used 0.0 cores")
    assert lying.noise() == ["winner: spread 50% of the median",
                             "winner: other processes used 2.0 cores"]  # fmt: skip
    # A reason its figures cannot give (disturbed samples) is said as its measurer said it.
    kept = said_noise(0.1, 0.02, "60% of samples disturbed")
    assert kept.noise() == ["winner: 60% of samples disturbed"]


def test_a_search_that_could_not_have_run_what_it_claims_is_refused(server: LiveServer) -> None:
    """10,000 rounds of 1 ms or more in a tune of 0.001 s."""
    rushed = body(make_record(make_key(m=71)))
    with_eager(rushed, winner_ms=1.0, eager_ms=1.5, speedup=1.5)
    rushed["timing"]["min_ms"] = rushed["baselines"][0]["timing"]["min_ms"] = 1.0
    rushed["baselines"][0]["speedup"]["rounds"] = 10_000
    rushed["search"]["seconds"] = 0.001
    answer = upload(server, rushed)
    assert answer.status_code == 422, answer.text
    assert "10000 interleaved rounds take at least 10 s, more than search.seconds 0.001" in (
        answer.text
    )
    rushed["search"]["seconds"] = 20.0  # time enough for them
    assert upload(server, rushed).status_code == 201


def test_a_clock_change_within_its_rounding_is_no_noise() -> None:
    """1000.49 to 1100.53 MHz is no 10 % change; stored to the MHz, 1000 to 1101 read as one."""
    from tunecache import conditions

    real = conditions.Reading(0.1, (1000.49, 1100.53), None, (), None)
    assert conditions.noise(real, spread=0.02, disturbed=0.0, cuda=False) == []
    stored = ConditionsModel(others_cpu=0.1, cpu_mhz_before=1000.0, cpu_mhz_after=1101.0)
    timing = TimingModel(median_ms=1.0, min_ms=0.9, max_ms=1.1, iqr_ms=0.02, repeats=20,
                         conditions=stored)  # fmt: skip
    assert timing.figures_noise(cuda=False) == []
    changed = stored.model_copy(update={"cpu_mhz_after": 1102.0})  # past it, rounding and all
    assert timing.model_copy(update={"conditions": changed}).figures_noise(cuda=False) == [
        "CPU clock 1000->1102 MHz"
    ]


def test_a_negative_zero_is_stored_and_shown_as_zero(server: LiveServer) -> None:
    """-0.0 passes ``ge=0``: a record read "max rel error -0.00e+00" and "tuned in -0.0 s"."""
    data = body(make_record(make_key(m=71)))
    data["validation"]["max_rel_error"] = -0.0
    data["validation"]["checks"][0]["rel_error"] = -0.0
    data["search"]["seconds"] = -0.0
    data["timing"]["iqr_ms"] = -0.0
    answer = upload(server, data)
    assert answer.status_code == 201, answer.text
    record_id = answer.json()["record_id"]
    shown = cli(server, "records", "show", str(record_id))
    assert shown.returncode == 0, shown.stderr
    assert "max rel error 0.00e+00" in shown.stdout and "tuned in 0.0 s" in shown.stdout
    assert "-0.0" not in shown.stdout, shown.stdout
    stored = httpx.get(f"{server.url}/v1/records/{record_id}", headers=AUTH, timeout=30).text
    assert "-0.0" not in stored, stored
