"""What a newcomer's walk of the CLI found, each reproduced here: options a form of ``tune``
dropped without a word, a token hint that failed when run, a wrong URL read as a miss, a
progress "best" no other line had, a default config counted as a trial, trial configs shown as
the start of their JSON, and ``tune --torch``'s closing lines."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.conftest import LiveServer
from tests.factories import TEST_TOKEN, make_key, timing
from tunecache_cli import main

KEY = ["matmul", "--backend", "tvm", "--shape", "M=8,N=8,K=8"]
REACHED = 99  # what a form's run returns here: reached, the option was not refused


@pytest.fixture
def reached(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Each form's run replaced by one that records its arguments and returns ``REACHED``: an
    option that is not refused reaches it (before the fix, a whole tune ran)."""
    from tunecache_cli import tune, tune_torch, tune_tvm

    seen: list[Any] = []

    def record(args: Any) -> int:
        seen.append(args)
        return REACHED

    monkeypatch.setattr(tune, "_run_key", record)
    monkeypatch.setattr(tune_torch, "run", record)
    monkeypatch.setattr(tune_tvm, "run", record)
    return seen


# B1, B2: every option a form does not use is refused by name, with why.
REFUSED = [
    ([*KEY, "--inputs", "get_inputs"], "--inputs (for --torch"),  # the default's own value
    ([*KEY, "--init-inputs", "get_init_inputs"], "--init-inputs (for --torch"),
    (["--torch", "m.py:M", "--dtype", "float16"], "--dtype (your code runs in the dtypes"),
    (["--torch", "m.py:M", "--dtype", "float32"], "--dtype ("),  # the key form's default
    (["--torch", "m.py:M", "--seconds", "5"], "--seconds (max-autotune's compile is not cut"),
    (["--torch", "m.py:M", "--trials", "3"], "--trials (max-autotune benchmarks every choice"),
    (["--tvm", "m.py:f", "--dtype", "float16"], "--dtype (the module's buffers declare"),
    (["--tvm", "m.py:f", "--inputs", "get_inputs"], "--inputs (MetaSchedule times the module"),
]


