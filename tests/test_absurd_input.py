"""Absurd input on every route that takes a key: 4xx with a reason, never a 5xx or a hang.

Each case is sent as raw JSON bytes (so NaN, Infinity and 1e400 reach the server as the bare tokens
Python's parser accepts) to ``POST /v1/records``, ``/v1/lookup``, ``/v1/misses``, ``/v1/jobs`` and
``/v1/snapshot``, on SQLite and on PostgreSQL (where an int beyond int64, a NUL byte or a lone
surrogate would fail in the driver rather than in validation). Every answer must be the expected
4xx, its ``detail`` must name the offending field or parameter and the bound it breaks, the server
must stay healthy, and nothing may be stored: no record, no job.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer
from tests.factories import AUTH, CPU, make_key, make_record
from tunecache.errors import InvalidInput
from tunecache.jsonsafe import MAX_JSON_DEPTH
from tunecache.schemas import KeyModel
from tunecache.snapshot import SNAPSHOT_FORMAT

TIMEOUT = 60  # seconds; a case that takes longer counts as a hang


@dataclass(frozen=True)
class Raw:
    """A JSON token sent as is: ``NaN``, ``Infinity``, ``1e400`` (no Python value encodes so)."""

    text: str


def encode(body: Any) -> bytes:
    """``body`` as JSON bytes, with each :class:`Raw` spliced in verbatim."""
    raws: list[str] = []

    def swap(value: Any) -> Any:
        if isinstance(value, Raw):
            raws.append(value.text)
            return f"@@raw{len(raws) - 1}@@"
        if isinstance(value, dict):
            return {k: swap(v) for k, v in value.items()}
        if isinstance(value, list):
            return [swap(v) for v in value]
        return value

    text = json.dumps(swap(body), allow_nan=True)
    for i, raw in enumerate(raws):
        text = text.replace(f'"@@raw{i}@@"', raw)
    return text.encode()


def nested(depth: int) -> Raw:
    """``64`` inside ``depth`` lists, as raw JSON (too deep for ``json.dumps`` to recurse)."""
    return Raw("[" * depth + "64" + "]" * depth)


def record_body() -> dict[str, Any]:
    return make_record().model_dump(mode="json", by_alias=True)


Wrap = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class Route:
    path: str
    wrap: Wrap  # a valid record (possibly mutated) -> this route's body
    ok: tuple[int, ...]  # what the unmutated body gets (after the routes before it)


ROUTES = {
    "records": Route("/v1/records", lambda record: record, (201,)),
    "lookup": Route("/v1/lookup", lambda record: {"key": record["key"]}, (200,)),
    "misses": Route("/v1/misses", lambda record: {"key": record["key"]}, (202,)),
    "jobs": Route("/v1/jobs", lambda record: {"key": record["key"]}, (200, 201)),
    "snapshot": Route(
        "/v1/snapshot",
        lambda record: {
            "format": SNAPSHOT_FORMAT,
            "filters": {"device_arch": CPU.arch},
            "records": [record],
        },
        (200,),
    ),
}
KEY_ROUTES = list(ROUTES)
RECORD_ROUTES = ["records", "snapshot"]

Path = tuple[str | int, ...]


@dataclass(frozen=True)
class Case:
    """Set ``path`` (in the record; ``("key", ...)`` for key parts) to ``value``; expect every
    fragment of ``reason`` in the answer's detail."""

    name: str
    path: Path
    value: Any
    reason: tuple[str, ...]
    status: int = 422


def mutated(path: Path, value: Any) -> dict[str, Any]:
    record = record_body()
    target: Any = record
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return record


M = ("key", "problem", "M")
SIZE = "1..2147483647"
INT64 = "outside the 64-bit integer range"
NOT_SIZE = "is not an integer size"
NOT_NAME = "is not an identifier"


def renamed(name: str) -> dict[str, Any]:
    return {name: 64, "N": 64, "K": 64}


