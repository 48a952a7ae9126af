"""What a hostile server (or anything in front of one) answers cannot raise into the caller, fill
its memory or serve another partition's data: answers nested past any parser's recursion, answers
compressed into bombs, answers larger than a call may read, items the request did not ask for.

The servers are hostile at the socket (:mod:`tests.hostile`), so the client's real transport is
under test. Times here are bounds, not speed: each failure mode took seconds or raised.
"""

from __future__ import annotations

import functools
import gzip
import itertools
import json
import logging
import socket
import time
import zlib
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

import tunecache.artifact_calls
import tunecache.client
import tunecache.http
import tunecache.jsonsafe
import tunecache.strict
from tests.factories import make_key, make_record
from tests.hostile import IDENTITY, Request, Seen, answer, serve
from tests.test_triton_autotune import run
from tunecache import Client, ServerError
from tunecache.artifacts import MAX_VALUE_BYTES, ArtifactList
from tunecache.errors import InvalidInput
from tunecache.http import deadline, parse
from tunecache.jsonsafe import json_problem
from tunecache.lookup import LookupResult
from tunecache.resolver import Resolver, Source
from tunecache.schemas import Health, LookupRequest, LookupResponse, Trial
from tunecache.snapshot import load_snapshot
from tunecache.strict import SERVED

SECONDS = 1.0
BOUND = SECONDS * 1.1
DEFAULT = {"schedule": "default"}
NESTED = b"[" * 20_000 + b"]" * 20_000  # Python's own json module raises RecursionError here


def nested_error(conn: socket.socket, request: Request, seen: Seen) -> None:
    """A proxy's error page, as JSON nested 20,000 deep (no tunecache identity)."""
    answer(conn, 502, NESTED, identity=False)


def nested_everything(conn: socket.socket, request: Request, seen: Seen) -> None:
    """Every answer is tunecache's, a 200, and nested 20,000 deep."""
    answer(conn, 200, NESTED)


@functools.cache
def _bomb(megabytes: int) -> bytes:
    """``{`` + spaces + ``}``, gzipped twice: a few KB on the wire, ``megabytes`` inflated."""
    squeeze = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: the gzip format
    spaces = b" " * (1 << 20)
    inner = b"".join([squeeze.compress(b"{"), *(squeeze.compress(spaces) for _ in range(megabytes)),
                      squeeze.compress(b"}"), squeeze.flush()])  # fmt: skip
    return gzip.compress(inner, compresslevel=9)


def gzip_bomb(conn: socket.socket, request: Request, seen: Seen) -> None:
    """256 MiB of JSON in two layers of gzip (``Content-Encoding: gzip, gzip``)."""
    bomb = _bomb(256)
    conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip, "
                 f"gzip\r\nContent-Length: {len(bomb)}\r\n{IDENTITY}\r\n".encode() + bomb)  # fmt: skip


def three_megabytes(conn: socket.socket, request: Request, seen: Seen) -> None:
    """A well-formed JSON answer of 3 MiB, at once."""
    answer(conn, 200, b'{"record": "' + b"x" * (3 << 20) + b'"}')


def timed_lookup(url: str) -> tuple[float, LookupResult]:
    with Client(url, timeout=SECONDS, token="") as client:
        started = time.monotonic()
        result = client.lookup(make_key(), default=DEFAULT)
        return time.monotonic() - started, result


@pytest.mark.parametrize("behaviour", [nested_error, nested_everything],
                         ids=lambda b: b.__name__)  # fmt: skip
def test_an_answer_nested_past_any_recursion_is_a_failed_call(behaviour: Any) -> None:
    with serve(behaviour) as (url, _), Client(url, timeout=SECONDS, token="") as client:
        for _ in range(2):  # and again: no state the first one left raises either
            assert client.lookup(make_key(), default=DEFAULT).source == "default"
        with pytest.raises(ServerError):
            client.fetch(make_key())
        with pytest.raises(ServerError, match="snapshot"):
            client.export_snapshot("cpu-avx2")
        with pytest.raises(ServerError):
            client.health()


