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

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "vllm-moe-configs"
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
