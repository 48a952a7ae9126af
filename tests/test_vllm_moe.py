"""The fused-MoE config files of serving engines (vLLM's, as shipped): read and written exactly,
and every name or entry that does not parse refused by name (tunecache/vllm_moe.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tunecache.errors import InvalidInput
from tunecache.vllm_moe import (
    FIELDS,
    MoeShape,
    check_entry,
    file_text,
    parse_entries,
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
    shape, table = read_file(shipped)
    assert shape.file_name() == shipped.name
    assert len(table) == 18 and min(table) == 1 and max(table) == 4096
    assert all(list(entry) == list(FIELDS) for entry in table.values())
    assert file_text(table) == shipped.read_text()
    written = write_file(tmp_path, shape, table)
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
    ({"1": {**GOOD, "waves_per_eu": 0}}, "entry M=1: unknown field(s) 'waves_per_eu'"),
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
        parse_entries(json.dumps(entries), "E=8,N=64,device_name=X.json")
    message = str(raised.value)
    assert message.startswith("E=8,N=64,device_name=X.json: ") and words in message, message


def test_what_is_not_json_or_too_big_is_refused() -> None:
    with pytest.raises(InvalidInput, match=r"f\.json: not JSON"):
        parse_entries("{'1': nan}", "f.json")
    with pytest.raises(InvalidInput, match=r"f\.json: not JSON"):
        parse_entries("[" * 100_000, "f.json")
    with pytest.raises(InvalidInput, match="over 1048576 bytes"):
        parse_entries(" " * (2**20 + 1), "f.json")
    with pytest.raises(InvalidInput, match="entries, over 4096"):
        parse_entries(json.dumps({str(m): GOOD for m in range(1, 5000)}), "f.json")


def test_a_file_that_cannot_be_read_says_so(tmp_path: Path) -> None:
    folder = tmp_path / "E=8,N=64,device_name=X.json"
    folder.mkdir()
    with pytest.raises(InvalidInput, match="cannot be read"):
        read_file(folder)


def test_an_entry_is_written_only_when_it_passes(tmp_path: Path) -> None:
    assert check_entry(dict(reversed(list(GOOD.items()))), "x") == GOOD  # the fields in order
    with pytest.raises(InvalidInput, match="entry M=4: num_warps=5"):
        write_file(tmp_path, MoeShape(8, 64, "X"), {1: GOOD, 4: {**GOOD, "num_warps": 5}})
    assert list(tmp_path.iterdir()) == []


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
    assert "imported 36 entries of 2 files (NVIDIA_H100, NVIDIA_H200)" in capsys.readouterr().err
    stored = imported(url, "NVIDIA_H200")
    assert len(stored) == 18 and stored[0].value["origin"] == "vllm-project/vllm"
    assert stored[0].value["file"] == "E=128,N=384,device_name=NVIDIA_H200.json"
    out = tmp_path / "configs"
    assert cli("sync", "--format", "vllm-moe", "-o", str(out), "--device", "NVIDIA_H100",
               "--device", "NVIDIA_H200", "--accept", "imported", "--server", url) == 0  # fmt: skip
    assert sorted(p.name for p in out.iterdir()) == [p.name for p in FILES]
    for shipped in FILES:
        written = out / shipped.name
        assert json.loads(written.read_text()) == json.loads(shipped.read_text())
        assert written.read_bytes() == shipped.read_bytes()
    # Imported again (a newer file, say): the entry is replaced, not added beside.
    assert cli("import", "vllm-moe", str(FIXTURES), "--server", url) == 0
    assert len(imported(url, "NVIDIA_H200")) == 18


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
    assert (
        cli("sync", "--format", "vllm-moe", "-o", out, "--device", "NVIDIA_H100", "--server", url)
        == 2
    )
    assert "written only with --accept imported" in capsys.readouterr().err
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
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []
    assert cli("sync", "--device", "NVIDIA_H100", "--server", url) == 2  # a snapshot has no device
    assert "--device and --accept go with --format vllm-moe" in capsys.readouterr().err


def test_sync_skips_entries_a_server_should_not_hold(
    server: Any, tmp_path: Path, capsys: Any
) -> None:
    """Entries written past the API (a compromised database): the server serves none whose value
    is outside the schema, and the client skips the names that make no file (a non-numeric M, a
    key that smuggles a device or a path) and holds every value to the schema again."""
    from tests.factories import store_behind_the_api

    good = {"config": GOOD, "file": "E=8,N=64,device_name=X.json", "origin": ""}
    items = [
        {"namespace": "vllm.moe", "partition": "X", "key": "E=8,N=64", "item": "1", "value": good},
        {"namespace": "vllm.moe", "partition": "X", "key": "E=8,N=64", "item": "2",
         "value": {**good, "config": {**GOOD, "num_warps": 3}}},
        {"namespace": "vllm.moe", "partition": "X", "key": "E=8,N=64", "item": "2x", "value": good},
        {"namespace": "vllm.moe", "partition": "X", "key": "E=8,N=64,device_name=../../x",
         "item": "4", "value": good},
        {"namespace": "vllm.moe", "partition": "X", "key": "E=8,N=64", "item": "8",
         "value": {**good, "run": "os.system('x')"}},
    ]  # fmt: skip
    assert store_behind_the_api(server.db, items) == len(items)
    out = tmp_path / "out"
    assert cli("sync", "--format", "vllm-moe", "-o", str(out), "--device", "X", "--accept",
               "imported", "--server", server.url) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert "X: wrote 1 file (1 entries, imported)" in err
    assert "skipped 2 entries outside the schema" in err  # the other two the server held back
    assert [p.name for p in out.iterdir()] == ["E=8,N=64,device_name=X.json"]
    assert json.loads((out / "E=8,N=64,device_name=X.json").read_text()) == {"1": GOOD}


def test_the_client_holds_what_a_server_answers_to_the_schema() -> None:
    """A server that serves anything (a hostile one at the transport): values outside the schema,
    names that make no file, an M out of range — each skipped, counted."""
    from tunecache_cli.sync_moe import _tables

    good = {"config": GOOD, "file": "E=8,N=64,device_name=X.json", "origin": ""}
    answered = [
        ("E=8,N=64", "1", good),
        ("E=8,N=64", "2", {**good, "config": {**GOOD, "num_warps": 3}}),
        ("E=8,N=64", "4", {**good, "run": "__import__('os').system('x')"}),
        ("E=8,N=64", "8", {**good, "file": "../x.json"}),
        ("E=8,N=64", "0", good),
        ("E=8,N=64", str(2**25), good),
        ("E=8,N=64", "१", good),  # a digit, not an ASCII one
        ("E=8", "16", good),
        ("E=8,N=64,dtype=a/b", "16", good),
        ("E=8,N=64", "32", [GOOD]),
    ]  # fmt: skip
    tables, skipped = _tables("X", answered)
    assert tables == {MoeShape(8, 64, "X"): {1: GOOD}} and skipped == len(answered) - 1
