"""Shape presets: the GEMM, norm and softmax problems of common models.

Given token counts (batch × sequence length) and a tensor-parallel degree, a preset yields the
problems a model's layers run: the attention projections (fused QKV, output), the MLP (fused
gate-up, down) or, for Mixtral, the experts' GEMMs at the tokens each expert sees on average
(top-2 of 8), and the RMSNorm rows. GEMMs are ``C[M, N] = A[M, K] @ B[K, N]`` with M the tokens.

Example:
    >>> problems = preset_problems("llama3-8b", tokens=[16], tp=1)
    >>> problems["matmul"][0]
    {'M': 16, 'N': 6144, 'K': 4096}
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tunecache.errors import InvalidInput


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
    name: str, *, tokens: Sequence[int], tp: int = 1
) -> dict[str, list[dict[str, int]]]:
    """The problems of model ``name`` at each token count: ``{"matmul": [...], "rmsnorm": [...]}``.

    Raises:
        InvalidInput: an unknown preset, or a tensor-parallel degree that does not divide it.
    """
    if name not in MODELS:
        raise InvalidInput(f"unknown preset {name!r}; known: {', '.join(sorted(MODELS))}")
    model = MODELS[name]
    if tp < 1 or (model.kv_heads % tp and tp % model.kv_heads) or model.intermediate % tp:
        raise InvalidInput(f"preset {name}: tensor-parallel degree {tp} does not divide it")
    gemms: list[dict[str, int]] = []
    norms: list[dict[str, int]] = []
    for count in tokens:
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise InvalidInput(f"preset {name}: token count {count!r} is not a positive integer")
        for m, n, k in _gemms(model, count, tp):
            problem = {"M": m, "N": n, "K": k}
            if problem not in gemms:
                gemms.append(problem)
        norms.append({"M": count, "N": model.hidden})
    return {"matmul": gemms, "rmsnorm": norms}
