"""``tunecache tune --tvm FILE.py:NAME``: tune a user's TVM module and share its validated records.

The run: load ``NAME`` (:mod:`tunecache.tvm.load`), tune it with MetaSchedule for this machine's
llvm target with the warm-pool builder and runner (:mod:`backends.tvm.search`), check the best
schedules against the unscheduled module on random inputs (:mod:`backends.tvm.golden`), time the
best against TVM's default schedule, and upload the records that passed to the server's
:class:`tunecache.tvm.Database`.

Why only validated records are uploaded: the server keeps each record with its score and
lookups take the fastest record that replays, so a wrong-but-fast schedule uploaded once would
stay the team's top record. MetaSchedule itself commits every candidate it measures, unchecked,
to the database it is given; so the search commits to a local JSON database (kept under the
tunecache work directory, where it warm-starts the next run) and only the records that matched
the reference go to the server. With ``--no-upload`` the local database is all there is.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tunecache.defaults import TOLERANCES
from tunecache.errors import InvalidInput, TuningError
from tunecache.settings import Settings
from tunecache.userfile import file_of
from tunecache_cli.args import upload_url

if TYPE_CHECKING:
    from tvm.ir import IRModule

    from backends.tvm.golden import Reference
    from tunecache.interleave import Compared

SEEDS = (1, 2)  # random inputs each best schedule is checked on
RANKED = 5  # best records validated (and uploaded when they pass)


@dataclass
class Checked:
    """One record after validation: its relative error (``None``: NaN, unwritten or failed)."""

    record: Any
    error: float | None
    note: str
    lib: Any = None

    def passed(self, tolerance: float) -> bool:
        return self.error is not None and self.error <= tolerance


def run(args: argparse.Namespace) -> int:
    """Tunes, validates, reports and uploads; returns the exit code.

    Raises:
        InvalidInput: bad arguments or a file that holds no TVM module (exit 2).
        TuningError: nothing compiled and ran, or no schedule matched the reference (exit 1).
        ServerError: the upload failed (exit 3 when unreachable).
    """
    if args.device == "cuda":
        raise InvalidInput("--tvm tunes for this machine's CPU (llvm); --device cuda is not "
                           "supported for TVM modules: leave --device out or pass cpu")  # fmt: skip
    budget = _budget(args)
    file_of("--tvm", args.tvm)  # a mistyped path said before TVM's import (seconds)
    mod, target, reference = _loaded(args.tvm)
    from backends.tvm.database import best_records, database_dir, open_database
    from tunecache_cli.progress import command_start, working
    from tuner.tune import default_workdir

    url = upload_url(args)  # after the module's own errors, before the search
    workdir = default_workdir()
    outcome, seconds = _search(mod, target, budget, workdir, args.tvm)
    records = best_records(open_database(workdir, target), mod, RANKED)
    tolerance = _tolerance(reference)
    with working(
        f"tvm {args.tvm}",
        f"checking the {len(records)} best schedules",
        "validate",
        since=command_start(),
    ):
        checked = [_check(reference, mod, record, target) for record in records]
    passed = [c for c in checked if c.passed(tolerance)]
    if not passed:
        notes = "; ".join(c.note for c in checked[:3])
        raise TuningError(
            f"none of the {len(checked)} best schedules matched the unscheduled "
            f"module (tolerance {tolerance:g}): {notes}"
        )
    print(f"tvm {args.tvm}: target {target}")
    print(_trials_line(outcome, budget, seconds))
    with working(
        f"tvm {args.tvm}", "the best against the default schedule", "time", since=command_start()
    ):
        versus = _compare_speed(reference, passed[0])
    own = own_times(outcome.trials)
    _report_speed(versus, passed[0], own, outcome.best_ms)
    earlier = sum(_trace_key(c.record) not in own for c in checked)
    print(
        f"validation: {len(passed)} of {len(checked)} best schedules{_from_earlier(earlier)} "
        f"match the unscheduled module; best max rel error {passed[0].error:.2e} "
        f"(tolerance {tolerance:g})"
    )
    if url is None or (why := slower_than_default(versus)) is not None:
        kept = "--no-upload" if url is None else f"not uploaded: {why}"
        print(f"records kept in {database_dir(workdir, target)} ({kept})")
        return 0
    return _upload(url, mod, target, [c.record for c in passed])


def _loaded(spec: str) -> tuple[Any, Any, Any]:
    """The module, the host target and the float64 reference (before tuning: a broken module
    fails fast), said while TVM loads (seconds: the run was silent 8.7 s from its start)."""
    from tunecache_cli.progress import command_start, working

    with working(
        f"tvm {spec}", "TVM, the module and its float64 reference", "load", since=command_start()
    ):
        from backends.tvm.golden import Reference, require_fixed_shapes
        from tunecache.tvm.load import load_module
        from tunecache.tvm.target import host_target

        mod = load_module(spec)
        require_fixed_shapes(mod, f"--tvm {spec!r}")
        target = host_target()
        return mod, target, Reference(mod, target, SEEDS)


def _search(
    mod: IRModule, target: dict[str, Any], budget: Any, workdir: Any, label: str
) -> tuple[Any, float]:
    """MetaSchedule on ``mod`` into the local JSON database; the outcome and its seconds."""
    from backends.base import Progress
    from backends.tvm.intrin import cpu_intrinsics_only
    from backends.tvm.search import tune
    from tunecache.tvm.target import host_cores
    from tunecache_cli.progress import ProgressPrinter, command_start

    started = time.monotonic()
    with (
        cpu_intrinsics_only(),
        ProgressPrinter(f"tvm {label}", seconds=budget.seconds, since=command_start()) as progress,
    ):
        if budget.trials:  # its first batch takes seconds (was "searching (still working)")
            progress.expect(Progress(0, budget.trials, None, "meta_schedule: the first batch"))
        outcome = tune(mod, target, budget, workdir=workdir, cores=host_cores(),
                       progress=progress)  # fmt: skip
    return outcome, time.monotonic() - started


def _budget(args: argparse.Namespace) -> Any:
    from backends.base import Budget

    try:
        return Budget(trials=args.trials, seconds=args.seconds)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None


def _tolerance(reference: Reference) -> float:
    """The loosest tolerance of the outputs' dtypes (integers: exact)."""
    dtypes = {reference.args[i].dtype for i in reference.outputs}
    return max(TOLERANCES.get(dtype, 0.0) for dtype in dtypes)


