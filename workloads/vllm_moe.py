"""vLLM's own fused-MoE Triton kernel, as a kernel ``tune`` takes: ``workloads.vllm_moe:FusedMoE``.

The engine runs a mixture-of-experts layer as two launches of its ``fused_moe_kernel`` with one
Triton config: the experts' gate-up GEMM (``hidden`` → ``2N``), ``silu(gate) · up``, then the
down GEMM (``N`` → ``hidden``) weighted by each token's routing weight, summed over its top-k
experts. Its tuned-config files hold one config per batch size M for each (experts ``E``,
intermediate size per shard ``N``, device, dtype); :mod:`tunecache.vllm_moe` reads and writes them,
and ``tunecache sync --format vllm-moe`` writes this kernel's winners in that form.

Tuning it here times what the engine's tuner (``benchmarks/kernels/benchmark_moe.py``) times: both
launches of the engine's kernel, through its own ``invoke_fused_moe_triton_kernel``, over the
space that tuner searches (plus the engine's untuned default, which is the ``default_config``
baseline). The tokens' order by expert is the engine's ``moe_align_block_size`` on a GPU and the
same computed with torch elsewhere.

It needs vLLM installed with Triton enabled: on a GPU machine where the engine runs. vLLM turns
Triton off where no GPU driver is active (its kernels become placeholders); there this kernel
says so, in one line. Under ``TRITON_INTERPRET=1`` with ``CUDA_VISIBLE_DEVICES=`` (which vLLM
reads as a distributed start-up and keeps Triton) the kernel runs in Triton's interpreter on the
CPU: correct, and timed on the host clock, which checks the flow, not a GPU's speed.

Problems are ``M`` (tokens), ``E``, ``N``, ``K`` (the hidden size) and ``topk``; unquantized
bfloat16 and float16 (a file without ``dtype=``). Quantized variants (fp8 blocks) are not tuned
here.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tunecache.device import DeviceLimits
from tunecache.errors import InvalidInput
from tunecache.space import Config, SearchSpace
from tunecache.vllm_moe import FIELDS, KERNEL
from tunecache.vllm_moe_launch import ENGINE_SPACE, shared_bytes
from workloads.base import Workload

if TYPE_CHECKING:
    import torch

_MODULE = "vllm.model_executor.layers.fused_moe.fused_moe"


@functools.cache
def engine_module() -> Any:
    """vLLM's fused-MoE module, with Triton enabled.

    Raises:
        InvalidInput: vLLM is not installed, or it has turned Triton off (no active GPU driver):
            one line saying where to run instead.
    """
    import importlib

    try:
        module = importlib.import_module(_MODULE)
    except ImportError as exc:
        raise InvalidInput(f"{KERNEL} tunes vLLM's own fused-MoE kernel: vLLM is not installed "
                           f"here ({exc}); run it where the engine runs (a GPU machine with "
                           "vllm)") from None  # fmt: skip
    if not hasattr(module.fused_moe_kernel, "run"):  # vLLM's placeholder: a plain function
        raise InvalidInput(f"{KERNEL}: vLLM has turned Triton off on this machine (no active GPU "
                           "driver); tune it on a GPU machine where the engine runs")  # fmt: skip
    return module


class FusedMoE(Workload):
    """vLLM's fused-MoE layer at ``M`` tokens: x[M, K], the experts' w1[E, 2N, K] and w2[E, K, N],
    the router's logits[M, E] (each token's ``topk`` experts are its largest) and the routing
    weights[M, topk]; out[M, K]."""

    params = ("M", "E", "N", "K", "topk")
    # w1 is [E, 2N, K]: input_shapes doubles its N (a shape names parameters only).
    inputs = (("M", "K"), ("E", "N", "K"), ("E", "K", "N"), ("M", "E"), ("M", "topk"))
    output = ("M", "K")
    bucket = ("M",)
    backend_dtypes = {"triton": ("bfloat16", "float16")}
    demo_problem = {"M": 4, "E": 4, "N": 32, "K": 64, "topk": 2}
    description = "vLLM's fused_moe_kernel: the experts' gate-up and down GEMMs of an MoE layer"

    def problem(self, sizes: Mapping[str, Any]) -> dict[str, int]:
        problem = super().problem(sizes)
        if problem["topk"] > problem["E"]:
            raise InvalidInput(f"topk={problem['topk']} is more than the E={problem['E']} experts")
        return problem

    def input_shapes(self, problem: Mapping[str, int]) -> tuple[tuple[int, ...], ...]:
        m, e, n, k, topk = (problem[p] for p in self.params)
        return (m, k), (e, 2 * n, k), (e, k, n), (m, e), (m, topk)

    def make_inputs(
        self, problem: Mapping[str, int], dtype: str, seed: int
    ) -> tuple[torch.Tensor, ...]:
        """Seeded inputs of a trained layer's scale: weights over the square root of their
        fan-in; float32 router logits with no ties in a row (each token's experts are the same
        however ``topk`` breaks ties, on any device); float32 routing weights (as the engine's
        router gives them) that sum to one per token."""
        x, w1, w2, logits, weights = super().make_inputs(problem, dtype, seed)
        ranks = logits.float().argsort(dim=1).argsort(dim=1).float()
        weights = weights.float().abs()
        return (x, w1 / math.sqrt(problem["K"]), w2 / math.sqrt(problem["N"]), ranks,
                weights / weights.sum(dim=1, keepdim=True))  # fmt: skip

    def edge_problem(self, problem: Mapping[str, int]) -> dict[str, int] | None:
        edge = super().edge_problem(problem)
        return None if edge is None else {**edge, "topk": min(edge["topk"], edge["E"])}

    def torch_fn(self, *inputs: torch.Tensor) -> torch.Tensor:
        return _experts(*inputs)

    def reference(self, *inputs: torch.Tensor) -> torch.Tensor:
        return _experts(*(t.double() for t in inputs))

    def flops(self, problem: Mapping[str, int]) -> int:
        return 6 * problem["M"] * problem["topk"] * problem["N"] * problem["K"]

    def bytes_moved(self, problem: Mapping[str, int], dtype: str) -> int:
        """The experts the tokens reach (at most ``M · topk``), the tokens and the output."""
        import torch

        from workloads.base import torch_dtype

        size = torch.empty((), dtype=torch_dtype(dtype)).element_size()
        experts = min(problem["E"], problem["M"] * problem["topk"])
        weights = experts * 3 * problem["N"] * problem["K"]
        return (weights + 2 * problem["M"] * problem["K"]) * size

    def triton_space(
        self, problem: Mapping[str, int], dtype: str, limits: DeviceLimits
    ) -> SearchSpace:
        """The engine's tuner's space and its default here, less what ``limits`` cannot hold."""
        default = self.triton_default(problem, dtype, limits)
        choices = {f: tuple(sorted({*ENGINE_SPACE[f], int(default[f])})) for f in FIELDS}

        def too_big(config: Config) -> str | None:
            shared = shared_bytes({f: int(config[f]) for f in FIELDS})
            if shared > limits.max_shared_memory_per_block:
                return f"{shared} B of shared memory, over {limits.name}'s"
            if int(config["num_warps"]) * limits.warp_size > limits.max_threads_per_block:
                return f"more threads than {limits.name} gives a block"
            return None

        return SearchSpace(choices, constraint=too_big)

    def triton_default(
        self, problem: Mapping[str, int], dtype: str, limits: DeviceLimits | None = None
    ) -> Config:
        """The engine's own default for a shape without a tuned file (its six fields)."""
        engine = engine_module()
        m, e, n, k, topk = (problem[p] for p in self.params)
        chosen = engine.get_default_config(m, e, n, k, topk, None)
        missing = {"num_warps": 4, "num_stages": 3}  # the engine leaves Triton's defaults
        return Config.of({f: int(chosen.get(f, missing.get(f, 1))) for f in FIELDS})

    def triton_launch(  # type: ignore[override]
        self,
        config: Config,
        x: torch.Tensor,
        w1: torch.Tensor,
        w2: torch.Tensor,
        logits: torch.Tensor,
        weights: torch.Tensor,
        *,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Both launches of the engine's kernel with ``config``, as its fused_experts runs them."""
        import torch
        import triton.language as tl

        engine = engine_module()
        m = x.shape[0]
        experts, n, topk = w2.shape[0], w2.shape[2], weights.shape[1]
        ids = torch.topk(logits.float(), topk, dim=1).indices.to(torch.int32)
        sorted_ids, expert_ids, padded = _assign(ids, int(config["BLOCK_SIZE_M"]), experts)
        compute = tl.bfloat16 if x.dtype == torch.bfloat16 else tl.float16
        weights = weights.float().contiguous()  # the engine's routing weights are float32

        def gemm(a: torch.Tensor, b: torch.Tensor, top_k: int, routed: bool) -> torch.Tensor:
            """[M, topk, rows of b]: A's rows (tokens, or token-expert pairs when ``top_k`` is
            1) each against its expert's slice of b."""
            c = torch.empty((m, topk, b.shape[1]), dtype=x.dtype, device=x.device)
            engine.invoke_fused_moe_triton_kernel(
                a, b, c, None, None, weights, sorted_ids, expert_ids, padded, routed, top_k,
                dict(config), compute, False, False, False, False, False,
            )  # fmt: skip
            return c

        up = gemm(x, w1, topk, False)  # each token against each of its experts: [M, topk, 2N]
        gate, lift = up.view(m * topk, 2 * n).float().split(n, dim=1)
        act = (torch.nn.functional.silu(gate) * lift).to(x.dtype)  # [M·topk, N]
        down = gemm(act, w2, 1, True)  # weighted by the routing weights: [M, topk, K]
        total = down.float().sum(dim=1).to(x.dtype)
        if out is None:
            return total
        return out.copy_(total)


def _assign(
    ids: torch.Tensor, block: int, experts: int
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """The engine's assignment of tokens to blocks of ``block`` rows: each expert's (token, slot)
    indices padded to a whole block, the expert of each block, and the padded count. A few tokens
    among many experts take one block each (the engine's naive assignment)."""
    import torch

    flat = ids.view(-1)
    if flat.numel() * 4 <= experts:  # the engine's rule: each (token, expert) pair its own block
        padded = torch.full((1,), flat.numel() * block, dtype=torch.int32, device=ids.device)
        return None, flat, padded
    if ids.is_cuda:  # the engine's own op
        from vllm.model_executor.layers.fused_moe.moe_align_block_size import (
            moe_align_block_size,
        )

        aligned: tuple[torch.Tensor, torch.Tensor, torch.Tensor] = moe_align_block_size(
            ids, block, experts
        )
        return aligned
    # Sized as the engine sizes them (the kernel's EM is the length, and Triton specialises an
    # integer argument on its divisibility: the same length compiles the same kernel).
    size = flat.numel() + experts * (block - 1)
    if flat.numel() < experts:
        size = min(flat.numel() * block, size)
    counts = torch.bincount(flat, minlength=experts)
    rounded = (counts + block - 1) // block * block
    order = torch.argsort(flat, stable=True)
    chosen = flat[order]
    rank = torch.arange(flat.numel()) - (torch.cumsum(counts, 0) - counts)[chosen]
    sorted_ids = torch.full((size,), flat.numel(), dtype=torch.int32)
    sorted_ids[(torch.cumsum(rounded, 0) - rounded)[chosen] + rank] = order.to(torch.int32)
    expert_ids = torch.zeros(-(-size // block), dtype=torch.int32)  # past the padded count: unread
    used = torch.repeat_interleave(torch.arange(experts), rounded // block)
    expert_ids[: used.numel()] = used.to(torch.int32)
    padded = torch.tensor([int(rounded.sum())], dtype=torch.int32)
    return sorted_ids, expert_ids, padded


def _experts(
    x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, logits: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """The layer in torch, expert by expert, in ``x``'s dtype: Σ_j weight_j · w2[e_j] ·
    (silu(gate) · up)(w1[e_j] · x)."""
    import torch

    n, topk = w2.shape[2], weights.shape[1]
    ids = torch.topk(logits.float(), topk, dim=1).indices
    out = torch.zeros_like(x)
    for expert in ids.unique().tolist():
        token, slot = (ids == expert).nonzero(as_tuple=True)
        gate, lift = (x[token] @ w1[expert].T).split(n, dim=1)
        y = (torch.nn.functional.silu(gate) * lift) @ w2[expert].T
        out.index_add_(0, token, (y * weights[token, slot, None]).to(out.dtype))
    return out
