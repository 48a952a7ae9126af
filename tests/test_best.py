"""``best``: the fastest validated backend of a kernel × problem × dtype, on a real server."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import LiveServer
from tests.factories import CPU, issue_token, make_record
from tunecache import key_for
from tunecache.best import best_backend
from tunecache.client import Client
from tunecache.device import DeviceFingerprint
from tunecache.errors import InvalidInput
from tunecache.key import Key
from tunecache.lookup import LookupResult
from tunecache.measured import BaselineModel, Speedup
from tunecache.schemas import RecordCreate, RecordPublic

REPO = Path(__file__).resolve().parents[1]
PROBLEM = {"M": 64, "N": 48, "K": 32}
SHAPE = "M=64,N=48,K=32"
# Triton keys name the CPU here (conftest runs Triton in its interpreter without a GPU), so the
# three backends' records are timed on one device and compare.
TIMES = {"tvm": 2.0, "inductor": 1.0, "triton": 3.0}


def cli(server: LiveServer, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tunecache_cli", *args, "--server", server.url],
        capture_output=True, text=True, timeout=300, cwd=REPO, env=dict(os.environ),
    )  # fmt: skip


def upload(server: LiveServer, key: Key, time_ms: float, *, passed: bool = True) -> None:
    with Client(server.url) as client:
        client.upload(make_record(key, time_ms=time_ms, passed=passed))


@pytest.fixture
def three(server: LiveServer) -> LiveServer:
    """A server holding a validated matmul record of each backend, inductor the fastest."""
    for backend, ms in TIMES.items():
        upload(server, key_for("matmul", backend, PROBLEM, "float32"), ms)
    return server


def test_the_fastest_validated_backend_wins_with_the_others_beside_it(three: LiveServer) -> None:
    # A faster record that failed validation is never served, so it cannot win.
    upload(three, key_for("matmul", "triton", PROBLEM, "float32"), 0.1, passed=False)
    with Client(three.url) as client:
        answer = client.resolver.best("matmul", PROBLEM, "float32")
    assert answer.backend == "inductor"
    assert [(a.backend, a.time_ms) for a in answer.answers] == sorted(
        TIMES.items(), key=lambda item: item[1]
    )
    assert answer.comparable and answer.note.startswith("all timed on")
    assert {a.result.rule for a in answer.answers if a.result} == {"exact"}

    shown = cli(three, "best", "matmul", "--shape", SHAPE)
    assert shown.returncode == 0, shown.stderr
    first = shown.stdout.splitlines()[0]
    assert "fastest is inductor (1 ms, pending: its uploader's claim, not verified), 2.00x faster "\
        "than tvm (medians timed apart)" in first  # fmt: skip
    assert table_row(shown.stdout, "inductor")[2] == "fastest"  # as eager's row says it
    assert table_row(shown.stdout, "tvm")[2] == "2.00x"
    as_json = json.loads(cli(three, "best", "matmul", "--shape", SHAPE, "--json").stdout)
    assert as_json["backend"] == "inductor" and as_json["comparable"] is True
    assert [a["backend"] for a in as_json["answers"]] == ["inductor", "tvm", "triton"]


def test_times_from_another_device_are_flagged_not_comparable(server: LiveServer) -> None:
    upload(server, key_for("matmul", "tvm", PROBLEM, "float32"), 2.0)
    here = key_for("matmul", "inductor", PROBLEM, "float32")
    other = dataclasses.replace(here.device, name="another-cpu-model")
    upload(server, dataclasses.replace(here, device=other), 1.0)  # served by the same_arch rule
    with Client(server.url) as client:
        answer = client.resolver.best("matmul", PROBLEM, "float32", backends=["tvm", "inductor"])
    assert answer.backend is None  # times that do not compare crown no one
    assert not answer.comparable
    assert "different devices" in answer.note and "another-cpu-model" in answer.note


def test_a_cpu_of_the_same_name_with_other_cores_is_another_device(server: LiveServer) -> None:
    """A CPU's name is generic (``intel-xeon-processor``): a 64-core box's record, served here
    by the same_arch rule, was ranked against this box's as timed "on one device"."""
    upload(server, key_for("matmul", "tvm", PROBLEM, "float32"), 2.0)
    here = key_for("matmul", "inductor", PROBLEM, "float32")
    bigger = dataclasses.replace(here.device, units=here.device.units + 62)
    upload(server, dataclasses.replace(here, device=bigger), 0.5)
    with Client(server.url) as client:
        answer = client.resolver.best("matmul", PROBLEM, "float32", backends=["tvm", "inductor"])
    assert answer.backend is None and not answer.comparable
    assert f"({bigger.units} cores)" in answer.note and "different devices" in answer.note
    shown = json.loads(cli(server, "best", "matmul", "--shape", SHAPE, "--json").stdout)
    assert shown["comparable"] is False and shown["backend"] is None


