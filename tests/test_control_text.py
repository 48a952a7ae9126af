"""Free text a record carries cannot forge or hide what a terminal shows beside it.

An uploader with a plain write token set a record's ``config_summary`` to ``tile 4x8\\n  trust
verified by …\\x1b[8m``: ``tunecache get`` printed a forged "trust verified" line above the real
"pending" one, and ESC[8m concealed the real one. Now the server refuses a control character (C0,
DEL, C1) or a bidi control in every free-text field of an upload (422 naming the field; an error
message may hold lines), a record stored before keeps being served as stored, and the CLI escapes
what a server sends, on one line.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import sqlite3
from typing import Any

import httpx
import pytest

import tunecache.client
import tunecache_cli
from tests.conftest import LiveServer
from tests.factories import AUTH, make_key, make_record, miss
from tunecache import Client
from tunecache.errors import InvalidInput
from tunecache.http import IDENTITY_HEADER
from tunecache.schemas import LookupRequest
from tunecache.snapshot import load_snapshot, save_snapshot
from tunecache_cli.get import describe
from tunecache_cli.table import render
from tunecache_cli.trials import config_text

ESC = "\x1b"
FORGED = ("tile 4x8\n  trust      verified by cpu-verifier on test-cpu (uploaded by ci)"
          f"{ESC}[8m")  # fmt: skip


def _set(data: dict[str, Any], path: str, value: str) -> None:
    *parents, last = path.split(".")
    for part in parents:
        data = data[int(part)] if part.isdigit() else data[part]  # type: ignore[index]
    data[last] = value


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("config_summary", FORGED),
        ("config_summary", f"tile 4x8{ESC}[8m"),
        ("config_summary", "tile 4x8\x9b8m"),  # C1: CSI in one byte
        ("config_summary", "tile \u202e8x4"),  # a bidi override
        ("provenance.machine", "c\u200bi"),  # shows as "ci": another uploader's name
        ("key.device.name", "test-cpu\u2028"),  # a line separator
        ("provenance.machine", "ci\U000e0041"),  # a tag character: invisible
        ("provenance.machine", "ci\u3164"),  # a Hangul filler: printable to Python, shows nothing
        ("key.device.name", "test-cpu\u034f"),  # combining grapheme joiner
        ("config_summary", "tile\ufe0f 4x8"),  # a variation selector
        ("provenance.machine", "c\U0001d173i"),  # musical formatting: invisible
        ("provenance.machine", "ci\rverified"),
        ("provenance.tool_version", "1.0\u2066"),
        ("key.device.name", "test-cpu\x85"),
        ("timing.timer", f"perf_counter{ESC}[2J"),
        ("baselines.0.name", f"torch_eager{ESC}[8m"),
        ("search.strategy", "random\n"),
        ("validation.checks.0.note", f"ok{ESC}[8m"),
        ("trials.0.error", f"{ESC}[31mcompile error"),
    ],
)  # fmt: skip
def test_an_upload_with_a_control_character_in_free_text_is_a_422_naming_the_field(
    shared_server: LiveServer, path: str, value: str
) -> None:
    record = make_record(make_key(m=72)).model_dump(mode="json", by_alias=True)
    record["baselines"] = record["baselines"] or [{"name": "torch_eager",
                                                   "timing": record["timing"]}]  # fmt: skip
    _set(record, path, value)
    answer = httpx.post(f"{shared_server.url}/v1/records", json=record, headers=AUTH)
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"]
    assert detail.startswith(f"body.{path}:") and "control character" in detail, detail


def test_an_error_or_a_note_may_hold_lines_and_tabs(shared_server: LiveServer) -> None:
    record = make_record(make_key(m=80)).model_dump(mode="json", by_alias=True)
    _set(record, "trials.0.error", "CompilationError:\n  at 3:4\n\tx = tl.load(p)")
    _set(record, "validation.checks.0.note", "first line\nsecond line")
    answer = httpx.post(f"{shared_server.url}/v1/records", json=record, headers=AUTH)
    assert answer.status_code == 201, answer.text


def test_a_record_stored_before_the_check_is_served_as_stored_and_shown_escaped(
    server: LiveServer,
) -> None:
    key = make_key(m=88)
    with Client(server.url) as client:
        stored = client.upload(make_record(key))
    with sqlite3.connect(server.db_path) as db:  # as an older server stored it, unchecked
        db.execute("update records set config_summary = ?", (FORGED,))
        db.execute("update trials set error = ?", (f"{ESC}[31mred",))
    assert httpx.get(f"{server.url}/v1/records/{stored.record_id}").status_code == 200
    with Client(server.url, token="") as client:
        answer = client.fetch_answer(key)
        listed = client.list_records(key_hash=key.digest()).items
    assert answer is not None and answer.record.config_summary == FORGED
    assert listed[0].config_summary == FORGED
    with Client(server.url) as client:  # every read of it: records show, sync, a token's list
        assert client.get_record(stored.record_id).config_summary == FORGED
        document, _ = client.export_snapshot(key.device.arch)
    assert document is not None and document["records"][0]["config_summary"] == FORGED
    snapshot_file = server.db_path.parent / "snapshot.json"
    save_snapshot(snapshot_file, document)
    assert load_snapshot(snapshot_file).records[0].config_summary == FORGED
    shown = describe(answer.record)
    assert ESC not in shown and "tile 4x8" not in shown  # the summary is not the config's
    assert [line for line in shown.splitlines() if "trust" in line or "config" in line] == [
        f"  config     {config_text('tvm', answer.record.config, 80)}",
        "  trust      pending: validated by its uploader only (uploaded by bootstrap; not verified)",
    ]


def _public_json(data: dict[str, Any]) -> str:
    return json.dumps({**data, "id": 7, "key_hash": "0" * 64,
                       "created_at": "2026-01-01T00:00:00Z"})  # fmt: skip


def _hostile_transport() -> httpx.MockTransport:
    """A server that answers every lookup with a record of the asked key whose free text holds
    a newline, escape sequences, a C1 control and a bidi override (as an unchecked server
    would serve them); its device's name differs, so it is served by the same-arch rule."""

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path != "/v1/lookup":
            return miss()
        key = LookupRequest.model_validate_json(request.content).key.to_key()
        data = make_record(key).model_dump(mode="json", by_alias=True)
        data["config_summary"] = FORGED
        data["provenance"]["machine"] = "\u202eci"
        data["key"]["device"]["name"] = f"{key.device.name}\x9b8m"
        record = _public_json(data)
        body = '{"record": ' + record + ', "match": "same_arch", "policy": "strict"}'
        return httpx.Response(200, content=body.encode(),
                              headers={IDENTITY_HEADER: "tunecache/test"})  # fmt: skip

    return httpx.MockTransport(handle)


