"""The ledger of ``sync --format vllm-moe`` (:mod:`tunecache_cli.sync_moe_ledger`): held by one
sync at a time, and read only from a folder of this user's own."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.test_vllm_moe import FILES, cli, imported_by_a_token
from tunecache.errors import InvalidInput
from tunecache_cli.sync_moe_ledger import held, ledger_path, read_ledger, write_ledger

URL = "http://cache.example:8000"
DIGEST = "0" * 64


def test_two_syncs_into_one_folder_take_turns_with_its_ledger(tmp_path: Path, capsys: Any) -> None:
    """Two syncs into one folder at once each wrote the ledger they read, and the other's
    entries were lost: its files were never removed. The second waits, says so, and reads the
    first one's entries."""
    out = tmp_path / "configs"
    seen: list[dict[str, Any]] = []

    def second() -> None:
        with held(out, URL) as ledger:
            seen.append(dict(ledger))
            ledger["NVIDIA_H200"] = {FILES[1].name: (DIGEST, True)}
            write_ledger(out, URL, ledger)

    with held(out, URL) as ledger:
        ledger["NVIDIA_H100"] = {FILES[0].name: (DIGEST, True)}
        write_ledger(out, URL, ledger)
        waiting = threading.Thread(target=second)
        waiting.start()
        waiting.join(timeout=1.0)
        assert waiting.is_alive()  # it waits for this one
    waiting.join(timeout=30)
    assert not waiting.is_alive() and list(seen[0]) == ["NVIDIA_H100"]
    assert sorted(read_ledger(out, URL)) == ["NVIDIA_H100", "NVIDIA_H200"]
    assert f"waiting for another sync from this server into {out} to end" in capsys.readouterr().err


def test_a_ledger_is_never_read_through_a_planted_link(
    server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """The ledgers' folder planted as a link: its ledger was read through it (and its removals
    made: an engine file whose bytes it named was removed), then its write refused. Now the
    folder is refused before anything is read in it."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("TUNECACHE_WORK_DIR", str(work))
    url = server.url
    imported_by_a_token(url, monkeypatch)  # a sync that reads a listing whole, serving these
    out = tmp_path / "configs"
    out.mkdir()
    engine = out / "E=16,N=1024,device_name=NVIDIA_H100.json"  # served by no one here
    engine.write_text('{"1": {}}')
    planted = tmp_path / "planted"
    planted.mkdir()
    sha = hashlib.sha256(engine.read_bytes()).hexdigest()
    name = ledger_path(out, url).name
    (planted / name).write_text(json.dumps({"NVIDIA_H100": {engine.name: [sha, False]}}))
    (work / "vllm-moe-sync").symlink_to(planted)
    with pytest.raises(InvalidInput, match="vllm-moe-sync"), held(out, url):
        pass
    capsys.readouterr()
    code = cli("sync", "--format", "vllm-moe", "-o", str(out), "--device", "NVIDIA_H100",
               "--accept", "imported", "--server", url)  # fmt: skip
    assert code == 2 and "vllm-moe-sync" in capsys.readouterr().err
    assert engine.read_text() == '{"1": {}}'  # the engine's file stays
