"""bench/search_cpu.py, run small: its space, its synthetic times, its table."""

from __future__ import annotations

import pytest

from bench import search_cpu


def test_the_space_is_large_and_its_times_are_seeded() -> None:
    configs = list(search_cpu.SPACE.configs())
    assert len(configs) == 20_736
    times = [search_cpu.synthetic_time(c) for c in configs[:2000]]
    assert times == [search_cpu.synthetic_time(c) for c in configs[:2000]]
    failed = sum(t is None for t in times)
    assert 10 < failed < 80  # about 2 %
    assert all(t is None or t > 0 for t in times)


def test_the_table_names_every_strategy(capsys: pytest.CaptureFixture[str]) -> None:
    assert search_cpu.main(["--seeds", "1", "--strategies", "random,local", "--no-write"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines()[2:] if line.strip()}
    assert set(rows) == {"random", "local"}
    assert all(float(r[1]) >= 0 for r in rows.values())
    with pytest.raises(SystemExit):
        search_cpu.main(["--strategies", "annealing", "--no-write"])
