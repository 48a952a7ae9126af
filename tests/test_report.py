"""``tunecache report``: the numbers behind each figure, the PNGs drawn from a real server, and
the command's exit codes."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import LiveServer, sqlite_server
from tests.factories import CPU, make_key, make_record, timing
from tunecache.client import Client
from tunecache.device import DeviceFingerprint
from tunecache.key import Key
from tunecache.manifest import parse_manifest
from tunecache.report import (
    convergence,
    coverage_grid,
    fetch_records,
    fetch_searches,
    key_label,
    record_states,
    speedups,
)
from tunecache.schemas import BaselineModel, RecordCreate, RecordPublic, SearchModel, Trial
from tunecache_cli import main

REPO = Path(__file__).resolve().parent.parent
H100 = DeviceFingerprint(kind="cuda", arch="sm_90", name="nvidia-h100", units=132, memory_gb=80)
WHITE = (255, 255, 255)
# The colours the figures draw with (tunecache.report.figures), as RGB.
DEFAULT_BLUE, EAGER_ORANGE = (0x4C, 0x72, 0xB0), (0xDD, 0x84, 0x52)
TUNED, STALE, QUEUED = (0x2C, 0xA0, 0x2C), (0xF0, 0xC4, 0x19), (0x5D, 0xAD, 0xE2)
FAILED, UNVALIDATED, MISSING = (0xD6, 0x27, 0x28), (0x94, 0x67, 0xBD), (0xC8, 0xC8, 0xC8)


def shaped(kernel: str, backend: str, problem: dict[str, int], dtype: str = "float32") -> Key:
    return dataclasses.replace(make_key(kernel=kernel, backend=backend, dtype=dtype),
                               problem=problem)  # fmt: skip


def record(
    key: Key,
    ms: float,
    *,
    baselines: dict[str, float] | None = None,
    trials: list[float | None] | None = None,
    passed: bool = True,
) -> RecordCreate:
    """A record of ``key``: winner ``ms``, baselines by name, one trial per time (``None``: a
    compile error)."""
    found = [
        Trial(config={"tile": i}, status="ok", time_ms=t)
        if t is not None
        else Trial(config={"tile": i}, status="compile_error", error="boom")
        for i, t in enumerate(trials or [])
    ]
    return make_record(key, time_ms=ms, passed=passed).model_copy(update={
        "baselines": [BaselineModel(name=n, timing=timing(t)) for n, t in (baselines or {}).items()],
        "trials": found,
        "search": SearchModel(strategy="random", trials=len(found), seconds=2.0),
    })  # fmt: skip


def public(created: RecordCreate, record_id: int = 1, *, winner: bool = True) -> RecordPublic:
    return RecordPublic.model_validate({**created.model_dump(), "id": record_id,
                                        "key_hash": created.key.digest(), "is_winner": winner,
                                        "created_at": datetime.now(UTC)})  # fmt: skip


BOTH = {"default_config": 3.0, "torch_eager": 6.0}
SEARCH = [5.0, 3.0, None, 4.0, 2.0, 2.5]  # best so far: 5, 3, 3, 2, 2


def team_records() -> list[RecordCreate]:
    """What a team's server holds after a while: 13 matmul shapes on TVM (one without a default
    baseline, one without eager), a softmax slower than its default, a layernorm without trials,
    an H100 Triton matmul, and a matmul that never validated."""
    records = []
    for i, m in enumerate(range(16, 16 * 14, 16)):
        baselines = (
            {"torch_eager": 4.0} if m == 16 else {"default_config": 2.0} if m == 32 else BOTH
        )
        records.append(record(shaped("matmul", "tvm", {"M": m, "N": 64, "K": 64}), 1.0 + i / 10,
                              baselines=baselines, trials=SEARCH[: 2 + i % 5]))  # fmt: skip
    softmax = shaped("softmax", "inductor", {"M": 8, "N": 48})
    records.append(record(softmax, 1.0, baselines={"default_config": 0.8, "torch_eager": 1.5},
                          trials=[1.2, 1.0]))  # fmt: skip
    layernorm = shaped("layernorm", "inductor", {"M": 8, "N": 48}, "bfloat16")
    records.append(record(layernorm, 0.5, baselines=BOTH))
    triton = dataclasses.replace(make_key(kernel="matmul", backend="triton", dtype="float16"),
                                 device=H100)  # fmt: skip
    records.append(record(triton, 0.02, baselines={"torch_eager": 0.05}, trials=[0.04, 0.02]))
    broken = shaped("matmul", "inductor", {"M": 256, "N": 64, "K": 64})
    records.append(record(broken, 1.0, baselines=BOTH, trials=[1.0], passed=False))
    return records


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A server filled with :func:`team_records` through the API, once for the module."""
    servers = sqlite_server(tmp_path_factory.mktemp("report-server"))
    live = next(servers)
    with Client(live.url) as client:
        for created in team_records():
            client.upload(created)
    yield live
    next(servers, None)  # the generator stops the server


