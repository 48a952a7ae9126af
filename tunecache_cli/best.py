"""``tunecache best``: the fastest validated backend for a kernel × shape × dtype on this machine.

Exit codes: 0 a backend has a validated record (crowned or not), 1 none has, 2 bad input,
3 unreachable.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

from tunecache.errors import InvalidInput
from tunecache.key import DTYPES, problem_text
from tunecache.measured import SAME_BELOW
from tunecache_cli.args import (
    add_server,
    parse_backends,
    parse_shape,
    refuse_triton_object,
    server_url,
)
from tunecache_cli.table import digits_apart, ms, ratio, render, shown

HEALTH_SECONDS = 10.0  # the server's first answer, before its records are asked for


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
    parser.add_argument(
        "--dtype", default="float32", help=f"one of {', '.join(DTYPES)} (default float32)"
    )
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
    from tunecache_cli.progress import asking

    problem = parse_shape(args.shape)
    try:
        as_spec(args.workload).problem(problem)  # bad input is said before the server is asked
    except InvalidInput:
        refuse_triton_object(args.workload)
        raise
    backends = list(parse_backends(args.backends)) if args.backends else None  # "": all
    url = server_url(args)
    with (
        Client(url, snapshot="") as client,  # the server's records, not a file's
        asking("best", url, HEALTH_SECONDS),
    ):
        # An unreachable server is exit 3, not "no record" on every backend; one that never
        # answers, within HEALTH_SECONDS (it kept `best` waiting a minute).
        client.health(timeout=HEALTH_SECONDS)
        answer = client.resolver.best(args.workload, problem, args.dtype, args.device,
                                      backends=backends)  # fmt: skip
    if args.json:
        print(json.dumps(_as_json(answer), indent=2))
    else:
        print(_as_text(args.workload, args.shape, args.dtype, answer, problem))
    return 0 if answer.found else 1


def _as_text(kernel: str, shape: str, dtype: str, answer: Any, asked: Mapping[str, Any]) -> str:
    digits = digits_apart([*(a.time_ms for a in answer.answers), answer.eager_ms])
    head = f"{kernel} {shape} {dtype}: {_headline(answer, digits)}{_timed_at(answer, asked)}"
    rows = [_eager_row(answer, digits)] if answer.eager_ms is not None else []
    for a in answer.answers:
        result = a.result
        if result is None:
            rows.append([a.backend, "-", "-", "-", "-", "-", "-", (a.why_not or "").split(":")[0]])
            continue
        record = f"#{result.record.id}" if result.record is not None else result.source
        noise = "" if result.served_record is None else result.served_record.noise_label
        marks = [m for m, on in (("interpreter", a.interpreted),
                                 ("slower than eager", result.slower_than_eager),
                                 (noise, bool(noise))) if on]  # fmt: skip
        rows.append([a.backend, ms(a.time_ms, digits) + (" v" if a.by_verifier else ""),
                     _vs_best(answer, a), result.vs_eager or "-", result.device or "-",
                     result.rule or "-", a.status or "-",
                     " ".join([record, *(f"({m})" for m in marks)])])  # fmt: skip
    if rows and not answer.eager_faster and answer.eager_ms is not None:
        rows.insert(_eager_place(answer), rows.pop(0))
    table = render(["backend", "time ms", "vs best", "vs torch eager", "timed on", "rule",
                    "status", "record"], rows)  # fmt: skip
    said = answer.winner is None  # the headline said the note already (twice, of no record)
    return f"{shown(head)}\n{table}" + ("" if said else f"\n{shown(answer.note)}")


def _headline(answer: Any, digits: int) -> str:
    """Who is fastest, by how much; or that no backend is, and why."""
    winner = answer.winner
    if winner is None:
        return answer.note if not answer.found else f"no backend is crowned: {answer.note}"
    if answer.eager_faster:
        eager = ms(answer.eager_ms, digits)
        return (f"fastest is torch eager ({eager} ms): no tuned record beats it; "
                f"{winner.backend}'s, the fastest, is {winner.result.vs_eager}")  # fmt: skip
    if answer.tied:  # every gap inside both records' spreads: no one is faster
        named = ", ".join(_named(a, digits) for a in answer.tied)
        head = f"{_named(winner, digits)} and {named}: the same within their spreads"
    else:
        head = f"fastest is {_named(winner, digits)}"
        runner_up = answer.runner_up
        if runner_up is not None and winner.time_ms:
            head += (f", {ratio(runner_up.time_ms / winner.time_ms)} faster than "
                     f"{runner_up.backend}")  # fmt: skip
    head += " (medians timed apart)" if answer.runner_up is not None else ""
    if _ties_eager(winner):  # not measurably faster than eager, nor slower: say so
        head += f"; {winner.result.vs_eager}"
    return head


def _timed_at(answer: Any, asked: Mapping[str, Any]) -> str:
    """Where the times shown were measured, when that is not the shape asked (a record of the
    nearest shape in the bucket answered): they read as the asked shape's."""
    winner = answer.winner
    measured = None if winner is None or winner.result is None else winner.result.problem
    if not measured or dict(measured) == dict(asked):
        return ""
    return f" (times measured at {problem_text(measured)}, the nearest shape in the bucket)"


