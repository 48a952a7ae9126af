"""What the run-time path costs: lookups by source, the decorator's launch overhead, start-up.

1. Lookup latency, p50/p99 per call: a memo hit, a snapshot hit (no server), and an HTTP hit
   (``POST /v1/lookup`` to a real server on loopback, paced at ``--rate`` lookups/s).
2. ``tunecache.triton.autotune``'s overhead per launch over plain ``triton.autotune`` once a key
   is tuned: both with the kernel's own launch stubbed out, so only the dispatch is timed.
3. Start-up of a process launching one kernel at ``--kernels`` shapes: served from the cache vs
   autotuned locally by ``triton.autotune`` — benchmark calls and seconds. Under Triton's
   interpreter (no GPU here) only the calls mean something; on a GPU the seconds too.

Results go to ``bench/results/client_overhead-<cpu>.md``. Figures, never pass/fail.

    TRITON_INTERPRET=1 python -m bench.client_overhead [--rate 200] [--seconds 5] [--kernels 50]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.report import write_result
from bench.server_load import TOKEN, serve
from tests.factories import knobs, make_record
from tunecache import Client, key_for
from tunecache.snapshot import save_snapshot
from tunecache_cli.table import render

REPO = Path(__file__).resolve().parent.parent


def quantiles_us(samples: list[float]) -> tuple[float, float]:
    cuts = statistics.quantiles(samples, n=100)
    return cuts[49] * 1e6, cuts[98] * 1e6


def per_call(fn: Callable[[], Any], n: int) -> list[float]:
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def paced(fn: Callable[[], Any], rate: float, seconds: float) -> list[float]:
    """Latency from each call's due time, calls due every 1/rate s (one client)."""
    samples, start = [], time.perf_counter()
    for i in range(int(rate * seconds)):
        due = start + i / rate
        if (delay := due - time.perf_counter()) > 0:
            time.sleep(delay)
        fn()
        samples.append(time.perf_counter() - due)
    return samples


def lookups(url: str, tmp: Path, args: argparse.Namespace) -> list[list[str]]:
    key = key_for("matmul", "tvm", {"M": 64, "N": 64, "K": 64}, "float32")
    with Client(url, token=TOKEN) as client:
        client.upload(make_record(key, config=knobs(8)))
        document, _ = client.export_snapshot(key.device.arch)
        assert document is not None
        client.lookup(key)  # now in the memo
        memo = per_call(lambda: client.lookup(key), 200_000)
        http = paced(lambda: client.fetch_answer(key), args.rate, args.seconds)
    path = tmp / "snapshot.json"
    save_snapshot(path, document)
    with Client("http://127.0.0.1:9", snapshot=path) as offline:
        assert offline.lookup(key).source == "snapshot"
        snapshot = per_call(lambda: offline.lookup(key), 200_000)
    rows = []
    for name, samples, how in (("memo hit", memo, "back to back"),
                               ("snapshot hit", snapshot, "back to back, no server"),
                               ("HTTP hit", http, f"{args.rate:g}/s from due time")):  # fmt: skip
        p50, p99 = quantiles_us(samples)
        rows.append([name, how, str(len(samples)), f"{p50:.2f}", f"{p99:.2f}"])
    return rows


STARTUP = """
import json, sys, time, torch, triton, triton.language as tl
import tunecache.triton
BENCH = []
def bench(call, quantiles=None):
    BENCH.append(1); call(); ms = 0.01 * (1 + len(BENCH) % 5); return [ms, ms, ms]
CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w) for b in (16, 32, 64) for w in (1, 2)]
decorate = (tunecache.triton.autotune if sys.argv[1] == "cache" else triton.autotune)
@decorate(configs=CONFIGS, key=["n"], do_bench=bench)
@triton.jit
def affine(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2.0 + 1.0, mask=mask)
start = time.perf_counter()
for n in range(64, 64 + int(sys.argv[2])):
    x = torch.randn(n); y = torch.empty_like(x)
    affine[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, n)
print(json.dumps({"bench": len(BENCH), "seconds": time.perf_counter() - start}))
"""


def startup(url: str, tmp: Path, args: argparse.Namespace) -> list[list[str]]:
    env = {**os.environ, "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "1"),
           "TUNECACHE_URL": url, "TUNECACHE_TOKEN": TOKEN,
           "PYTHONPATH": str(REPO)}  # fmt: skip
    script = tmp / "startup_kernel.py"  # a file: Triton reads a kernel's source
    script.write_text(STARTUP)

    def run(mode: str) -> dict[str, Any]:
        done = subprocess.run([sys.executable, str(script), mode, str(args.kernels)], env=env,
                              capture_output=True, text=True, timeout=1200)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(done.stderr[-2000:])
        answer: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
        return answer

    run("cache")  # the first process tunes every shape and uploads the winners
    rows = []
    for label, mode in (("served from the cache", "cache"), ("triton.autotune", "plain")):
        answer = run(mode)
        rows.append([label, str(args.kernels), str(answer["bench"]), f"{answer['seconds']:.2f}"])
    return rows


def dispatch(args: argparse.Namespace) -> list[list[str]]:
    """Per-launch dispatch cost once tuned, with the kernel's own launch stubbed out."""
    import triton
    import triton.language as tl

    import tunecache.triton

    configs = [triton.Config({"BLOCK": b}) for b in (16, 32)]

    def stub_kernel(x_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        pass

    rows = []
    for label, decorate in (("triton.autotune", triton.autotune),
                            ("tunecache.triton.autotune", tunecache.triton.autotune)):  # fmt: skip
        tuner = decorate(configs=configs, key=["n"], do_bench=lambda c, quantiles=None: [1, 1, 1])(
            triton.jit(stub_kernel)
        )
        tuner.fn.run = lambda *a, **k: None  # only the autotuner's own work is timed
        tuner.cache[(1024,)] = configs[0]
        samples = per_call(lambda t=tuner: t.run(None, 1024, grid=(1,)), 100_000)
        p50, p99 = quantiles_us(samples)
        rows.append([label, f"{p50:.2f}", f"{p99:.2f}"])
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--kernels", type=int, default=50)
    args = parser.parse_args(argv)
    os.environ.setdefault("TRITON_INTERPRET", "1")
    with tempfile.TemporaryDirectory() as tmp, serve(f"sqlite:///{tmp}/bench.db", 1) as url:
        lookup_rows = lookups(url, Path(tmp), args)
        startup_rows = startup(url, Path(tmp), args)
    dispatch_rows = dispatch(args)
    tables = "\n\n".join([
        render(["lookup", "how", "calls", "p50 µs", "p99 µs"], lookup_rows),
        render(["launch dispatch (tuned key)", "p50 µs", "p99 µs"], dispatch_rows),
        render(["start-up", "kernel shapes", "benchmark calls", "seconds"], startup_rows),
    ])  # fmt: skip
    print(tables)
    write_result(
        "client_overhead",
        "Run-time path: lookups by source, the decorator's dispatch, start-up",
        [
            "server and client on the same machine; memo and snapshot hits back to back in one "
            "thread; HTTP hits paced, latency from each call's due time",
            "dispatch: the autotuner's run() for an already tuned key, the kernel's launch "
            "stubbed out",
            f"start-up: one Triton kernel at {args.kernels} shapes in a fresh process; "
            f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')} (interpreter: only the "
            "benchmark calls are meaningful, not the seconds)",
        ],
        tables,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