def rgb(path: Path) -> np.ndarray:
    """The PNG's pixels as 8-bit RGB, after checking it decodes to a real figure."""
    from matplotlib.image import imread

    image = imread(path)
    assert image.ndim == 3 and image.shape[0] >= 250 and image.shape[1] >= 400, image.shape
    return np.asarray(np.round(image[..., :3] * 255), dtype=np.uint8)


def close_to(pixels: np.ndarray, colour: tuple[int, int, int]) -> np.ndarray:
    """Which pixels are exactly ``colour``, give or take rounding."""
    return np.abs(pixels.astype(int) - np.array(colour)).max(axis=-1) <= 2


def share(pixels: np.ndarray, colour: tuple[int, int, int]) -> float:
    """The fraction of pixels of ``colour``."""
    return float(close_to(pixels, colour).mean())


def assert_drawn(pixels: np.ndarray, *colours: tuple[int, int, int]) -> None:
    """Not blank: a good part is not background, many colours, and each of ``colours`` covers
    a visible area (a bar, a line, a cell: some hundreds of pixels)."""
    assert 1 - share(pixels, WHITE) > 0.04
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 20
    for colour in colours:
        assert close_to(pixels, colour).sum() > 200, colour


# -- the numbers plotted ----------------------------------------------------------------------
def test_speedups_are_the_records_own_baselines_and_none_where_missing() -> None:
    key = shaped("matmul", "tvm", {"M": 64, "N": 64, "K": 64})
    both = public(record(key, 2.0, baselines={"default_config": 3.0, "torch_eager": 8.0}))
    eager_only = public(record(dataclasses.replace(key, problem={"M": 8, "N": 64, "K": 64}), 2.0,
                               baselines={"torch_eager": 1.0}))  # fmt: skip
    rows = speedups([both, eager_only])
    assert [r.label for r in rows] == ["matmul tvm float32 K=64,M=8,N=64",  # M=8 before M=64
                                       "matmul tvm float32 K=64,M=64,N=64"]  # fmt: skip
    assert (rows[0].vs_default, rows[0].vs_eager) == (None, 0.5)  # not invented, and slower
    assert (rows[1].vs_default, rows[1].vs_eager) == (1.5, 4.0)


def test_labels_name_the_arch_only_when_records_span_several() -> None:
    cpu = public(record(make_key(), 1.0, baselines=BOTH))
    gpu = public(record(dataclasses.replace(make_key(), device=H100), 1.0, baselines=BOTH))
    assert [r.label.split()[-1] for r in speedups([cpu])] == ["K=64,M=64,N=64"]
    assert sorted(r.label.split()[-1] for r in speedups([cpu, gpu])) == [CPU.arch, "sm_90"]
    assert key_label(make_key(), with_arch=True).endswith(CPU.arch)


