"""What a served config must satisfy besides being in the kernel's space (``docs/integrations.md``).

A record served by the cache (an untrusted uploader's) never changes a kernel's result, nor raises
into the user's launch where Triton's own autotuner would not:

- the kernel's ``early_config_prune`` keeps it for this call, as Triton would have pruned it;
- a config from a declared ``space=`` runs the listed configs' ``pre_hook`` (a hook may zero an
  output the kernel adds into), or is refused where which hook it needs cannot be told;
- on a GPU, it compiles for the call: a ``tl.static_assert`` that fails (Triton's autotuner times
  such a config as infinitely slow: it never picks it) refuses it.

Kernels run under Triton's interpreter in fresh processes (``tests/user_triton_served_space.py``);
the real compiles for a GPU target run in a process where the interpreter never ran.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
SCRIPT = """
import json, logging, sys
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
import tests.user_triton_served_space as m
print(json.dumps(m.main(json.loads(sys.argv[1]))))
"""
EVEN = {"BLOCK": 64, "EVEN": True, "num_warps": 1, "num_stages": 3}
UNEVEN = {**EVEN, "EVEN": False}  # the first listed config: what a miss launches


def scenario(spec: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """Runs :func:`tests.user_triton_served_space.main` on ``spec`` in a fresh process."""
    done = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(spec)], capture_output=True,
                          text=True, timeout=300, cwd=REPO,
                          env={**os.environ, "TRITON_INTERPRET": "1"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return json.loads(done.stdout.splitlines()[-1]), done.stderr


def launched(out: dict[str, Any]) -> list[tuple[int, bool, dict[str, Any]]]:
    return [(r["n"], r["correct"], r["launched"]) for r in out["results"]]


# -- the kernel's early_config_prune ------------------------------------------------------------
@pytest.mark.parametrize("prune", ["divides", "rewrites"])
def test_a_served_config_the_kernels_prune_drops_is_never_launched(prune: str) -> None:
    """``EVEN=True`` is listed; the kernel's prune drops it where 64 does not divide n (1000),
    keeps it where it does (1024), compared by values (``rewrites`` returns new objects). The
    prune runs once per tuning key, when the served answer is fitted: not on later launches."""
    out, stderr = scenario({"kernel": "masked", "answers": {1000: EVEN, 1024: EVEN},
                            "decorations": [{"prune": prune}],
                            "calls": [[0, 1000], [0, 1024], [0, 1024], [0, 1000]]})  # fmt: skip
    assert launched(out) == [(1000, True, UNEVEN), (1024, True, EVEN), (1024, True, EVEN),
                             (1000, True, UNEVEN)]  # fmt: skip
    assert out["pruned"] == [1000, 1024]
    assert "pruned for this call by the kernel's early_config_prune" in stderr
    assert stderr.count("never launched") == 1, stderr  # one warning for the kernel


def test_a_prune_that_raises_makes_the_served_config_a_miss() -> None:
    """A prune with a bug (``KeyError``) cannot say the served config is right here: it is not
    launched (the first config is), with a warning, and nothing raises into the user's launch."""
    out, stderr = scenario({"kernel": "masked", "answers": {1024: EVEN},
                            "decorations": [{"prune": "raises"}],
                            "calls": [[0, 1024], [0, 1024]]})  # fmt: skip
    assert launched(out) == [(1024, True, UNEVEN), (1024, True, UNEVEN)]
    assert out["pruned"] == [1024]
    assert "early_config_prune, which raised KeyError: 'rows'" in stderr
    assert stderr.count("never launched") == 1, stderr