def test_a_compressed_answer_is_refused_before_it_is_inflated(
    caplog: pytest.LogCaptureFixture,
) -> None:
    _bomb(256)  # made before the clock starts
    with serve(gzip_bomb) as (url, _), caplog.at_level(logging.WARNING):
        elapsed, result = timed_lookup(url)
    assert result.source == "default"
    assert elapsed <= BOUND, f"a {SECONDS} s lookup took {elapsed:.2f} s (inflating 256 MiB)"
    assert "encoded (gzip, gzip)" in caplog.text


def test_an_answer_over_the_calls_byte_limit_is_refused(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    with serve(three_megabytes) as (url, _), caplog.at_level(logging.WARNING):
        elapsed, result = timed_lookup(url)
        assert result.source == "default" and elapsed <= BOUND
        assert "the answer is over 2,097,152 bytes" in caplog.text  # a lookup's limit
        monkeypatch.setattr(tunecache.client, "MAX_ANSWER_BYTES", 1 << 20)  # any other call's
        with Client(url, timeout=SECONDS, token="") as client:
            with pytest.raises(ServerError, match="over 1,048,576 bytes"):
                client.export_snapshot("cpu-avx2")
            with pytest.raises(ServerError, match="over 1,048,576 bytes"):
                client.get_artifacts("tvm.record", "p", timeout=SECONDS)


def test_a_snapshot_file_nested_past_any_recursion_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "snapshot.json"
    path.write_bytes(b'{"records": ' + NESTED + b"}")
    with pytest.raises(InvalidInput, match="not a valid snapshot"):
        load_snapshot(path)
    with Client("http://127.0.0.1:9", snapshot=path, timeout=SECONDS, token="") as client:
        assert client.lookup(make_key(), default=DEFAULT).source == "default"


def test_a_snapshot_file_past_a_servers_snapshot_bounds_is_refused_unparsed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crafted file of 20 MB of empty lists cost a consumer's first lookup 7.5 s and 1.1 GB
    (parsed twice); past what a server's snapshot may hold it is refused before it is parsed,
    as ``tunecache sync`` refuses such an answer (the bounds made small here to keep it quick)."""
    import tunecache.snapshot

    path = tmp_path / "snapshot.json"
    path.write_bytes(b'{"records": [' + b",".join([b"[]"] * 2000) + b"]}")
    monkeypatch.setattr(tunecache.snapshot, "SNAPSHOT_CONTAINERS", 1000)
    with pytest.raises(InvalidInput, match=r"2,002 JSON arrays and objects .* at most 1,000"):
        load_snapshot(path)
    monkeypatch.setattr(tunecache.snapshot, "MAX_ANSWER_BYTES", 1000)
    with pytest.raises(InvalidInput, match="over 1,000 bytes"):
        load_snapshot(path)
    with Client("http://127.0.0.1:9", snapshot=path, timeout=SECONDS, token="") as client:
        assert client.lookup(make_key(), default=DEFAULT).source == "default"


def _item(item_id: int, partition: str, key: str) -> dict[str, Any]:
    return {"id": item_id, "namespace": "tvm.record", "partition": partition, "key": key,
            "item": "", "value": {"v": item_id}, "score": 1.0,
            "updated_at": "2026-01-01T00:00:00Z"}  # fmt: skip


def test_artifacts_of_another_partition_or_key_are_left_out() -> None:
    items = [_item(1, "mine", "k"), _item(2, "theirs", "k"), _item(3, "mine", "other")]

    def mixed(conn: socket.socket, request: Request, seen: Seen) -> None:
        answer(conn, 200, json.dumps({"items": items, "next_after": None}).encode())

    with serve(mixed) as (url, _), Client(url, timeout=SECONDS, token="") as client:
        assert [i.id for i in client.get_artifacts("tvm.record", "mine")] == [1, 3]
        assert [i.id for i in client.get_artifacts("tvm.record", "mine", key="k")] == [1]
        assert client.get_artifacts("inductor.choices", "mine") == []


class Raising(Source):
    def get(self, key: Any, digest: str) -> LookupResult | None:
        raise RecursionError("a source's bug")


class Answering(Source):
    def get(self, key: Any, digest: str) -> LookupResult | None:
        return LookupResult(config={"BLOCK": 64}, source="snapshot")


def test_a_source_or_a_fit_that_raises_never_reaches_the_caller(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def fits(config: dict[str, Any]) -> str | None:
        raise ValueError("a fit's bug")

    with caplog.at_level(logging.WARNING):
        assert Resolver([Raising(), Answering()]).resolve(make_key()).config == {"BLOCK": 64}
        assert "Raising failed (RecursionError: a source's bug)" in caplog.text
        found = Resolver([Answering()]).resolve(make_key(), default=DEFAULT, fits=fits)
    assert found.source == "default"
    assert "checking it raised ValueError: a fit's bug" in caplog.text


@pytest.mark.slow
def test_the_triton_drop_in_launches_whatever_the_server_answers() -> None:
    """The user's launch runs, and is right, against a server whose every answer is nested past
    Python's recursion limit (it raised RecursionError out of the launch)."""
    with serve(nested_error) as (url, seen):
        out, err = run({"TUNECACHE_URL": url, "TUNECACHE_TOKEN": ""})
    assert "POST /v1/lookup" in seen.requests
    # A proxy's 502 is no answer: the first config runs, nothing tuned (as the server down)
    assert "Traceback" not in err and out["bench"] == 0


def test_a_page_that_is_not_tunecaches_is_named_as_such() -> None:
    """A 200 HTML page (a wrong URL, a captive portal) was a failed call like an unreachable one:
    ``tunecache get`` said exit 3, the server could not be reached."""

    def portal(conn: socket.socket, request: Request, seen: Seen) -> None:
        answer(conn, 200, b"<html>Sign in to the Wi-Fi</html>", identity=False,
               content_type="text/html")  # fmt: skip

    with (
        serve(portal) as (url, _),
        Client(url, timeout=SECONDS, token="") as client,
        pytest.raises(ServerError, match="not a tunecache server") as refused,
    ):
        client.fetch(make_key())
    assert refused.value.foreign


def test_an_unchanged_snapshot_is_read_whatever_encoding_a_proxy_names() -> None:
    """A 304 has no body to inflate: a caching proxy that repeats ``Content-Encoding`` on it is
    not refused (the encoded-answer refusal would have made every unchanged sync fail)."""

    def unchanged(conn: socket.socket, request: Request, seen: Seen) -> None:
        conn.sendall(f"HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\nContent-Encoding: gzip\r\n"
                     f"{IDENTITY}\r\n".encode())  # fmt: skip

    with serve(unchanged) as (url, _), Client(url, timeout=SECONDS, token="") as client:
        assert client.export_snapshot("cpu-avx2", if_none_match='"v1"') == (None, '"v1"')


def test_a_snapshot_answer_unasked_for_is_refused_not_written() -> None:
    """``sync`` with no snapshot of the arch here sends no ETag: a server (or a proxy) answering
    304 had it say "is up to date", exit 0, with no file written; a snapshot of another arch
    than asked was written as this one's. Each is a bad answer now (exit 3)."""
    from tunecache.snapshot import SnapshotFilters, render_snapshot

    other = render_snapshot(SnapshotFilters(device_arch="cpu-avx512"), [])[0]

    def unasked(conn: socket.socket, request: Request, seen: Seen) -> None:
        if "kernel=other" not in request.path:
            conn.sendall(f'HTTP/1.1 304 Not Modified\r\nETag: "e"\r\n{IDENTITY}\r\n'.encode())
        else:
            answer(conn, 200, other)

    with serve(unasked) as (url, _), Client(url, timeout=SECONDS, token="") as client:
        with pytest.raises(ServerError, match="304 Not Modified where no ETag was sent"):
            client.export_snapshot("cpu-avx2")
        with pytest.raises(ServerError, match="a snapshot of other filters than asked"):
            client.export_snapshot("cpu-avx2", kernel="other")


def _served_record(key: Any, **changes: Any) -> dict[str, Any]:
    """A record of ``key`` as a server answers it, with ``changes`` to its fields."""
    data = make_record(key).model_dump(mode="json", by_alias=True)
    return {**data, "id": 7, "key_hash": "0" * 64, "created_at": "2026-01-01T00:00:00Z", **changes}


def test_an_answer_of_a_million_empty_lists_is_refused_before_it_is_parsed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A valid record with 1.8 MiB of trials whose configs are empty lists (under a lookup's 2
    MiB): parsing and checking it took 5 s of a 0.5 s lookup, and it was served (a server
    never sends a lookup's trials). Now its brackets are counted before it is parsed."""
    junk = [{"config": {"a": [[]] * 80_000}, "status": "invalid"}] * 8

    def many_lists(conn: socket.socket, request: Request, seen: Seen) -> None:
        key = LookupRequest.model_validate_json(request.body).key.to_key()
        body = {"record": _served_record(key, trials=junk)}
        answer(conn, 200, json.dumps(body, separators=(",", ":")).encode())

    with serve(many_lists) as (url, _), caplog.at_level(logging.WARNING):
        elapsed, result = timed_lookup(url)
    assert result.source == "default" and elapsed <= BOUND
    assert "640,043 JSON arrays and objects (or brackets), where at most 65,536" in caplog.text


def test_an_artifact_read_holds_a_bounded_number_of_containers_over_all_its_pages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each page under the bound, together over it: 256 MiB of empty lists over pages took 10
    minutes and 9 GiB to read (all of it parsed, 87 million lists)."""
    monkeypatch.setattr(tunecache.artifact_calls, "READ_CONTAINERS", 3000)
    item = {**_item(1, "p", "k"), "value": {"v": [[]] * 1000}}

    def pages(conn: socket.socket, request: Request, seen: Seen) -> None:
        after = int(request.path.partition("after=")[2].partition("&")[0] or 0)
        page = {"items": [{**item, "id": after + 1}], "next_after": after + 1}
        answer(conn, 200, json.dumps(page).encode())

    refused = r"1,00\d JSON arrays and objects .* at most 9\d\d"
    with (
        serve(pages) as (url, seen),
        Client(url, timeout=SECONDS, token="") as client,
        pytest.raises(ServerError, match=refused),
    ):
        client.get_artifacts("tvm.record", "p", timeout=SECONDS)
    assert len(seen.requests) == 3  # two pages read, the third refused
    with pytest.raises(ValidationError, match="at most 1000 items"):
        ArtifactList.model_validate({"items": [_item(i, "p", "k") for i in range(1, 1002)]})


def test_an_artifact_read_of_a_flat_list_is_refused_unparsed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Numbers and strings are built as Python objects too: one item whose value was a flat list
    of 16 million zeros (7 containers in 64 MiB) took 10 s and 1.4 GB to parse, past a TVM
    database's 0.5 s deadline, before its value was refused as too large. Values of any kind
    are counted before the parse, over all the pages of a read."""
    monkeypatch.setattr(tunecache.artifact_calls, "READ_VALUES", 100_000)
    flat = {**_item(1, "p", "k"), "value": {"v": [0] * 60_000}}

    def pages(conn: socket.socket, request: Request, seen: Seen) -> None:
        after = int(request.path.partition("after=")[2].partition("&")[0] or 0)
        page = {"items": [{**flat, "id": after + 1}], "next_after": after + 1}
        answer(conn, 200, json.dumps(page).encode())

    with (
        serve(pages) as (url, seen),
        Client(url, timeout=SECONDS, token="") as client,
        pytest.raises(ServerError, match=r"about [\d,]+ JSON values .* at most [\d,]+ are read"),
    ):
        client.get_artifacts("tvm.record", "p", timeout=SECONDS)
    assert len(seen.requests) == 2  # a page read, the second past what is left


def test_an_honest_read_of_many_pages_passes_each_pages_bound_and_stops_at_the_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each page is bounded on its own (its parse, before the deadline is looked at again), and
    the read over all its pages by four times that: one bound for both refused a partition of
    20,000 Inductor groups of 50 choices each, marking the team cache down for the process."""
    monkeypatch.setattr(tunecache.artifact_calls, "PAGE_VALUES", 3000)
    monkeypatch.setattr(tunecache.artifact_calls, "READ_VALUES", 12_000)
    timings = {f"c{i}": 0.5 for i in range(50)}  # a group's 50 choices: 200 values and more

    def pages(conn: socket.socket, request: Request, seen: Seen) -> None:
        after = int(request.path.partition("after=")[2].partition("&")[0] or 0)
        items = [{**_item(after + i, "p", f"k{after + i}"), "value": {"timings": timings}}
                 for i in range(1, 11)]  # fmt: skip
        page = {"items": items, "next_after": after + 10 if after < 30 else None}
        answer(conn, 200, json.dumps(page).encode())

    with serve(pages) as (url, _), Client(url, timeout=SECONDS, token="") as client:
        assert len(client.get_artifacts("tvm.record", "p", timeout=SECONDS)) == 40
        monkeypatch.setattr(tunecache.artifact_calls, "READ_VALUES", 9_000)
        with pytest.raises(ServerError, match="JSON values"):
            client.get_artifacts("tvm.record", "p", timeout=SECONDS)


def test_a_keys_artifact_read_is_bounded_by_what_its_items_can_hold() -> None:
    """A key's page of ``limit`` items is at most ``limit`` items' bytes: one Inductor config
    (one item, 256 KiB of value at most) was read up to the 256 MiB every answer may be."""
    big = {**_item(1, "p", "k"), "value": {"v": "x" * (3 * MAX_VALUE_BYTES)}}

    def one(conn: socket.socket, request: Request, seen: Seen) -> None:
        answer(conn, 200, json.dumps({"items": [big], "next_after": None}).encode())

    with serve(one) as (url, _), Client(url, timeout=SECONDS, token="") as client:
        with pytest.raises(ServerError, match="the answer is over 528,384 bytes"):
            client.get_artifacts("inductor.autotune", "p", key="k", limit=1, timeout=SECONDS)
        with pytest.raises(ServerError, match="bytes; the limit is"):  # read, then refused
            client.get_artifacts("inductor.autotune", "p", key="k", limit=2, timeout=SECONDS)


def test_an_answer_read_past_the_calls_deadline_is_a_failed_call() -> None:
    """Parsing and checking an answer is part of the call: one read past the deadline fails
    (and a lookup then skips the server a while) rather than serving a slow hostile answer."""
    response = httpx.Response(200, json={"database": "sqlite", "records": 1, "version": "1"})
    assert parse(Health, response, "/health").records == 1
    with deadline(0.01), pytest.raises(ServerError, match="past the call's deadline"):
        time.sleep(0.02)
        parse(Health, response, "/health")


def test_an_answer_is_walked_for_unsafe_json_once_not_once_per_nested_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each nested model walked its part of the body again (a lookup answer three times and
    more); a nested model validated on its own is still walked."""
    walks: list[str] = []

    def counted(data: Any, root: str = "body") -> str | None:
        walks.append(root)
        return json_problem(data, root)

    body = json.dumps({"record": _served_record(make_key())})
    monkeypatch.setattr(tunecache.strict, "json_problem", counted)
    LookupResponse.model_validate_json(body, context=SERVED)
    assert walks == ["LookupResponse"]
    with pytest.raises(ValidationError, match="NaN"):
        LookupResponse.model_validate_json(body.replace('"time_ms": 1.0', '"time_ms": NaN', 1))
    Trial.model_validate({"config": {}, "status": "invalid"})
    assert walks[-1] == "Trial"


def test_brackets_inside_a_records_strings_are_not_counted_as_containers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A write token's winning record whose 200 check notes held 102,400 brackets: every
    consumer refused its answer as too many arrays and objects (and skipped the server a while),
    though it holds a few dozen."""

    def bracketed(conn: socket.socket, request: Request, seen: Seen) -> None:
        key = LookupRequest.model_validate_json(request.body).key.to_key()
        record = _served_record(key)
        check = {**record["validation"]["checks"][0], "note": "[{" * 256}
        record["validation"]["checks"] = [check] * 200
        answer(conn, 200, json.dumps({"record": record}, separators=(",", ":")).encode())

    with serve(bracketed) as (url, _), caplog.at_level(logging.WARNING):
        elapsed, result = timed_lookup(url)
    assert "JSON arrays and objects" not in caplog.text
    assert result.source == "server" and elapsed <= BOUND


@pytest.mark.parametrize("status", [200, 404])
def test_a_string_that_never_ends_is_counted_past_at_once(status: int) -> None:
    """``"`` + ``\\"`` × 32,000 (64 KB): the count of arrays and objects before the parse
    searched for each quote's end again from the next quote, 14 s at C speed holding the GIL:
    a lookup (or an error answer read as JSON) stood the whole process still past its deadline.
    An unended string is an answer that does not parse: the default, within the deadline."""
    body = b'"' + b'\\"' * (1 << 16)

    def unended(conn: socket.socket, request: Request, seen: Seen) -> None:
        answer(conn, status, body)

    with serve(unended) as (url, _):
        elapsed, result = timed_lookup(url)
    assert result.source == "default" and elapsed <= BOUND, elapsed
    assert tunecache.jsonsafe.containers(b'["a\\\n[", {"b": "\\"]"}]') == 2  # escapes, any byte
    assert tunecache.jsonsafe.containers(b'[{}, "[{') == 2  # to the end: what follows is string


@pytest.mark.parametrize("charset", ["hex", "rot13", "base64", "no-such-codec"])
def test_an_error_answer_in_any_charset_is_a_failed_call(charset: str) -> None:
    """An error answer naming a charset of Python's bytes codecs (``charset=hex``) made httpx's
    text decoding raise AssertionError or TypeError: ``tunecache.inductor.enable()`` raised it
    into the user's code and the daemon died on one 502. It is a failed call, read as UTF-8."""
    from tunecache.inductor.remote import TeamCache

    def odd(conn: socket.socket, request: Request, seen: Seen) -> None:
        answer(conn, 500, b'{"detail": "broken"}',
               content_type=f"application/json; charset={charset}")  # fmt: skip

    with serve(odd) as (url, _):
        with Client(url, timeout=SECONDS, token="") as client:
            with pytest.raises(ServerError, match="500: broken") as failed:
                client.fetch(make_key())
            assert failed.value.status_code == 500
        team = TeamCache(url, "", "partition", timeout=SECONDS)
        with pytest.warns(Warning):
            assert team.fetch("inductor.choices") == []


@pytest.mark.parametrize("status", [404, 422, 500])
def test_an_error_answer_of_a_million_empty_lists_is_read_as_text(
    status: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error answer's body was parsed as JSON with no bound (to tell a miss from a missing
    route, to say the server's reason): 2 MiB of empty lists in a 404 took seconds of a lookup's
    half second, 256 MiB in a 500 would have held tens of GB. Past its bounds it is text."""
    import tunecache.jsonsafe

    parsed: list[int] = []
    real = tunecache.jsonsafe.parse_json
    monkeypatch.setattr(tunecache.http, "parse_json", lambda b: parsed.append(len(b)) or real(b))
    junk = b"[" + b"[]," * 300_000 + b"[]]"  # 0.9 MB, 300,002 containers

    def lists(conn: socket.socket, request: Request, seen: Seen) -> None:
        answer(conn, status, junk)

    with serve(lists) as (url, _), Client(url, timeout=SECONDS, token="") as client:
        try:
            assert client.fetch(make_key()) is None and status == 404  # a miss, as it says
        except ServerError as failed:
            assert failed.status_code == status != 404
    assert parsed == []


def test_a_tunecache_servers_bad_answer_is_exit_3_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """docs/cli.md: exit 3 is a server that could not be reached or whose answer does not read
    as one; never a miss (1) or a traceback."""
    from tunecache_cli import main

    with serve(nested_everything) as (url, _):
        code = main(["get", "matmul", "--backend", "tvm", "--shape", "M=64,N=64,K=64",
                     "--server", url])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 3 and "bad answer" in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1


def test_an_unavailable_server_is_exit_3_never_a_miss(capsys: pytest.CaptureFixture[str]) -> None:
    """A 503 (a server shedding load, or its database down) made `get` exit 1, a miss's code."""
    from tunecache_cli import main

    def unavailable(conn: socket.socket, request: Request, seen: Seen) -> None:
        answer(conn, 503, b'{"status": 503, "detail": "the database is not answering", '
                          b'"errors": []}')  # fmt: skip

    with serve(unavailable) as (url, _):
        code = main(["get", "matmul", "--backend", "tvm", "--shape", "M=64,N=64,K=64",
                     "--server", url])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 3 and "503" in err and "not answering" in err, err
    from tunecache_cli import server_exit  # a 503 from what is not a tunecache server: its URL

    assert server_exit(ServerError("a proxy's 503", status_code=503, foreign=True)) == 2


def shed(times: int, item_id: int = 1, asked: int = 1) -> Any:
    """A tunecache server that sheds its first ``times`` requests (503, ``Retry-After: asked``),
    then lists one artifact, ``item_id``."""

    def behaviour(conn: socket.socket, request: Request, seen: Seen) -> None:
        if len(seen.requests) <= times:
            body = b'{"status": 503, "detail": "busy", "errors": []}'
            conn.sendall(f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json"
                         f"\r\nRetry-After: {asked}\r\nContent-Length: {len(body)}\r\n{IDENTITY}"
                         f"\r\n".encode() + body)  # fmt: skip
            return
        page = {"items": [_item(item_id, "partition", "key")], "next_after": None}
        answer(conn, 200, json.dumps(page).encode())

    return behaviour


def test_the_tvm_database_asks_again_after_a_shed_read() -> None:
    """One 503 with Retry-After (a server shedding load) made a process's TVM database stop
    asking for good: that rank built TVM's default schedule while the others built the tuned
    one. It asks again within its timeout where the Retry-After allows (MetaSchedule asks once a
    compile); where it does not, it pauses for the Retry-After, and a failed answer is never
    kept as the answer."""
    from tunecache.tvm.remote import Remote

    with serve(shed(1)) as (url, seen):
        remote = Remote(url, "", 3.0, "partition")  # a timeout with room for the Retry-After
        items = remote.get("tvm.record", "key", 8)  # shed, then asked once more: answered
        assert items is not None and [i.id for i in items] == [1] and len(seen.requests) == 2
        remote.close()
    with serve(shed(1)) as (url, seen):
        remote = Remote(url, "", SECONDS, "partition")  # no room: not asked again in the call
        assert remote.get("tvm.record", "key", 8) is None and remote.down is None
        assert remote.get("tvm.record", "key", 8) is None  # paused: not asked
        assert len(seen.requests) == 1
        time.sleep(1.1)
        items = remote.get("tvm.record", "key", 8)
        remote.close()
    assert items is not None and [i.id for i in items] == [1]


def test_a_server_asking_for_no_wait_is_not_asked_again_at_once() -> None:
    """A server shedding every request with ``Retry-After: 0`` was asked 34 times in a read of
    2 s (one request per 50 ms, for as long as the caller waited): each ask now waits at least
    twice as long as the one before."""
    from tunecache.tvm.remote import Remote

    with serve(shed(10**6, asked=0)) as (url, seen):
        remote = Remote(url, "", 2.0, "partition")
        assert remote.get("tvm.record", "key", 8) is None
        remote.close()
    assert 2 <= len(seen.requests) <= 6, len(seen.requests)


def slow_shed(conn: socket.socket, request: Request, seen: Seen) -> None:
    """A tunecache server answering each request late, with 503 and ``Retry-After: 0``."""
    time.sleep(0.2)
    body = b'{"status": 503, "detail": "busy", "errors": []}'
    conn.sendall(f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                 f"Retry-After: 0\r\nContent-Length: {len(body)}\r\n{IDENTITY}\r\n".encode()
                 + body)  # fmt: skip


def test_a_server_asking_for_no_wait_cannot_make_every_lookup_wait_for_it() -> None:
    """The server's ``Retry-After`` could only shorten the pause after a failure: one answering
    each lookup near the lookup timeout with 503 and ``Retry-After: 0`` was asked by every
    lookup, each waiting for it (10 lookups, 10 requests, 4.5 s at a 0.5 s timeout). Now the
    pause is at least 0.1 s, doubled for each failure since the server last answered."""
    with serve(slow_shed) as (url, seen), Client(url, timeout=SECONDS, token="") as client:
        looked = [client.lookup(make_key(m=16 * (i + 1)), default=DEFAULT) for i in range(10)]
    assert {result.source for result in looked} == {"default"}
    # the rest skipped, the server down (3: a machine stalled twice past a pause; 10 before)
    assert len(seen.requests) <= 3, len(seen.requests)


def test_the_inductor_team_cache_asks_once_more_after_a_shed_read() -> None:
    """One 503 with Retry-After marked the team cache down: that rank autotuned on its own."""
    from tunecache.inductor.remote import TeamCache

    with serve(shed(1, item_id=7)) as (url, seen):
        team = TeamCache(url, "", "partition", timeout=3.0)  # room for the Retry-After
        items = team.fetch("tvm.record")  # the namespace of the items served
        team.close()
    assert [i.id for i in items] == [7] and not team.down and len(seen.requests) == 2


def test_the_tvm_database_waits_longer_each_time_a_server_sheds_it() -> None:
    """The TVM database paused a second after each shed read, whatever came before: a server
    shedding every read near the timeout with ``Retry-After: 0`` was asked each second of a
    compile, each read waiting for it. Each pause in a row past the first few is twice as
    long as the one before (to :data:`~tunecache.tvm.remote.MAX_PAUSE`); an answer resets it."""
    from tunecache.tvm.remote import MAX_PAUSE, Remote

    pauses = []
    with serve(shed(12)) as (url, seen):  # Retry-After: 1, past the timeout: one ask a call
        remote = Remote(url, "", SECONDS, "partition")
        for _ in range(12):  # each pause as bounds: a busy machine stalls between the clocks
            before = time.monotonic()
            assert remote.get("tvm.record", "key", 8) is None and remote.down is None
            after = time.monotonic()
            pauses.append((remote.paused_until - after, remote.paused_until - before))
            remote.paused_until = 0.0  # the pause ran out
        items = remote.get("tvm.record", "key", 8)
        assert items is not None and [i.id for i in items] == [1]
        remote.close()
    assert all(low <= 1.0 <= high for low, high in pauses[:4]), pauses
    assert pauses[-1][0] <= MAX_PAUSE <= pauses[-1][1], pauses
    assert all(b[1] >= a[0] for a, b in itertools.pairwise(pauses)), pauses  # never shorter
    assert remote._shed == 0 and len(seen.requests) == 13