def test_a_speedup_timed_by_the_interpreter_is_marked() -> None:
    """A Triton drop-in record timed by Triton's interpreter on the host stood in the speedup
    figure as a speedup like any other ("3.54x faster than torch eager"); its label now says so,
    as ``records ls`` and the dashboard do."""
    from tunecache.measured import INTERPRETER_TIMER

    created = record(make_key(), 1.0, baselines=BOTH)
    timing = created.timing.model_copy(update={"timer": INTERPRETER_TIMER})
    interpreted = public(created.model_copy(update={"timing": timing}))
    (row,) = speedups([interpreted])
    assert row.interpreted and row.caveat == " (interpreter)"
    (plain,) = speedups([public(created)])
    assert not plain.interpreted and plain.caveat in ("", " (noisy)")


def test_a_label_that_reads_as_tex_is_drawn_as_text(tmp_path: Path) -> None:
    """A write token uploaded a user kernel's key whose problem read ``$\\frac{1}{$``: from then
    on every ``tunecache report`` ended in matplotlib's math parser ("internal error:
    ValueError"). The server's text is drawn as text."""
    from tunecache.report.figures import draw_convergence, draw_speedup
    from tunecache.report.series import Convergence, Speedup

    label = "mine $\\frac{1}{$ tvm float32"
    said = draw_speedup([Speedup(label, 2.0, 0.5)], tmp_path / "speedup.png")
    assert "1 key" in said and (tmp_path / "speedup.png").stat().st_size > 0
    draw_convergence([Convergence(label, (1, 2), (2.0, 1.0), 0)], tmp_path / "convergence.png",
                     not_shown=0)  # fmt: skip
    assert (tmp_path / "convergence.png").stat().st_size > 0


def test_convergence_is_best_so_far_over_the_final_best_skipping_failed_trials() -> None:
    series = convergence(public(record(make_key(), 2.0, trials=SEARCH)), "k")
    assert series is not None
    assert series.trials == (1, 2, 4, 5, 6)  # trial 3 failed: no point, but it was a trial
    assert series.relative == (2.5, 1.5, 1.5, 1.0, 1.0)
    assert series.failed == 1
    assert convergence(public(record(make_key(), 2.0, trials=[None, None])), "k") is None
    assert convergence(public(record(make_key(), 2.0)), "k") is None


def test_convergence_leaves_out_the_default_config_timed_beside_the_winner() -> None:
    """The tuner appends the default config's timing to a record's trials: it was drawn as the
    search's last trial, and where it was the fastest the search's own best read as 1.25x."""
    from tunecache.defaults import default_config

    searched = record(make_key(), 2.0, trials=[5.0, 2.5], baselines={"default_config": 2.0})
    default = Trial(config=default_config("tvm") or {}, status="ok", time_ms=2.0)
    with_default = searched.model_copy(update={"trials": [*searched.trials, default]})
    series = convergence(public(with_default), "k")
    assert series is not None and series.trials == (1, 2) and series.relative == (2.0, 1.0)
    other = Trial(config={"tile": 9}, status="ok", time_ms=2.0)  # a search's own last trial
    kept = convergence(public(searched.model_copy(update={"trials": [*searched.trials, other]})),
                       "k")  # fmt: skip
    assert kept is not None and kept.trials == (1, 2, 3)


def test_the_grid_puts_each_key_in_its_cell_with_the_best_status_of_a_cell() -> None:
    a, b = make_key(16), make_key(32)
    other_device = dataclasses.replace(a, device=dataclasses.replace(CPU, name="other-cpu"))
    grid = coverage_grid([(a, "missing"), (other_device, "tuned"), (b, "queued"),
                          (make_key(16, backend="inductor"), "failed")])  # fmt: skip
    assert grid.rows == ("matmul K=64,M=16,N=64", "matmul K=64,M=32,N=64")
    assert grid.columns == ("inductor float32 cpu-avx2", "tvm float32 cpu-avx2")
    assert dict(grid.cells) == {(0, 1): "tuned", (1, 1): "queued", (0, 0): "failed"}
    assert grid.counts() == {"tuned": 1, "queued": 1, "failed": 1}
    with pytest.raises(ValueError, match="unknown coverage status"):
        coverage_grid([(a, "done")])


def test_record_states_are_tuned_with_a_winner_else_unvalidated() -> None:
    good, bad = make_key(16), make_key(32)
    records = [public(record(good, 1.0), 1, winner=False), public(record(good, 0.5), 2),
               public(record(bad, 1.0, passed=False), 3, winner=False)]  # fmt: skip
    states = {key.problem["M"]: state for key, state in record_states(records)}
    assert states == {16: "tuned", 32: "unvalidated"}


