"""What a hostile server can make ``tunecache.inductor.enable`` write into Inductor's choice file.

Inductor parses its whole ``PersistentCache`` file at every autotuned GEMM and rewrites it on
every miss, in every later compile on that cache folder. A server that answered groups for made-up
ops, hundreds of long choice names each and fresh op names on every read, grew the file by 32 MB
per ``enable()``. These serve such answers over raw HTTP (``tests/hostile.py``) and check that the
file stays within :data:`tunecache.inductor.choices.MAX_FILE_BYTES`, while an honest group (the
shape Inductor writes, as in ``tests/test_inductor_cache.py``) still merges.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.hostile import Request, Seen, answer, serve
from tunecache.inductor import enable
from tunecache.inductor.choices import (
    MAX_FILE_BYTES,
    MAX_MERGE_BYTES,
    MAX_MERGE_GROUPS,
    MAX_SERVED_NAME,
    ChoiceGroup,
    merge_groups,
)

HONEST: dict[str, Any] = {"op": "mm", "inputs": "[('cpu', 'torch.float32', 8, 8)]", "precision": "highest",
          "timings": {"a-1": 0.5, "b-2": 0.25}}  # fmt: skip
CHOICES = 400  # per made-up group, as the auditor's server answered
GROUPS = 40  # per read: about 4.6 MB as Inductor's file holds them, past one merge's bytes


def made_up(op: str, name_length: int) -> dict[str, Any]:
    """A group that passes the schema: ``CHOICES`` names of ``name_length`` characters."""
    timings = {f"{i:04d}".rjust(name_length, "x"): 0.001 * (i + 1) for i in range(CHOICES)}
    return {"op": op, "inputs": f"[('cpu', 'torch.float32', {len(op)}, 8)]",
            "precision": "highest", "timings": timings}  # fmt: skip


def fresh_ops(name_length: int, first: list[dict[str, Any]]) -> Any:
    """A server answering every artifact read with ``first``, then ``GROUPS`` groups for ops
    never seen before."""
    counter = itertools.count()

    def behaviour(conn: Any, request: Request, seen: Seen) -> None:
        asked = {k: v[0] for k, v in parse_qs(urlsplit(request.path).query).items()}
        read = next(counter)
        values = first + [made_up(f"op_{read}_{i}", name_length) for i in range(GROUPS)]
        items = [{"namespace": asked["namespace"], "partition": asked["partition"],
                  "key": f"k{read}-{i}", "item": "", "value": value, "score": 1e-9,
                  "id": i + 1, "updated_at": "2026-01-01T00:00:00Z"}
                 for i, value in enumerate(values)]  # fmt: skip
        answer(conn, 200, json.dumps({"items": items, "next_after": None}).encode())

    return behaviour


def test_fresh_made_up_groups_on_every_read_never_grow_the_file_past_its_bound(
    inductor_cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sizes, merged, removed = [], [], []
    name_length = MAX_SERVED_NAME - 6  # long, yet within what the client takes
    with serve(fresh_ops(name_length, [HONEST])) as (url, _), caplog.at_level(logging.WARNING):
        for _ in range(3):
            start = time.monotonic()
            enabled = enable(url, timeout=30.0)
            assert time.monotonic() - start < 120  # a hang check, not a speed claim
            assert enabled.reachable and enabled.ignored == 0
            merged.append(enabled.merged)
            removed.append(enabled.removed)
            sizes.append(inductor_cache.stat().st_size)
    assert all(0 < size <= MAX_FILE_BYTES for size in sizes), sizes
    growth = [b - a for a, b in zip([0, *sizes], sizes, strict=False)]
    assert all(step <= MAX_MERGE_BYTES + 1024 for step in growth), growth  # + the system entry
    assert all(n <= MAX_MERGE_GROUPS for n in merged) and merged[0] > 1, merged
    # The groups of the read before, no longer served, are taken out (the honest one, served on
    # every read, stays): the made-up groups never pile up in the file.
    assert removed == [0, merged[0] - 1, merged[1]], (merged, removed)
    document = json.loads(inductor_cache.read_text())
    assert document["cache"]["mm"][HONEST["inputs"]]["highest"] == HONEST["timings"]
    assert "not merged" in caplog.text


def test_a_choice_name_longer_than_inductors_is_refused(inductor_cache: Path) -> None:
    with serve(fresh_ops(MAX_SERVED_NAME + 1, [HONEST])) as (url, _):
        enabled = enable(url, timeout=30.0)
    assert (enabled.fetched, enabled.ignored, enabled.merged) == (1, GROUPS, 1)
    assert list(json.loads(inductor_cache.read_text())["cache"]) == ["mm"]
    assert ChoiceGroup.from_value(made_up("op", MAX_SERVED_NAME)) is not None
    assert ChoiceGroup.from_value(made_up("op", MAX_SERVED_NAME + 1)) is None


def test_a_file_already_past_the_bound_is_left_alone_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "cache" / "system-hash"
    path.parent.mkdir()
    filler = {"x": {"y": {"highest": {"h": 1.0}}}, "pad": {"p" * (MAX_FILE_BYTES + 1): {}}}
    path.write_text(json.dumps({"system": {"hash": "h"}, "cache": filler}))
    before = path.read_bytes()
    honest = ChoiceGroup.from_value(HONEST)
    assert honest is not None
    with caplog.at_level(logging.WARNING):
        assert merge_groups(path, [honest], {"hash": "h"}) == 0
    assert path.read_bytes() == before
    assert len([r for r in caplog.records if "past" in r.getMessage()]) == 1


def test_a_merge_adds_nothing_past_its_deadline_and_honest_groups_within_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "cache" / "system-hash"
    honest = ChoiceGroup.from_value(HONEST)
    other = ChoiceGroup.from_value({**HONEST, "op": "addmm"})
    assert honest is not None and other is not None
    assert merge_groups(path, [honest], {"hash": "h"}, deadline=time.monotonic() - 1) == 0
    assert not path.exists()
    assert merge_groups(path, [honest, other], {"hash": "h"}, deadline=math.inf) == 2
    assert set(json.loads(path.read_text())["cache"]) == {"mm", "addmm"}