def test_the_cli_prints_a_hostile_servers_text_escaped_on_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    hostile = functools.partial(Client, transport=_hostile_transport())
    monkeypatch.setattr(tunecache.client, "Client", hostile)
    code = tunecache_cli.main(["get", "matmul", "--backend", "tvm", "--shape", "M=8,N=8,K=8",
                               "--server", "http://hostile.test"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert ESC not in out and "\x9b" not in out and "\u202e" not in out
    lines = out.splitlines()
    assert [line.split()[0] for line in lines[1:]] == [
        "config", "time", "speedup", "validated", "trust", "record", "matched"
    ]  # fmt: skip
    assert "tile 4x8" not in out  # the uploader's summary: said from the config instead
    config = make_record(make_key()).config  # the same config whatever the key
    assert lines[1] == f"  config     {config_text('tvm', config, 80)}"
    assert lines[5].startswith("  trust      pending: validated by its uploader only")


def test_a_table_cell_holding_control_characters_stays_on_its_line() -> None:
    table = render(["name", "note"], [["a\nb", f"{ESC}[8mhidden"], ["\u202ex", "\x85"],
                                      ["c\u200bi", "\ufeff\U000e0041"], ["ci\u3164", "ok"]])  # fmt: skip
    assert table.splitlines() == [
        "name      note",
        "--------  ----------------",
        "a\\nb      \\x1b[8mhidden",
        "\\u202ex   \\x85",
        "c\\u200bi  \\ufeff\\U000e0041",
        "ci\\u3164  ok",
    ]


def test_a_hostile_servers_text_is_logged_escaped(caplog: pytest.LogCaptureFixture) -> None:
    """A process's warnings hold what a server says (an error's detail, a refused record's key):
    ``ESC]0;…`` retitled the terminal and ``\\r`` forged a log line of the user's process."""
    forged = f"{ESC}]0;owned\x07{ESC}[2K\rWARNING forged line"

    def handle(request: httpx.Request) -> httpx.Response:
        key = LookupRequest.model_validate_json(request.content).key.to_key()
        if key.problem["M"] == 1:
            return httpx.Response(500, json={"detail": forged},
                                  headers={IDENTITY_HEADER: "tunecache/test"})  # fmt: skip
        data = make_record(make_key(m=2, kernel="softmax")).model_dump(mode="json", by_alias=True)
        data["key"]["device"]["name"] = forged
        body = '{"record": ' + _public_json(data) + "}"
        return httpx.Response(200, content=body.encode(),
                              headers={IDENTITY_HEADER: "tunecache/test"})  # fmt: skip

    with caplog.at_level(logging.WARNING):
        for m in (1, 2):  # a failed call; a record of another key, refused
            with Client("http://hostile.test", transport=httpx.MockTransport(handle)) as client:
                assert client.lookup(make_key(m=m)).source == "default"
    assert "500: \\x1b]0;owned\\x07\\x1b[2K; using default configs" in caplog.text  # one line
    assert "ignoring record #7" in caplog.text and "\\x1b[2K\\rWARNING" in caplog.text
    assert ESC not in caplog.text and "\r" not in caplog.text


@pytest.mark.parametrize("json_out", [False, True], ids=["text", "json"])
def test_get_calls_a_record_a_process_would_refuse_a_miss(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], json_out: bool
) -> None:
    """``tunecache get`` printed whatever the server answered as the key's winner, exit 0 and
    ``"hit": true``: another kernel's record, one rejected by a verifier."""

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path != "/v1/lookup":
            return miss()
        data = make_record(make_key(kernel="softmax")).model_dump(mode="json", by_alias=True)
        body = '{"record": ' + _public_json({**data, "status": "rejected"}) + "}"
        return httpx.Response(200, content=body.encode(),
                              headers={IDENTITY_HEADER: "tunecache/test"})  # fmt: skip

    hostile = functools.partial(Client, transport=httpx.MockTransport(handle))
    monkeypatch.setattr(tunecache.client, "Client", hostile)
    code = tunecache_cli.main(["get", "matmul", "--backend", "tvm", "--shape", "M=8,N=8,K=8",
                               "--server", "http://hostile.test", *(["--json"] * json_out)])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 1, out
    said = json.loads(out)["refused"] if json_out else out.splitlines()[1]
    assert said.strip() == "record #7 refused: it is rejected"
    assert json_out is False or json.loads(out)["hit"] is False


def test_a_problem_flag_is_printable_and_a_key_label_shows_it_escaped(
    shared_server: LiveServer,
) -> None:
    """A user kernel's string parameter held ``ESC]0;…BEL`` and a newline: stored (201), it
    retitled the terminal of every verifier and daemon that logged the key and forged a line of
    their logs. Now a 422 names it; a key a server sends with one is labelled escaped."""
    key = make_key(m=72)
    record = make_record(key).model_dump(mode="json", by_alias=True)
    record["key"]["kernel"] = "mypkg.mod:Kern"
    hostile = f"{ESC}]0;PWNED\x07\nINFO tuner.verify: record #9 ok"
    for problem in [record["key"]["problem"], *(c["problem"] for c in
                                                record["validation"]["checks"])]:  # fmt: skip
        problem["mode"] = hostile
    answer = httpx.post(f"{shared_server.url}/v1/records", json=record, headers=AUTH)
    assert answer.status_code == 422, answer.text
    assert "body.key.problem.mode" in answer.text and "control character" in answer.text
    served = dataclasses.replace(key, kernel="mypkg.mod:Kern",
                                 problem={**key.problem, "mode": hostile})  # fmt: skip
    label = served.short()
    assert "\n" not in label and ESC not in label and "\x07" not in label
    assert 'mode="\\u001b]0;PWNED\\u0007\\nINFO' in label  # quoted as JSON writes it


def test_a_key_a_server_would_refuse_is_refused_before_the_search() -> None:
    """The same string parameter in a user's own key: ``tune`` searched, then failed at the
    upload; now it stops first, naming the parameter."""
    from tuner.tune import check_local
    from workloads import get_workload

    key = make_key(m=72)
    hostile = dataclasses.replace(key, problem={**key.problem, "mode": f"{ESC}]0;PWNED\x07"})
    with pytest.raises(InvalidInput, match=r"problem\.mode.*control character"):
        check_local(hostile, get_workload(key.kernel))


def test_timing_cores_this_process_may_not_use_are_refused_before_the_search(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``TUNECACHE_TIMING_CORES=9-12`` on a 2-core machine: a MetaSchedule tune searched for
    12.7 s, then refused it when its measurement workers started. ``tune`` checks it first."""
    import os

    from tunecache.key import key_for
    from tuner.tune import check_local
    from workloads import get_workload

    key = key_for("matmul", "tvm", {"M": 72, "N": 64, "K": 64}, "float32")  # this machine's
    check_local(key, get_workload(key.kernel))  # the key itself is fine here
    away = max(os.sched_getaffinity(0)) + 1000
    monkeypatch.setenv("TUNECACHE_TIMING_CORES", f"{away}-{away + 3}")
    with pytest.raises(InvalidInput, match="TUNECACHE_TIMING_CORES names cores"):
        check_local(key, get_workload(key.kernel))


def _odd_answers() -> httpx.MockTransport:
    """A server whose record holds a C1 control and a bidi override in its free text, whose new
    token holds a terminal's controls, whose snapshot export is a 304 nobody asked for and whose
    ETags hold a C1 control."""

    def handle(request: httpx.Request) -> httpx.Response:
        ours = {IDENTITY_HEADER: "tunecache/test"}
        if request.url.path == "/v1/records/1":
            data = make_record(make_key()).model_dump(mode="json", by_alias=True)
            data["config_summary"] = "tile \x9b2J \u202e8x4"
            return httpx.Response(200, content=_public_json(data).encode(), headers=ours)
        if request.url.path == "/v1/tokens":
            info = {"id": 1, "name": "a", "scope": "read", "shown": "tc_abcde",
                    "created_at": "2026-01-01T00:00:00Z", "revoked_at": None, "trusted": False}  # fmt: skip
            body = {"token": f"tc_{ESC}]0;owned{ESC}\\{ESC}[2J" + "a" * 30, "info": info}
            return httpx.Response(201, json=body, headers=ours)
        if request.url.path == "/v1/snapshot":
            etag = (b"ETag", b'"v1\xc2\x9b2J"')  # a C1 control, in UTF-8
            return httpx.Response(
                304, headers=[*((k.encode(), v.encode()) for k, v in ours.items()), etag]
            )
        return miss()

    return httpx.MockTransport(handle)


@pytest.mark.parametrize(
    ("argv", "code", "absent"),
    [
        (["records", "show", "1", "--json"], 0, "\x9b"),  # model_dump_json left C1 and bidi
        (["token", "create", "--name", "a", "--scope", "read"], 3, ESC),  # printed it raw
        (["snapshot", "export", "--arch", "cpu-avx2", "-o", "{tmp}/s.json"], 3, "\x9b"),
    ],
)
def test_what_a_hostile_server_answers_never_reaches_the_terminal_raw(
    argv: list[str], code: int, absent: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], tmp_path: Any,
) -> None:  # fmt: skip
    """Found by a hostile-server review: ``records show --json`` printed a record's C1 and bidi
    controls as they were, ``token create --server`` printed a "token" of escape sequences, and
    ``snapshot export`` ended in AssertionError on a 304 it had not asked for."""
    hostile = functools.partial(Client, transport=_odd_answers())
    monkeypatch.setattr(tunecache.client, "Client", hostile)
    monkeypatch.setenv("TUNECACHE_TOKEN", "tc_" + "3" * 43)
    argv = [a.format(tmp=tmp_path) for a in argv]
    assert tunecache_cli.main([*argv, "--server", "http://hostile.test"]) == code
    said = capsys.readouterr()
    assert absent not in said.out + said.err and "\u202e" not in said.out + said.err
    if code == 0:
        assert "\\u009b" in said.out  # escaped, not dropped
    else:
        assert len(said.err.strip().splitlines()) == 1, said.err
