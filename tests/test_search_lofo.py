"""bench/search_lofo.py: settings chosen without the family they are scored on."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import search_lofo
from tests.test_landscape import bowl_landscape

SMALL = {"BLOCK_M": (16, 32, 64, 128), "BLOCK_N": (32, 64, 128), "num_warps": (2, 4, 8)}
OTHER = {"BLOCK_K": (16, 32, 64, 128, 256), "num_stages": (1, 2, 3, 4, 5, 6)}


def test_the_held_out_family_and_its_kin_never_choose_its_setting() -> None:
    fit, general = (("local_after", 0),), (("local_after", 25),)
    means = {  # ``fit`` is best on F and its twin F'; ``general`` on the others
        fit: {"F": {"@100": 1.0}, "F'": {"@100": 1.0}, "G": {"@100": 0.80}, "H": {"@100": 0.85}},
        general: {"F": {"@100": 0.9}, "F'": {"@100": 0.9}, "G": {"@100": 0.95},
                  "H": {"@100": 0.90}},
    }  # fmt: skip
    assert search_lofo.choose(means, {"F", "F'"}, "@100") == general
    # Held out G, the others' worst decides: H (0.85 against 0.90).
    assert search_lofo.choose(means, {"G"}, "@100") == general
    means[fit]["H"]["@100"] = 0.95
    assert search_lofo.choose(means, {"G"}, "@100") == fit


def test_writes_each_family_left_out_beside_the_default(tmp_path: Path) -> None:
    bowl_landscape(1, SMALL, device="GPU A").save(tmp_path / "a.json")
    bowl_landscape(2, OTHER, device="GPU B").save(tmp_path / "b.json")
    bowl_landscape(3, OTHER, device="GPU C").save(tmp_path / "c.json")
    out = tmp_path / "lofo.md"
    argv = [str(tmp_path), "--seeds", "2", "--grid", "local_after=0,100", "--out", str(out)]
    assert search_lofo.main([*argv, "--scrambled"]) == 0
    rows = [line for line in out.read_text().splitlines() if line.startswith("| ")]
    families = {row.split(" | ")[0] for row in rows[1:] if "*" not in row}
    assert len(families) == 4  # a's parameters are not b's and c's; each relabelled too
    assert sum("| chosen: local_after=" in row for row in rows) == 4
    assert sum("| default |" in row for row in rows) == 4 + 2  # a row each, worst, average
    assert sum(row.startswith("| *worst family* |") for row in rows) == 2


def test_one_set_of_parameters_cannot_leave_one_out(tmp_path: Path) -> None:
    bowl_landscape(1, SMALL, device="GPU A").save(tmp_path / "a.json")
    assert search_lofo.main([str(tmp_path), "--out", str(tmp_path / "x.md")]) == 2
    assert not (tmp_path / "x.md").exists()


@pytest.mark.parametrize("bad", [["--grid", "local_after=x"], ["--grid", "seed=1"],
                                 ["--grid", "arms=1"], ["--grid", ";"], ["--grid", "nothing"],
                                 ["--seeds", "0"], ["--at", "@7"]])  # fmt: skip
def test_a_bad_argument_is_one_line_and_exit_2(bad: list[str], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    bowl_landscape(1, SMALL).save(tmp_path / "a.json")
    with pytest.raises(SystemExit) as exit_:
        search_lofo.main([str(tmp_path), *bad])
    assert exit_.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("python -m bench.search_lofo: error: " + bad[0])
