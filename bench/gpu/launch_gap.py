"""Where a decode GEMM's time goes: the kernel on the device, and the launch path on the CPU.

The kernel table timed bf16 qkv at M=16 (16×6144×4096, config 16×64×256 g4 w2 s5) at 49.3 µs
while a brute force of the same kernel and config (``triton.testing.do_bench``, L2 flushed, the
kernel launched directly) timed 29.5 µs. This script separates the two candidates:

* the device time of the kernel alone, from the profiler's kernel records (no host in it);
* the host time of one call through each layer of the launch path — the jitted kernel launched
  directly, ``workloads.matmul.triton.gemm``, the backend's runnable, and ``torch.mm`` — with the
  calls queued back to back (what a decode loop pays per call when the host is the bottleneck);
* the time each timer reports for each layer (``tunecache.timing.time_cuda`` and ``do_bench``,
  both with L2 flushed before every call).

A timer's flush occupies the device for about ``flush µs`` while the host prepares the next call,
so host work up to that long is hidden; beyond it the timer reports host time as kernel time, and
a user pays it on every call that is not captured in a CUDA graph.

    python -m bench.gpu.launch_gap             # on a GPU machine (about a minute)
    python -m bench.gpu.launch_gap --dry-run   # on a CPU: the plan
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from bench.gpu.common import device_name, markdown, out_dir, software

PROBLEM = {"M": 16, "N": 6144, "K": 4096}
TABLE = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 256, "GROUP_M": 4, "num_warps": 2,
         "num_stages": 5, "SPLIT_K": 1}  # fmt: skip
CONFIGS = {  # the table's winner; the brute force's best (landscape tunecache_matmul_bf16_…);
    # a split-K config, which launches twice per call
    "table 16x64x256 g4 w2 s5": TABLE,
    "landscape best 16x64x256 g8 w4 s3": {**TABLE, "GROUP_M": 8, "num_warps": 4, "num_stages": 3},
    "split-K 4 16x64x256 g4 w2 s5": {**TABLE, "SPLIT_K": 4},
}
CALLS = 400
GRAPH_CALLS = 20


def layers(config: dict[str, Any], a: Any, b: Any, out: Any) -> dict[str, Any]:
    """The callables to compare, from the bare jitted launch up to the backend's runnable."""
    import torch

    from backends.triton import TritonBackend
    from tunecache.settings import interpret_enabled
    from tunecache.space import Config
    from workloads import get_workload
    from workloads.matmul import triton as mm

    m, k = a.shape
    n = b.shape[1]
    cfg = Config.of(config)
    meta = mm.launch_meta(cfg, a.dtype, "none", interpret_enabled())
    jitted = mm.matmul_kernel.jit()
    grid = (-(-m // meta.block_m) * -(-n // meta.block_n), 1)
    args = (a, b, out, out, out, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            out.stride(0), out.stride(1))  # fmt: skip
    run = TritonBackend().build(get_workload("matmul"), PROBLEM, "bfloat16", config)
    found = {
        "gemm(config, a, b, out=)": lambda: mm.gemm(cfg, a, b, out=out),
        "runnable(a, b, out=)": lambda: run(a, b, out=out),
        "runnable(a, b)": lambda: run(a, b),
        "torch.mm(a, b, out=)": lambda: torch.mm(a, b, out=out),
    }
    if meta.split_k == 1:
        found = {"kernel[grid](...)": lambda: jitted[grid](*args, **meta.kwargs), **found}
    return found


def host_us(fn: Any) -> float:
    """Median host µs per call over batches of back-to-back calls (the device never waits)."""
    import torch

    per = []
    for _ in range(5):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(CALLS):
            fn()
        per.append((time.perf_counter() - start) / CALLS * 1e6)
    torch.cuda.synchronize()
    return statistics.median(per)


def events_us(fn: Any, flush: Any) -> float:
    """The timer as it was before the device spin: flush, event, call, event; median µs."""
    import torch

    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
             for _ in range(200)]  # fmt: skip
    for start, end in pairs:
        flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in pairs) * 1e3


