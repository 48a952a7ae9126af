"""The fused-MoE config files of serving engines (vLLM's, as shipped): read and written exactly,
and every name or entry that does not parse refused by name (tunecache/vllm_moe.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import start_server
from tests.factories import TEST_TOKEN
from tunecache.errors import InvalidInput
from tunecache.vllm_moe import (
    FIELDS,
    MoeFile,
    MoeShape,
    check_entry,
    file_text,
    imported_value,
    parse_file_text,
    read_file,
    write_file,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "vllm-moe-configs"  # vLLM's own files
FILES = sorted(FIXTURES.glob("*.json"))
GOOD = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
        "num_warps": 4, "num_stages": 3}  # fmt: skip


@pytest.fixture(params=FILES, ids=lambda p: p.name)
def shipped(request: pytest.FixtureRequest) -> Path:
    return request.param  # type: ignore[no-any-return]


def test_the_fixtures_are_there() -> None:
    assert len(FILES) == 2, FIXTURES


def test_a_shipped_file_reads_and_writes_back_to_the_same_bytes(
    shipped: Path, tmp_path: Path
) -> None:
    shape, contents = read_file(shipped)
    table = contents.table
    assert shape.file_name() == shipped.name
    assert len(table) == 18 and min(table) == 1 and max(table) == 4096
    assert all(list(entry) == list(FIELDS) for entry in table.values())
    assert contents.triton_version is None
    assert file_text(contents) == shipped.read_text()
    written = write_file(tmp_path, shape, contents)
    assert written.name == shipped.name and written.read_bytes() == shipped.read_bytes()
    assert [p.name for p in tmp_path.iterdir()] == [shipped.name]  # no partial file left


def test_a_file_name_gives_the_shape() -> None:
    shape = MoeShape.parse(
        "E=128,N=384,device_name=NVIDIA_H100,dtype=fp8_w8a8,block_shape=[128,128].json"
    )
    assert shape == MoeShape(128, 384, "NVIDIA_H100", "fp8_w8a8", (128, 128))
    odd = MoeShape.parse("E=8,N=14336,device_name=NVIDIA_A100-SXM4-80GB,dtype=int8_w8a16.json")
    assert odd == MoeShape(8, 14336, "NVIDIA_A100-SXM4-80GB", "int8_w8a16", None)
    assert odd.file_name() == "E=8,N=14336,device_name=NVIDIA_A100-SXM4-80GB,dtype=int8_w8a16.json"


@pytest.mark.parametrize("name", [
    "E=128,N=384.json", "E=0,N=384,device_name=X.json", "E=128,N=384,device_name=NVIDIA H100.json",
    "E=128,N=384,device_name=../../etc.json", "E=128,N=384,device_name=X,dtype=fp8.json.bak",
    "E=128,N=384,device_name=X,block_shape=[128].json", "E=128,N=384,device_name=X,tp=2.json",
    "e=128,n=384,device_name=X.json", "E=1e3,N=384,device_name=X.json", "",
])  # fmt: skip
def test_a_name_that_is_not_a_config_files_is_refused_by_name(name: str) -> None:
    with pytest.raises(InvalidInput, match="is not a fused-MoE config file name") as raised:
        MoeShape.parse(name)
    assert repr(name) in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize(("entries", "words"), [
    ({"1": {**GOOD, "grf_mode": "large"}}, "entry M=1: unknown field(s) 'grf_mode'"),
    ({"1": {**GOOD, "SPLIT_K": 0}}, "entry M=1: SPLIT_K=0 is not a whole number from 1 to 64"),
    ({"triton_version": 3, "1": GOOD}, "triton_version is not a version such as '3.5.0'"),
    ({"triton_version": "3.5.0"}, "expected a non-empty object"),
    ({"1": {k: v for k, v in GOOD.items() if k != "num_stages"}}, "entry M=1: missing num_stages"),
    ({"1": GOOD, "2": {**GOOD, "num_warps": 3}}, "entry M=2: num_warps=3 is not a power of two"),
    ({"1": {**GOOD, "BLOCK_SIZE_K": 2**20}}, "BLOCK_SIZE_K=1048576 is not a power of two from 1"),
    ({"1": {**GOOD, "GROUP_SIZE_M": 0}}, "GROUP_SIZE_M=0 is not a whole number from 1 to 1024"),
    ({"1": {**GOOD, "num_stages": 2.0}}, "num_stages=2.0 is not a whole number"),
    ({"1": {**GOOD, "num_stages": True}}, "num_stages=True is not a whole number"),
    ({"1": {**GOOD, "num_warps": "4"}}, "num_warps='4' is not a power of two"),
    ({"0": GOOD}, "entry '0': M is not a batch size"),
    ({"-1": GOOD}, "entry '-1': M is not a batch size"),
    ({"01": GOOD}, "entry '01': M is not a batch size"),
    ({"1": [16, 64]}, "entry M=1: expected an object of BLOCK_SIZE_M"),
    ({}, "expected a non-empty object"),
    ([GOOD], "expected a non-empty object"),
])  # fmt: skip
def test_an_entry_outside_the_closed_schema_is_refused_by_name(entries: Any, words: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        parse_file_text(json.dumps(entries), "E=8,N=64,device_name=X.json")
    message = str(raised.value)
    assert message.startswith("E=8,N=64,device_name=X.json: ") and words in message, message


def test_what_is_not_json_or_too_big_is_refused() -> None:
    with pytest.raises(InvalidInput, match=r"f\.json: not JSON"):
        parse_file_text("{'1': nan}", "f.json")
    with pytest.raises(InvalidInput, match=r"f\.json: not JSON"):
        parse_file_text("[" * 100_000, "f.json")
    with pytest.raises(InvalidInput, match="over 1048576 bytes"):
        parse_file_text(" " * (2**20 + 1), "f.json")
    with pytest.raises(InvalidInput, match="entries, over 4096"):
        parse_file_text(json.dumps({str(m): GOOD for m in range(1, 5000)}), "f.json")


def test_a_file_that_cannot_be_read_says_so(tmp_path: Path) -> None:
    folder = tmp_path / "E=8,N=64,device_name=X.json"
    folder.mkdir()
    with pytest.raises(InvalidInput, match="not a file of at most"):
        read_file(folder)


def test_an_entry_is_written_only_when_it_passes(tmp_path: Path) -> None:
    assert check_entry(dict(reversed(list(GOOD.items()))), "x") == GOOD  # the fields in order
    with pytest.raises(InvalidInput, match="entry M=4: num_warps=5"):
        write_file(tmp_path, MoeShape(8, 64, "X"), MoeFile({1: GOOD, 4: {**GOOD, "num_warps": 5}}))
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "E=8,N=64,device_name=X.json").mkdir()  # in the way: one line, no partial file
    with pytest.raises(InvalidInput, match=r"device_name=X\.json: cannot be written"):
        write_file(tmp_path, MoeShape(8, 64, "X"), MoeFile({1: GOOD}))
    assert [p.name for p in tmp_path.iterdir()] == ["E=8,N=64,device_name=X.json"]


def test_a_tuners_own_file_and_other_platforms_fields_round_trip(tmp_path: Path) -> None:
    """vLLM's tuner writes its Triton version first; AMD's and Intel's files add a split of K
    (and ROCm's its own fields); Intel's device names have parentheses."""
    name = "E=10,N=512,device_name=Intel(R)_Arc(TM)_Pro_B60_Graphics.json"
    split = {**GOOD, "SPLIT_K": 2, "waves_per_eu": 0, "matrix_instr_nonkdim": 16, "kpack": 2}
    text = json.dumps({"triton_version": "3.5.0", "1": GOOD, "16": split}, indent=4) + "\n"
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / name).write_text(text)
    shape, contents = read_file(tmp_path / "in" / name)
    assert shape.device_name == "Intel(R)_Arc(TM)_Pro_B60_Graphics"
    assert contents == MoeFile({1: GOOD, 16: split}, "3.5.0")
    assert write_file(tmp_path, shape, contents).read_text() == text


# -- tunecache import vllm-moe / sync --format vllm-moe, through a real server ------------------
def cli(*argv: str) -> int:
    from tunecache_cli import main

    return main(list(argv))


def imported(url: str, device: str) -> list[Any]:
    from tunecache.client import Client

    with Client(url) as client:
        return client.get_artifacts("vllm.moe", device)


def test_imported_files_sync_back_as_the_same_files(
    any_server: Any, tmp_path: Path, capsys: Any
) -> None:
    url = any_server.url
    assert (
        cli("import", "vllm-moe", str(FIXTURES), "--origin", "vllm-project/vllm", "--server", url)
        == 0
    )
    assert "imported 2 files (36 entries; NVIDIA_H100, NVIDIA_H200)" in capsys.readouterr().err
    stored = imported(url, "NVIDIA_H200")
    assert len(stored) == 1 and stored[0].value["origin"] == "vllm-project/vllm"
    assert len(stored[0].value["configs"]) == 18
    assert stored[0].value["file"] == "E=128,N=384,device_name=NVIDIA_H200.json"
    out = tmp_path / "configs"
    assert cli("sync", "--format", "vllm-moe", "-o", str(out), "--device", "NVIDIA_H100",
               "--device", "NVIDIA_H200", "--accept", "imported", "--server", url) == 0  # fmt: skip
    assert sorted(p.name for p in out.iterdir()) == [p.name for p in FILES]
    for shipped in FILES:
        written = out / shipped.name
        assert json.loads(written.read_text()) == json.loads(shipped.read_text())
        assert written.read_bytes() == shipped.read_bytes()
    # A newer file of a shape replaces the stored one whole: never a mix of the two.
    newer = tmp_path / "newer"
    newer.mkdir()
    (newer / FILES[1].name).write_text(json.dumps({"1": GOOD}))
    assert cli("import", "vllm-moe", str(newer), "--server", url) == 0
    [replaced] = imported(url, "NVIDIA_H200")
    assert replaced.value["configs"] == {"1": GOOD}


@pytest.mark.parametrize(("name", "text", "words"), [
    ("E=8,N=64,device_name=X,tp=2.json", "{}", "'E=8,N=64,device_name=X,tp=2.json' is not a fused-MoE config file name"),
    ("E=8,N=64,device_name=X.json", json.dumps({"1": GOOD, "64": {**GOOD, "num_warps": 3}}),
     "E=8,N=64,device_name=X.json: entry M=64: num_warps=3 is not a power of two"),
    ("E=8,N=64,device_name=X.json", "not json", "E=8,N=64,device_name=X.json: not JSON"),
])  # fmt: skip
def test_a_folder_with_one_bad_file_imports_nothing(
    server: Any, tmp_path: Path, capsys: Any, name: str, text: str, words: str
) -> None:
    folder = tmp_path / "configs"
    folder.mkdir()
    for shipped in FILES:
        (folder / shipped.name).write_bytes(shipped.read_bytes())
    (folder / name).write_text(text)
    assert cli("import", "vllm-moe", str(folder), "--server", server.url) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert imported(server.url, "NVIDIA_H100") == [] and imported(server.url, "NVIDIA_H200") == []


def test_sync_writes_imported_entries_only_when_told_and_names_bad_input(
    server: Any, tmp_path: Path, capsys: Any
) -> None:
    url, out = server.url, str(tmp_path / "out")
    assert cli("import", "vllm-moe", str(FIXTURES), "--server", url) == 0
    # Without --accept imported only winners tuned here are written: none, exit 1, and a hint.
    assert (
        cli("sync", "--format", "vllm-moe", "-o", out, "--device", "NVIDIA_H100", "--server", url)
        == 1
    )
    assert "imported files need --accept imported" in capsys.readouterr().err
    assert list((tmp_path / "out").iterdir()) == []
    # A device of no file at all: its name is the likelier cause than the server's policy
    assert cli("sync", "--format", "vllm-moe", "-o", out, "--device", "NVIDIA_H20", "--accept",
               "imported", "--server", url) == 1  # fmt: skip
    assert "no imported file for it either: is the device named as the engine names it" in (
        capsys.readouterr().err
    )
    (tmp_path / "out").rmdir()
    for argv, words in [
        (["--device", "NVIDIA H100"], "'NVIDIA H100' is not a device name"),
        (["--device", "../etc"], "'../etc' is not a device name"),
        ([], "--device: no GPU is visible here"),
    ]:
        assert cli("sync", "--format", "vllm-moe", "-o", out, "--accept", "imported", *argv,
                   "--server", url) == 2  # fmt: skip
        assert words in capsys.readouterr().err
    assert cli("sync", "--format", "vllm-moe", "--device", "X", "--accept", "imported") == 2
    assert "needs -o DIR" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # a refused command makes no folder
    assert cli("sync", "--device", "NVIDIA_H100", "--server", url) == 2  # a snapshot has no device
    assert "--device and --accept go with --format vllm-moe" in capsys.readouterr().err


def test_sync_skips_files_a_server_should_not_hold(
    server: Any, tmp_path: Path, capsys: Any
) -> None:
    """Files written past the API (a compromised database): the server serves none whose value is
    outside the schema, and the client skips those stored under another name than their own."""
    from tests.factories import store_behind_the_api

    good = imported_value("E=8,N=64,device_name=X.json", "", MoeFile({1: GOOD}))
    other = imported_value("E=9,N=64,device_name=X.json", "", MoeFile({1: GOOD}))
    items = [
        {"namespace": "vllm.moe", "partition": "X", "key": "E=8,N=64", "value": good},
        {"namespace": "vllm.moe", "partition": "X", "key": "E=7,N=64",
         "value": {**good, "configs": {"1": {**GOOD, "num_warps": 3}}}},
        {"namespace": "vllm.moe", "partition": "X", "key": "E=6,N=64", "value": good},  # misnamed
        {"namespace": "vllm.moe", "partition": "X", "key": "E=9,N=64", "item": "1", "value": other},
        {"namespace": "vllm.moe", "partition": "X", "key": "E=5,N=64",
         "value": {**good, "run": "os.system('x')"}},
    ]  # fmt: skip
    assert store_behind_the_api(server.db, items) == len(items)
    out = tmp_path / "out"
    assert cli("sync", "--format", "vllm-moe", "-o", str(out), "--device", "X", "--accept",
               "imported", "--server", server.url) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert "X: wrote 1 file (1 entries: 0 tuned, 1 imported)" in err
    assert "skipped 2 outside the schema" in err  # the other two the server held back
    assert [p.name for p in out.iterdir()] == ["E=8,N=64,device_name=X.json"]
    assert json.loads((out / "E=8,N=64,device_name=X.json").read_text()) == {"1": GOOD}


def test_the_server_stores_an_imported_file_only_under_its_own_name(server: Any) -> None:
    """A write token cannot put a file under another device's or shape's name (to land in their
    engine's folder under a name they read)."""
    import httpx

    good = imported_value("E=8,N=64,device_name=X.json", "", MoeFile({1: GOOD}))
    for partition, key, item, value in [
        ("Y", "E=8,N=64", "", good),
        ("X", "E=9,N=64", "", good),
        ("X", "E=8,N=64", "1", good),
        ("X", "E=8,N=64,device_name=Y", "", good),
        ("X/..", "E=8,N=64", "", good),
        ("X", "E=8,N=64", "", {**good, "origin": "a\u202eb"}),
        ("X", "E=8,N=64", "", {**good, "configs": {"01": GOOD}}),
    ]:
        body = {"items": [{"namespace": "vllm.moe", "partition": partition, "key": key,
                           "item": item, "value": value}]}  # fmt: skip
        answer = httpx.post(f"{server.url}/v1/artifacts", json=body,
                            headers={"Authorization": f"Bearer {TEST_TOKEN}"})  # fmt: skip
        assert answer.status_code == 422, (partition, key, item, answer.text)
    assert imported(server.url, "X") == [] and imported(server.url, "Y") == []


def test_the_client_holds_what_a_server_answers_to_the_schema() -> None:
    """A server that serves anything (a hostile one at the transport): values outside the schema,
    names that do not name the file held, an M out of range — each skipped, counted."""
    from tunecache_cli.sync_moe import _files

    good = imported_value("E=8,N=64,device_name=X.json", "", MoeFile({1: GOOD}))
    answered = [
        ("E=8,N=64", "", good),
        ("E=8,N=64", "", {**good, "configs": {"1": {**GOOD, "num_warps": 3}}}),
        ("E=8,N=64", "", {**good, "run": "__import__('os').system('x')"}),
        ("E=8,N=64", "", {**good, "file": "../x.json"}),
        ("E=8,N=64", "", {**good, "configs": {"0": GOOD}}),
        ("E=8,N=64", "", {**good, "configs": {str(2**25): GOOD}}),
        ("E=8,N=64", "", {**good, "configs": {"१": GOOD}}),  # a digit, not an ASCII one
        ("E=8,N=64", "", {**good, "configs": {str(m): GOOD for m in range(1, 5000)}}),
        ("E=8", "", good),
        ("E=8,N=64,dtype=a/b", "", good),
        ("E=8,N=64", "1", good),
        ("E=8,N=64", "", [GOOD]),
    ]  # fmt: skip
    files, skipped = _files("X", answered)
    assert files == {MoeShape(8, 64, "X"): MoeFile({1: GOOD})} and skipped == len(answered) - 1


def imported_by_a_token(url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The fixtures imported by a write token of their own; returns what revokes it (its
    imports then served no more)."""
    import httpx

    from tests.factories import AUTH

    made = httpx.post(f"{url}/v1/tokens", headers=AUTH, json={"name": "moe", "scope": "write"})
    monkeypatch.setenv("TUNECACHE_TOKEN", made.json()["token"])
    assert cli("import", "vllm-moe", str(FIXTURES), "--server", url) == 0
    monkeypatch.setenv("TUNECACHE_TOKEN", TEST_TOKEN)

    def revoke() -> None:
        gone = httpx.delete(f"{url}/v1/tokens/{made.json()['info']['id']}", headers=AUTH)
        assert gone.status_code == 200, gone.text

    return revoke


def test_a_later_sync_removes_the_files_the_cache_no_longer_serves(
    server: Any, tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file written from an import stayed in the engine's folder after its token was revoked
    (the engine kept using it; the next sync said "wrote 0 files"). A later sync removes the
    files it wrote that the cache no longer serves, unchanged since; a file changed since, or
    the user's own, stays; a sync that reads no imported files keeps those it wrote from them."""

    from tunecache_cli.sync_moe_ledger import ledger_path

    url = server.url
    revoke = imported_by_a_token(url, monkeypatch)
    out = tmp_path / "configs"
    sync = ["sync", "--format", "vllm-moe", "-o", str(out), "--device", "NVIDIA_H100",
            "--device", "NVIDIA_H200", "--server", url]  # fmt: skip
    assert cli(*sync, "--accept", "imported") == 0
    names = sorted(p.name for p in FILES)
    assert sorted(p.name for p in out.glob("E=*.json")) == names and ledger_path(out, url).is_file()
    (out / "E=1,N=2,device_name=NVIDIA_H100.json").write_text('{"1": {}}')  # the user's own
    assert cli(*sync) == 1  # imports not read: the files written from them are kept
    assert sorted(p.name for p in out.glob("E=*.json")) == sorted(
        [*names, "E=1,N=2,device_name=NVIDIA_H100.json"]
    )
    changed = out / names[1]
    changed.write_text(changed.read_text() + " ")  # edited since: the user's now
    capsys.readouterr()
    revoke()
    assert cli(*sync, "--accept", "imported") == 1  # nothing served now
    assert f"removed 1 file it wrote before that the cache no longer serves ({names[0]})" \
        in capsys.readouterr().err  # fmt: skip
    assert sorted(p.name for p in out.glob("E=*.json")) == [
        "E=1,N=2,device_name=NVIDIA_H100.json",
        names[1],
    ]


def test_a_sync_removes_neither_a_users_file_it_overwrote_nor_another_servers_files(
    server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ledger adopted a user's own file a sync overwrote (the next sync not serving its
    shape removed it), and was one a folder: a sync from another server removed every file the
    first one's wrote."""

    url = server.url
    revoke = imported_by_a_token(url, monkeypatch)
    out = tmp_path / "configs"
    out.mkdir()
    theirs = out / FILES[0].name
    theirs.write_text('{"1": {}}')  # the user's, before any sync
    sync = ["sync", "--format", "vllm-moe", "-o", str(out), "--device", "NVIDIA_H100",
            "--device", "NVIDIA_H200", "--accept", "imported"]  # fmt: skip
    assert cli(*sync, "--server", url) == 0  # overwritten, as a sync always did
    other = tmp_path / "other"
    other.mkdir()
    live = start_server(f"sqlite:///{other / 'cache.db'}", other / "cache.db", tmp_path / "o.log")
    try:
        assert cli(*sync, "--server", live.url) == 1  # serves nothing: removes nothing of url's
    finally:
        live.stop()
    assert sorted(p.name for p in out.glob("E=*.json")) == sorted(p.name for p in FILES)
    revoke()
    assert cli(*sync, "--server", url) == 1  # nothing served: its own file removed, not theirs
    assert [p.name for p in out.glob("E=*.json")] == [FILES[0].name]


def test_a_sync_writes_at_most_so_many_files_a_device(
    server: Any, tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One write token's imports of 20,000 shapes wrote 20,000 files into the engine's folder."""
    import tunecache_cli.sync_moe

    url = server.url
    assert cli("import", "vllm-moe", str(FIXTURES), "--server", url) == 0
    monkeypatch.setattr(tunecache_cli.sync_moe, "MAX_FILES", 1)
    out = tmp_path / "configs"
    capsys.readouterr()
    assert cli("sync", "--format", "vllm-moe", "-o", str(out), "--device", "NVIDIA_H100",
               "--device", "NVIDIA_H200", "--accept", "imported", "--server", url) == 0  # fmt: skip
    assert len(list(out.glob("E=*.json"))) == 2  # one a device: each has one here
    monkeypatch.setattr(tunecache_cli.sync_moe, "MAX_FILES", 0)
    assert cli("sync", "--format", "vllm-moe", "-o", str(out), "--device", "NVIDIA_H100",
               "--accept", "imported", "--server", url) == 1  # fmt: skip
    said = capsys.readouterr().err
    assert "NVIDIA_H100: the cache serves 1 shapes; the first 0 by file name are written" in said
    assert "removed" not in said and len(list(out.glob("E=*.json"))) == 2  # served: not removed