def _named(row: Any, digits: int) -> str:
    """``tvm (0.1 ms)``, saying whose time it is and, unverified, that it is a claim."""
    whose = ", a verifier's time" if row.by_verifier else ""
    claim = ", pending: its uploader's claim, not verified" if row.status == "pending" else ""
    return f"{row.backend} ({ms(row.time_ms, digits)} ms{whose}{claim})"


def _speedup(row: Any) -> float | None:
    """How many times faster than torch eager ``row``'s record ran, by its own interleaved
    comparison (eager's time and the record's may come from different devices: a verifier
    re-times the record, not eager)."""
    served = row.result.served_record
    return None if served is None else served.speedup()


def _eager_place(answer: Any) -> int:
    """Where torch eager's row goes when no tuned record is faster: after the leading records
    that beat it by their own comparison with it (its interval above 1; without one, a ratio
    that reads faster, past :data:`SAME_BELOW`), and after the fastest record should that one
    tie it. It was listed last, below a tie and below backends with no record; listed after
    the last record beating it, it fell below records slower than it."""
    place = 0
    for row in answer.answers:
        served = None if row.result is None else row.result.served_record
        interval = None if served is None else served.speedup_interval()
        speedup = None if served is None else served.speedup()
        beats = (interval[0] > 1.0 if interval is not None
                 else speedup is not None and speedup >= 1 / SAME_BELOW)  # fmt: skip
        if not beats:
            break
        place += 1
    return max(place, 1)


def _ties_eager(row: Any) -> bool:
    """Whether ``row``'s record's interleaved comparison with torch eager holds 1."""
    served = row.result.served_record
    interval = None if served is None else served.speedup_interval()
    return interval is not None and interval[0] <= 1.0 <= interval[1]


def _vs_best(answer: Any, row: Any) -> str:
    """``row``'s time over the fastest contender's. Behind torch eager, the record's own
    comparison with eager: the number its "vs torch eager" cell says, not a ratio of medians
    measured apart."""
    if answer.winner is None or not row.ranked:  # no ranking, or an interpreter's time
        return "-"
    speedup = _speedup(row) if answer.eager_faster else None
    if speedup:
        return ratio(1 / speedup)
    if row is answer.winner and not answer.eager_faster:
        return "fastest"  # as eager's row says when eager is
    fastest = answer.eager_ms if answer.eager_faster else answer.winner.time_ms
    if not fastest or row.time_ms is None:
        return "-"
    tie = ", tie" if row in answer.tied else ""
    return f"{ratio(row.time_ms / fastest)}{tie}"


def _eager_row(answer: Any, digits: int) -> list[str]:
    winner = answer.winner
    speedup = _speedup(winner)
    relative = "fastest" if answer.eager_faster else ratio(speedup) if speedup else "-"
    if speedup and not answer.eager_faster and _ties_eager(winner):
        relative += ", tie"  # as a tuned record within noise of the fastest says
    device = winner.result.served_record.key.device  # eager was timed by the record's uploader
    return ["torch eager", ms(answer.eager_ms, digits), relative, "-",
            f"{device.arch} {device.name}", "-", "-",
            f"timed with {winner.backend}'s record"]  # fmt: skip


def _as_json(answer: Any) -> dict[str, Any]:
    return {
        "backend": answer.backend,
        "eager_faster": answer.eager_faster,
        "eager_ms": answer.eager_ms,
        "comparable": answer.comparable,
        "tied": [a.backend for a in answer.tied],
        "note": answer.note,
        "answers": [
            {
                "backend": a.backend,
                "time_ms": a.time_ms,
                "timed_by_verifier": a.by_verifier,
                "status": a.status,
                "interpreted": a.interpreted,
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