def graph_us(fn: Any) -> float:
    """µs per call replaying ``GRAPH_CALLS`` calls captured in one CUDA graph (the way a decode
    loop hides its launch path; L2 not flushed between calls)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_CALLS):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (10 * GRAPH_CALLS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu.launch_gap", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--dry-run", action="store_true", help="print the plan; run nothing")
    parser.add_argument("--host-only", action="store_true",
                        help="on a CPU: tunecache's own layers of the launch path, the kernel "
                        "replaced by a no-op (what they add to Triton's launch)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.host_only:
        return host_only()
    if args.dry_run:
        for name in CONFIGS:
            print(f"matmul bfloat16 {PROBLEM} {name}: device, host and timer µs per layer")
        return 0
    return run()


class _NoLaunch:
    """Stands in for a jitted kernel: ``kernel[grid](*args, **meta)`` does nothing."""

    def __getitem__(self, grid: Any) -> Any:
        return lambda *args, **kwargs: None


def host_only() -> int:
    """µs per call of tunecache's layers above Triton's launch, on this CPU (no GPU needed)."""
    import torch

    from backends.triton import TritonBackend
    from tunecache.settings import interpret_enabled
    from tunecache.space import Config
    from workloads import get_workload
    from workloads.matmul import triton as mm

    kernel, mm.matmul_kernel = mm.matmul_kernel, _NoLaunch()  # type: ignore[assignment]
    try:
        a = torch.randn(PROBLEM["M"], PROBLEM["K"]).bfloat16()
        b = torch.randn(PROBLEM["K"], PROBLEM["N"]).bfloat16()
        out = torch.empty(PROBLEM["M"], PROBLEM["N"], dtype=torch.bfloat16)
        cfg = Config.of(TABLE)
        run = TritonBackend().build(get_workload("matmul"), PROBLEM, "bfloat16", TABLE)
        layers = {"gemm(config, a, b, out=)": lambda: mm.gemm(cfg, a, b, out=out)}
        if interpret_enabled():  # else the runnable copies CPU tensors to a GPU
            layers["runnable(a, b, out=) (CPU tensors)"] = lambda: run(a, b, out=out)
        for name, fn in layers.items():
            fn()
            per = []
            for _ in range(7):
                start = time.perf_counter()
                for _ in range(20_000):
                    fn()
                per.append((time.perf_counter() - start) / 20_000 * 1e6)
            print(f"{name}: {statistics.median(per):.2f} µs per call "
                  f"(range {min(per):.2f}-{max(per):.2f}, 7 x 20,000 calls)")  # fmt: skip
    finally:
        mm.matmul_kernel = kernel
    return 0


def run() -> int:
    import torch
    import triton.testing

    from bench.gpu.common import profiled_device_us
    from tunecache.timing import L2_FLUSH_BYTES, TimerSettings, time_cuda
    from workloads import get_workload

    workload = get_workload("matmul")
    a, b = (t.cuda() for t in workload.make_inputs(PROBLEM, "bfloat16", seed=7))
    out = torch.empty((PROBLEM["M"], PROBLEM["N"]), dtype=a.dtype, device="cuda")
    flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    timer = TimerSettings(warmup=10, min_repeats=30, max_repeats=500, target_s=0.3)
    rows, raw = [], []
    for name, config in CONFIGS.items():
        for layer, fn in layers(config, a, b, out).items():
            fn()
            torch.cuda.synchronize()
            item = {
                "config": name, "layer": layer, "device_us": profiled_device_us(fn, flush),
                "host_us": host_us(fn), "time_cuda_us": time_cuda(fn, timer).median_ms * 1e3,
                "events_no_spin_us": events_us(fn, flush),
                "do_bench_us": triton.testing.do_bench(fn, warmup=25, rep=100,
                                                       return_mode="median") * 1e3,
                "graph_us": graph_us(fn),
            }  # fmt: skip
            raw.append(item)
            rows.append([item[k] for k in item])
            print(json.dumps(item), flush=True)
    flush_us = time_cuda(lambda: flush.zero_()).median_ms * 1e3
    notes = [f"device: {device_name()}; {software()}",
             f"L2 flush ({L2_FLUSH_BYTES >> 20} MiB zeroed): {flush_us:.1f} µs",
             f"b strides {tuple(b.stride())}, a strides {tuple(a.stride())}",
             "device µs: the profiler's kernel durations per call (L2 flushed); host µs: the "
             "host's time per call, calls queued back to back; time_cuda: tunecache's timer "
             "(the device spins before each call); events, no spin: the timer as it was; "
             f"graph: µs per call replaying {GRAPH_CALLS} calls captured in a CUDA graph "
             "(L2 not flushed)"]  # fmt: skip
    body = markdown(["config", "layer", "device µs (profiler)", "host µs per call",
                     "time_cuda µs", "events, no spin µs", "do_bench µs", "graph µs"], rows)  # fmt: skip
    text = "# Launch gap: bf16 16×6144×4096\n\n" + "\n".join(f"- {n}" for n in notes)
    text += "\n\n" + body
    (out_dir() / "launch_gap.md").write_text(text + "\n")
    (out_dir() / "launch_gap.json").write_text(json.dumps({"notes": notes, "rows": raw}, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