class _Served:
    """A resolver answering tvm with a record a verifier re-timed on a device named as the key's,
    and inductor with one uploaded from a device of that name with other cores or SMs."""

    def resolve(self, key: Key, *, default: dict[str, object] | None = None) -> LookupResult:
        if key.backend == "tvm":
            check = {
                "passed": True,
                "verifier": "ver",
                "device_name": key.device.name,
                "verified_at": datetime.now(UTC).isoformat(),
                "timing": make_record(key, time_ms=2.0).timing.model_dump(mode="json"),
            }
            return LookupResult.served(_public(key, 2.0, check), "server", "exact", "strict")
        other = dataclasses.replace(key.device, units=key.device.units + 62)
        mine = _public(dataclasses.replace(key, device=other), 0.5)
        return LookupResult.served(mine, "server", "same_arch", "strict")


def _public(key: Key, ms: float, check: dict[str, object] | None = None) -> RecordPublic:
    fields = make_record(key, time_ms=ms).model_dump(mode="json", by_alias=True)
    fields.update(id=1, key_hash=key.digest(), created_at=datetime.now(UTC).isoformat(),
                  is_winner=True, status="pending" if check is None else "verified",
                  uploaded_by="u", verification=check)  # fmt: skip
    return RecordPublic.model_validate(fields)


def test_a_verifiers_time_on_a_cpu_is_not_ranked_against_an_uploaders() -> None:
    """A CPU's name is generic: a verifier's time on a box named as the key's device was ranked
    against a 64-core box's upload of that name, "all timed on ... (64 cores)". A GPU's name
    names its model: there, a verifier's time and an uploader's of that name do compare."""
    cpu = best_backend(_Served(), "matmul", PROBLEM, "float32", CPU,
                       backends=["tvm", "inductor"])  # fmt: skip
    assert not cpu.comparable and cpu.backend is None
    assert "(verifier ver)" in cpu.note and "(64 cores)" in cpu.note
    h100 = DeviceFingerprint(kind="cuda", arch="sm_90", name="nvidia-h100-80gb-hbm3", units=132,
                             memory_gb=80)  # fmt: skip
    gpu = best_backend(_Served(), "matmul", PROBLEM, "float32", h100,
                       backends=["tvm", "inductor"])  # fmt: skip
    assert gpu.comparable and gpu.backend == "inductor", gpu.note