@pytest.mark.parametrize(("argv", "words"), REFUSED)
def test_an_option_the_form_does_not_use_is_refused_by_name(
    argv: list[str], words: str, reached: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tune", *argv, "--no-upload"]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1 and not reached, err


def test_the_options_a_form_uses_reach_it_with_their_defaults(reached: list[Any]) -> None:
    """``--seconds`` bounds a ``--tvm`` search (MetaSchedule stops at it), so it is taken; the
    defaults no option of the parser holds any longer are each form's own again."""
    assert main(["tune", "--tvm", "m.py:f", "--seconds", "5", "--no-upload"]) == REACHED
    assert main(["tune", "--torch", "m.py:M", "--device", "cpu", "--no-upload"]) == REACHED
    assert main(["tune", *KEY, "--trials", "4", "--no-upload"]) == REACHED
    tvm, torch, key = reached
    assert (tvm.seconds, tvm.trials, tvm.dtype, tvm.inputs) == (5.0, 32, None, None)
    assert (torch.inputs, torch.init_inputs, torch.trials, torch.dtype) == (
        "get_inputs", "get_init_inputs", None, None)  # fmt: skip
    assert (key.dtype, key.trials, key.inputs) == ("float32", 4, None)


def test_every_option_of_tune_is_in_the_table_of_forms() -> None:
    """A new option of ``tune`` that the table lacks would be taken by every form unchecked."""
    from tunecache_cli import build_parser
    from tunecache_cli.tune_forms import NOT_OPTIONS, OPTIONS

    args = build_parser().parse_args(["tune"])
    assert set(vars(args)) - NOT_OPTIONS == set(OPTIONS)
    unset = [dest for dest in OPTIONS if getattr(args, dest) not in (None, False)]
    assert unset == []  # given or not is set or not: no option has a default of its own


# M1: the token hint is a command that works on the local default.
def test_the_token_hint_is_a_command_that_works_on_the_local_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("TUNECACHE_TOKEN")
    assert main(["tune", *KEY, "--server", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    found = re.search(r"tunecache (token create [^`;)]*)", err)
    assert found is not None, err
    hint = found.group(1).replace("NAME", "me").split()
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "TUNECACHE_URL": "http://127.0.0.1:9"}
    env.pop("TUNECACHE_SERVER_DB", None)
    done = subprocess.run([sys.executable, "-m", "tunecache_cli", *hint], capture_output=True,
                          text=True, timeout=120, env=env)  # fmt: skip
    assert done.returncode == 0, (hint, done.stderr)
    assert done.stdout.strip().startswith("tc_")


# M2: a path no route of the server has is a wrong URL (2) for every command, never a miss (1).
@pytest.mark.parametrize("argv", [["records", "ls"], ["records", "show", "1"], ["get", *KEY]])
def test_a_url_with_v1_in_it_is_bad_input_not_a_miss(
    argv: list[str], shared_server: LiveServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--server", f"{shared_server.url}/v1"]) == 2
    assert "no such path" in capsys.readouterr().err
    if argv[0] == "get":  # the same lookup at the server's root: a real miss, still 1
        assert main([*argv, "--server", shared_server.url]) == 1


# M3: the progress "best" is the best of the trials counted.
def test_the_progress_best_is_the_best_of_this_runs_trials() -> None:
    """MetaSchedule's closing report carries the best record of its local database (earlier
    runs' too): shown as "best", it was a time the trial table and the closing line lacked."""
    from backends.base import Progress
    from tunecache_cli.progress import ProgressPrinter

    stream = io.StringIO()
    with ProgressPrinter("k", stream, heartbeat=60) as progress:
        progress(Progress(0, 8, None, "meta_schedule: starting"))
        progress(Progress(8, 8, 0.01743, "measured a batch"))
        progress(Progress(8, 8, 0.01616, "meta_schedule: done"))
    lines = stream.getvalue().splitlines()
    assert "best 0.01743 ms meta_schedule: done" in lines[-1], lines
    assert "0.01616" not in stream.getvalue()


# C2, C4: records show counts the default apart and summarises each trial's config.
TRACE: list[Any] = [
    [
        ["GetSBlock", [], ["C", "main"], ["b0"]],
        ["GetLoops", ["b0"], [], ["l2", "l3", "l4"]],
        ["SamplePerfectTile", ["l2"], [4, 64], ["v5", "v6", "v7", "v8"]],
        ["SampleCategorical", [], [[0, 16, 64, 512], [0.25, 0.25, 0.25, 0.25]], ["v14"]],
    ],
    [[2, [2, 1, 16, 4]], [3, 1]],
]


def _tvm_record(searched: int) -> Any:
    from tunecache.schemas import (
        BaselineModel,
        CheckModel,
        KeyModel,
        RecordCreate,
        SearchModel,
        Trial,
        ValidationReport,
    )

    key = make_key(m=96)
    meta = {"schedule": "meta_schedule", "trace": TRACE, "target": {"kind": "llvm"}}
    trials = [Trial(config=meta, status="ok", time_ms=0.02 + i / 1000) for i in range(searched)]
    trials.append(Trial(config={"schedule": "default"}, status="ok", time_ms=0.01))
    check = CheckModel(problem=dict(key.problem), seed=1, rel_error=1e-7, max_abs_error=1e-7,
                       tolerance=1e-4, passed=True)  # fmt: skip
    return RecordCreate(
        key=KeyModel.from_key(key), config={"schedule": "default"},
        config_summary="default (no schedule)", timing=timing(0.01),
        baselines=[BaselineModel(name="torch_eager", timing=timing(0.02)),
                   BaselineModel(name="default_config", timing=timing(0.01))],
        validation=ValidationReport(passed=True, tolerance=1e-4, max_rel_error=1e-7,
                                    checks=[check]),
        search=SearchModel(strategy="meta_schedule", trials=len(trials), seconds=3.0),
        trials=trials,
    )  # fmt: skip


def test_records_show_counts_the_default_apart_and_summarises_each_trial(
    shared_server: LiveServer, capsys: pytest.CaptureFixture[str]
) -> None:
    from tunecache.client import Client

    with Client(shared_server.url, token=TEST_TOKEN) as client:
        record_id = client.upload(_tvm_record(16)).record_id
    assert main(["records", "show", str(record_id), "--server", shared_server.url]) == 0
    out = capsys.readouterr().out
    assert "meta_schedule, 16 trials + the default config;" in out, out
    rows = out.split("trial  ")[1].splitlines()[2:]
    assert len(rows) == 17 and rows[-1].startswith("default "), rows
    assert all("tiles 2x1x16x4 unroll 16" in row for row in rows[:-1]), rows
    assert "default (no schedule)" in rows[-1] and '"trace"' not in out


def test_the_dashboard_counts_the_default_apart_as_records_show_does(
    any_server: LiveServer,
) -> None:
    """After ``tune --trials 8`` the CLI said "8 trials + the default config" while the
    dashboard's index said 9 and the record page "9 trials; … 9 stored": the default config,
    timed beside the winner, counted as a trial of the search. Both now say what the CLI says,
    and the record page's trial table names the default's row as ``records show`` does. On
    SQLite and PostgreSQL: the pages find the last trial's config in SQL."""
    import httpx

    from tunecache.client import Client

    with Client(any_server.url, token=TEST_TOKEN) as client:
        record_id = client.upload(_tvm_record(8)).record_id
    auth = {"Authorization": f"Bearer {TEST_TOKEN}"}
    index = httpx.get(f"{any_server.url}/", params={"all": "true"}, headers=auth).text
    (row,) = [r for r in re.findall(r"<tr class=.*?</tr>", index, flags=re.S)
              if f'/ui/records/{record_id}"' in r]  # fmt: skip
    assert '<td class="num trials">8 trials + the default config</td>' in row, row
    page = httpx.get(f"{any_server.url}/ui/records/{record_id}", headers=auth).text
    assert "meta_schedule: 8 trials + the default config; tuned in 3.0 s;" in page
    assert "9 trials" not in page
    rows = page.split('<table class="trials">', 1)[1].split("</table>", 1)[0]
    numbers = re.findall(r'<td class="num">([^<]*)</td><td>ok</td>', rows)
    assert numbers == [*map(str, range(1, 9)), "default"], numbers


def test_a_record_that_kept_part_of_its_trials_counts_every_one_searched(
    shared_server: LiveServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """A record keeps at most 20,000 trials (and 8 MiB of them): ``search.trials`` counts
    every one. ``records show`` and the record page counted the kept ones where the last was
    the default's: 25,000 searched read "8 trials + the default config"."""
    import httpx

    from tunecache.client import Client

    record = _tvm_record(8)
    record = record.model_copy(
        update={"search": record.search.model_copy(update={"trials": 25_001})}
    )
    with Client(shared_server.url, token=TEST_TOKEN) as client:
        record_id = client.upload(record).record_id
    assert main(["records", "show", str(record_id), "--server", shared_server.url]) == 0
    assert "meta_schedule, 25000 trials + the default config;" in capsys.readouterr().out
    auth = {"Authorization": f"Bearer {TEST_TOKEN}"}
    page = httpx.get(f"{shared_server.url}/ui/records/{record_id}", headers=auth).text
    assert "meta_schedule: 25000 trials + the default config; tuned in 3.0 s; 9 stored" in page


# C5: tune --torch's closing lines.
def test_tune_torch_says_it_did_not_upload_and_keeps_the_choices_under_their_heading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The compile is stood in for (what it returns is what the lines are made of)."""
    from backends.inductor import observe
    from tunecache.inductor import pretune

    model = tmp_path / "mlp.py"
    model.write_text("import torch\n\ndef f(x):\n    return x @ x\n\n"
                     "def get_inputs():\n    return [torch.ones(4, 4)]\n")  # fmt: skip
    group = SimpleNamespace(op="mm", timings={"cpp_gemm-1": 0.01, "aten_mm-2": 0.02})
    result = SimpleNamespace(
        device="cpu", compile_s=1.0, compiled_ms=0.01, eager_ms=0.02,
        versus_eager=SimpleNamespace(text=lambda: "2.00x faster"), groups=[group],
        best_configs=[], check=SimpleNamespace(ok=True, reference="float64 eager", error=1e-7,
                                               tolerance=1e-4),
    )  # fmt: skip
    monkeypatch.setattr(pretune, "pretune", lambda *a, **k: result)
    monkeypatch.setattr(observe, "other_load", lambda since: 1.3)
    assert main(["tune", "--torch", f"{model}:f", "--device", "cpu", "--no-upload"]) == 0
    said = capsys.readouterr()
    lines = said.out.splitlines()
    heading = next(i for i, line in enumerate(lines) if "autotune choices recorded" in line)
    assert lines[heading + 1].startswith("    mm: cpp_gemm"), lines
    assert "note: other processes keep about 1.3 cores busy" in lines[-1], lines
    assert "not uploaded (--no-upload)" in said.err