KEY_CASES = [
    # Sizes out of range, of the wrong type, or not numbers at all.
    Case("M negative", M, -1, ("problem", "M=-1", SIZE)),
    Case("M zero", M, 0, ("problem", "M=0", SIZE)),
    Case("M 2**31", M, 2**31, ("problem", "M=2147483648", SIZE)),
    Case("M int64 max", M, 2**63 - 1, ("problem", "M=9223372036854775807", SIZE)),
    Case("M 2**63", M, 2**63, ("key.problem.M", "9223372036854775808", INT64)),
    Case("M 2**64", M, 2**64, ("key.problem.M", "18446744073709551616", INT64)),
    Case("M 10**100", M, 10**100, ("key.problem.M", "(101 digits)", INT64)),
    Case("M -2**63-1", M, -(2**63) - 1, ("key.problem.M", "-9223372036854775809", INT64)),
    Case("M 1.5", M, 1.5, ("problem", "M=1.5", NOT_SIZE)),
    Case("M 1e308", M, 1e308, ("problem", "M=1e+308", NOT_SIZE)),
    Case("M 64.5", M, 64.5, ("problem", "M=64.5", NOT_SIZE)),
    Case("M NaN", M, Raw("NaN"), ("key.problem.M", "NaN", "not a finite number")),
    Case("M Infinity", M, Raw("Infinity"), ("key.problem.M", "Infinity", "not a finite")),
    Case("M -Infinity", M, Raw("-Infinity"), ("key.problem.M", "-Infinity", "not a finite")),
    Case("M 1e400", M, Raw("1e400"), ("key.problem.M", "Infinity", "not a finite number")),
    Case("M true", M, True, ("problem", "M=True", NOT_SIZE)),
    Case("M false", M, False, ("problem", "M=False", NOT_SIZE)),
    Case("M null", M, None, ("problem", "M=None", NOT_SIZE)),
    Case("M string", M, "64", ("problem", "M='64'", NOT_SIZE)),
    Case("M object", M, {"rows": 64}, ("problem", "M={'rows': 64}", NOT_SIZE)),
    Case("M list", M, [64], ("problem", "M=[64]", NOT_SIZE)),
    Case("M 33 deep", M, nested(33), ("key.problem.M", f"more than {MAX_JSON_DEPTH} levels")),
    # Deeper than any body may nest: refused before the models see it.
    Case("M 900 deep", M, nested(900), ("nested too deeply",), 400),
    Case("flag of 65 chars", ("key", "problem", "layout"), "x" * 65,
         ("problem", "layout is a string of 65 characters", "limit is 64")),
    Case("flag with NUL", ("key", "problem", "layout"), "ab\x00", ("problem.layout", "NUL")),
    Case("flag with lone surrogate", ("key", "problem", "layout"), "\ud800",
         ("problem.layout", "surrogate")),
    # Problems of absurd shape.
    Case("empty problem", ("key", "problem"), {}, ("problem", "at least one parameter")),
    Case("problem is a list", ("key", "problem"), [64, 64, 64], ("problem", "not list")),
    Case("problem is a string", ("key", "problem"), "M=64,N=64,K=64", ("problem", "not str")),
    Case("problem is null", ("key", "problem"), None, ("problem", "not NoneType")),
    Case("33 parameters", ("key", "problem"), {f"P{i}": 1 for i in range(33)},
         ("problem has 33 parameters", "limit is 32")),
    Case("100,000 parameters", ("key", "problem"), {f"P{i}": 1 for i in range(100_000)},
         ("problem has 100000 parameters", "limit is 32")),
    Case("flags only", ("key", "problem"), {"causal": True, "layout": "nhwc"},
         ("problem", "at least one integer size")),
    Case("10,000-char name", ("key", "problem"), renamed("M" * 10_000),
         ("parameter name", "(10000 characters)", NOT_NAME)),
    Case("129-char name", ("key", "problem"), renamed("M" * 129), ("parameter name", NOT_NAME)),
    Case("empty name", ("key", "problem"), renamed(""), ("parameter name ''", NOT_NAME)),
    Case("name with a newline", ("key", "problem"), renamed("M\n"),
         ("parameter name 'M\\n'", NOT_NAME)),
    Case("name with a space", ("key", "problem"), renamed("M "), ("parameter name 'M '", NOT_NAME)),
    Case("name with NUL", ("key", "problem"), renamed("M\x00"), ("key.problem", "NUL")),
    Case("name a lone surrogate", ("key", "problem"), renamed("\udc00"),
         ("key.problem", "surrogate")),
    Case("name Cyrillic M", ("key", "problem"), renamed("\u041c"), ("parameter name", NOT_NAME)),
    Case("name Greek M", ("key", "problem"), renamed("\u039c"), ("parameter name", NOT_NAME)),
    Case("name fullwidth M", ("key", "problem"), renamed("\uff2d"), ("parameter name", NOT_NAME)),
    Case("name Kelvin sign", ("key", "problem"), {"\u212a": 64, "M": 64, "N": 64},
         ("parameter name", NOT_NAME)),
    Case("name with zero-width space", ("key", "problem"), renamed("M\u200b"),
         ("parameter name", NOT_NAME)),
    # The device.
    Case("units 0", ("key", "device", "units"), 0, ("device.units", "greater than or equal to 1")),
    Case("units negative", ("key", "device", "units"), -1, ("device.units", "greater than")),
    Case("units 2**40", ("key", "device", "units"), 2**40,
         ("device.units", "less than or equal to 1000000")),
    Case("units 2**64", ("key", "device", "units"), 2**64, ("device.units", INT64)),
    Case("units true", ("key", "device", "units"), True, ("device.units", "valid integer")),
    Case("units 8.5", ("key", "device", "units"), 8.5, ("device.units", "valid integer")),
    Case("units '8'", ("key", "device", "units"), "8", ("device.units", "valid integer")),
    Case("units Infinity", ("key", "device", "units"), Raw("Infinity"),
         ("device.units", "Infinity")),
    Case("memory_gb negative", ("key", "device", "memory_gb"), -1,
         ("device.memory_gb", "greater than or equal to 0")),
    Case("memory_gb 2**31", ("key", "device", "memory_gb"), 2**31,
         ("device.memory_gb", "less than or equal to 1000000")),
    Case("memory_gb NaN", ("key", "device", "memory_gb"), Raw("NaN"),
         ("device.memory_gb", "NaN")),
    Case("memory_gb true", ("key", "device", "memory_gb"), True,
         ("device.memory_gb", "valid integer")),
    Case("device name lone surrogate", ("key", "device", "name"), "cpu\ud800",
         ("device.name", "surrogate")),
    Case("device name control char", ("key", "device", "name"), "cpu\n", ("device.name",)),
    Case("device is a list", ("key", "device"), [1, 2], ("device", "valid dictionary")),
    # The rest of the key.
    Case("schema 2", ("key", "schema"), 2, ("key schema 2 is not 1",)),
    Case("schema true", ("key", "schema"), True, ("key schema True is not 1",)),
    Case("schema 1.5", ("key", "schema"), 1.5, ("key schema 1.5 is not 1",)),
    Case("schema 2**64", ("key", "schema"), 2**64, ("key.schema", INT64)),
    Case("kernel of 10,000 chars", ("key", "kernel"), "k" * 10_000,
         ("kernel", "at most 128 characters")),
    Case("kernel nested", ("key", "kernel"), {"name": "matmul"}, ("kernel", "valid string")),
    Case("source_hash 10**100", ("key", "source_hash"), 10**100, ("key.source_hash", INT64)),
    Case("dtype a list", ("key", "dtype"), ["float32"], ("dtype", "valid string")),
    Case("backend 1e308", ("key", "backend"), 1e308, ("backend", "'triton'")),
    Case("1,000 environment entries", ("key", "environment"),
         {f"pkg{i}": "1.0" for i in range(1000)}, ("environment", "at most 16 items")),
    Case("environment name of 10,000 chars", ("key", "environment"), {"p" * 10_000: "1.0"},
         ("environment", "at most 64 characters")),
    Case("environment name unicode", ("key", "environment"), {"t\u043erch": "2.11.0"},
         ("environment", "should match pattern")),
    Case("environment version nested", ("key", "environment"), {"torch": {"v": [2, 11]}},
         ("environment.torch", "valid string")),
    Case("environment version NaN", ("key", "environment"), {"torch": Raw("NaN")},
         ("environment.torch", "NaN")),
    Case("unknown key field", ("key", "surprise"), 1, ("key.surprise", "Extra inputs")),
    Case("key is a list", ("key",), [1, 2, 3], ("key", "valid dictionary")),
]  # fmt: skip

