"""Files in the outbox that do not parse (a truncated ``1-trunc.json``, a binary ``2-bin.json``)
are set aside in ``rejected/``, counted and named, like refused uploads: they used to be skipped
by every push, never mentioned, and stay for ever."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import tunecache_cli
from tests.factories import make_key, make_record
from tunecache import outbox

URL = "http://cache.example:8765"


def plant(folder: Path) -> None:
    (folder / "1-trunc.json").write_text('{"url": "http://cache.example:8765", "rec')
    (folder / "2-bin.json").write_bytes(b"\x00\xff\xfe\x80garbage")


def test_push_sets_unreadable_files_aside_and_names_them(
    own_outbox: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plant(own_outbox)
    assert tunecache_cli.main(["push", "--server", URL]) == 1  # nothing else waits: no server
    err = capsys.readouterr().err
    assert f"2 unreadable files set aside in {own_outbox / 'rejected'}: 1-trunc.json, 2-bin.json" \
        in err  # fmt: skip
    assert sorted(p.name for p in (own_outbox / "rejected").iterdir()) == \
        ["1-trunc.json", "2-bin.json"]  # fmt: skip
    assert not list(own_outbox.glob("*.json"))


def test_only_unreadable_files_are_set_aside_never_one_being_written_or_taken(
    tmp_path: Path,
) -> None:
    plant(tmp_path)
    kept = outbox.release(outbox.put(URL, make_record(make_key(8)), tmp_path))
    taken = outbox.put(URL, make_record(make_key(16)), tmp_path)  # this live process's
    (tmp_path / ".writing-x.tmp").write_text("{")  # put's temporary file, not a .json
    (tmp_path / "3-list.json").write_text("[]")  # JSON, but no upload of any server
    names = outbox.set_aside_unreadable(tmp_path)
    assert sorted(names) == ["1-trunc.json", "2-bin.json", "3-list.json"]
    assert kept.exists() and taken.exists() and (tmp_path / ".writing-x.tmp").exists()
    assert outbox.waiting(URL, tmp_path) == 1
    assert sorted(os.listdir(tmp_path / "rejected")) == sorted(names)