def test_a_backend_without_a_record_is_listed_with_why(server: LiveServer) -> None:
    upload(server, key_for("matmul", "tvm", PROBLEM, "float32"), 2.0)
    shown = cli(server, "best", "matmul", "--shape", SHAPE)
    assert shown.returncode == 0
    assert "only tvm has a validated record" in shown.stdout
    assert shown.stdout.count("no validated record") == 2  # inductor and triton rows

    nothing = cli(server, "best", "softmax", "--shape", "M=8,N=48")
    assert nothing.returncode == 1
    assert nothing.stdout.count("no backend has a validated record") == 1, nothing.stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["best", "nosuchkernel", "--shape", SHAPE], "nosuchkernel"),
        (["best", "matmul", "--shape", "M=64"], "matmul"),
        (["best", "matmul", "--shape", SHAPE, "--backends", "cuda"], "--backends 'cuda': expected"),
        (["best", "matmul", "--shape", SHAPE, "--backends", ","], "--backends ',': expected some"),
        (
            ["best", "matmul", "--shape", SHAPE, "--backends", "tvm,trition"],
            "unknown 'trition' (did you mean 'triton'?)",
        ),
        (["best", "matmul", "--shape", SHAPE, "--dtype", "int8"], "no backend for int8"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    shared_server: LiveServer, args: list[str], says: str
) -> None:
    result = cli(shared_server, *args)
    assert result.returncode == 2, result.stderr
    assert says in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_an_unreachable_server_is_exit_3(tmp_path: Path) -> None:
    down = LiveServer(url="http://127.0.0.1:9", db="", db_path=None, process=None)  # type: ignore[arg-type]
    result = cli(down, "best", "matmul", "--shape", SHAPE)
    assert result.returncode == 3 and "Traceback" not in result.stderr


def test_best_refuses_what_no_backend_could_serve() -> None:
    with Client("http://127.0.0.1:9") as client, pytest.raises(InvalidInput, match="float64"):
        client.resolver.best("matmul", PROBLEM, "float64", backends=["triton"])


def with_eager(key: Key, time_ms: float, eager_ms: float, speedup: float) -> RecordCreate:
    """A record whose interleaved comparison with torch eager found ``speedup`` (per-round
    ratios' median), which the ratio of the two medians need not equal."""
    record = make_record(key, time_ms=time_ms)
    eager = BaselineModel(name="torch_eager", timing=make_record(key, time_ms=eager_ms).timing,
                          speedup=Speedup(median=speedup, low=speedup * 0.9, high=speedup * 1.1,
                                          rounds=5))  # fmt: skip
    # Its five rounds took their time: a tune is at least that long (RecordCreate refuses less).
    search = record.search.model_copy(update={"seconds": record.search.seconds
                                              + 5 * (time_ms + eager_ms) / 1000})  # fmt: skip
    return record.model_copy(update={"baselines": [eager], "search": search})


def table_row(text: str, backend: str) -> list[str]:
    row = next(line for line in text.splitlines() if line.startswith(backend))
    return [cell.strip() for cell in row.split("  ") if cell.strip()]


def test_one_ratio_to_eager_and_the_device_that_measured_each_time(server: LiveServer) -> None:
    """Eager beat the record: the table's "vs best" and "vs torch eager" say one number (the
    record's interleaved comparison: 2.0 ms against 1.0 ms, rounds' median 0.6 = 1.67x, not the
    2.00x the medians' ratio gives); once a verifier re-timed the record, its time is said to be
    the verifier's device's, and eager's the uploader's."""
    from tunecache.verification import VerificationCreate

    key = key_for("matmul", "tvm", PROBLEM, "float32")
    slower = key_for("matmul", "inductor", PROBLEM, "float32")
    with Client(server.url) as client:
        record_id = client.upload(with_eager(key, 2.0, 1.0, 0.6)).record_id
        client.upload(with_eager(slower, 3.0, 1.1, 0.4))
    shown = cli(server, "best", "matmul", "--shape", SHAPE, "--backends", "tvm,inductor")
    assert shown.returncode == 0, shown.stderr
    assert "tvm's, the fastest, is 1.67x slower than torch eager" in shown.stdout
    assert table_row(shown.stdout, "tvm")[2:4] == [
        "1.67x", "1.67x slower than torch eager (1.52-1.85x)"]  # fmt: skip
    assert table_row(shown.stdout, "inductor")[2] == "2.50x"  # its own comparison, not 3.0 / 1.0
    assert table_row(shown.stdout, "torch eager")[2] == "fastest"

    with Client(server.url, token=issue_token(server.url, "verify")) as client:
        assert client.claim_verification("v1", device_arch=key.device.arch, backends=["tvm"])
        client.submit_verification(record_id, VerificationCreate(
            worker="v1", outcome="passed", device_name="verifier-cpu",
            timing=make_record(key, time_ms=2.2).timing,
            validation=make_record(key).validation))  # fmt: skip
    # tvm is now timed on the verifier's device, inductor on its uploader's: no crown, no eager row
    shown = cli(server, "best", "matmul", "--shape", SHAPE, "--backends", "tvm,inductor")
    assert shown.returncode == 0 and "no backend is crowned" in shown.stdout, shown.stderr
    shown = cli(server, "best", "matmul", "--shape", SHAPE, "--backends", "tvm,tvm")
    assert shown.returncode == 0, shown.stderr
    assert [line.split()[0] for line in shown.stdout.splitlines() if line.strip()].count("tvm") == 1
    tvm, eager = table_row(shown.stdout, "tvm"), table_row(shown.stdout, "torch eager")
    assert tvm[1] == "2.2 v" and tvm[4] == f"{key.device.arch} verifier-cpu"
    assert eager[1] == "1" and eager[4] == f"{key.device.arch} {key.device.name}"
    assert tvm[2] == "1.67x"  # still the record's own comparison, not 2.2 / 1.0


