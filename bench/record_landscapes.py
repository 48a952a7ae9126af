"""Records TVM knob landscapes: every config of each key's knob space, built, checked and timed.

Per key (``workload:M=..,N=..``) the full knob space (:func:`backends.tvm.knobs.knob_space`) is
enumerated; every config is compiled (in a process pool with ``--jobs N`` > 1, a batch at a time,
never while anything is being timed), run once on fresh seeded inputs into a NaN-poisoned output
and compared with the workload's float64 reference, then timed with TVM's ``time_evaluator``
(``--repeats`` samples, each at least ``--min-sample-ms`` long; every sample is kept so noise is
visible). A failed build is recorded as ``compile_error``, a failed call as ``runtime_error``, an
answer off the reference (or NaN, or an element left unwritten) as ``wrong_answer``. One landscape
file per key goes to ``--out`` (:class:`tuner.landscape.Landscape`); a table is printed.

    python -m bench.record_landscapes [--out bench/landscapes] [--keys matmul:M=256,N=256,K=256 ...]
        [--repeats 5] [--jobs 1] [--sample N]

Run it on a quiet machine: timings taken while other work runs are noise.
"""

from __future__ import annotations

import argparse
import logging
import math
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backends.tvm.knobs import apply_knobs, knob_space
from tunecache import key_for
from tunecache.errors import InvalidInput, TuningError
from tunecache.schemas import MAX_REPEATS
from tunecache.space import Config, SearchSpace
from workloads import get_workload
from workloads.base import Workload

if TYPE_CHECKING:
    import torch
    from tvm.runtime import Module

    from backends.base import Trial
    from tuner.landscape import Landscape

logger = logging.getLogger("bench.record_landscapes")

OUT = Path(__file__).with_name("landscapes")
DEFAULT_KEYS = (
    "matmul:M=256,N=256,K=256",
    "bias_gelu:M=256,N=256,K=256",
    "softmax:M=512,N=1024",
    "layernorm:M=512,N=1024",
    "rmsnorm:M=512,N=1024",
)
_MAX_ERROR = 500


@dataclass(frozen=True)
class Timer:
    """How each config is timed: ``repeats`` samples of ``number`` calls, each ≥ ``min_sample_ms``."""

    repeats: int = 5
    min_sample_ms: float = 2.0
    warmup: int = 0  # beyond the correctness run and time_evaluator's own warm-up call

    def describe(self) -> str:
        return (
            f"time_evaluator: {self.repeats} samples of n calls each >= {self.min_sample_ms:g} ms"
            " after the correctness run and a warm-up call (times_ms: per-call mean per sample);"
            " torch single-threaded"
        )


@dataclass(frozen=True)
class KeySpec:
    """One key to record: a workload at a problem, in a dtype."""

    workload: Workload
    problem: dict[str, int]
    dtype: str = "float32"

    @classmethod
    def parse(cls, text: str, dtype: str = "float32") -> KeySpec:
        """``matmul:M=256,N=256,K=256`` → the key spec.

        Raises:
            InvalidInput: malformed text, an unknown workload, or a bad problem.
        """
        name, sep, sizes = text.partition(":")
        if not sep or not sizes:
            raise InvalidInput(f"key {text!r} is not WORKLOAD:M=..,N=..")
        problem: dict[str, Any] = {}
        for part in sizes.split(","):
            param, eq, value = part.partition("=")
            if not eq or not value.strip().isdigit():
                raise InvalidInput(f"key {text!r}: {part!r} is not NAME=INTEGER")
            problem[param.strip()] = int(value)
        workload = get_workload(name.strip())
        return cls(workload, workload.problem(problem), dtype)

    @property
    def stem(self) -> str:
        """The landscape's file name without ``.json``: ``tvm-matmul-256x256x256-float32``."""
        shape = "x".join(str(v) for v in self.problem.values())
        return f"tvm-{self.workload.name}-{shape}-{self.dtype}"


@dataclass
class Built:
    """A config's compiled module, or why it did not compile."""

    module: Module | None = None
    error: str = ""


