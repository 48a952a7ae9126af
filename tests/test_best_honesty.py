"""``best`` says only what its times can say: an interpreter's time is never ranked, times that do
not compare crown no one, a gap inside both records' spreads is a tie, and whose time each is
(an uploader's claim or a verifier's) shows."""

from __future__ import annotations

import dataclasses
import json

from tests.conftest import LiveServer
from tests.factories import issue_token, make_record
from tests.test_best import PROBLEM, SHAPE, cli, table_row, upload
from tunecache import key_for
from tunecache.client import Client
from tunecache.key import Key
from tunecache.measured import INTERPRETER_TIMER, TimingModel
from tunecache.schemas import RecordCreate


def exact(key: Key, time_ms: float, *, low: float | None = None, high: float | None = None,
          timer: str = "perf_counter") -> RecordCreate:  # fmt: skip
    """A record of ``key`` timed at ``time_ms``, its samples from ``low`` to ``high``."""
    timing = TimingModel(median_ms=time_ms, min_ms=low or time_ms, max_ms=high or time_ms,
                         repeats=50, timer=timer)  # fmt: skip
    return make_record(key, time_ms=time_ms).model_copy(update={"timing": timing})


def put(server: LiveServer, *records: RecordCreate) -> list[int]:
    with Client(server.url) as client:
        return [client.upload(r).record_id for r in records]


def key(backend: str) -> Key:
    return key_for("matmul", backend, PROBLEM, "float32")


def best(server: LiveServer, *args: str) -> tuple[str, list[str]]:
    shown = cli(server, "best", "matmul", "--shape", SHAPE, *args)
    assert shown.returncode == 0, shown.stderr
    return shown.stdout, shown.stdout.splitlines()


def test_an_interpreters_time_is_listed_never_ranked(server: LiveServer) -> None:
    """The auditor's 40³ case: Triton's interpreter timed on the host beside TVM and Inductor
    read "250x faster than triton ... all timed on cpu"; it is now marked and out of every
    ratio, and an interpreted time faster than every other is not crowned either."""
    put(server, exact(key("tvm"), 0.01), exact(key("inductor"), 0.02),
        exact(key("triton"), 0.001, high=0.002, timer=INTERPRETER_TIMER))  # fmt: skip
    with Client(server.url) as client:
        answer = client.resolver.best("matmul", PROBLEM, "float32")
    assert answer.backend == "tvm" and answer.comparable
    assert [a.backend for a in answer.answers] == ["tvm", "inductor", "triton"]
    assert "triton timed by Triton's interpreter" in answer.note
    text, lines = best(server)
    assert "fastest is tvm (0.01 ms" in lines[0] and "2.00x faster than inductor" in lines[0]
    assert "triton" not in lines[0]
    triton = table_row(text, "triton")
    assert triton[2] == "-" and triton[-1].endswith("(interpreter)")
    assert "not ranked" in lines[-1]


def test_times_that_do_not_compare_crown_no_one(server: LiveServer) -> None:
    upload(server, key("tvm"), 2.0)
    here = key("inductor")
    other = dataclasses.replace(here.device, name="another-cpu-model")
    upload(server, dataclasses.replace(here, device=other), 1.0)  # served by the same_arch rule
    with Client(server.url) as client:
        answer = client.resolver.best("matmul", PROBLEM, "float32", backends=["tvm", "inductor"])
    assert answer.winner is None and answer.backend is None and answer.found
    shown = cli(server, "best", "matmul", "--shape", SHAPE, "--backends", "tvm,inductor")
    assert shown.returncode == 0, shown.stderr  # a backend has a record: exit 0, as documented
    first = shown.stdout.splitlines()[0]
    assert "no backend is crowned" in first and "not comparable" in first
    assert "another-cpu-model" in first and "faster" not in first
    assert table_row(shown.stdout, "tvm")[2] == table_row(shown.stdout, "inductor")[2] == "-"
    as_json = json.loads(cli(server, "best", "matmul", "--shape", SHAPE, "--backends",
                             "tvm,inductor", "--json").stdout)  # fmt: skip
    assert as_json["backend"] is None and as_json["comparable"] is False


def test_a_gap_inside_both_spreads_is_a_tie_with_the_digits_to_see_it(server: LiveServer) -> None:
    put(server, exact(key("tvm"), 0.1, low=0.095, high=0.11),
        exact(key("inductor"), 0.1004, low=0.096, high=0.12))  # fmt: skip
    text, lines = best(server, "--backends", "tvm,inductor")
    assert "tvm (0.1 ms" in lines[0] and "inductor (0.1004 ms" in lines[0]
    assert "the same within their spreads" in lines[0] and "faster" not in lines[0]
    assert table_row(text, "tvm")[1] == "0.1" and table_row(text, "inductor")[1] == "0.1004"
    assert table_row(text, "inductor")[2] == "1.004x, tie"


def test_ratios_read_as_numbers_with_their_digits(server: LiveServer) -> None:
    put(server, exact(key("tvm"), 0.001), exact(key("inductor"), 2.0))
    text, lines = best(server, "--backends", "tvm,inductor")
    assert "fastest is tvm (0.001 ms" in lines[0] and "2,000x faster than inductor" in lines[0]
    assert table_row(text, "inductor")[2] == "2,000x"
    from tunecache_cli.table import digits_apart, ms, ratio

    assert (ratio(1.004), ratio(2000.0), ratio(2.5), ratio(1.0)) == (
        "1.004x", "2,000x", "2.50x", "1.00x")  # fmt: skip
    assert digits_apart([0.1, 0.1004, None]) == 4 and digits_apart([1.0, 2.0]) == 3
    assert ms(1.0) == "1" and ms(0.0224) == "0.0224"  # other callers' output unchanged


def test_a_pending_claim_and_a_verifiers_time_are_told_apart(server: LiveServer) -> None:
    """A pending record (checked by its uploader alone) claiming 0.001 ms was crowned with
    nothing saying it was a claim; a verifier's time stood beside uploaders' unmarked under
    "all timed on"."""
    from tunecache.verification import VerificationCreate

    tvm_id, _ = put(server, exact(key("tvm"), 2.0), exact(key("inductor"), 0.001))
    text, lines = best(server, "--backends", "tvm,inductor")
    assert "fastest is inductor (0.001 ms, pending: its uploader's claim" in lines[0]
    assert table_row(text, "inductor")[6] == "pending"

    with Client(server.url, token=issue_token(server.url, "verify")) as client:
        assert client.claim_verification("v1", device_arch=key("tvm").device.arch,
                                         backends=["tvm"])  # fmt: skip
        client.submit_verification(tvm_id, VerificationCreate(
            worker="v1", outcome="passed", device_name=key("tvm").device.name,
            timing=exact(key("tvm"), 2.2).timing,
            validation=make_record(key("tvm")).validation))  # fmt: skip
    text, lines = best(server, "--backends", "tvm,inductor")
    tvm = table_row(text, "tvm")
    assert tvm[1] == "2.2 v" and tvm[6] == "verified"
    # On a CPU the verifier's machine is not the uploader's, whose name alone cannot tell.
    assert "no backend is crowned" in lines[0] and "(verifier " in lines[0]
    as_json = json.loads(cli(server, "best", "matmul", "--shape", SHAPE, "--backends",
                             "tvm,inductor", "--json").stdout)  # fmt: skip
    assert {a["backend"]: (a["status"], a["timed_by_verifier"]) for a in as_json["answers"]} == {
        "tvm": ("verified", True), "inductor": ("pending", False)}  # fmt: skip