def test_a_config_from_the_declared_space_is_pruned_with_the_listed_ones() -> None:
    """The prune sees the listed configs and the served one: ``BLOCK=128, EVEN=True`` is dropped
    at n=1000 and kept at 1024; ``EVEN=False`` is kept everywhere."""
    big = {**EVEN, "BLOCK": 128}
    out, _ = scenario({"kernel": "masked",
                       "answers": {1000: big, 1024: big, 1001: {**big, "EVEN": False}},
                       "decorations": [{"prune": "divides", "space": {"BLOCK": [64, 128]}}],
                       "calls": [[0, 1000], [0, 1024], [0, 1001]]})  # fmt: skip
    assert launched(out) == [(1000, True, UNEVEN), (1024, True, big),
                             (1001, True, {**big, "EVEN": False})]  # fmt: skip


def test_a_memo_answer_is_pruned_too() -> None:
    """Another decoration of the kernel (no prune) put the answer in the process's memo, which is
    not fitted again: the decoration with the prune still drops it."""
    out, _ = scenario({"kernel": "masked", "answers": {1000: EVEN},
                       "decorations": [{}, {"prune": "divides"}],
                       "calls": [[0, 1000], [1, 1000]]})  # fmt: skip
    assert launched(out)[1] == (1000, True, UNEVEN)
    assert out["pruned"] == [1000]


# -- the listed configs' pre_hook -----------------------------------------------------------------
def test_a_config_from_the_declared_space_runs_the_listed_pre_hook() -> None:
    """``BLOCK=128`` is inside the declared space: it runs with the hook every listed config has
    (zeroing the output ``tl.atomic_add`` adds into). Where each listed config has its own hook,
    which one it needs cannot be told: refused, the first config runs (its own hook)."""
    block = {"BLOCK": 128, "num_warps": 1, "num_stages": 3}
    space = {"BLOCK": [32, 64, 128]}
    out, stderr = scenario({"kernel": "sum", "answers": {1000: block},
                            "decorations": [{"space": space},
                                            {"space": space, "configs": "own_hooks"}],
                            "calls": [[0, 1000], [1, 1000]]})  # fmt: skip
    first = {**block, "BLOCK": 32}
    assert launched(out) == [(1000, True, block), (1000, True, first)]
    assert out["hooked"] == ["zero", "zero32"]
    assert "which pre_hook it needs cannot be told" in stderr


def _zero(nargs: dict[str, Any]) -> None: ...


def _other(nargs: dict[str, Any]) -> None: ...


class _Hooks:
    def zero(self, nargs: dict[str, Any]) -> None: ...


def test_the_pre_hook_a_declared_config_takes() -> None:
    import triton

    from tunecache.triton.keys import KernelSpace

    def config(block: int, warps: int, hook: Any, stages: int = 3) -> Any:
        return triton.Config({"BLOCK": block}, num_warps=warps, num_stages=stages, pre_hook=hook)

    served = {"BLOCK": 128, "num_warps": 1, "num_stages": 3}
    space = {"BLOCK": (32, 64, 128)}
    # One hook for all (equal bound methods count as one), or none at all.
    hooks = _Hooks()
    for hook in (_zero, hooks.zero, None):
        found = KernelSpace([config(32, 1, hook), config(64, 1, hook)], space).find(served)
        assert found is not None and found.pre_hook == hook
    # By the parameters the space does not name: num_warps=1's hook, num_warps=2's hook.
    by_warps = KernelSpace([config(b, w, hook) for b in (32, 64)
                            for w, hook in ((1, _zero), (2, _other))], space)  # fmt: skip
    assert getattr(by_warps.find(served), "pre_hook", None) is _zero
    assert getattr(by_warps.find({**served, "num_warps": 2}), "pre_hook", None) is _other
    listed = by_warps.find({**served, "BLOCK": 32})
    assert listed is not None and listed.pre_hook is _zero  # a listed config: the user's own
    # Which hook cannot be told: refused.
    mixed = KernelSpace([config(32, 1, _zero), config(64, 1, _other)], space)
    assert mixed.find(served) is None
    why = mixed.outside(served)
    assert "'num_warps': 1" in why and "have different pre_hooks" in why, why
    apart = KernelSpace([config(32, 1, _zero), config(64, 2, _other, stages=4)], space)
    inside = {**served, "num_stages": 4}  # each value is a listed one; no config has both
    assert apart.find(inside) is None and "no listed config's together" in apart.outside(inside)