@dataclass
class Recorder:
    """Builds, checks and times the configs of one key; ``measure`` is what the landscape calls.

    Configs are compiled ahead of measurement, ``batch`` at a time (in ``jobs`` processes when
    ``jobs`` > 1), in the order :meth:`SearchSpace.configs` yields them.
    """

    spec: KeySpec
    configs: list[Config]
    timer: Timer = field(default_factory=Timer)
    jobs: int = 1
    seed: int = 0
    batch: int = 16
    _built: dict[Config, Built] = field(default_factory=dict, init=False)
    _next: int = field(default=0, init=False)
    _pool: ProcessPoolExecutor | None = field(default=None, init=False)
    _tmp: Path | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        workload, problem, dtype = self.spec.workload, self.spec.problem, self.spec.dtype
        self._inputs = workload.make_inputs(problem, dtype, self.seed)
        self._reference = workload.reference(*self._inputs)
        self._tolerance = workload.tolerance(dtype)
        self._index = {config: i for i, config in enumerate(self.configs)}

    @contextmanager
    def running(self) -> Iterator[Recorder]:
        """Holds the compile pool and its scratch folder while the key is recorded.

        torch runs single-threaded meanwhile: its OpenMP threads spin-wait after each check and
        fight TVM's thread pool for the cores, which made checks 10x slower and timings noisy.
        """
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        if self.jobs > 1:
            self._tmp = Path(tempfile.mkdtemp(prefix="tunecache-landscape-"))
            self._pool = ProcessPoolExecutor(self.jobs, mp_context=_spawn())
        try:
            yield self
        finally:
            torch.set_num_threads(threads)
            if self._pool is not None:
                self._pool.shutdown(cancel_futures=True)
                self._pool = None
            if self._tmp is not None:
                shutil.rmtree(self._tmp, ignore_errors=True)
                self._tmp = None

    # -- compiling ----------------------------------------------------------------------------
    def _compile_through(self, index: int) -> None:
        """Compiles the configs up to ``index`` (and the rest of its batch) if not yet done."""
        while self._next <= index:
            chunk = self.configs[self._next : self._next + self.batch * max(1, self.jobs)]
            self._next += len(chunk)
            if self._pool is None or self._tmp is None:
                for config in chunk:
                    self._built[config] = _build_here(self.spec, config)
                continue
            futures = {
                config: self._pool.submit(
                    _build_to_file,
                    self.spec.workload.name,
                    self.spec.problem,
                    self.spec.dtype,
                    config.to_json(),
                    str(self._tmp / f"{self._index[config]}.so"),
                )
                for config in chunk
            }
            for config, future in futures.items():
                self._built[config] = _load(future.result())

    def built(self, config: Config) -> Built:
        """The compiled module of ``config`` (compiling its batch first if needed)."""
        if config not in self._built:
            index = self._index.get(config)
            if index is None:
                self._built[config] = _build_here(self.spec, config)
            else:
                self._compile_through(index)
        return self._built.pop(config)

    # -- measuring ----------------------------------------------------------------------------
    def measure(self, config: Config) -> Trial:
        """Builds (or fetches) ``config``, checks it against the reference, then times it."""
        from tuner.landscape import entry

        built = self.built(config)
        if built.module is None:
            return entry(config.to_json(), "compile_error", error=built.error)
        try:
            func = built.module["main"]
            out = self._poisoned()
            func(*self._inputs, out)
        except Exception as exc:
            return entry(config.to_json(), "runtime_error", error=_short(exc))
        problem = self._check(out)
        if problem:
            return entry(config.to_json(), "wrong_answer", error=problem)
        try:
            times = self._time(built.module, out)
        except Exception as exc:
            return entry(config.to_json(), "runtime_error", error=_short(exc))
        return entry(config.to_json(), "ok", times_ms=tuple(times))

    def _poisoned(self) -> torch.Tensor:
        import torch

        from workloads.base import torch_dtype

        shape = self.spec.workload.output_shape(self.spec.problem)
        return torch.full(shape, math.nan, dtype=torch_dtype(self.spec.dtype))

    def _check(self, out: torch.Tensor) -> str:
        """Why ``out`` is not the reference (``""`` when it is within tolerance)."""
        if tuple(out.shape) != tuple(self._reference.shape):
            return f"output shape {tuple(out.shape)} is not {tuple(self._reference.shape)}"
        unwritten = int(out.isnan().sum())
        if unwritten:
            return f"{unwritten} output elements NaN (unwritten or overflowed)"
        ref = self._reference
        error = float((out.double() - ref).norm() / ref.norm())
        if not error <= self._tolerance:
            return f"relative error {error:.3g} > tolerance {self._tolerance:g}"
        return ""

    def _time(self, module: Module, out: torch.Tensor) -> list[float]:
        import tvm

        func = module["main"]
        for _ in range(self.timer.warmup):
            func(*self._inputs, out)
        started = time.perf_counter()
        func(*self._inputs, out)
        once_ms = max((time.perf_counter() - started) * 1e3, 1e-6)
        number = max(1, math.ceil(self.timer.min_sample_ms / once_ms))
        evaluator = module.time_evaluator(
            "main", tvm.cpu(), number=number, repeat=self.timer.repeats
        )
        result = evaluator(*self._inputs, out)
        return [float(seconds) * 1e3 for seconds in result.results]


