"""``tunecache tune``: tune one key on this machine, validate it, upload the record."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tunecache.errors import InvalidInput, ServerError
from tunecache.schemas import MAX_SEARCH_SECONDS
from tunecache_cli.args import (
    MAX_SEED,
    add_key,
    add_server,
    check_count,
    check_seconds,
    check_trials,
    check_workers,
    key_from_args,
    output_file,
    server_url,
    upload_url,
)
from tunecache_cli.tune_forms import (
    DEFAULT_TRIALS,
    KEY,
    TORCH,
    check_unused,
    fill_defaults,
    form_of,
    unset_defaults,
)


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "tune",
        help="tune one key and upload the validated winner",
        description="Tune a kernel key (KERNEL --backend B --shape S), or your own torch code "
        "(--torch FILE.py:NAME) or TVM module (--tvm FILE.py:NAME), and upload what was found.",
    )
    add_key(parser, optional=True)
    _add_own_code(parser)
    parser.add_argument(
        "--strategy",
        help="exhaustive, random, optuna, bayes, local, portfolio (the default), or the "
        "backend's own (the default where it has one: tvm: meta_schedule; inductor: "
        "inductor_max_autotune)",
    )
    parser.add_argument("--trials", type=int, help=f"search budget in trials (default "
                        f"{DEFAULT_TRIALS}); not with --torch")  # fmt: skip
    parser.add_argument(
        "--seconds",
        type=float,
        help="budget of the whole tune in seconds (search, re-timing, validation,"
        " baselines; --tvm: its search); with --trials, whichever comes first; not with --torch",
    )
    parser.add_argument("--patience", type=int, help="stop after N trials without improvement")
    parser.add_argument("--seed", type=int, help="seed of the search strategy (default 0)")
    parser.add_argument("--workers", type=int, help="measurement worker processes")
    parser.add_argument("--landscape", type=Path, metavar="FILE",
                        help="measure every valid config (exhaustively: no --trials, --strategy "
                        "or --patience) and write them to FILE")  # fmt: skip
    parser.add_argument("--no-upload", action="store_true", help="tune and print, store nothing")
    parser.add_argument("--json", action="store_true",
                        help="print the record as JSON (the stored one once uploaded)")  # fmt: skip
    add_server(parser)
    unset_defaults(parser)  # given or not is then set or not (tune_forms)
    parser.set_defaults(run=run)


def _add_own_code(parser: Any) -> None:
    """The flags of a tune of the user's own torch or TVM code."""
    own = parser.add_argument_group("your own code (instead of KERNEL)")
    own.add_argument(
        "--torch",
        metavar="FILE.py:NAME",
        help="a torch function or nn.Module class to compile with max-autotune",
    )
    own.add_argument(
        "--tvm",
        metavar="FILE.py:NAME",
        help="a TVM PrimFunc or IRModule (TE or TVMScript) to tune with MetaSchedule",
    )
    own.add_argument(
        "--inputs",
        metavar="FUNC",
        help="the function in FILE.py returning the inputs (default: get_inputs)",
    )
    own.add_argument(
        "--init-inputs",
        metavar="FUNC",
        help="the function in FILE.py returning a module's constructor arguments "
        "(default: get_init_inputs, when FILE.py has one)",
    )
    own.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        help="--torch: where to compile and run (default: cuda when a GPU is visible); --tvm: cpu",
    )


def _check_numbers(args: argparse.Namespace) -> None:
    """The budget and worker options in range, each refusal naming its option.

    Raises:
        InvalidInput: ``--trials``, ``--patience`` or ``--workers`` below 1, ``--workers``
            above this process's cores, ``--seed`` outside what the strategies take,
            ``--seconds`` not a positive number or above what a record holds.
    """
    check_trials("--trials", args.trials)
    check_count("--patience", args.patience)
    check_workers(args.workers)
    check_count("--seed", args.seed, 0, MAX_SEED)
    check_seconds("--seconds", args.seconds, most=MAX_SEARCH_SECONDS)  # what a record holds


def _check_landscape(args: argparse.Namespace) -> None:
    """``--landscape FILE``: a file that can be written (said before the search, which may take
    an hour), and no option that would leave configs of the space unmeasured.

    Raises:
        InvalidInput: the file's folder is missing or read-only, or ``--trials``,
            ``--strategy`` or ``--patience`` was given with it.
    """
    if not args.landscape:
        return
    strategy = None if args.strategy == "exhaustive" else args.strategy  # what it runs anyway
    given = [flag for flag, value in (("--trials", args.trials), ("--strategy", strategy),
             ("--patience", args.patience)) if value is not None]  # fmt: skip
    if given:
        raise InvalidInput(f"--landscape measures every config of the space, exhaustively: leave "
                           f"out {', '.join(given)} (--seconds bounds the time)")  # fmt: skip
    output_file("--landscape", args.landscape)


def _budget(args: argparse.Namespace) -> Any:
    from backends import Budget

    trials = 10**9 if args.landscape else args.trials  # a landscape is the whole space
    try:
        return Budget(trials=trials, seconds=args.seconds, patience=args.patience)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None