def test_a_speedup_the_verifier_did_not_believe_is_not_shown(server: LiveServer) -> None:
    """An uploader claimed 0.1 ms, 20x faster than torch eager; a verifier re-timed it at 2 ms
    (flagged: not believed). Its "20.00x faster than torch eager" was still shown beside the
    verifier's 2 ms; now no comparison of that uploader's stands."""
    from tunecache.verification import VerificationCreate

    key = key_for("matmul", "tvm", PROBLEM, "float32")
    with Client(server.url) as client:
        record_id = client.upload(with_eager(key, 0.1, 2.0, 20.0)).record_id
    with Client(server.url, token=issue_token(server.url, "verify")) as client:
        assert client.claim_verification("v1", device_arch=key.device.arch, backends=["tvm"])
        checked = client.submit_verification(record_id, VerificationCreate(
            worker="v1", outcome="passed", device_name="verifier-cpu",
            timing=make_record(key, time_ms=2.0).timing,
            validation=make_record(key).validation))  # fmt: skip
    assert checked.verification is not None and checked.verification.timing_flag
    with Client(server.url) as client:
        found = client.lookup(key, default={"schedule": "default"})
    assert found.time_ms == 2.0
    assert (found.vs_eager, found.eager_ms, found.slower_than_eager) == (None, None, False)
    shown = cli(server, "get", "matmul", "--backend", "tvm", "--shape", SHAPE)
    assert shown.returncode == 0, shown.stderr
    assert "speedup    not believed" in shown.stdout
    assert "faster than torch eager" not in shown.stdout
    best = cli(server, "best", "matmul", "--shape", SHAPE, "--backends", "tvm")
    assert best.returncode == 0, best.stderr
    assert not any(line.startswith("torch eager") for line in best.stdout.splitlines())
    assert table_row(best.stdout, "tvm")[3] == "-"


def test_a_winner_no_faster_than_eager_within_noise_is_not_crowned_alone(
    server: LiveServer,
) -> None:
    """A newcomer's ``tunecache best``: "fastest is tvm (0.0224 ms)" above an eager row of
    0.0144 ms, the record's own comparison a median of 0.67x within 0.59-1.01x. The headline
    now says the tie and its median."""
    from tunecache.measured import BaselineModel, Speedup

    key = key_for("matmul", "tvm", PROBLEM, "float32")
    eager = BaselineModel(name="torch_eager", timing=make_record(key, time_ms=0.0144).timing,
                          speedup=Speedup(median=0.67, low=0.59, high=1.01, rounds=11))  # fmt: skip
    with Client(server.url) as client:
        client.upload(make_record(key, time_ms=0.0224).model_copy(update={"baselines": [eager]}))
    shown = cli(server, "best", "matmul", "--shape", SHAPE, "--backends", "tvm")
    assert shown.returncode == 0, shown.stderr
    first = shown.stdout.splitlines()[0]
    assert "fastest is tvm (0.0224 ms, pending: its uploader's claim, not verified); the same as "\
        "torch eager within noise" in first  # fmt: skip
    assert "median 0.67x, 0.59-1.01x" in first
    # Eager was listed last (below backends with no record), "0.67x" with no tie: it is right
    # below the record it ties, and says so as a tuned record within noise of the fastest does.
    every = cli(server, "best", "matmul", "--shape", SHAPE, "--backends", "tvm,inductor")
    names = [line.split("  ")[0] for line in every.stdout.splitlines()[3:] if line.strip()]
    assert names[:3] == ["tvm", "torch eager", "inductor"], every.stdout
    assert table_row(every.stdout, "torch eager")[2] == "0.67x, tie"