CHECK = ("validation", "checks", 0)
TRIAL = ("trials", 0)
RECORD_CASES = [
    Case("time_ms negative", ("timing", "median_ms"), -1.0, ("timing.median_ms", "greater than or equal to 0.000001")),
    Case("time_ms 1e308", ("timing", "median_ms"), 1e308, ("timing.median_ms", "less than")),
    Case("time_ms Infinity", ("timing", "median_ms"), Raw("Infinity"),
         ("timing.median_ms", "Infinity")),
    Case("time_ms 1e400", ("timing", "median_ms"), Raw("1e400"),
         ("timing.median_ms", "Infinity")),
    Case("time_ms NaN", ("timing", "median_ms"), Raw("NaN"), ("timing.median_ms", "NaN")),
    Case("time_ms true", ("timing", "median_ms"), True, ("timing.median_ms", "valid number")),
    Case("time_ms a string", ("timing", "median_ms"), "1.0", ("timing.median_ms", "valid number")),
    Case("iqr_ms -Infinity", ("timing", "iqr_ms"), Raw("-Infinity"),
         ("timing.iqr_ms", "-Infinity")),
    Case("repeats 10**30", ("timing", "repeats"), 10**30, ("timing.repeats", INT64)),
    Case("repeats 2**31", ("timing", "repeats"), 2**31,
         ("timing.repeats", "less than or equal to 1000000000")),
    Case("repeats true", ("timing", "repeats"), True, ("timing.repeats", "valid integer")),
    Case("repeats 1.5", ("timing", "repeats"), 1.5, ("timing.repeats", "valid integer")),
    Case("warmup negative", ("timing", "warmup"), -1, ("timing.warmup", "greater than")),
    Case("baseline time Infinity", ("baselines", 0, "timing", "median_ms"), Raw("Infinity"),
         ("baselines", "median_ms", "Infinity")),
    Case("seed 2**64", (*CHECK, "seed"), 2**64, ("seed", INT64)),
    Case("seed 2**63", (*CHECK, "seed"), 2**63, ("seed", INT64)),
    Case("seed negative", (*CHECK, "seed"), -1, ("seed", "greater than or equal to 0")),
    Case("seed true", (*CHECK, "seed"), True, ("seed", "valid integer")),
    Case("seed NaN", (*CHECK, "seed"), Raw("NaN"), ("seed", "NaN")),
    Case("check problem M 2**40", (*CHECK, "problem", "M"), 2**40,
         ("checks", "problem", "M=1099511627776", SIZE)),
    Case("check problem a list", (*CHECK, "problem"), [1], ("checks", "problem", "not list")),
    Case("check problem 10,000-char name", (*CHECK, "problem"), renamed("N" * 10_000),
         ("checks", "parameter name", NOT_NAME)),
    Case("check problem empty", (*CHECK, "problem"), {}, ("checks", "at least one parameter")),
    Case("check tolerance Infinity", (*CHECK, "tolerance"), Raw("Infinity"),
         ("tolerance", "Infinity")),
    Case("check tolerance 1e308", (*CHECK, "tolerance"), 1e308,
         ("tolerance", "less than or equal to 1")),
    Case("check rel_error NaN", (*CHECK, "rel_error"), Raw("NaN"), ("rel_error", "NaN")),
    Case("check passed 1", (*CHECK, "passed"), 1, ("passed", "valid boolean")),
    Case("tolerance Infinity", ("validation", "tolerance"), Raw("Infinity"),
         ("validation.tolerance", "Infinity")),
    Case("tolerance 0", ("validation", "tolerance"), 0, ("validation.tolerance", "greater than 0")),
    Case("max_rel_error -Infinity", ("validation", "max_rel_error"), Raw("-Infinity"),
         ("validation.max_rel_error", "-Infinity")),
    Case("trial time_ms NaN", (*TRIAL, "time_ms"), Raw("NaN"), ("trials", "time_ms", "NaN")),
    Case("trial time_ms 1e400", (*TRIAL, "time_ms"), Raw("1e400"),
         ("trials", "time_ms", "Infinity")),
    Case("trial time_ms negative", (*TRIAL, "time_ms"), -5.0, ("trials", "time_ms", "greater")),
    Case("trial config 2**64", (*TRIAL, "config"), {"tile": 2**64}, ("trials", "config", INT64)),
    Case("search trials 2**40", ("search", "trials"), 2**40,
         ("search.trials", "less than or equal to 10000000")),
    Case("search trials true", ("search", "trials"), True, ("search.trials", "valid integer")),
    Case("search seconds 1e308", ("search", "seconds"), 1e308,
         ("search.seconds", "less than or equal to")),
    Case("search seconds Infinity", ("search", "seconds"), Raw("Infinity"),
         ("search.seconds", "Infinity")),
    Case("config NaN", ("config",), {"tile": Raw("NaN")}, ("config.tile", "NaN")),
    Case("config 10**100", ("config",), {"tile": 10**100}, ("config.tile", INT64)),
    Case("config 40 deep", ("config",), {"tile": nested(40)},
         ("config.tile", f"more than {MAX_JSON_DEPTH} levels")),
    Case("config lone surrogate key", ("config",), {"\ud83d": 1}, ("config", "surrogate")),
    Case("config NUL", ("config",), {"tile": "a\x00b"}, ("config.tile", "NUL")),
    Case("config summary lone surrogate", ("config_summary",), "\udfff",
         ("config_summary", "surrogate")),
    Case("provenance lone surrogate", ("provenance", "machine"), "host\ud800",
         ("provenance.machine", "surrogate")),
]  # fmt: skip

