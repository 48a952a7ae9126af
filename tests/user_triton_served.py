"""Users' Triton kernels under ``tunecache.triton.autotune``, for the tests of what is served.

Imported by ``tests/test_triton_served.py`` and by the fresh processes it starts (Triton's
interpreter on a CPU). Every launch of a kernel is logged in ``LAUNCHES`` with its
meta-parameters (the kernel's ``run`` is wrapped), and Triton's benchmark calls in ``BENCH_CALLS``.

- ``grouped``: ``y = 2x + 1`` with blocks visited in groups (``BLOCK``, ``GROUP_SIZE_M``);
- ``masked``: the same, where ``EVEN=True`` assumes ``n`` is a multiple of ``BLOCK`` and leaves
  the tail unwritten otherwise (a masking bug, memory-safe under the interpreter);
- ``pruned``: the same, whose ``prune_configs_by`` keeps one config from ``n >= 1500`` on.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import triton
import triton.language as tl

import tunecache.triton
from tunecache.client import Client
from tunecache.key import Key

BENCH_CALLS: list[int] = []
LAUNCHES: list[tuple[str, dict[str, Any]]] = []
HOOKED: list[int] = []  # the listed configs' pre_hooks that ran (their BLOCK)
ON_MISS: Any = os.environ.get("TEST_ON_MISS", "default")
VERIFY: Any = os.environ.get("TEST_VERIFY", "never")
META = ("BLOCK", "GROUP_SIZE_M", "EVEN")


def counting_bench(kernel_call: Any, quantiles: Any = None) -> list[float]:
    """Runs the call once; 0.03, 0.02, 0.01, … ms by call order."""
    BENCH_CALLS.append(1)
    kernel_call()
    ms = 0.01 * (3 - (len(BENCH_CALLS) - 1) % 3)
    return [ms, ms, ms]


def hook(block: int) -> Any:
    def pre_hook(nargs: dict[str, Any]) -> None:
        HOOKED.append(block)

    return pre_hook


def counted(name: str, autotuner: Any) -> Any:
    """``autotuner`` with every launch of its kernel logged in ``LAUNCHES``."""
    run = autotuner.fn.run

    def logged(*args: Any, **kwargs: Any) -> Any:
        LAUNCHES.append((name, {k: kwargs[k] for k in META if k in kwargs}))
        return run(*args, **kwargs)

    autotuner.fn.run = logged
    return autotuner


GROUPED_CONFIGS = [
    triton.Config({"BLOCK": b, "GROUP_SIZE_M": g}, num_warps=1, pre_hook=hook(b))
    for b in (16, 32)
    for g in (1, 4)
]


@triton.jit
def _grouped(x_ptr, y_ptr, n, BLOCK: tl.constexpr, GROUP_SIZE_M: tl.constexpr):
    pid = tl.program_id(0)
    blocks = tl.cdiv(n, BLOCK)
    first = (pid // GROUP_SIZE_M) * GROUP_SIZE_M
    size = tl.minimum(blocks - first, GROUP_SIZE_M)
    block = first + (size - 1 - pid % GROUP_SIZE_M)  # a group's blocks in reverse order
    offsets = block * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2.0 + 1.0, mask=mask)


# The same with no pre_hook: a config from a declared space runs the hook the listed configs
# share, and each of GROUPED_CONFIGS has its own (which one a new BLOCK needs cannot be told).
PLAIN_CONFIGS = [triton.Config(dict(c.kwargs), num_warps=c.num_warps) for c in GROUPED_CONFIGS]

grouped = counted("grouped", tunecache.triton.autotune(
    configs=GROUPED_CONFIGS, key=["n"], do_bench=counting_bench, on_miss=ON_MISS)(_grouped))  # fmt: skip

MASKED_CONFIGS = [triton.Config({"BLOCK": 64, "EVEN": even}, num_warps=1) for even in (False, True)]


@triton.jit
def _masked(x_ptr, y_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:  # noqa: SIM108  # "every block is full": right only when BLOCK divides n
        mask = offsets < (n // BLOCK) * BLOCK
    else:
        mask = offsets < n
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2.0 + 1.0, mask=mask)


masked = counted("masked", tunecache.triton.autotune(
    configs=MASKED_CONFIGS, key=["n"], do_bench=counting_bench, on_miss=ON_MISS,
    verify=VERIFY)(_masked))  # fmt: skip

PRUNED_CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w) for b in (16, 32, 64) for w in (1, 2)]


def keep_one_from_1500(configs: list[Any], named_args: dict[str, Any], **kwargs: Any) -> list[Any]:
    return configs[-1:] if named_args["n"] >= 1500 else configs


@triton.jit
def _pruned(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2.0 + 1.0, mask=mask)


pruned = counted("pruned", tunecache.triton.autotune(
    configs=PRUNED_CONFIGS, key=["n"], do_bench=counting_bench, on_miss="tune",
    prune_configs_by={"early_config_prune": keep_one_from_1500})(_pruned))  # fmt: skip


def launch(kernel: Any, x: torch.Tensor) -> torch.Tensor:
    """``kernel`` over ``x`` (a fresh output, ``y = 2x + 1``)."""
    y = torch.empty_like(x)
    n = x.numel()
    kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, n)
    return y


# -- a hostile server at the client's transport ------------------------------------------------
def key_at(jit_fn: Any, n: int) -> Key:
    """The key a call of ``jit_fn`` at ``n`` (float32 ``x``, ``y``) looks up."""
    from tunecache.triton.keys import KernelIdentity, key_of_call

    x = torch.zeros(n)
    return key_of_call(KernelIdentity.of(jit_fn), ["n"], {"x_ptr": x, "y_ptr": x, "n": n})


def lookup_answer(key: Key, config: dict[str, Any]) -> bytes:
    """A well-formed lookup answer for ``key`` carrying ``config`` (whatever it is)."""
    from tests.factories import make_record
    from tunecache.schemas import LookupResponse, RecordPublic

    record = make_record(key, config={"BLOCK": 32}).model_dump(mode="json", by_alias=True)
    public = RecordPublic.model_validate({**record, "config": config, "id": 7,
                                          "key_hash": key.digest(),
                                          "created_at": "2026-01-01T00:00:00Z"})  # fmt: skip
    return LookupResponse(record=public).model_dump_json(by_alias=True).encode()


def hostile_client(jit_fn: Any, answers: dict[int, dict[str, Any]]) -> Client:
    """A client whose server answers ``answers[n]`` for ``jit_fn`` at n, and misses the rest."""
    import httpx

    from tests.factories import miss
    from tunecache.schemas import LookupRequest

    bodies = {key_at(jit_fn, n).digest(): lookup_answer(key_at(jit_fn, n), c)
              for n, c in answers.items()}  # fmt: skip

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path != "/v1/lookup":
            return httpx.Response(204)
        asked = LookupRequest.model_validate_json(request.content).key.to_key().digest()
        body = bodies.get(asked)
        return httpx.Response(200, content=body) if body else miss()

    return Client("http://hostile.invalid", transport=httpx.MockTransport(answer), token="")