def test_the_server_gives_every_record_and_twelve_searches(team: LiveServer) -> None:
    with Client(team.url) as client:
        records = fetch_records(client)
        assert len(records) == 17 and sum(r.is_winner for r in records) == 16
        assert len(fetch_records(client, backend="inductor")) == 3
        searches = fetch_searches(client, [r for r in records if r.is_winner], keys=12)
    assert len(searches.series) == 12
    assert (searches.not_shown, searches.without_trials) == (4, 1)  # the layernorm has none
    first = searches.series[0]  # layernorm is passed over; the H100 Triton key sorts next
    assert first.label.startswith("matmul triton float16") and first.relative == (2.0, 1.0)


# -- the PNGs ---------------------------------------------------------------------------------
def test_report_draws_three_pngs_from_the_servers_records(
    team: LiveServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "new" / "report"  # created
    assert main(["report", "-o", str(out), "--server", team.url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        str(out / name) for name in ("speedup.png", "convergence.png", "coverage.png")
    ]
    assert "16 keys" in lines[0] and "12 keys" in lines[1] and "16 tuned, 1 unvalidated" in lines[2]
    assert_drawn(rgb(out / "speedup.png"), DEFAULT_BLUE, EAGER_ORANGE)
    assert_drawn(rgb(out / "convergence.png"), (0x1F, 0x77, 0xB4), (0xFF, 0xBB, 0x78))  # 1st, 12th
    coverage = rgb(out / "coverage.png")
    assert_drawn(coverage, TUNED, UNVALIDATED)
    assert share(coverage, TUNED) > 5 * share(coverage, UNVALIDATED)  # 16 cells to 1
    assert sorted(p.name for p in out.iterdir()) == ["convergence.png", "coverage.png",
                                                     "speedup.png"]  # no temp file left  # fmt: skip


def test_filters_narrow_every_figure(
    team: LiveServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["report", "-o", str(tmp_path), "--kernel", "matmul", "--backend", "inductor",
                 "--server", team.url])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0
    # Its only record never validated: no winner to compare or follow, a grid of one cell.
    assert captured.out.splitlines() == [
        f"{tmp_path / 'coverage.png'}: coverage grid, 1 kernel shape × 1 backend/dtype/arch "
        "column, from records: 1 unvalidated"
    ]
    assert (
        "speedup.png not written" in captured.err and "convergence.png not written" in captured.err
    )
    assert_drawn(rgb(tmp_path / "coverage.png"), UNVALIDATED)
    assert share(rgb(tmp_path / "coverage.png"), TUNED) == 0


def test_coverage_of_a_manifest_colours_each_state(
    server: LiveServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = """policy = "compatible"
arch = "sm_90"
[[tune]]
kernel = "matmul"
backends = ["triton"]
dtypes = ["float16", "bfloat16"]
shapes = [{M = 16, N = 64, K = 64}, {M = 32, N = 64, K = 64}, {M = 48, N = 64, K = 64}]
"""
    (tmp_path / "m.toml").write_text(text)
    tuned, stale, queued, failed, *_ = parse_manifest(text).keys
    with Client(server.url) as client:
        client.upload(record(tuned, 0.5, baselines=BOTH, trials=[0.7, 0.5]))
        old = dataclasses.replace(stale, environment={"torch": "1.0.0", "triton": "1.0.0"})
        client.upload(record(old, 0.5, baselines=BOTH))
        client.create_job(queued)
        job = client.create_job(failed, max_attempts=1, priority=10).job
        assert client.claim_job("w", device_arch="sm_90") is not None
        client.fail_job(job.id, "w", "out of memory")
    out = tmp_path / "out"
    assert main(["report", "-o", str(out), "--manifest", str(tmp_path / "m.toml"),
                 "--server", server.url]) == 0  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].endswith(
        "from manifest m.toml: 1 tuned, 1 stale, 1 queued, 1 failed, 2 missing"
    )
    assert_drawn(rgb(out / "coverage.png"), TUNED, STALE, QUEUED, FAILED, MISSING)


def test_report_as_a_subprocess(team: LiveServer, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "tunecache_cli", "report", "-o", str(tmp_path),
                           "--backend", "tvm", "--server", team.url], capture_output=True,
                          text=True, timeout=120, cwd=REPO, env=dict(os.environ))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 3 and "13 keys" in done.stdout
    assert_drawn(rgb(tmp_path / "speedup.png"), DEFAULT_BLUE, EAGER_ORANGE)


def test_importing_tunecache_does_not_import_matplotlib() -> None:
    code = "import sys, tunecache, tunecache_cli, tunecache.report; sys.exit('matplotlib' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO, timeout=60).returncode == 0


# -- bad input ----------------------------------------------------------------------------------
def run_report(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Exit code and stderr of ``tunecache report ARGS`` in this process."""
    try:
        code = main(["report", *args])
    except SystemExit as exc:  # argparse
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and captured.out == ""
    return code, captured.err


def test_bad_input_is_one_line_and_exit_2(
    team: LiveServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("")
    bad = tmp_path / "bad.toml"
    bad.write_text("kernel = [")
    for args, says in [
        (["--server", team.url], "the following arguments are required: -o"),
        (["-o", str(a_file / "sub"), "--server", team.url], "cannot create output folder"),
        (["-o", str(a_file), "--server", team.url], "is not a folder"),
        (
            ["-o", str(tmp_path), "--backend", "cuda", "--server", team.url],
            "--backend 'cuda': expected one of triton, tvm, inductor",
        ),
        (["-o", str(tmp_path), "--manifest", str(bad), "--server", team.url], "not TOML"),
    ]:
        code, err = run_report(args, capsys)
        assert code == 2 and says in err and len(err.strip().splitlines()) == 1, (args, err)
    assert not list(tmp_path.glob("*.png"))


def test_missing_matplotlib_says_how_to_install_it(
    team: LiveServer, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib → ImportError
    code, err = run_report(["-o", str(tmp_path), "--server", team.url], capsys)
    assert code == 2 and err.strip().endswith("pip install -e '.[report]')")
    assert len(err.strip().splitlines()) == 1


def test_no_match_is_exit_1_and_a_dead_server_exit_3(
    team: LiveServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run_report(["-o", str(tmp_path), "--kernel", "conv9d", "--server", team.url],
                           capsys)  # fmt: skip
    assert (
        code == 1
        and err.strip() == f"tunecache report: no records match kernel=conv9d on {team.url}"
    )
    from cache_server.embedded import free_port

    code, err = run_report(["-o", str(tmp_path), "--server", f"http://127.0.0.1:{free_port()}"],
                           capsys)  # fmt: skip
    assert code == 3 and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.glob("*.png"))


def test_a_report_that_fails_leaves_no_folder_of_its_own(
    team: LiveServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("kernel = [")
    for args, expected in [
        (["--manifest", str(bad)], 2),  # bad input
        (["--kernel", "no_such_kernel"], 1),  # no record matches
    ]:
        out = tmp_path / "new" / "deeper"
        code, _ = run_report(["-o", str(out), *args, "--server", team.url], capsys)
        assert code == expected and not (tmp_path / "new").exists()
    kept = tmp_path / "mine"
    kept.mkdir()  # the user's own folder stays, even empty
    code, _ = run_report(["-o", str(kept), "--kernel", "no_such_kernel", "--server", team.url],
                         capsys)  # fmt: skip
    assert code == 1 and kept.is_dir()


def test_long_names_are_shortened_in_the_middle_on_every_axis() -> None:
    from tunecache.report.figures import short

    name = "mypkg.kernels.attention:FlashAttentionForward bfloat16 B=8,H=32,S=4096,D=128"
    shown = short(name, 44)
    assert len(shown) == 44 and shown.startswith("mypkg.kernels") and shown.endswith("D=128")
    assert short("matmul tvm", 44) == "matmul tvm"