# -- building (in this process or in a pool worker) -------------------------------------------
def _build_here(spec: KeySpec, config: Config) -> Built:
    from backends.tvm.runnable import compile_module
    from tunecache.tvm.target import host_target

    try:
        mod = apply_knobs(spec.workload, spec.problem, spec.dtype, config.to_json())
        return Built(compile_module(mod, host_target()))
    except (TuningError, InvalidInput) as exc:
        return Built(error=_short(exc))


def _build_to_file(
    workload: str, problem: dict[str, int], dtype: str, config: dict[str, Any], path: str
) -> tuple[str, str]:
    """Pool worker: compiles ``config`` into the shared library ``path``; ``(path, "")`` or the
    error as ``("", message)``."""
    built = _build_here(KeySpec(get_workload(workload), problem, dtype), Config.of(config))
    if built.module is None:
        return "", built.error
    try:
        built.module.export_library(path)
    except Exception as exc:
        return "", f"export_library failed: {_short(exc)}"
    return path, ""


def _load(answer: tuple[str, str]) -> Built:
    import tvm

    path, error = answer
    if not path:
        return Built(error=error)
    try:
        return Built(tvm.runtime.load_module(path))
    except Exception as exc:
        return Built(error=f"load_module failed: {_short(exc)}")


def _spawn() -> Any:
    import multiprocessing

    return multiprocessing.get_context("spawn")  # TVM's thread pool does not survive fork


