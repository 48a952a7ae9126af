"""Shape presets: the GEMM, norm and softmax problems of common models, and the fused-MoE
problems a serving engine runs.

Given token counts (batch × sequence length) and a tensor-parallel degree, a preset yields the
problems a model's layers run: the attention projections (fused QKV, output), the MLP (fused
gate-up, down) or, for Mixtral, the experts' GEMMs at the tokens each expert sees on average
(top-2 of 8), and the RMSNorm rows. GEMMs are ``C[M, N] = A[M, K] @ B[K, N]`` with M the tokens.

An ``…-moe`` preset yields the problems of vLLM's own fused-MoE kernel
(:data:`tunecache.vllm_moe.KERNEL`) for a model's experts: ``M`` each batch size (by default the
engine's tuner's list, :data:`ENGINE_BATCH_SIZES`), ``E`` experts, ``N`` the experts'
intermediate size split ``tp`` ways, ``K`` the hidden size, ``topk``; its winners are written as
the engine's config files by ``tunecache sync --format vllm-moe``.

Example:
    >>> problems = preset_problems("llama3-8b", tokens=[16], tp=1)
    >>> problems["matmul"][0]
    {'M': 16, 'N': 6144, 'K': 4096}
    >>> preset_problems("mixtral-8x7b-moe", tokens=[1], tp=2)["workloads.vllm_moe:FusedMoE"]
    [{'M': 1, 'E': 8, 'N': 7168, 'K': 4096, 'topk': 2}]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tunecache.errors import InvalidInput
from tunecache.vllm_moe import KERNEL as ENGINE_MOE


@dataclass(frozen=True)
class Model:
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int = 128
    experts: int = 0  # 0: a dense MLP
    experts_per_token: int = 0


MODELS: dict[str, Model] = {
    "llama3-8b": Model(hidden=4096, intermediate=14336, heads=32, kv_heads=8),
    "llama3-70b": Model(hidden=8192, intermediate=28672, heads=64, kv_heads=8),
    "mixtral-8x7b": Model(
        hidden=4096, intermediate=14336, heads=32, kv_heads=8, experts=8, experts_per_token=2
    ),
}


@dataclass(frozen=True)
class Experts:
    """A model's MoE layer as the engine's fused-MoE kernel sees it (its Hugging Face config's
    ``hidden_size``, ``moe_intermediate_size`` or ``intermediate_size``, experts, top-k)."""

    hidden: int
    intermediate: int
    experts: int
    topk: int


MOE_MODELS: dict[str, Experts] = {
    "mixtral-8x7b-moe": Experts(hidden=4096, intermediate=14336, experts=8, topk=2),
    "mixtral-8x22b-moe": Experts(hidden=6144, intermediate=16384, experts=8, topk=2),
    "qwen1.5-moe-a2.7b-moe": Experts(hidden=2048, intermediate=1408, experts=60, topk=4),
    "qwen3-30b-a3b-moe": Experts(hidden=2048, intermediate=768, experts=128, topk=8),
    "qwen3-235b-a22b-moe": Experts(hidden=4096, intermediate=1536, experts=128, topk=8),
    "deepseek-v2-lite-moe": Experts(hidden=2048, intermediate=1408, experts=64, topk=6),
}
# The batch sizes vLLM's MoE tuner writes into every file (benchmarks/kernels/benchmark_moe.py).
ENGINE_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072,
                      4096)  # fmt: skip


def _gemms(model: Model, tokens: int, tp: int) -> list[tuple[int, int, int]]:
    """(M, N, K) of one layer's GEMMs, each weight split ``tp`` ways."""
    qkv = (model.heads + 2 * model.kv_heads) * model.head_dim
    gemms = [(tokens, qkv // tp, model.hidden), (tokens, model.hidden, model.hidden // tp)]
    rows = tokens
    if model.experts:
        rows = max(1, tokens * model.experts_per_token // model.experts)
    gemms += [(rows, 2 * model.intermediate // tp, model.hidden),
              (rows, model.hidden, model.intermediate // tp)]  # fmt: skip
    return gemms


def preset_problems(
    name: str, *, tokens: Sequence[int] | None = None, tp: int = 1
) -> dict[str, list[dict[str, int]]]:
    """The problems of model ``name`` at each token count (default: one token; an ``…-moe``
    preset, :data:`ENGINE_BATCH_SIZES`): ``{"matmul": [...], "rmsnorm": [...]}``, or the engine's
    fused-MoE kernel's.

    Raises:
        InvalidInput: an unknown preset, a token count that is not a positive integer, or a
            tensor-parallel degree that does not divide it.
    """
    if tokens is not None and len(tokens) == 0:
        raise InvalidInput(f"preset {name}: tokens is empty (leave it out for the default)")
    if name in MOE_MODELS:
        return _moe_problems(name, _counts(name, tokens or ENGINE_BATCH_SIZES), tp)
    if name not in MODELS:
        known = ", ".join(sorted([*MODELS, *MOE_MODELS]))
        raise InvalidInput(f"unknown preset {name!r}; known: {known}")
    model = MODELS[name]
    if tp < 1 or (model.kv_heads % tp and tp % model.kv_heads) or model.intermediate % tp:
        raise InvalidInput(f"preset {name}: tensor-parallel degree {tp} does not divide it")
    gemms: list[dict[str, int]] = []
    norms: list[dict[str, int]] = []
    for count in _counts(name, tokens or [1]):
        for m, n, k in _gemms(model, count, tp):
            problem = {"M": m, "N": n, "K": k}
            if problem not in gemms:
                gemms.append(problem)
        norms.append({"M": count, "N": model.hidden})
    return {"matmul": gemms, "rmsnorm": norms}


def _counts(name: str, tokens: Sequence[object]) -> list[int]:
    """``tokens``, each a positive integer.

    Raises:
        InvalidInput: one is not.
    """
    counts = []
    for count in tokens:
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise InvalidInput(f"preset {name}: token count {count!r} is not a positive integer")
        counts.append(count)
    return counts


def _moe_problems(name: str, tokens: list[int], tp: int) -> dict[str, list[dict[str, int]]]:
    """The engine's fused-MoE problems of ``name``'s experts, their intermediate size split
    ``tp`` ways, at each batch size."""
    model = MOE_MODELS[name]
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1 or model.intermediate % tp:
        raise InvalidInput(f"preset {name}: tensor-parallel degree {tp!r} does not divide its "
                           f"intermediate size {model.intermediate}")  # fmt: skip
    problems = [{"M": m, "E": model.experts, "N": model.intermediate // tp, "K": model.hidden,
                 "topk": model.topk} for m in dict.fromkeys(tokens)]  # fmt: skip
    return {ENGINE_MOE: problems}
