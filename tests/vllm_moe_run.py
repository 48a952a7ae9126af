"""Run in a subprocess with vLLM importable (``.vllm/`` on ``PYTHONPATH``), Triton's interpreter
on and ``CUDA_VISIBLE_DEVICES`` empty (so vLLM keeps Triton): the engine's own fused-MoE kernel on
this CPU. Prints one JSON line.

    python -m tests.vllm_moe_run tune URL     tunes PROBLEM in float16 and uploads the record
    python -m tests.vllm_moe_run read DEVICE  what the engine's own lookup (VLLM_TUNED_CONFIG_FOLDER)
                                              takes for PROBLEM, run through the engine's kernel
    python -m tests.vllm_moe_run compile CONFIG  (no interpreter) what the compile farm does: the
                                              engine's kernels compiled for sm_90 in bfloat16
"""

from __future__ import annotations

import json
import sys
from typing import Any

PROBLEM = {"M": 4, "E": 4, "N": 32, "K": 64, "topk": 2}
DTYPE = "float16"  # the interpreter computes bfloat16 dots wrongly: validation refuses them


def tune_and_upload(url: str) -> dict[str, Any]:
    from backends.base import Budget
    from tunecache.client import Client
    from tunecache.key import key_for
    from tunecache.timing import TimerSettings
    from tunecache.vllm_moe import KERNEL
    from tuner.tune import TuneOptions, tune
    from workloads.vllm_moe import engine_module

    kernel = engine_module().fused_moe_kernel
    key = key_for(KERNEL, "triton", PROBLEM, DTYPE)
    quick = TimerSettings(warmup=1, min_repeats=3, max_repeats=5, target_s=0.01)
    options = TuneOptions(timer=quick, workers=1, timer_ref="tests.user_kernels:stand_in_timer")
    outcome = tune(key, Budget(trials=4), options)
    with Client(url) as client:
        client.upload(outcome.record)
    record = outcome.record
    return {"kernel": f"{kernel.fn.__module__}:{kernel.fn.__qualname__}", "config": record.config,
            "passed": record.validation.passed, "device": key.device.name,
            "ok_trials": sum(t.status == "ok" for t in outcome.trials),
            "baselines": sorted(b.name for b in record.baselines)}  # fmt: skip


def read_as_the_engine(device: str) -> dict[str, Any]:
    from tunecache.space import Config
    from tuner.validation import compare
    from workloads.vllm_moe import FusedMoE, engine_module

    engine = engine_module()
    engine.get_device_name_as_file_name = lambda: device  # this CPU's name, as the GPU's would be
    m, e, n, k, topk = (PROBLEM[p] for p in ("M", "E", "N", "K", "topk"))
    config = engine.try_get_optimal_moe_config((e, 2 * n, k), (e, k, n), topk, None, m)
    workload = FusedMoE()
    inputs = workload.make_inputs(PROBLEM, DTYPE, seed=7)
    out = workload.triton_launch(Config.of(config), *inputs)
    rel, _, _ = compare(out, workload.reference(*inputs))
    few = {**PROBLEM, "M": 1, "E": 16}  # 1 token x 2 experts x 4 <= 16 experts: naive blocks
    inputs = workload.make_inputs(few, DTYPE, seed=7)
    out = workload.triton_launch(workload.triton_default(few, DTYPE), *inputs)
    naive, _, _ = compare(out, workload.reference(*inputs))
    return {"config": config, "rel_error": rel, "naive_rel_error": naive,
            "tolerance": workload.tolerance(DTYPE)}  # fmt: skip


def compile_for_sm_90(config: str) -> dict[str, Any]:
    from backends.base import Target
    from backends.triton.ahead import compile_for, compiles
    from tunecache.device import DeviceLimits
    from tunecache.space import Config
    from workloads.vllm_moe import FusedMoE

    target = Target("cuda", "sm_90", DeviceLimits.H100)
    mixtral = {"M": 64, "E": 8, "N": 7168, "K": 4096, "topk": 2}  # TP 2
    facts = compile_for(FusedMoE(), mixtral, "bfloat16", Config.from_json(json.loads(config)),
                        target)  # fmt: skip
    return {**facts, **compiles()}


if __name__ == "__main__":
    command, argument = sys.argv[1], sys.argv[2]
    run = {"tune": tune_and_upload, "read": read_as_the_engine, "compile": compile_for_sm_90}
    print(json.dumps(run[command](argument)))
