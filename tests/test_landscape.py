"""Landscape files: record, save/load, replay as a simulated device; the search-efficiency bench."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from backends.base import Budget, Progress, Trial
from bench import search_efficiency
from tunecache.errors import InvalidInput
from tunecache.space import Config, Scalar, SearchSpace
from tuner.landscape import FORMAT, Landscape, entry, record_landscape
from tuner.search import get_strategy, run_search

BOWL_PARAMS: dict[str, tuple[Scalar, ...]] = {
    "BLOCK_M": (16, 32, 64, 128, 256, 512, 1024, 2048),
    "BLOCK_N": (16, 32, 64, 128, 256, 512, 1024, 2048),
    "num_warps": (1, 2, 4, 8),
    "num_stages": (2, 3),
}  # 512 configs


def bowl_landscape(
    seed: int,
    params: Mapping[str, tuple[Scalar, ...]] | None = None,
    *,
    fail_rate: float = 0.05,
    device: str = "synthetic bowl",
) -> Landscape:
    """A smooth bowl over the choices' indices, centred at random, with some failed configs.

    Configs whose BLOCK_M * BLOCK_N reaches 2**20 are pruned (unrecorded) when both exist.
    """
    params = params or BOWL_PARAMS
    rng = random.Random(seed)
    centre = {name: rng.uniform(0, len(choices) - 1) for name, choices in params.items()}
    weight = {name: rng.uniform(0.5, 2.0) for name in params}

    def too_big(config: Config) -> str | None:
        area = int(config.get("BLOCK_M", 1)) * int(config.get("BLOCK_N", 1))
        return "too big" if area >= 2**20 else None

    def measure(config: Config) -> Trial:
        if rng.random() < fail_rate:
            return entry(config.to_json(), rng.choice(["compile_error", "timeout"]), error="boom")
        index = {name: params[name].index(config[name]) for name in params}
        t = 1.0 + sum(weight[n] * (index[n] - centre[n]) ** 2 for n in params)
        return entry(config.to_json(), "ok", tuple(t * (1 + 0.01 * rng.random()) for _ in range(3)))

    space = SearchSpace(params, constraint=too_big)
    return record_landscape(space, measure, key={"kernel": "bowl", "seed": seed}, device=device)


def tiny_landscape() -> Landscape:
    a, b, c = (Config.of({"x": x}) for x in (1, 2, 3))
    return Landscape(
        key={"kernel": "tiny", "problem": {"N": 8}},
        space={"x": [1, 2, 3, 4]},
        entries=[
            entry(a.to_json(), "ok", (3.0, 1.0, 2.0)),
            entry(b.to_json(), "compile_error", error="too many registers"),
            entry(c.to_json(), "ok", (1.5,)),
        ],
        device="test device",
        note="hand-made",
    )


class TestEntry:
    def test_time_is_median_of_repeats_and_none_unless_ok(self) -> None:
        landscape = tiny_landscape()
        assert [e.time_ms for e in landscape.entries] == [2.0, None, 1.5]

    @pytest.mark.parametrize(
        ("status", "times", "why"),
        [("fast", (1.0,), "status 'fast'"), ("ok", (), "ok but has no times"),
         ("ok", (float("nan"),), "malformed: .*time_ms is NaN"),
         ("ok", (0.0,), "malformed: time_ms: Input should be greater than or equal"),
         ("ok", (1.0,) * 65, "malformed: times_ms: Tuple should have at most 64 items")],
    )  # fmt: skip
    def test_rejects_bad_status_and_times(self, status: str, times: tuple[float, ...],
                                          why: str) -> None:  # fmt: skip
        with pytest.raises(InvalidInput, match=why):
            entry({"x": 1}, status, times)


class TestFile:
    def test_round_trip(self, tmp_path: Path) -> None:
        landscape = tiny_landscape()
        path = tmp_path / "sub" / "tiny.json"
        landscape.save(path)
        assert json.loads(path.read_text())["format"] == FORMAT
        assert Landscape.load(path) == landscape

    def test_save_is_atomic(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        path = tmp_path / "tiny.json"
        tiny_landscape().save(path)
        before = path.read_text()

        def broken_dump(*args: Any, **kwargs: Any) -> None:
            raise OSError("disk full")

        monkeypatch.setattr(json, "dump", broken_dump)
        changed = tiny_landscape()
        changed.note = "changed"
        with pytest.raises(OSError, match="disk full"):
            changed.save(path)
        assert path.read_text() == before  # the old file is intact
        assert [p.name for p in tmp_path.iterdir()] == ["tiny.json"]  # no temp file left

    @pytest.mark.parametrize(
        "text",
        [
            "not json {",
            "[1, 2]",
            json.dumps({"format": "other/1"}),
            json.dumps({"format": FORMAT, "key": {}, "space": {"x": [1]}, "device": "d"}),
            json.dumps(
                {"format": FORMAT, "key": {}, "space": {"x": 1}, "entries": [], "device": "d"}
            ),
            json.dumps(
                {"format": FORMAT, "key": {}, "space": {"x": []}, "entries": [], "device": "d"}
            ),
        ],
    )
    def test_malformed_file_is_invalid_input(self, tmp_path: Path, text: str) -> None:
        path = tmp_path / "bad.json"
        path.write_text(text)
        with pytest.raises(InvalidInput, match="landscape"):
            Landscape.load(path)

    @pytest.mark.parametrize(
        "entry",
        [
            {"config": {"x": 1}, "status": "exploded"},
            {"config": {"x": 1}, "status": "ok", "times_ms": []},
            {"config": {"x": 1}, "status": "ok", "times_ms": ["fast"]},
            {"config": {"x": [1]}, "status": "invalid"},
            {"config": {"x": 9}, "status": "invalid"},
            {"config": {"y": 1}, "status": "invalid"},
            {"status": "invalid"},
            "x=1",
        ],
    )
    def test_malformed_entry_is_invalid_input(self, tmp_path: Path, entry: Any) -> None:
        data = tiny_landscape().to_json()
        data["entries"].append(entry)
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(data))
        with pytest.raises(InvalidInput):
            Landscape.load(path)

    def test_duplicate_config_is_invalid_input(self, tmp_path: Path) -> None:
        data = tiny_landscape().to_json()
        data["entries"].append(data["entries"][0])
        path = tmp_path / "dup.json"
        path.write_text(json.dumps(data))
        with pytest.raises(InvalidInput, match="twice"):
            Landscape.load(path)

    def test_missing_file_is_invalid_input(self, tmp_path: Path) -> None:
        with pytest.raises(InvalidInput):
            Landscape.load(tmp_path / "nowhere.json")


class TestReplay:
    def test_optimum_is_fastest_ok_entry(self) -> None:
        assert tiny_landscape().optimum().config == {"x": 3}
        only_failures = tiny_landscape()
        only_failures.entries = only_failures.entries[1:2]
        with pytest.raises(InvalidInput, match="no ok entry"):
            only_failures.optimum()

    def test_search_space_is_restricted_to_recorded_configs(self) -> None:
        space = tiny_landscape().search_space()
        assert list(space.configs()) == [Config.of({"x": x}) for x in (1, 2, 3)]
        assert not space.contains(Config.of({"x": 4}))

    def test_the_space_and_replay_follow_entries_edited_after_use(self) -> None:
        landscape = tiny_landscape()
        assert len(landscape.search_space().valid()) == 3
        landscape.entries.pop()  # x=3 is no longer recorded
        assert landscape.configs() == [Config.of({"x": 1}), Config.of({"x": 2})]
        [trial] = landscape.evaluator()([Config.of({"x": 3})])
        assert trial.status == "invalid"

    def test_evaluator_simulates_the_device(self) -> None:
        evaluate = tiny_landscape().evaluator()
        trials = evaluate([Config.of({"x": x}) for x in (1, 2, 3, 4)])
        assert [(t.status, t.time_ms) for t in trials] == [
            ("ok", 2.0),
            ("compile_error", None),
            ("ok", 1.5),
            ("invalid", None),
        ]
        assert trials[1].error == "too many registers"
        assert trials[0].config == {"x": 1}

    @pytest.mark.parametrize("strategy", ["exhaustive", "random", "optuna"])
    def test_replay_is_deterministic(self, strategy: str) -> None:
        landscape = bowl_landscape(3)

        def replay() -> list[tuple[Config, str, float | None]]:
            search = get_strategy(strategy, landscape.search_space(), seed=7)
            log = run_search(search, landscape.evaluator(), Budget(trials=30))
            return [(c, t.status, t.time_ms) for c, t in log]

        first = replay()
        assert len(first) == 30
        assert replay() == first


class TestRecord:
    def test_records_every_unpruned_config_in_order(self) -> None:
        space = SearchSpace(
            {"a": (1, 2, 3), "b": (1, 2)},
            constraint=lambda c: "odd" if (int(c["a"]) + int(c["b"])) % 5 == 0 else None,
        )
        seen: list[Progress] = []

        def measure(config: Config) -> Trial:
            if config == Config.of({"a": 2, "b": 1}):
                raise RuntimeError("worker died")
            return entry(config.to_json(), "ok", (float(config["a"]) * float(config["b"]),))

        landscape = record_landscape(
            space, measure, key={"kernel": "k"}, device="cpu", note="n", progress=seen.append
        )
        assert landscape.configs() == list(space.configs())
        assert len(landscape.entries) == 5  # a=3, b=2 pruned
        assert [e.status for e in landscape.entries] == ["ok", "ok", "runtime_error", "ok", "ok"]
        assert "worker died" in landscape.entries[2].error
        assert landscape.space == {"a": [1, 2, 3], "b": [1, 2]}
        assert (landscape.key, landscape.device, landscape.note) == ({"kernel": "k"}, "cpu", "n")
        assert [(p.done, p.total, p.best_ms) for p in seen][-1] == (5, 5, 1.0)
        assert not landscape.search_space().contains(Config.of({"a": 3, "b": 2}))

    def test_an_entry_no_trial_can_be_stops_the_recording(self) -> None:
        # 65 repeats: more than a trial keeps. Recorded as every config's runtime_error, a
        # night's recording would be lost without a word; it stops at the first config instead.
        with pytest.raises(InvalidInput, match="at most 64"):
            record_landscape(SearchSpace({"a": (1, 2)}),
                             lambda c: entry(c.to_json(), "ok", (1.0,) * 65), key={}, device="cpu")  # fmt: skip

    def test_a_compilers_message_with_a_nul_is_kept_as_its_status(self) -> None:
        found = entry({"a": 1}, "compile_error", error="bad\x00byte \ud800" + "x" * 3000)
        assert found.status == "compile_error" and found.error.startswith("bad\ufffdbyte \ufffd")
        assert len(found.error) == 2048

    def test_entry_for_another_config_is_rejected(self) -> None:
        space = SearchSpace({"a": (1, 2)})
        with pytest.raises(InvalidInput, match="returned an entry"):
            record_landscape(
                space,
                lambda c: entry({"a": 1}, "invalid"),
                key={},
                device="cpu",
            )


def test_tune_landscape_writes_each_config_once_as_the_search_measured_it(tmp_path: Path) -> None:
    from tests.factories import make_key
    from tunecache_cli.tune import _write_landscape

    key = make_key()  # a TVM knob key: its space is enumerable on this machine
    first, second, third = (c.to_json() for c in list(_space_of(key).configs())[:3])
    trials = [
        Trial(config=first, status="ok", time_ms=1.0, times_ms=(0.9, 1.0, 1.2)),
        Trial(config=second, status="ok", time_ms=2.0),  # no spread kept: its one time
        Trial(config=third, status="compile_error", error="x"),
        Trial(config={**first, "extra": 1}, status="ok", time_ms=3.0),  # not of the space
        Trial(config=first, status="wrong_answer", error="refused in validation"),  # again
    ]
    _write_landscape(tmp_path / "l.json", SimpleNamespace(key=key, trials=trials))
    loaded = Landscape.load(tmp_path / "l.json")
    assert [(t.status, t.time_ms, t.times_ms) for t in loaded.entries] == [
        ("ok", 1.0, (0.9, 1.0, 1.2)), ("ok", 2.0, (2.0,)), ("compile_error", None, ())]  # fmt: skip


def _space_of(key: Any) -> SearchSpace:
    from backends import get_backend
    from tuner.candidates import enumerable_space
    from workloads import get_workload

    return enumerable_space(get_backend(key.backend), get_workload(key.kernel),
                            dict(key.problem), key.dtype)  # fmt: skip


class TestSearchEfficiencyBench:
    def test_writes_table_for_every_landscape_and_strategy(self, tmp_path: Path) -> None:
        small = {"BLOCK_M": (16, 32, 64, 128), "BLOCK_N": (32, 64, 128), "num_warps": (2, 4, 8)}
        bowl_landscape(1, small, device="Synthetic GPU A").save(tmp_path / "a.json")
        bowl_landscape(2, device="Synthetic GPU B").save(tmp_path / "b.json")
        out = tmp_path / "results" / "search_efficiency.md"
        code = search_efficiency.main([str(tmp_path), "--seeds", "2", "--out", str(out)])
        assert code == 0
        text = out.read_text()
        assert "Synthetic GPU A" in text and "Synthetic GPU B" in text
        assert "36 configs" in text
        cold, families = text.split("## Cold, by family")
        rows = [line for line in cold.splitlines() if line.startswith("| ")]
        assert len(rows) == 1 + 3 * 3  # header, 2 landscapes + average, 3 strategies each
        header = rows[0].split(" | ")
        # Two families (a's parameters are not b's), then the worst and average rows; then the
        # default held to the bar.
        families, held = families.split("`portfolio` below random less 0.01: ")
        assert held.split(" of ")[1].startswith("8 cells")  # 2 families × 4 fixed counts
        by_family = [line for line in families.splitlines() if line.startswith("| ")]
        assert len(by_family) == 1 + 2 * 3 + 3 + 3
        assert sum("*worst family*" in row for row in by_family) == 3
        cpu = [float(r.split(" | ")[-1].rstrip(" |")) for r in rows[1:]]
        assert all(ms >= 0 for ms in cpu) and "CPU ms/proposal" in rows[0]
        exhaustive_a = next(r for r in rows if r.startswith("| a | exhaustive")).split(" | ")
        assert exhaustive_a[header.index("@200")] == "1.000"  # capped at the size (36)
        assert {"1%", "2%", "5%"} <= set(header)

    def test_families_show_their_spread_and_only_replays_the_landscapes_named(
        self, tmp_path: Path
    ) -> None:
        for seed, device in ((1, "GPU A"), (2, "GPU B")):
            bowl_landscape(seed, device=device).save(tmp_path / f"{device[-1]}.json")
        out = tmp_path / "out.md"
        argv = [str(tmp_path), "--seeds", "3", "--strategies", "random", "--only", "A"]
        assert search_efficiency.main([*argv, "--out", str(out)]) == 0
        cold, families = out.read_text().split("## Cold, by family")
        assert "GPU A" in cold and "GPU B" not in cold
        row = next(line for line in families.splitlines() if line.startswith("| bowl"))
        mean, error = row.split(" | ")[2].split(" ±")  # @25 of 3 random seeds: they differ
        assert 0 < float(mean) <= 1 and 0 < float(error) < 1, row
        with pytest.raises(SystemExit):
            search_efficiency.main([str(tmp_path), "--only", "C", "--out", str(out)])

    def test_transfer_searches_each_landscape_with_its_family_as_prior(
        self, tmp_path: Path
    ) -> None:
        for seed, device in ((1, "GPU A"), (2, "GPU B"), (3, "GPU C")):
            bowl_landscape(seed, device=device).save(tmp_path / f"{device[-1]}.json")
        out = tmp_path / "out.md"
        argv = [str(tmp_path), "--seeds", "2", "--strategies", "random,bayes", "--transfer"]
        assert search_efficiency.main([*argv, "--out", str(out)]) == 0
        text = out.read_text()
        assert "## With transfer" in text
        transfer = text.split("## With transfer")[1]
        assert transfer.count("| A | ") == 2 and "| *average* | bayes |" in transfer

    def test_the_default_is_held_to_the_better_of_optuna_and_random_less_the_slack(self) -> None:
        def eff(strategy: str, at25: float, at50: float) -> search_efficiency.Efficiency:
            ratios = {"@25": at25, "@50": at50, "@100": 1.0, "@200": 1.0}
            return search_efficiency.Efficiency(strategy, ratios, 10.0, 0,
                                                errors=dict.fromkeys(ratios, 0.01))  # fmt: skip

        rows = [
            ("F", eff("random", 0.80, 0.97)),
            ("F", eff("optuna", 0.95, 0.90)),
            ("F", eff("portfolio", 0.90, 0.961)),  # @25: 0.05 below optuna; @50: 0.009 below
            ("G", eff("random", 0.90, 0.90)),
            ("G", eff("optuna", 0.89, 0.90)),
            ("G", eff("portfolio", 0.885, 0.99)),  # @25: 0.015 below, within the noise
            ("*worst family*", eff("portfolio", 0.0, 0.0)),  # not a family
        ]
        lines = search_efficiency.bar(rows, ["random", "optuna", "portfolio"])
        assert lines[0].startswith("`portfolio` below the better of optuna and random less 0.01: "
                                   "2 of 8 cells")  # fmt: skip
        assert "1 of them by more than the slack plus twice" in lines[0]
        below = [line for line in lines if line.startswith("| F") or line.startswith("| G")]
        assert below == ["| F | @25 | 0.900 | optuna 0.950 | -0.050 | 0.028 |",
                         "| G | @25 | 0.885 | random 0.900 | -0.015 | 0.028 |"]  # fmt: skip
        assert search_efficiency.bar(rows, ["random", "optuna"]) == []  # no default run

    def test_empty_folder_and_unknown_strategy(self, tmp_path: Path) -> None:
        assert search_efficiency.main([str(tmp_path), "--out", str(tmp_path / "x.md")]) == 2
        with pytest.raises(SystemExit):
            search_efficiency.main([str(tmp_path), "--strategies", "annealing"])