JOB_CASES = [
    Case("priority 2**31", ("priority",), 2**31, ("priority", "less than or equal to 1000")),
    Case("priority -2**31-1", ("priority",), -(2**31) - 1, ("priority", "greater than")),
    Case("priority 2**63", ("priority",), 2**63, ("priority", INT64)),
    Case("priority true", ("priority",), True, ("priority", "valid integer")),
    Case("priority 1.5", ("priority",), 1.5, ("priority", "valid integer")),
    Case("priority NaN", ("priority",), Raw("NaN"), ("priority", "NaN")),
    Case("max_attempts 2**40", ("max_attempts",), 2**40, ("max_attempts", "less than or equal")),
    Case("max_attempts 0", ("max_attempts",), 0, ("max_attempts", "greater than or equal to 1")),
    Case("max_attempts 10**100", ("max_attempts",), 10**100, ("max_attempts", INT64)),
    Case("source of 10,000 chars", ("source",), "s" * 10_000, ("source", "at most 32")),
]  # fmt: skip


class Checker:
    """Sends cases to a live server and collects every way an answer falls short."""

    def __init__(self, server: LiveServer) -> None:
        self.http = httpx.Client(base_url=server.url, headers=AUTH, timeout=TIMEOUT)
        self.failures: list[str] = []

    def stored(self) -> tuple[int, int]:
        records, jobs = self.http.get("/v1/records"), self.http.get("/v1/jobs")
        assert records.status_code == 200, records.text
        assert jobs.status_code == 200, jobs.text
        return records.json()["count"], jobs.json()["count"]

    def send(
        self, label: str, path: str, content: bytes, status: int, reason: tuple[str, ...]
    ) -> None:
        """Posts ``content``; the answer must be ``status`` with every part of ``reason``."""
        try:
            answer = self.http.post(
                path, content=content, headers={"content-type": "application/json"}
            )
        except httpx.TimeoutException:
            self.failures.append(f"{label}: no answer in {TIMEOUT} s")
            return
        detail = explain(answer)
        if answer.status_code != status:
            self.failures.append(f"{label}: {answer.status_code}, not {status}: {detail[:300]}")
        elif missing := [part for part in reason if part not in detail]:
            self.failures.append(f"{label}: the detail does not say {missing}: {detail[:300]}")

    def unharmed(self, label: str) -> None:
        """The server still answers, and holds no record and no job."""
        health = self.http.get("/health")
        if health.status_code != 200:
            self.failures.append(f"{label}: the server is unhealthy after it: {health.text}")
        if (stored := self.stored()) != (0, 0):
            self.failures.append(f"{label}: stored {stored[0]} records and {stored[1]} jobs")

    def finish(self) -> list[str]:
        """Closes the connection; returns what went wrong, one line a case."""
        self.http.close()
        return self.failures


