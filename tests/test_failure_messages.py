"""A failing user kernel is named in one line: what it raised, or how far off it was.

Never a Python object's repr (``[CheckModel(problem=…), …]``), never Dynamo's wrapping of the
user's exception (``Unsupported: Observed exception`` and its hints), never a traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import pytest

from backends import SearchResult
from tunecache.errors import TuningError
from tunecache.schemas import CheckModel, ValidationReport
from tuner.measure import Benchmarker, Measurement
from tuner.select import select_winner
from tuner.validation import failure_summary

TOLERANCE = 1e-4
PLACES: list[tuple[dict[str, Any], int]] = [
    ({"M": 64}, 1),
    ({"M": 64}, 2),
    ({"M": 64}, 3),
    ({"M": 63}, 1),
]


def _checks(rel_errors: Sequence[float | None], note: str = "") -> list[CheckModel]:
    return [
        CheckModel(problem=problem, seed=seed, rel_error=rel, max_abs_error=rel,
                   tolerance=TOLERANCE, passed=False, note="" if rel is not None else note)
        for (problem, seed), rel in zip(PLACES, rel_errors, strict=True)
    ]  # fmt: skip


def _report(checks: list[CheckModel]) -> ValidationReport:
    errors = [c.rel_error for c in checks]
    worst = None if None in errors else max(e for e in errors if e is not None)
    return ValidationReport(passed=all(c.passed for c in checks), tolerance=TOLERANCE,
                            max_rel_error=worst, checks=checks)  # fmt: skip


class _Bench:
    """Validates every config with ``report``; measures with ``measured``."""

    def __init__(self, report: ValidationReport, measured: Measurement | None = None) -> None:
        self.report, self.measured = report, measured

    def validate(self, config: Mapping[str, Any], seeds: Sequence[int]) -> ValidationReport:
        return self.report

    def measure(self, config: Mapping[str, Any] | None, *, again: bool = False) -> Measurement:
        assert self.measured is not None
        return self.measured


def _failure(bench: _Bench) -> str:
    found = SearchResult([{"mode": "default"}], [], "test")
    with pytest.raises(TuningError) as raised:
        select_winner(cast(Benchmarker, bench), found, default=None, seeds=(1, 2, 3),
                      emit=lambda *args, **kwargs: None)  # fmt: skip
    return str(raised.value)


def test_a_wrong_answer_is_summarized_from_the_checks_not_their_repr() -> None:
    message = _failure(_Bench(_report(_checks([0.506, 0.456, 0.495, 0.498]))))
    assert "CheckModel" not in message and "\n" not in message
    assert message == (
        "no candidate passed validation (1 tried, 0 searched); first failure: rel error 0.51 > "
        "tolerance 0.0001 on 4 of 4 checks (M=64 seed 1, M=64 seed 2, M=64 seed 3, M=63 seed 1)"
    )


def test_each_kind_of_failure_is_counted_on_one_line() -> None:
    checks = [*_checks([None, 0.3, 0.0, None], note="raised ValueError: odd M\n  more text")]
    checks[2] = checks[2].model_copy(update={"passed": True})
    summary = failure_summary(_report(checks))
    assert summary == (
        "raised ValueError: odd M on 2 of 4 checks (M=64 seed 1, M=63 seed 1); "
        "rel error 0.3 > tolerance 0.0001 on 1 of 4 checks (M=64 seed 2)"
    )


def test_a_candidate_that_failed_to_run_is_named_by_its_status_and_error() -> None:
    passed = _report([c.model_copy(update={"passed": True, "rel_error": 0.0})
                      for c in _checks([0.0] * 4)])  # fmt: skip
    crashed = Measurement("runtime_error", error="worker killed by SIGSEGV\n  details")
    message = _failure(_Bench(passed, crashed))
    assert message.endswith("first failure: runtime_error: worker killed by SIGSEGV"), message
    assert "Trial(" not in message


def test_the_compiled_kernel_raises_what_torch_fn_raises() -> None:
    torch = pytest.importorskip("torch")
    from backends.inductor.runnable import InductorRunnable

    def torch_fn(x: Any) -> Any:
        raise ValueError("user bug in torch_fn")

    runnable = InductorRunnable(torch_fn, {"mode": "default"}, label="raises")
    with pytest.raises(ValueError, match=r"^user bug in torch_fn$"):
        runnable(torch.ones(4))  # Dynamo's own: "Unsupported: Observed exception …"
    assert isinstance(runnable.torch_fn_error, ValueError)


def test_a_compile_that_ran_out_of_memory_is_not_run_again_eagerly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The device's failure is never ``torch_fn``'s to answer for: a compile out of memory was
    run again eagerly (its memory still held), and blamed on ``torch_fn`` if that failed too."""
    torch = pytest.importorskip("torch")
    from backends.inductor.runnable import InductorRunnable

    ran: list[int] = []

    def torch_fn(x: Any) -> Any:
        ran.append(1)
        raise ValueError("would be blamed")

    def out_of_memory(*args: Any) -> Any:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")

    monkeypatch.setattr(torch, "compile", lambda fn, **options: out_of_memory)
    runnable = InductorRunnable(torch_fn, {"mode": "default"}, label="oom")
    with pytest.raises(torch.cuda.OutOfMemoryError):
        runnable(torch.ones(4))
    assert ran == [] and runnable.torch_fn_error is None


KERNEL = """
    from workloads import Workload

    class Raises(Workload):
        params = ("M",)
        inputs = (("M",),)
        output = ("M",)
        backend_dtypes = {"inductor": ("float32",)}
        def torch_fn(self, x): raise ValueError("user bug in torch_fn")
        def reference(self, x): return x.double() + 1
        def flops(self, p): return p["M"]
"""


def test_tune_names_the_kernel_and_what_its_torch_fn_raised(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    (tmp_path / "raising_kernel.py").write_text(textwrap.dedent(KERNEL))
    argv = ["tune", "raising_kernel:Raises", "--backend", "inductor", "--shape", "M=8",
            "--trials", "1", "--workers", "1", "--no-upload"]  # fmt: skip
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "tunecache_cli", *argv], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path, env=env)  # fmt: skip
    out = done.stderr + done.stdout
    assert done.returncode == 1, out
    assert "Traceback" not in out and "Unsupported" not in out and "CheckModel" not in out, out
    assert out.strip().splitlines()[-1] == (
        "tunecache: tuning failed: raising_kernel:Raises: torch_fn raised ValueError: "
        "user bug in torch_fn"
    ), out
    assert not [line for line in out.splitlines() if line.startswith("WARNING")], out
