"""What every GPU bench shares: the device's two ceilings, timing, errors, an embedded server,
and where results go (``$OUT`` on the device machine, else ``bench/results/``).

The method (DESIGN.md, "Search and measurement"): two numbers first (a large device-to-device
copy counting bytes read + written; a bf16 8192³ ``torch.mm``), correct first (float64 reference
on fresh random inputs, output poisoned), then CUDA events with L2 flushed, median of many runs.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunecache.timing import TimerSettings

RESULTS = Path(__file__).resolve().parents[1] / "results"
LLAMA3_8B = {  # (N, K) of Llama-3-8B's projections: C[M, N] = A[M, K] @ W[K, N]
    "qkv": (6144, 4096),
    "o": (4096, 4096),
    "gate_up": (28672, 4096),
    "down": (4096, 14336),
}


def out_dir() -> Path:
    """``$OUT`` on the device machine, else ``bench/results/``."""
    path = Path(os.environ.get("OUT") or RESULTS)
    path.mkdir(parents=True, exist_ok=True)
    return path


def device_name() -> str:
    """``nvidia-smi``'s name of GPU 0 with its driver, or torch's name."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        line = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout.strip().splitlines()[0]  # fmt: skip
        return line
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"


def software() -> str:
    import torch
    import triton

    return f"torch {torch.__version__}, Triton {triton.__version__}"


def geomean(values: Sequence[float]) -> float:
    values = [v for v in values if v and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


@dataclass(frozen=True)
class Ceilings:
    copy_tbs: float  # device-to-device copy, bytes read + written per second / 1e12
    mm_tflops: float  # bf16 8192^3 torch.mm
    device: str = ""  # torch's name of the GPU they were measured on ("" in files of before)
    source: str = "measured now"  # where a table's figures came from; not written to files

    def to_json(self) -> dict[str, Any]:
        return {"copy_tbs": self.copy_tbs, "mm_tflops": self.mm_tflops, "device": self.device}


def measure_ceilings() -> Ceilings:
    """The two ceilings, each the median of CUDA-event-timed runs on random data."""
    import torch

    from tunecache.timing import time_cuda

    settings = TimerSettings(warmup=5, min_repeats=30, max_repeats=200, target_s=1.0)
    copy_bytes = 2**30  # 1 GiB of float32, read and written
    buffers = [
        torch.randn(copy_bytes // 4, device="cuda"),
        torch.empty(copy_bytes // 4, device="cuda"),
    ]
    copy_ms = time_cuda(lambda: buffers[1].copy_(buffers[0]), settings).median_ms
    copy_tbs = 2 * copy_bytes / (copy_ms / 1e3) / 1e12
    buffers.clear()
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    mm_ms = time_cuda(lambda: torch.mm(a, b), settings).median_ms
    return Ceilings(copy_tbs=copy_tbs, mm_tflops=2 * n**3 / (mm_ms / 1e3) / 1e12,
                    device=torch.cuda.get_device_name(0))  # fmt: skip


def ceilings_from(path: Path, device: str) -> Ceilings | None:
    """The ceilings in ``path`` if they were measured on a GPU named ``device``, else None.

    A file of another GPU (or one that names none) would put that GPU's bandwidth under this
    one's table: the committed ``ceilings-gpu.json`` is an H100's, and an H200's decode table
    of 2026-12-04 said "measured on it" of it."""
    if not path.exists():
        return None
    found = json.loads(path.read_text())
    if found.get("device") != device:
        return None
    return Ceilings(**found, source=f"from {path.name}, measured on this GPU model before")


def load_ceilings(path: Path | None) -> Ceilings:
    """The ceilings from ``path`` (written by ``bench.gpu.ceilings``) when they are this GPU's,
    else measured now."""
    import torch

    device = torch.cuda.get_device_name(0)
    known = ceilings_from(path, device) if path is not None else None
    if known is not None:
        return known
    if path is not None and path.exists():
        print(f"{path} holds another GPU's ceilings (this is {device}): measuring now",
              file=sys.stderr)  # fmt: skip
    return measure_ceilings()


TIMER_FULL = TimerSettings(warmup=10, min_repeats=30, max_repeats=500, target_s=0.3)


def time_ms(fn: Callable[[], Any]) -> float:
    """The median milliseconds of ``fn()``: CUDA events, L2 flushed before each run."""
    from tunecache.timing import time_cuda

    return time_cuda(fn, TIMER_FULL).median_ms


def rel_error(out: Any, ref: Any) -> float:
    """‖out − ref‖ / ‖ref‖ (NaN anywhere: inf)."""
    diff = out.double().to(ref.device) - ref
    if not bool(diff.isfinite().all()):
        return math.inf
    return float(diff.norm() / ref.norm())


@contextlib.contextmanager
def embedded_server(db_path: Path) -> Iterator[tuple[str, str]]:
    """A cache server on loopback over a SQLite file; yields its URL and an admin token."""
    from cache_server.embedded import EmbeddedServer

    with EmbeddedServer(f"sqlite:///{db_path}") as server:
        yield server.url, server.issue_token("bench", "admin")


def write_table(name: str, title: str, notes: Sequence[str], table: str,
                rows: list[dict[str, Any]], *, quiet: bool = False) -> Path:  # fmt: skip
    """``<name>.md`` (title, notes, table) and ``<name>.json`` (rows) in :func:`out_dir`."""
    directory = out_dir()
    md = directory / f"{name}.md"
    bullets = [f"- {n}" for n in notes]
    md.write_text("\n".join([f"# {title}", "", *bullets, "", table, ""]))
    (directory / f"{name}.json").write_text(json.dumps(rows, indent=1, default=str))
    if not quiet:
        print(md.read_text(), flush=True)
    return md


def markdown(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.4g}" if math.isfinite(value) else "–"
        return str(value)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def profiled_device_us(fn: Callable[[], Any], flush: Any, calls: int = 50) -> float:
    """The mean device µs of one ``fn()``, from the profiler's kernel records (L2 flushed
    before each call, as the timers do; the flush's own kernel left out): the device's time with
    no host in it. A call that launches several kernels counts them all."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            flush.zero_()
            fn()
        torch.cuda.synchronize()
    flushes = ("fill", "memset")  # zero_() is one of these
    kernels = [e.device_time_total for e in prof.events() if e.device_type.name == "CUDA"
               and not any(word in e.name.lower() for word in flushes)]  # fmt: skip
    return sum(kernels) / calls if kernels else float("nan")