def _check(reference: Reference, mod: IRModule, record: Any, target: dict[str, Any]) -> Checked:
    """Builds ``record``'s schedule of ``mod`` and compares it with the reference on every seed."""
    from tvm.s_tir import Schedule

    from backends.tvm.runnable import compile_module

    try:
        sch = Schedule(mod)
        record.trace.apply_to_schedule(sch, remove_postproc=False)
        lib = compile_module(sch.mod, target)
        error, note = max_error(reference, lib)
    except Exception as exc:  # a candidate may fail in any way: that is a failed check
        lines = [line for line in str(exc).splitlines() if line.strip()] or [""]
        return Checked(record, None, f"{type(exc).__name__}: {lines[-1][:200]}")
    return Checked(record, error, note, lib)


def max_error(reference: Reference, lib: Any) -> tuple[float | None, str]:
    """The worst ‖out − ref‖ / ‖ref‖ of ``lib``'s outputs over the reference's seeds.

    ``(None, why)`` when an output is not comparable: NaN or inf (an element left unwritten
    keeps the poison), or a wrong shape.
    """
    from tuner.validation import compare

    worst = 0.0
    for seed, expected in zip(reference.seeds, reference.expected, strict=True):
        for out, ref in zip(reference.run(lib, seed), expected, strict=True):
            error, _, note = compare(out, ref)
            if error is None:
                return None, note
            worst = max(worst, error)
    return worst, ""


def _compare_speed(reference: Reference, best: Checked) -> Any:
    from tunecache.interleave import compare

    return compare(lambda: reference.time_ms(reference.lib), lambda: reference.time_ms(best.lib))


def slower_than_default(versus: Compared) -> str | None:
    """Why the best schedule is not shared: it ran measurably slower than TVM's default schedule
    (the whole interval of the interleaved comparison below 1), so a process served it would
    run slower than one served nothing; ``None`` when it is faster or the same within noise."""
    if versus.speedup.high >= 1.0:
        return None
    slower = versus.text(than="TVM's default schedule")
    return f"the best schedule ran {slower} here: a process served it would run slower"


def own_times(trials: list[Any]) -> dict[str, float | None]:
    """This run's measured schedules: each trace (as :func:`_trace_key` writes it) and its time
    in the search. The best records are read from the local database, which also holds earlier
    runs' records (the warm start): only these were measured by this run."""
    return {json.dumps(t.config["trace"], sort_keys=True): t.time_ms for t in trials}