# -- a tl.static_assert failing at this call ------------------------------------------------------
STATIC_ASSERT = """
import json, torch
import tests.user_triton_served_space as m
from tunecache.device import Device, DeviceFingerprint, DeviceLimits
from tunecache.triton.shared import shared_memory, shared_misfit
h100 = Device(DeviceFingerprint(kind="cuda", arch="sm_90", name="h100", units=132),
              DeviceLimits.H100)
x = torch.empty(400)
arguments = {"x_ptr": x, "y_ptr": x, "n": 4, "D": 100}
config = {"num_warps": 1, "num_stages": 3}
print(json.dumps([shared_misfit(m.rowscale, arguments, {**config, "BLOCK_D": 64}, h100),
                  shared_misfit(m.rowscale, arguments, {**config, "BLOCK_D": 128}, h100),
                  # raises where it does not compile: the None above is then no pass
                  shared_memory(m.rowscale, arguments, {**config, "BLOCK_D": 128}, "sm_90")]))
"""


def test_a_config_failing_the_kernels_static_assert_at_this_call_is_refused() -> None:
    """Compiled for the GPU's target (no GPU needed) with the call's ``tl.constexpr`` arguments
    (``D=100``): ``BLOCK_D=64`` fails ``tl.static_assert(BLOCK_D >= D)``, 128 compiles. In a fresh
    process where the interpreter never ran (it patches ``triton.language`` for good)."""
    done = subprocess.run([sys.executable, "-c", STATIC_ASSERT], capture_output=True, text=True,
                          timeout=300, cwd=REPO, env={**os.environ, "TRITON_INTERPRET": "1"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    small, wide, wide_bytes = json.loads(done.stdout.splitlines()[-1])
    assert small is not None and "fails the kernel's tl.static_assert at this call" in small
    assert "tl.static_assert(BLOCK_D >= D)" in small
    assert wide is None and isinstance(wide_bytes, int)


PRUNED_FIRST = """
import json, torch, triton
import tunecache.triton, tunecache.triton.autotuner as autotuner
from tests.user_triton_served import _masked, hostile_client
from tests.user_triton_served_space import divides
client = hostile_client(_masked, {})  # every lookup a miss
autotuner.shared_client = lambda *a: client
configs = [triton.Config({"BLOCK": 64, "EVEN": e}, num_warps=1) for e in (True, False)]
configs.append(triton.Config({"BLOCK": 32, "EVEN": False}, num_warps=1))
kernel = tunecache.triton.autotune(configs=configs, key=["n"], on_miss="tune",
                                   prune_configs_by={"early_config_prune": divides})(_masked)
n, runs = 100, []
for _ in range(2):
    x, y = torch.randn(n, generator=torch.Generator().manual_seed(1)), torch.full((n,), 7.0)
    kernel[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, y, n)
    runs.append([bool(torch.allclose(y, x * 2 + 1)), kernel.best_config.kwargs["EVEN"]])
print(json.dumps(runs))
"""


def test_a_winner_is_checked_against_a_config_the_kernel_keeps_for_the_call() -> None:
    """Without ``reference=``, the tuned winner is compared with the first config the kernel's
    prune keeps for the call, and a wrong one falls back to it: the first listed config
    (``EVEN=True``, wrong where 64 does not divide 100) made a right winner fail its check, and
    was launched instead of it from then on."""
    done = subprocess.run([sys.executable, "-c", PRUNED_FIRST], capture_output=True, text=True,
                          timeout=300, cwd=REPO, env={**os.environ, "TRITON_INTERPRET": "1"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == [[True, False], [True, False]]
    assert "failed validation" not in done.stderr, done.stderr