def explain(answer: httpx.Response) -> str:
    """The answer's ``detail`` as one line: a string, or each error's location and message."""
    try:
        detail = answer.json()["detail"]
    except (ValueError, KeyError, TypeError):
        return f"(no JSON detail) {answer.text[:300]}"
    if isinstance(detail, str):
        return detail
    return " | ".join(
        ".".join(str(part) for part in error["loc"]) + ": " + error["msg"] for error in detail
    )


def send_cases(checker: Checker, cases: list[Case], routes: list[str]) -> None:
    for case in cases:
        for name in routes:
            route = ROUTES[name]
            body = route.wrap(mutated(case.path, case.value))
            checker.send(f"{case.name} -> {name}", route.path, encode(body), case.status,
                         case.reason)  # fmt: skip
        checker.unharmed(case.name)


def test_absurd_keys_are_422_on_every_route(any_server: LiveServer) -> None:
    checker = Checker(any_server)
    assert checker.stored() == (0, 0)
    send_cases(checker, KEY_CASES, KEY_ROUTES)
    failures = checker.finish()
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures)
    # The bodies the cases mutate are valid: each route takes the unmutated one.
    with httpx.Client(base_url=any_server.url, headers=AUTH, timeout=TIMEOUT) as http:
        for name, route in ROUTES.items():
            answer = http.post(route.path, content=encode(route.wrap(record_body())),
                               headers={"content-type": "application/json"})  # fmt: skip
            assert answer.status_code in route.ok, (name, answer.text[:300])


