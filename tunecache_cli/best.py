"""``tunecache best``: the fastest validated backend for a kernel × shape × dtype on this machine.

Exit codes: 0 a backend has a validated record, 1 none has, 2 bad input, 3 unreachable.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from tunecache.errors import InvalidInput
from tunecache.key import DTYPES
from tunecache_cli.args import add_server, parse_shape, refuse_triton_object, server_url
from tunecache_cli.table import ms, render


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "best",
        help="the fastest validated backend for a kernel, shape and dtype",
        description="Looks the kernel up on every backend it has in the dtype and ranks the "
        "validated records by median time, with torch eager as a contender (each record was "
        "timed against it in alternating rounds). Times compare only when measured on one "
        "device at one shape: the answer says when they were not.",
    )
    parser.add_argument("workload", metavar="KERNEL",
                        help="a built-in kernel or your own, as package.module:Class")  # fmt: skip
    parser.add_argument("--shape", required=True, help="shape parameters, e.g. M=64,N=64,K=64")
    parser.add_argument("--dtype", default="float32", help=f"one of {', '.join(DTYPES)}")
    parser.add_argument("--backends", metavar="B,B", help="only these backends (default: all)")
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), help="every key's device (default: each backend's)"
    )
    parser.add_argument("--json", action="store_true", help="print the answer as JSON")
    add_server(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tunecache.client import Client
    from tunecache.kernels import as_spec

    problem = parse_shape(args.shape)
    try:
        as_spec(args.workload).problem(problem)  # bad input is said before the server is asked
    except InvalidInput:
        refuse_triton_object(args.workload)
        raise
    backends = [b.strip() for b in args.backends.split(",")] if args.backends else None
    with Client(server_url(args)) as client:
        client.health()  # an unreachable server is exit 3, not "no record" on every backend
        answer = client.resolver.best(args.workload, problem, args.dtype, args.device,
                                      backends=backends)  # fmt: skip
    if args.json:
        print(json.dumps(_as_json(answer), indent=2))
    else:
        print(_as_text(args.workload, args.shape, args.dtype, answer))
    return 0 if answer.winner is not None else 1


def _as_text(kernel: str, shape: str, dtype: str, answer: Any) -> str:
    winner = answer.winner
    best_ms = None if winner is None else winner.time_ms
    head = f"{kernel} {shape} {dtype}: "
    if winner is None:
        head += "no backend has a validated record"
    elif answer.eager_faster:
        head += (f"fastest is torch eager ({ms(answer.eager_ms)} ms): no tuned record beats it; "
                 f"{winner.backend}'s, the fastest, is {winner.result.vs_eager}")  # fmt: skip
        best_ms = answer.eager_ms  # every time below is relative to eager's
    else:
        head += f"fastest is {winner.backend} ({ms(best_ms)} ms)"
        runner_up = answer.answers[1] if len(answer.answers) > 1 else None
        if runner_up is not None and runner_up.time_ms is not None and best_ms:
            head += f", {runner_up.time_ms / best_ms:.2f}x faster than {runner_up.backend}"
    rows = []
    if answer.eager_ms is not None and winner is not None:
        relative = f"{answer.eager_ms / best_ms:.2f}x" if best_ms else "-"
        rows.append(["torch eager", ms(answer.eager_ms),
                     "fastest" if answer.eager_faster else relative, "-", winner.device or "-",
                     "-", f"timed with {winner.backend}'s record"])  # fmt: skip
    for a in answer.answers:
        result = a.result
        if result is None:
            rows.append([a.backend, "-", "-", "-", "-", "-", (a.why_not or "").split(":")[0]])
            continue
        ratio = f"{a.time_ms / best_ms:.2f}x" if best_ms and a.time_ms else "-"
        record = f"#{result.record.id}" if result.record is not None else result.source
        marks = [m for m, on in (("slower than eager", result.slower_than_eager),
                                 ("noisy", result.noisy)) if on]  # fmt: skip
        rows.append([a.backend, ms(a.time_ms), ratio, result.vs_eager or "-",
                     result.device or "-", result.rule or "-",
                     " ".join([record, *(f"({m})" for m in marks)])])  # fmt: skip
    if rows and not answer.eager_faster and answer.eager_ms is not None:
        rows.append(rows.pop(0))  # eager last when a tuned record beats it
    table = render(["backend", "time ms", "vs best", "vs torch eager", "timed on", "rule",
                    "record"], rows)  # fmt: skip
    return f"{head}\n{table}\n{answer.note}"


def _as_json(answer: Any) -> dict[str, Any]:
    return {
        "backend": answer.backend,
        "eager_faster": answer.eager_faster,
        "eager_ms": answer.eager_ms,
        "comparable": answer.comparable,
        "note": answer.note,
        "answers": [
            {
                "backend": a.backend,
                "time_ms": a.time_ms,
                "device": a.device,
                "problem": None if a.result is None else a.result.problem,
                "rule": None if a.result is None else a.result.rule,
                "record_id": None
                if a.result is None or a.result.record is None
                else a.result.record.id,
                "config": None if a.result is None else a.result.config,
                "key_hash": None if a.key is None else a.key.digest(),
                "why_not": a.why_not,
                "vs_eager": None if a.result is None else a.result.vs_eager,
                "slower_than_eager": a.result is not None and a.result.slower_than_eager,
                "noisy": a.result is not None and a.result.noisy,
            }
            for a in answer.answers
        ],
    }
