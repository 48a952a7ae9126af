"""Users' Triton kernels for what a served config must satisfy besides being in the kernel's space.

Imported by ``tests/test_triton_served_space.py`` and the fresh processes it starts (Triton's
interpreter on a CPU; :func:`main` runs one scenario there against a hostile server at the
client's transport and says what was launched).

- ``tests.user_triton_served._masked``: ``y = 2x + 1``, where ``EVEN=True`` assumes ``BLOCK``
  divides ``n`` and leaves the tail unwritten otherwise; a library's ``early_config_prune``
  (:func:`divides`) drops it then;
- ``_sum_into``: ``y[0] += sum(x)`` with ``tl.atomic_add``: right only when the configs'
  ``pre_hook`` zeroes ``y`` first;
- ``rowscale``: a ``tl.static_assert`` that one block holds a row of ``D`` columns.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

import tunecache.triton
from tests.user_triton_served import MASKED_CONFIGS, _masked, hostile_client

PRUNED: list[int] = []  # the n each call of an early_config_prune saw
HOOKED: list[str] = []  # the pre_hooks that ran


def divides(configs: list[Any], named_args: dict[str, Any], **kwargs: Any) -> list[Any]:
    """Keeps ``EVEN=True`` only where ``BLOCK`` divides ``n`` (a library's own prune)."""
    n = named_args["n"]
    PRUNED.append(n)
    return [c for c in configs if not c.kwargs["EVEN"] or n % c.kwargs["BLOCK"] == 0]


def rewrites(configs: list[Any], named_args: dict[str, Any], **kwargs: Any) -> list[Any]:
    """:func:`divides`, returning new ``triton.Config`` objects with the same values."""
    return [triton.Config(dict(c.kwargs), num_warps=c.num_warps, num_stages=c.num_stages)
            for c in divides(configs, named_args, **kwargs)]  # fmt: skip


def raises(configs: list[Any], named_args: dict[str, Any], **kwargs: Any) -> list[Any]:
    """A prune with a bug: it reads an argument the kernel does not have."""
    PRUNED.append(named_args["n"])
    return [c for c in configs if named_args["rows"] > 0]


PRUNES = {"divides": divides, "rewrites": rewrites, "raises": raises}


@triton.jit
def _sum_into(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.atomic_add(y_ptr, tl.sum(tl.load(x_ptr + offsets, mask=mask, other=0.0), axis=0))


def zeroes(name: str) -> Any:
    """A ``pre_hook`` zeroing the output (logged in ``HOOKED`` as ``name``)."""

    def pre_hook(nargs: dict[str, Any]) -> None:
        HOOKED.append(name)
        nargs["y_ptr"].zero_()

    return pre_hook


ZERO = zeroes("zero")
SUM_CONFIGS = [triton.Config({"BLOCK": b}, num_warps=1, pre_hook=ZERO) for b in (32, 64)]
# The same, where each config has its own hook: which one a new BLOCK needs cannot be told.
OWN_HOOKS = [triton.Config({"BLOCK": b}, num_warps=1, pre_hook=zeroes(f"zero{b}"))
             for b in (32, 64)]  # fmt: skip


@triton.jit
def rowscale(x_ptr, y_ptr, n, D: tl.constexpr, BLOCK_D: tl.constexpr):
    tl.static_assert(BLOCK_D >= D)  # one block must hold a whole row
    cols = tl.arange(0, BLOCK_D)
    mask = cols < D
    row = tl.program_id(0) * D
    tl.store(y_ptr + row + cols, tl.load(x_ptr + row + cols, mask=mask) * 2.0, mask=mask)


# -- one scenario in a fresh process ------------------------------------------------------------
def launch(kernel: Any, n: int, summed: bool) -> dict[str, Any]:
    """``kernel`` at ``n`` on seeded inputs (``summed``: ``_sum_into``'s): whether ``y`` is
    right, and the config launched."""
    from tunecache.triton.record import config_json

    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    y = torch.full((1,) if summed else (n,), 12345.0)  # stale contents: a buffer used before
    kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, n)
    want = x.sum().reshape(1) if summed else x * 2 + 1
    return {"n": n, "correct": bool(torch.allclose(y, want, rtol=1e-4, atol=1e-3)),
            "launched": config_json(kernel.best_config)}  # fmt: skip


def main(spec: dict[str, Any]) -> dict[str, Any]:
    """Runs ``spec``: ``kernel`` (``masked`` or ``sum``), ``answers`` (n → served config),
    ``calls`` ([decoration index, n]) over ``decorations`` (each: ``prune``, the name of one of
    :data:`PRUNES`; ``space``; ``configs``: ``own_hooks`` for :data:`OWN_HOOKS`)."""
    import tunecache.triton.autotuner as autotuner

    jit_fn = _masked if spec["kernel"] == "masked" else _sum_into
    client = hostile_client(jit_fn, {int(n): c for n, c in spec["answers"].items()})
    autotuner.shared_client = lambda *a: client  # type: ignore[assignment]
    kernels = []
    for options in spec["decorations"]:
        listed = MASKED_CONFIGS if jit_fn is _masked else SUM_CONFIGS
        listed = OWN_HOOKS if options.get("configs") == "own_hooks" else listed
        extra: dict[str, Any] = {"space": options["space"]} if "space" in options else {}
        if "prune" in options:
            extra["prune_configs_by"] = {"early_config_prune": PRUNES[options["prune"]]}
        kernels.append(tunecache.triton.autotune(configs=listed, key=["n"], on_miss="default",
                                                 **extra)(jit_fn))  # fmt: skip
    summed = jit_fn is _sum_into
    results = [launch(kernels[index], n, summed) for index, n in spec["calls"]]
    return {"results": results, "pruned": PRUNED, "hooked": HOOKED}