def test_absurd_record_fields_are_422(any_server: LiveServer) -> None:
    checker = Checker(any_server)
    send_cases(checker, RECORD_CASES, RECORD_ROUTES)
    failures = checker.finish()
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures)


def test_absurd_job_fields_are_422(any_server: LiveServer) -> None:
    checker = Checker(any_server)
    key = record_body()["key"]
    for case in JOB_CASES:
        body = {"key": key, case.path[0]: case.value}
        checker.send(f"{case.name} -> jobs", "/v1/jobs", encode(body), case.status, case.reason)
        checker.unharmed(case.name)
    for policy in ([1], 10**100, Raw("NaN"), "x" * 10_000):
        label = f"policy {str(policy)[:20]} -> lookup"
        checker.send(label, "/v1/lookup", encode({"key": key, "policy": policy}), 422, ("policy",))
        checker.unharmed(label)
    failures = checker.finish()
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures)


def test_nesting_bombs_and_oversized_bodies_are_4xx(any_server: LiveServer) -> None:
    """Too deep for the JSON parser (400), too deep for us (422), too big (413): never a 500."""
    checker = Checker(any_server)
    bomb = "[" * 100_000 + "]" * 100_000
    for name, route in ROUTES.items():
        checker.send(f"100,000 nested lists -> {name}", route.path, bomb.encode(), 400,
                     ("nested too deeply",))  # fmt: skip
        in_m = json.dumps(route.wrap(record_body())).replace('"M": 64', f'"M": {bomb}', 1)
        checker.send(f"100,000 nested lists in M -> {name}", route.path, in_m.encode(), 400,
                     ("nested too deeply",))  # fmt: skip
        checker.send(f"500 nested lists in M -> {name}", route.path,
                     encode(route.wrap(mutated(M, nested(500)))), 400,
                     ("nested too deeply", "more than 64 levels"))  # fmt: skip
        padded = route.wrap(record_body())
        padded["padding"] = "x" * (17 * 2**20)
        checker.send(f"17 MiB -> {name}", route.path, encode(padded), 413, ("limit",))
        digits = b'{"key": ' + b"9" * 5000 + b"}"  # beyond Python's 4300-digit int parsing
        checker.send(f"a 5000-digit number -> {name}", route.path, digits, 400,
                     ("more than 4300 digits",))  # fmt: skip
        latin1 = b'{"key": "caf\xe9"}'
        checker.send(f"not UTF-8 -> {name}", route.path, latin1, 400, ("not UTF-8",))
        checker.unharmed(f"bombs -> {name}")
    failures = checker.finish()
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures)


