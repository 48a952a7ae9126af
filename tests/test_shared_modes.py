"""Files other users' programs read keep the mode they had when tunecache rewrites them:
Inductor's choice file and its record of served groups in a team's shared cache folder
(``tune --torch``'s merge), and a snapshot ``tunecache sync -o FILE`` writes again. Each was
rewritten 0600, so teammates' compiles and service users could no longer read it."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from tests.factories import make_key, make_record
from tunecache.inductor import served
from tunecache.inductor.choices import ChoiceGroup, merge_groups
from tunecache.snapshot import SnapshotFilters, load_snapshot, render_snapshot, save_snapshot


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_merge_keeps_the_shared_choice_files_mode(tmp_path: Path) -> None:
    choice_file = tmp_path / "cache" / "abc123"
    choice_file.parent.mkdir()
    choice_file.write_text(json.dumps({"system": {"device": "cpu"}, "cache": {}}))
    os.chmod(choice_file, 0o664)  # a team's: group members read and write it
    group = ChoiceGroup("mm", "inputs-key-1", "highest", {"choice_a": 0.5, "choice_b": 0.7})
    assert merge_groups(choice_file, [group], {"device": "cpu"}) == 1
    assert mode(choice_file) == 0o664
    assert "choice_a" in choice_file.read_text()  # rewritten, not left as it was


def test_the_record_of_served_groups_keeps_its_mode(tmp_path: Path) -> None:
    choice_file = tmp_path / "abc123"
    one, two = ("1" * 64, "a" * 64), ("2" * 64, "b" * 64)  # (identity, digest): hex digests
    served.write_record(choice_file, [one])
    record = served.record_path(choice_file)
    os.chmod(record, 0o644)  # read by every user of the folder
    served.write_record(choice_file, [one, two])
    assert mode(record) == 0o644
    assert served.read_record(choice_file) == {one, two}


def test_sync_over_a_shared_snapshot_keeps_its_mode(tmp_path: Path) -> None:
    target = tmp_path / "snapshot.json"
    target.write_text("{}")
    os.chmod(target, 0o644)  # service users' processes load it
    body, _ = render_snapshot(SnapshotFilters(device_arch="cpu-avx2"), [make_record(make_key())])
    save_snapshot(target, json.loads(body))
    assert mode(target) == 0o644
    assert len(load_snapshot(target).records) == 1
