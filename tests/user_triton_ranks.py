"""Two users' Triton kernels under ``tunecache.triton.autotune``, as two ranks of a
``torch.distributed`` job run them (``tests/test_triton_ranks.py``).

``affine``'s stand-in ``do_bench`` makes each rank pick its own winner per ``n`` (``WINNER``:
no two agree), so which rank decided a key shows in the config every rank launches; ``BENCHED``
holds the ``n`` this process benchmarked. ``triple`` is another stage's kernel with configs of its
own (``TRIPLE_CONFIGS``): nothing of ``affine``'s is in its list.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import triton
import triton.language as tl

import tunecache.triton

CONFIGS = [triton.Config({"BLOCK": b}, num_warps=1) for b in (16, 32, 64)]
TRIPLE_CONFIGS = [triton.Config({"BLOCK": b}, num_warps=4) for b in (128, 256)]
# (n, rank) -> the index of the config that rank's timings make fastest.
WINNER = {(1000, 0): 0, (2000, 0): 2, (1000, 1): 1, (2000, 1): 0}
STATE: dict[str, int] = {"n": 0, "calls": 0}
BENCHED: list[int] = []


def ranked_bench(kernel_call: Any, quantiles: Any = None) -> list[float]:
    """Runs the call once; the config ``WINNER`` names for this ``n`` and rank is fastest."""
    index = STATE["calls"]
    STATE["calls"] += 1
    if STATE["n"] not in BENCHED:
        BENCHED.append(STATE["n"])
    kernel_call()
    ms = 0.01 if WINNER.get((STATE["n"], dist.get_rank())) == index else 0.02
    return [ms, ms, ms]


def affine_reference(x: torch.Tensor, y: torch.Tensor, n: int) -> None:
    y.copy_(x * 2.0 + 1.0)


def triple_reference(x: torch.Tensor, y: torch.Tensor, n: int) -> None:
    y.copy_(x * 3.0)


@tunecache.triton.autotune(configs=CONFIGS, key=["n"], do_bench=ranked_bench,
                           reference=affine_reference)  # fmt: skip
@triton.jit
def affine(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2.0 + 1.0, mask=mask)


@tunecache.triton.autotune(configs=TRIPLE_CONFIGS, key=["n"], reference=triple_reference)
@triton.jit
def triple(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 3.0, mask=mask)


def launch_affine(n: int) -> int:
    """``affine`` at ``n`` (checked): the index in ``CONFIGS`` of the config it launched."""
    STATE["n"], STATE["calls"] = n, 0
    x = torch.arange(n, dtype=torch.float32)
    y = torch.empty_like(x)
    affine[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, n)
    assert torch.allclose(y, x * 2 + 1), "wrong result"
    return next((i for i, c in enumerate(CONFIGS) if c is affine.best_config), -1)


def launch_triple(n: int) -> bool:
    """``triple`` at ``n`` (checked): whether it launched one of its own listed configs."""
    x = torch.arange(n, dtype=torch.float32)
    y = torch.empty_like(x)
    triple[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, n)
    assert torch.allclose(y, x * 3), "wrong result"
    return any(c is triple.best_config for c in TRIPLE_CONFIGS)