def test_keys_built_in_python_are_checked_alike() -> None:
    """The client builds keys with :class:`Key`: the same shapes are refused there."""
    good = make_key()
    for problem, reason in [
        ({"M\n": 64}, "not an identifier"),
        ({"M": True, "N": 64, "K": 64}, "M=True is not an integer size"),
        ({"causal": True}, "at least one integer size"),
        ({"M": 2**63}, "outside 1..2147483647"),
        ({f"P{i}": 1 for i in range(33)}, "33 parameters"),
    ]:
        with pytest.raises(InvalidInput, match=re.escape(reason)):
            dataclasses.replace(good, problem=problem)
    flagged = dataclasses.replace(good, problem={"M": 64, "N": 64, "K": 64, "causal": True})
    assert KeyModel.from_key(flagged).to_key() == flagged


CLI_CASES = [
    pytest.param("get", "M=99999999999999999999999,N=1,K=1", "M=", id="get-M=10**23"),
    pytest.param("tune", "M=99999999999999999999999,N=1,K=1", "M=", id="tune-M=10**23"),
    pytest.param("get", "M=2147483648,N=1,K=1", "M=2147483648", id="get-M=2**31"),
    pytest.param("tune", "M=1,N=1,K=2147483648", "K=2147483648", id="tune-K=2**31"),
    pytest.param("tune", "M=1,N=0,K=1", "N=0", id="tune-N=0"),
    # One short line, not the whole 5,000-digit shape echoed back.
    pytest.param("get", "M=1,N=1,K=" + "9" * 5000, "K=", id="get-K-of-5000-digits"),
    # int() reads any Unicode digits: this must not be looked up as M=12.
    pytest.param("get", "M=\u0661\u0662,N=1,K=1", "M=", id="get-M-in-Arabic-Indic-digits"),
]  # fmt: skip


@pytest.mark.parametrize(("command", "shape", "names"), CLI_CASES)
def test_cli_refuses_absurd_shapes_with_one_line(
    shared_server: LiveServer, command: str, shape: str, names: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tunecache_cli", command, "matmul", "--backend", "tvm",
         "--shape", shape, "--server", shared_server.url],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[:300]
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr[:300]
    assert lines[0].startswith("tunecache: error:") and names in lines[0], lines[0][:300]
    assert len(lines[0]) < 200, lines[0][:300]
    records = httpx.get(f"{shared_server.url}/v1/records", headers=AUTH, timeout=10)
    assert records.status_code == 200 and records.json()["count"] == 0