def _trace_key(record: Any) -> str:
    from backends.tvm.schedule import trace_json

    return json.dumps(trace_json(record.trace), sort_keys=True)


def _trials_line(outcome: Any, budget: Any, seconds: float) -> str:
    """``trials: N measured, M ran, in S s``, saying why fewer were measured than asked, as the
    search says it stopped (it said "1 measured" against ``--trials 8`` and no more)."""
    trials = outcome.trials
    ok = sum(t.status == "ok" for t in trials)
    why = ""
    if budget.trials and len(trials) < budget.trials and outcome.stopped == "time":
        why = f" of {budget.trials} asked (--seconds {budget.seconds:g} ran out)"
    elif budget.trials and len(trials) < budget.trials and outcome.stopped == "space":
        why = (
            f" of {budget.trials} asked (MetaSchedule proposed no other new schedule of "
            "this module: its space is that small, or the local database holds the rest)"
        )
    return f"trials: {len(trials)} measured{why}, {ok} ran, in {seconds:.1f} s"


def _from_earlier(count: int) -> str:
    """How many of the best schedules came from earlier runs' records, said when any did."""
    if not count:
        return ""
    return f" ({count} from earlier runs' records in the local database)"


def _report_speed(
    versus: Any, best: Checked, own: dict[str, float | None], searched_ms: float | None
) -> None:
    """The best schedule's time against the default's, beside its time in this run's search;
    never a time from the local database of earlier runs (its record's ``run_secs``)."""
    during = own.get(_trace_key(best.record))
    if during is not None:
        note = f" ({during:.4g} ms in the search)"
    else:
        fastest = f"; this run's search's best: {searched_ms:.4g} ms" if searched_ms else ""
        note = f" (a schedule from an earlier run's records in the local database{fastest})"
    # The ratio is the rounds' median ratio, not the two medians' (4.13x beside 0.009814 and
    # 0.04224 ms, whose ratio is 4.30): said, or the line reads as miscomputed.
    rounds = versus.speedup.rounds
    ratios = f"the median of the {rounds} rounds' ratios" if rounds > 1 else "one round's ratio"
    ratios += versus.left_out()
    print(f"best: {versus.tuned_ms:.4g} ms{note} vs default schedule {versus.baseline_ms:.4g} "
          f"ms (medians, timed in alternating rounds; the speedup is {ratios}): "
          f"{versus.text()}")  # fmt: skip


def _upload(url: str, mod: IRModule, target: dict[str, Any], records: list[Any]) -> int:
    from tunecache.tvm import Database
    from tunecache_cli.outbox import kept_upload
    from tunecache_cli.push import push_quietly

    database = Database(url, target=target, timeout=Settings.from_env(with_url=False).timeout)
    try:
        items = database.artifacts(mod, records)
        if not items:  # no record MetaSchedule's JSON can carry: nothing to keep or send
            raise TuningError(f"none of the {len(records)} validated records can be uploaded")
        result = kept_upload(database.remote.client, url, items, "the upload")  # see outbox
        push_quietly(database.remote.client, url)  # then what earlier tunes could not upload
    finally:
        database.close()
    print(upload_summary(len(records), items, result, url, database.partition), file=sys.stderr)
    if result.served is not False:  # else no Database of this server reads them back
        print(f"use them: compile_tir(tunecache.tvm.Database({url!r}, target={target!r}), mod, "
              "target)", file=sys.stderr)  # fmt: skip
    return 0


def upload_summary(validated: int, items: list[Any], result: Any, url: str, partition: str) -> str:
    """What an upload sent and what the server did with it, each count named: the artifacts
    are the module's workload and one per tuning record; the server ``stored`` those new or
    better than what it held, and ``kept`` what it held for the others."""
    from tunecache.artifacts import unserved
    from tunecache.tvm.wire import RECORD, WORKLOAD

    records = sum(item.namespace == RECORD for item in items)
    workloads = sum(item.namespace == WORKLOAD for item in items)
    sent = f"{records} tuning record{'' if records == 1 else 's'}"
    if workloads:
        sent += f" and the module's workload{'' if workloads == 1 else f' ({workloads})'}"
    return (
        f"uploaded {validated} validated record{'' if validated == 1 else 's'} to {url} "
        f"(partition {partition}) as {len(items)} artifacts ({sent}): the server stored "
        f"{result.stored} (new, or better than what it held) and kept what it held for "
        f"{result.kept}{unserved(result)}"
    )