def test_times_of_the_nearest_shape_in_the_bucket_say_where_they_were_measured(
    server: LiveServer,
) -> None:
    """``best`` at M=7 headed "matmul M=7,N=8,K=8 float32: fastest is tvm (0.5 ms …)" with a
    time measured at M=8 (the bucket's nearest record); only the table's rule said "bucket"."""
    key = key_for("matmul", "tvm", {"M": 8, "N": 8, "K": 8}, "float32")
    with Client(server.url) as client:
        client.upload(make_record(key, time_ms=0.5))
    asked = cli(server, "best", "matmul", "--shape", "M=7,N=8,K=8", "--backends", "tvm")
    assert asked.returncode == 0, asked.stderr
    first = asked.stdout.splitlines()[0]
    assert first.startswith("matmul M=7,N=8,K=8 float32: fastest is tvm (0.5 ms"), first
    assert first.endswith("(times measured at K=8,M=8,N=8, the nearest shape in the bucket)")
    exact = cli(server, "best", "matmul", "--shape", "M=8,N=8,K=8", "--backends", "tvm")
    assert exact.returncode == 0 and "times measured at" not in exact.stdout, exact.stdout


def test_torch_eager_is_listed_after_every_record_that_beats_it(server: LiveServer) -> None:
    """Eager was placed after the records beating it in an unbroken run: a record whose
    comparison with eager has no interval (its ratio of medians: 2.00x) was listed below it."""
    problem = {"M": 96, "N": 48, "K": 32}
    tvm = key_for("matmul", "tvm", problem, "float32")
    inductor = key_for("matmul", "inductor", problem, "float32")
    eager = BaselineModel(name="torch_eager", timing=make_record(inductor, time_ms=3.0).timing)
    with Client(server.url) as client:
        client.upload(with_eager(tvm, 1.0, 2.0, 2.0))
        client.upload(make_record(inductor, time_ms=1.5).model_copy(update={"baselines": [eager]}))
    shown = cli(server, "best", "matmul", "--shape", "M=96,N=48,K=32", "--backends", "tvm,inductor")
    assert shown.returncode == 0, shown.stderr
    names = [line.split("  ")[0] for line in shown.stdout.splitlines()[3:6]]
    assert names == ["tvm", "inductor", "torch eager"], shown.stdout


def test_torch_eager_follows_only_the_leading_records_that_beat_it() -> None:
    """Placed after the last record beating it, eager fell below a record whose own cell says
    it is slower than eager; a ratio of 1.003 with no interval reads "the same", not faster."""
    from types import SimpleNamespace

    from tunecache_cli.best import _eager_place

    def row(speedup: float | None, interval: tuple[float, float] | None = None) -> Any:
        served = SimpleNamespace(speedup=lambda: speedup, speedup_interval=lambda: interval)
        return SimpleNamespace(result=SimpleNamespace(served_record=served))

    def place(*rows: Any) -> int:
        return _eager_place(SimpleNamespace(answers=rows))

    assert place(row(1.5, (1.3, 1.7)), row(2.0), row(1.2, (1.1, 1.3))) == 3
    assert place(row(1.0, (0.9, 1.1)), row(0.7, (0.6, 0.8)), row(1.2)) == 1  # a tie first
    assert place(row(1.5, (1.3, 1.7)), row(1.003), row(2.0)) == 1  # "1.00x (the same)"
    assert place(row(1.5, (1.3, 1.7)), SimpleNamespace(result=None), row(2.0)) == 1