def _write_landscape(path: Path, outcome: Any) -> None:
    from backends import get_backend
    from tunecache.space import Config
    from tuner.candidates import enumerable_space
    from tuner.landscape import Landscape
    from workloads import get_workload

    key = outcome.key
    space = enumerable_space(get_backend(key.backend), get_workload(key.kernel),
                             dict(key.problem), key.dtype)  # fmt: skip
    entries, seen = [], set()  # each config once, as the search measured it (not re-timed)
    for t in outcome.trials:
        config = Config.of(t.config)
        if space.contains(config) and config not in seen:
            seen.add(config)  # an ok entry keeps its repeats' spread: a lone time where none
            spread = t.times_ms or ((t.time_ms,) if t.time_ms is not None else ())
            entries.append(t.model_copy(update={"times_ms": spread}))
    device = key.device
    landscape = Landscape(
        key=key.to_json(), space=space.to_json(), entries=entries,
        device=f"{device.raw_name or device.name}, {device.units} {device.kind} units",
    )  # fmt: skip
    landscape.save(path)
    print(f"wrote {len(entries)} configs to {path}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    _check_numbers(args)
    form = form_of(args)
    if form == KEY:
        missing = [flag for flag, value in (("KERNEL", args.workload),
                   ("--backend", args.backend), ("--shape", args.shape)) if not value]  # fmt: skip
        if missing:
            raise InvalidInput(f"tune needs {', '.join(missing)} (or --torch / --tvm "
                               "FILE.py:NAME)")  # fmt: skip
    check_unused(args, form)  # what the form would not use, refused by name (tune_forms)
    if form == KEY:
        _check_landscape(args)  # before the defaults: --trials given is refused with it
    fill_defaults(args, form)
    from tunecache_cli.interrupt import prompt

    with prompt():  # Ctrl-C: the progress silenced at once, the process ended within a second
        if form == KEY:
            return _run_key(args)
        if form == TORCH:
            from tunecache_cli import tune_torch

            return tune_torch.run(args)
        from tunecache_cli import tune_tvm

        return tune_tvm.run(args)


def _run_key(args: argparse.Namespace) -> int:
    from backends.base import Progress
    from tunecache.client import Client
    from tunecache_cli import outbox
    from tunecache_cli.progress import ProgressPrinter, command_start
    from tunecache_cli.push import push_quietly
    from tuner import TuneOptions, tune
    from tuner.tune import check_memory, plan

    key = key_from_args(args)  # bad input fails here, before anything is compiled
    check_memory(key)  # a shape that cannot fit: one line, before the progress starts
    budget = _budget(args)
    options = TuneOptions(strategy="exhaustive" if args.landscape else args.strategy,
                          seed=args.seed or 0, workers=args.workers)  # fmt: skip
    backend, _ = plan(key, options)  # what cannot run or time here: before the progress starts
    url = upload_url(args)
    with (
        Client(url or server_url(args)) as client,
        ProgressPrinter(key.short(), seconds=budget.seconds, since=command_start()) as progress,
    ):
        outcome = tune(key, budget, options, progress=progress, backend=backend,
                       cache=None if url is None else client)  # fmt: skip
        if args.landscape:
            _write_landscape(args.landscape, outcome)
        record = outcome.record
        if url is None:
            progress.close()
            _show(record, args)
            return 0
        progress(Progress(0, 0, message=f"to {url}", phase="upload"))
        try:  # never lost: kept till the server has it
            result = outbox.kept_upload(client, url, record)
        except ServerError:
            progress.close()
            _show(record, args)  # what the search found, though the server does not have it
            raise
        push_quietly(client, url)  # then what earlier tunes could not upload
        try:
            stored: Any = client.get_record(result.record_id)
        except ServerError:  # stored, but not read back: what was uploaded stands for it
            stored = None
    _show(
        record if stored is None else stored,
        args,
        uploaded=result.record_id if stored is None else None,
    )
    print(f"uploaded record #{result.record_id} to {url}: {upload_state(result)}", file=sys.stderr)
    return 0


def _show(record: Any, args: argparse.Namespace, *, uploaded: int | None = None) -> None:
    """``record`` on stdout (``--json``: escaped past ASCII, as ``records show``); ``uploaded``:
    stored as that id, not read back."""
    from tunecache_cli.get import describe

    data = record.model_dump(mode="json", by_alias=True)
    print(json.dumps(data, indent=2) if args.json else describe(record, uploaded=uploaded))


def upload_state(result: Any) -> str:
    """Where an upload (an :class:`~tunecache.schemas.UploadResult`) stands, in words."""
    if result.status in ("disputed", "rejected"):
        return (f"{result.status}, not served: a consumer's check or a verifier failed this "
                "config at this key; served once a verifier passes it")  # fmt: skip
    # "#2 is faster" was said of the same config timed again within noise: the winner is the
    # record of the lowest time the server ranks by, however close
    state = ("the winner" if result.is_winner
             else f"kept; #{result.winner_record_id} stays the winner (a lower time)")  # fmt: skip
    if result.policy == "verified" and result.status != "verified":
        state += " (this server serves verified records only: served once a verifier passes it)"
    return state
