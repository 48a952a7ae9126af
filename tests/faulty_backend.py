"""A backend whose candidates misbehave on purpose, to test the measurement harness.

Each config's ``mode`` says what its runnable (or its build) does: ``ok`` computes the right
answer after sleeping ``sleep_ms``; ``wrong`` is off by 1 %; ``segfault`` dereferences NULL;
``hang`` never returns; ``raise`` raises; ``build_raise`` fails to build; ``build_segfault``
crashes while building. It wraps nothing: correct answers come from the workload's own torch_fn.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from backends import Backend, Runnable, SearchRequest, SearchResult
from tunecache.space import SearchSpace
from workloads.base import Workload

MODES = ("ok", "wrong", "segfault", "hang", "raise", "build_raise", "build_segfault")


def _segfault() -> None:
    ctypes.string_at(0)  # reads address 0: SIGSEGV


class FaultyBackend(Backend):
    name = "faulty"  # type: ignore[assignment]

    def unavailable_reason(self) -> str | None:
        return None

    def space(self, workload: Workload, problem: Mapping[str, int], dtype: str) -> SearchSpace:
        return SearchSpace({"mode": MODES, "sleep_ms": (0.0, 1.0)})

    def build(
        self, workload: Workload, problem: Mapping[str, int], dtype: str, config: Mapping[str, Any]
    ) -> Runnable:
        mode = config["mode"]
        if mode == "build_raise":
            raise RuntimeError("this candidate does not compile")
        if mode == "build_segfault":
            _segfault()
        sleep_s = float(config.get("sleep_ms", 0.0)) / 1e3

        def run(*inputs: torch.Tensor) -> torch.Tensor:
            if mode == "segfault":
                _segfault()
            if mode == "hang":
                time.sleep(3600)
            if mode == "raise":
                raise RuntimeError("illegal memory access (simulated)")
            if sleep_s:
                time.sleep(sleep_s)
            out = workload.torch_fn(*inputs)
            return out * 1.01 if mode == "wrong" else out

        return run

    def summarize(self, config: Mapping[str, Any]) -> str:
        return f"{config['mode']} {config.get('sleep_ms', 0)}ms"


class SlowSetUpBackend(FaultyBackend):
    """The faulty backend whose every set-up in a worker takes ``SET_UP_S`` (a cold device, a
    large reference): the workers construct it by name when they set a task up."""

    SET_UP_S = 3.0

    def __init__(self) -> None:
        time.sleep(self.SET_UP_S)


def knob(mode: str, sleep_ms: float = 0.0) -> dict[str, Any]:
    """A :class:`FaultyTVM` config: a TVM knob config (what a TVM record may hold) naming a mode."""
    return {"schedule": "knobs", "fault": MODES.index(mode), "sleep_us": int(sleep_ms * 1000)}


def mode_of(config: Mapping[str, Any]) -> str:
    """The mode of a :class:`FaultyBackend` or :class:`FaultyTVM` config."""
    return str(config["mode"]) if "mode" in config else MODES[int(config["fault"])]


class FaultyTVM(FaultyBackend):
    """The same misbehaving candidates, under a real backend's name so keys can be made; its
    configs are TVM knob configs (``fault``: the mode's index), as a TVM record must hold."""

    name = "tvm"  # type: ignore[assignment]

    def space(self, workload: Workload, problem: Mapping[str, int], dtype: str) -> SearchSpace:
        return SearchSpace({"schedule": ("knobs",), "fault": tuple(range(len(MODES))),
                            "sleep_us": (0, 1000)})  # fmt: skip

    def build(
        self, workload: Workload, problem: Mapping[str, int], dtype: str, config: Mapping[str, Any]
    ) -> Runnable:
        sleep_ms = int(config.get("sleep_us", 0)) / 1000
        return super().build(workload, problem, dtype, {"mode": mode_of(config),
                                                        "sleep_ms": sleep_ms})  # fmt: skip

    def summarize(self, config: Mapping[str, Any]) -> str:
        return f"{mode_of(config)} {int(config.get('sleep_us', 0)) / 1000}ms"


class FaultyNativeTVM(FaultyTVM):
    """A backend with a search of its own whose best candidate segfaults when it runs."""

    native_strategy = "faulty_search"  # type: ignore[assignment]

    def search(self, request: SearchRequest, *, workdir: Path) -> SearchResult:
        from backends import Trial

        best, runner_up = knob("segfault"), knob("ok")
        trials = [Trial(config=c, status="ok", time_ms=1.0) for c in (best, runner_up)]
        return SearchResult([best, runner_up], trials, self.native_strategy or "")


class SoundTVM(FaultyTVM):
    """Only candidates that pass, a few microseconds apart: many quick trials, a search that only
    its budget stops."""

    def space(self, workload: Workload, problem: Mapping[str, int], dtype: str) -> SearchSpace:
        return SearchSpace({"schedule": ("knobs",), "fault": (MODES.index("ok"),),
                            "sleep_us": tuple(range(64))})  # fmt: skip
