"""Worked examples of the API's request bodies: shown in the OpenAPI document (and so in
``/docs``), sent first by a contract fuzzer, and checked against their models by the tests.

One key (a Llama-3-8B QKV projection at decode, bf16, on an H100) and a record of it whose
numbers are the H100 run's (``bench/results/kernels-h100-80gb-hbm3.md``).
"""

from __future__ import annotations

from typing import Any

KEY: dict[str, Any] = {
    "schema": 1,
    "kernel": "matmul",
    "source_hash": "5f0c2a9d1e7b4c36",
    "backend": "triton",
    "problem": {"M": 16, "N": 6144, "K": 4096},
    "dtype": "bfloat16",
    "device": {
        "kind": "cuda",
        "arch": "sm_90",
        "name": "h100-80gb-hbm3",
        "units": 132,
        "memory_gb": 80,
        "flags": [],
    },
    "environment": {"torch": "2.11.0+cu130", "triton": "3.6.0"},
}
CONFIG = {
    "BLOCK_M": 32,
    "BLOCK_N": 64,
    "BLOCK_K": 128,
    "GROUP_M": 8,
    "SPLIT_K": 1,
    "num_warps": 2,
    "num_stages": 5,
}


def _timing(median: float) -> dict[str, Any]:
    return {
        "median_ms": median,
        "min_ms": round(median * 0.98, 6),
        "max_ms": round(median * 1.05, 6),
        "iqr_ms": round(median * 0.01, 6),
        "repeats": 200,
        "warmup": 10,
        "timer": "cuda events, L2 flushed, median of 200",
    }


RECORD: dict[str, Any] = {
    "key": KEY,
    "config": CONFIG,
    "config_summary": "32x64x128 g8 w2 s5",
    "timing": _timing(0.02842),
    "baselines": [
        {"name": "torch_eager", "timing": _timing(0.02854)},
        {"name": "default_config", "timing": _timing(0.04138)},
    ],
    "validation": {
        "passed": True,
        "tolerance": 0.01,
        "max_rel_error": 0.0021,
        "checks": [
            {
                "problem": {"M": 16, "N": 6144, "K": 4096},
                "seed": 1,
                "rel_error": 0.0021,
                "max_abs_error": 0.0625,
                "tolerance": 0.01,
                "passed": True,
            },
            {
                "problem": {"M": 15, "N": 6143, "K": 4095},
                "seed": 1,
                "rel_error": 0.0020,
                "max_abs_error": 0.0625,
                "tolerance": 0.01,
                "passed": True,
            },
        ],
    },
    "search": {"strategy": "bayes", "trials": 41, "seconds": 19.5},
    "trials": [
        {"config": CONFIG, "status": "ok", "time_ms": 0.0291},
        {
            "config": {**CONFIG, "BLOCK_K": 256},
            "status": "compile_error",
            "error": "out of resource: shared memory",
        },
    ],
    "provenance": {
        "machine": "gpu-node-3",
        "tool_version": "0.1.0",
        "device_raw_name": "NVIDIA H100 80GB HBM3",
    },
}
LOOKUP: dict[str, Any] = {"key": KEY, "policy": "strict"}
JOB: dict[str, Any] = {"key": KEY, "priority": 0, "max_attempts": 3, "source": "api"}
CLAIM: dict[str, Any] = {
    "worker": "gpu-node-3",
    "lease_seconds": 300.0,
    "device_arch": "sm_90",
    "backends": ["triton"],
}
