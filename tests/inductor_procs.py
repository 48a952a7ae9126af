"""Processes for tests/test_inductor_cache.py and bench/inductor_team_cache.py (run as a script).

``tune OUT -- ARGS…``
    Runs ``tunecache ARGS…`` (the CLI's ``main``) in this process and saves the first output of
    the call ``torch.compile`` returned there to ``OUT`` (``torch.save``); exits with the CLI's
    code. ``torch.compile`` is wrapped only to see that output.

``compile FILE.py OUT [--url URL] [--timeout S]``
    A user's process: optionally ``tunecache.inductor.enable(URL)``, then ``FILE.py``'s ``Model``
    (built with ``get_init_inputs()``) compiled with max-autotune and freezing under
    ``torch.no_grad()`` and called on ``get_inputs()``. Inductor's autotune entry points are
    wrapped to count benchmark calls and a feedback saver notes the choice picked per op. Saves
    the output to ``OUT`` and prints one JSON line: ``benchmarks``, ``chosen`` (the picked choice
    hashes), ``enabled`` (what enable returned), ``warnings`` (TeamCacheWarning count),
    ``enable_s``, ``compile_s``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch


def _tune(out: Path, argv: list[str]) -> int:
    from tunecache_cli import main

    outputs: list[Any] = []
    real_compile = torch.compile

    def spy(*args: Any, **kwargs: Any) -> Any:
        compiled = real_compile(*args, **kwargs)

        def call(*call_args: Any, **call_kwargs: Any) -> Any:
            result = compiled(*call_args, **call_kwargs)
            if not outputs:
                outputs.append(result.detach().clone())
            return result

        return call

    torch.compile = spy
    code = main(argv)
    if outputs:
        torch.save(outputs[0], out)
    return code


def _count_benchmarks() -> dict[str, int]:
    from torch._inductor.select_algorithm import AlgorithmSelectorCache

    counts: dict[str, int] = {}
    for name in ("autotune", "benchmark", "benchmark_choices", "benchmark_in_current_process"):
        original = AlgorithmSelectorCache.__dict__.get(name)
        if original is None:
            continue
        counts[name] = 0

        def make(method: Any, label: str) -> Any:
            inner = method.__func__ if isinstance(method, classmethod | staticmethod) else method

            def counted(*args: Any, **kwargs: Any) -> Any:
                counts[label] += 1
                return inner(*args, **kwargs)

            return (
                type(method)(counted) if isinstance(method, classmethod | staticmethod) else counted
            )

        setattr(AlgorithmSelectorCache, name, make(original, name))
    return counts


def _compile(path: Path, out: Path, url: str | None, timeout: float) -> int:
    from torch._inductor import config, select_algorithm

    import tunecache.inductor

    counts = _count_benchmarks()
    chosen: list[str] = []

    def saver(timings: dict[Any, float], name: str, *_rest: Any) -> None:
        chosen.append(min(timings, key=lambda choice: timings[choice]).hash_key())

    select_algorithm.add_feedback_saver(saver)
    spec = importlib.util.spec_from_file_location("user_model", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.Model(*module.get_init_inputs()).eval()
    inputs = module.get_inputs()
    report: dict[str, Any] = {"enabled": None}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.perf_counter()
        if url is not None:
            enabled = tunecache.inductor.enable(url, timeout=timeout)
            report["enabled"] = dataclasses.asdict(enabled)
        report["enable_s"] = time.perf_counter() - start
        start = time.perf_counter()
        with torch.no_grad(), config.patch(freezing=True):
            output = torch.compile(model, mode="max-autotune")(*inputs)
        report["compile_s"] = time.perf_counter() - start
    report["warnings"] = sum(
        issubclass(w.category, tunecache.inductor.TeamCacheWarning) for w in caught
    )
    report["warning_text"] = [str(w.message) for w in caught if "tunecache" in str(w.message)]
    report["benchmarks"] = sum(counts.values())
    report["chosen"] = chosen
    torch.save(output, out)
    print(json.dumps(report))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command", required=True)
    tune = commands.add_parser("tune")
    tune.add_argument("out", type=Path)
    tune.add_argument("argv", nargs=argparse.REMAINDER)
    compile_ = commands.add_parser("compile")
    compile_.add_argument("file", type=Path)
    compile_.add_argument("out", type=Path)
    compile_.add_argument("--url")
    compile_.add_argument("--timeout", type=float, default=2.0)
    args = parser.parse_args()
    if args.command == "tune":
        argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        return _tune(args.out, argv)
    return _compile(args.file, args.out, args.url, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