def _short(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    text = " | ".join(lines[-3:]) if lines else type(exc).__name__
    return f"{type(exc).__name__}: {text}"[-_MAX_ERROR:]


# -- recording ----------------------------------------------------------------------------------
def sampled(space: SearchSpace, sample: int | None, seed: int) -> SearchSpace:
    """``space``, or a seeded random ``sample`` of its configs (the others pruned as unsampled)."""
    if sample is None:
        return space
    configs = list(space.configs())
    keep = set(random.Random(seed).sample(configs, min(sample, len(configs))))

    def constraint(config: Config) -> str | None:
        reason = space.prune_reason(config)
        return reason or (None if config in keep else "not in the --sample")

    return SearchSpace(space.params, constraint=constraint)


def device_name() -> str:
    """``AMD EPYC, 2 cores (cpu-avx512)``: this CPU, for the landscape's ``device`` field."""
    from tunecache.device import local_fingerprint
    from tunecache.tvm.target import host_cores

    fingerprint = local_fingerprint("cpu")
    name = fingerprint.raw_name or fingerprint.name
    return f"{name}, {host_cores()} cores ({fingerprint.arch})"


def record_key(
    spec: KeySpec,
    *,
    timer: Timer = Timer(),  # frozen dataclass: a safe default
    jobs: int = 1,
    seed: int = 0,
    sample: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> Landscape:
    """The landscape of one key: every config of its knob space (or a ``sample`` of them)."""
    from backends.base import Progress
    from tuner.landscape import record_landscape

    space = sampled(knob_space(spec.workload, spec.problem, spec.dtype), sample, seed)
    configs = list(space.configs())
    key = key_for(spec.workload, "tvm", spec.problem, spec.dtype).to_json()
    started = time.perf_counter()
    every = max(1, len(configs) // 20)

    def report(p: Progress) -> None:
        if progress is not None and (p.done % every == 0 or p.done == p.total):
            best = "-" if p.best_ms is None else f"{p.best_ms:.4g} ms"
            elapsed = time.perf_counter() - started
            progress(f"{spec.stem}: {p.done}/{p.total} in {elapsed:.0f} s, best {best}")

    recorder = Recorder(spec, configs, timer=timer, jobs=jobs, seed=seed)
    with recorder.running():
        landscape = record_landscape(
            space, recorder.measure, key=key, device=device_name(), progress=report
        )
    seconds = time.perf_counter() - started
    sampled_note = f"; a seeded sample of {len(configs)} configs" if sample is not None else ""
    landscape.note = (
        f"TVM knob space; {timer.describe()}; inputs seed {seed}; compile jobs {jobs};"
        f" recorded in {seconds:.0f} s{sampled_note}"
    )
    return landscape


def summary_row(spec: KeySpec, landscape: Landscape, seconds: float) -> list[str]:
    """One table row: counts by status, the optimum, the spread, the time it took."""
    from backends.tvm.knobs import summarize_knobs

    counts: dict[str, int] = {}
    for entry in landscape.entries:
        counts[entry.status] = counts.get(entry.status, 0) + 1
    ok = [e for e in landscape.entries if e.time_ms is not None]
    best = landscape.optimum() if ok else None
    worst = max(e.time_ms or 0.0 for e in ok) if ok else None
    noise = [
        (max(e.times_ms) - min(e.times_ms)) / statistics.median(e.times_ms)
        for e in ok
        if statistics.median(e.times_ms) > 0
    ]
    failed = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()) if k != "ok") or "-"
    return [
        spec.stem,
        str(len(landscape.entries)),
        str(counts.get("ok", 0)),
        failed,
        "-" if best is None else f"{best.time_ms:.4g}",
        "-" if best is None else summarize_knobs(best.config),
        "-" if worst is None else f"{worst:.4g}",
        "-" if not noise else f"{statistics.median(noise) * 100:.1f}%",
        f"{seconds:.0f}",
        f"{seconds / max(1, len(landscape.entries)) * 1e3:.0f}",
    ]


HEADER = ["landscape", "configs", "ok", "failed", "best ms", "best config", "worst ms",
          "spread", "s", "ms/config"]  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help="folder for the landscape files")
    parser.add_argument(
        "--keys", nargs="+", default=list(DEFAULT_KEYS), help="WORKLOAD:M=..,N=.. ..."
    )
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeats", type=int, default=Timer.repeats, help="samples per config")
    parser.add_argument(
        "--min-sample-ms", type=float, default=Timer.min_sample_ms, help="shortest sample"
    )
    parser.add_argument(
        "--jobs", type=int, default=1, help="compile processes (1: compile in this process)"
    )
    parser.add_argument("--seed", type=int, default=0, help="inputs (and --sample) seed")
    parser.add_argument("--sample", type=int, default=None, help="record only N random configs")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    if args.repeats < 1 or args.jobs < 1 or (args.sample is not None and args.sample < 1):
        parser.error("--repeats, --jobs and --sample must be >= 1")
    if args.repeats > MAX_REPEATS:
        parser.error(f"--repeats: at most {MAX_REPEATS} (a trial keeps that many times)")

    from tunecache_cli.table import render

    specs = [KeySpec.parse(text, args.dtype) for text in args.keys]
    timer = Timer(repeats=args.repeats, min_sample_ms=args.min_sample_ms)
    rows = []
    for spec in specs:
        started = time.perf_counter()
        landscape = record_key(
            spec, timer=timer, jobs=args.jobs, seed=args.seed, sample=args.sample,
            progress=logger.info,
        )  # fmt: skip
        path = args.out / f"{spec.stem}.json"
        landscape.save(path)
        seconds = time.perf_counter() - started
        logger.info("%s: %d configs in %.0f s -> %s", spec.stem, len(landscape.entries), seconds,
                    path)  # fmt: skip
        rows.append(summary_row(spec, landscape, seconds))
    print(render(HEADER, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
