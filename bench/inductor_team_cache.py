"""torch.compile max-autotune on this CPU: compile time with and without the team cache, and speed.

For each small module (a GEMM, a fused bias+GELU MLP, softmax, layernorm):

1. ``tunecache tune --torch FILE.py:Model --device cpu`` pretunes it and uploads Inductor's
   choices to an embedded cache server (its report gives compiled vs eager ms);
2. a fresh process (empty ``TORCHINDUCTOR_CACHE_DIR``) compiles it with max-autotune and freezing
   without the team cache ("cold"), and another after ``tunecache.inductor.enable(url)``
   ("team"), each ``--repeats`` times; each counts Inductor's autotune calls.

Prints a table and writes it to ``bench/results/inductor-team-cache-<cpu>.md`` (not with
``--quick``: smaller shapes, one repeat, to check that it works). Figures, never pass/fail.

    python -m bench.inductor_team_cache [--quick] [--repeats 3] [--modules gemm,mlp]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

_HEADER = """
import torch
from torch import nn
N, D = {n}, {d}


def get_inputs():
    return [torch.randn(N, D, generator=torch.Generator().manual_seed(1))]


def get_init_inputs():
    return []
"""
MODULES: dict[str, str] = {
    "gemm": """
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(D, D, bias=False)

    def forward(self, x):
        return self.fc(x)
""",
    "mlp": """
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2 = nn.Linear(D, 2 * D), nn.Linear(2 * D, D)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))
""",
    "softmax": """
class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)
""",
    "layernorm": """
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(D)

    def forward(self, x):
        return self.norm(x)
""",
}
SHAPES = {"full": (256, 512), "quick": (32, 64)}


def worker(path: Path, url: str | None) -> int:
    """One user process: [enable], compile with max-autotune + freezing, call; prints JSON."""
    import importlib.util

    import torch
    from torch._inductor import config
    from torch._inductor.select_algorithm import AlgorithmSelectorCache

    calls = {"autotune": 0}
    original = AlgorithmSelectorCache.autotune

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls["autotune"] += 1
        return original(self, *args, **kwargs)

    AlgorithmSelectorCache.autotune = counted  # type: ignore[method-assign]
    spec = importlib.util.spec_from_file_location("bench_model", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model, inputs = module.Model(*module.get_init_inputs()).eval(), module.get_inputs()
    start = time.perf_counter()
    if url is not None:
        import tunecache.inductor

        tunecache.inductor.enable(url)
    enable_s = time.perf_counter() - start
    start = time.perf_counter()
    with torch.no_grad(), config.patch(freezing=True, autotune_num_choices_displayed=0):
        torch.compile(model, mode="max-autotune")(*inputs)
    compile_s = time.perf_counter() - start
    print(json.dumps({"compile_s": compile_s, "enable_s": enable_s, **calls}))
    return 0


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done


def _compile(path: Path, url: str | None, env: dict[str, str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="inductor-") as cache:
        extra = ["--url", url] if url else []
        done = _run(["-m", "bench.inductor_team_cache", "--worker", str(path), *extra],
                    {**env, "TORCHINDUCTOR_CACHE_DIR": cache})  # fmt: skip
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _pretune(path: Path, env: dict[str, str]) -> dict[str, float]:
    done = _run(["-m", "tunecache_cli", "tune", "--torch", f"{path}:Model", "--device", "cpu"], env)
    found = re.search(r"compiled ([\d.e+-]+) ms vs eager ([\d.e+-]+) ms", done.stdout)
    ops = re.search(r"recorded: (\d+) GEMM", done.stdout)
    if found is None or ops is None:
        raise RuntimeError(f"unexpected tune --torch report:\n{done.stdout}")
    return {"compiled_ms": float(found[1]), "eager_ms": float(found[2]), "ops": int(ops[1])}


def bench_module(name: str, folder: Path, shape: tuple[int, int], url: str,
                 env: dict[str, str], repeats: int) -> list[str]:  # fmt: skip
    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(_HEADER.format(n=shape[0], d=shape[1])) + MODULES[name])
    tuned = _pretune(path, env)
    cold = [_compile(path, None, env) for _ in range(repeats)]
    team = [_compile(path, url, env) for _ in range(repeats)]
    cold_s = statistics.median(r["compile_s"] for r in cold)
    team_s = statistics.median(r["compile_s"] for r in team)
    print(f"{name}: cold {cold_s:.1f} s, team {team_s:.1f} s", file=sys.stderr, flush=True)
    return [
        name, f"{shape[0]}x{shape[1]}", str(tuned["ops"]), f"{cold_s:.1f}", f"{team_s:.1f}",
        f"{cold_s - team_s:+.1f}",
        f"{max(r['autotune'] for r in cold)}/{max(r['autotune'] for r in team)}",
        f"{tuned['compiled_ms']:.4g}", f"{tuned['eager_ms']:.4g}",
        f"{tuned['eager_ms'] / tuned['compiled_ms']:.2f}x",
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small shapes, one repeat, no file")
    parser.add_argument("--repeats", type=int, default=3, help="compiles per mode and module")
    parser.add_argument("--modules", default=",".join(MODULES))
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.worker, args.url)

    import torch

    from bench.report import write_result
    from cache_server.embedded import EmbeddedServer
    from tunecache_cli.table import render

    shape = SHAPES["quick" if args.quick else "full"]
    repeats = 1 if args.quick else args.repeats
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, EmbeddedServer(f"sqlite:///{tmp}/bench.db") as srv:
        env = {**os.environ, "TUNECACHE_URL": srv.url,
               "TUNECACHE_TOKEN": srv.issue_token("bench", "write")}  # fmt: skip
        rows = [bench_module(name, Path(tmp), shape, srv.url, env, repeats)
                for name in args.modules.split(",")]  # fmt: skip
    header = ["module", "N x D", "GEMM ops", "cold compile s", "team compile s", "saved s",
              "autotune calls cold/team", "compiled ms", "eager ms", "eager/compiled"]  # fmt: skip
    table = render(header, rows)
    print(table)
    if not args.quick:
        load = os.getloadavg()[0]
        write_result(
            "inductor-team-cache",
            "torch.compile max-autotune on CPU: compile time with and without the team cache",
            [
                f"torch {torch.__version__}, float32, max-autotune with freezing, no_grad",
                "cold: a fresh process and empty TORCHINDUCTOR_CACHE_DIR; team: the same after "
                "tunecache.inductor.enable(url) with the choices `tune --torch` uploaded",
                f"compile s: first compiled call, median of {repeats}; autotune calls: "
                "AlgorithmSelectorCache.autotune, max over repeats",
                "compiled/eager ms: `tune --torch`'s report (perf_counter medians)",
                f"load average at the end: {load:.1f}; "
                f"{time.perf_counter() - started:.0f} s in all",
            ],
            table,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
