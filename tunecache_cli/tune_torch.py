"""``tunecache tune --torch FILE.py:NAME``: pretune your torch code with max-autotune, team-shared.

``NAME`` is a function or an ``nn.Module`` class in ``FILE.py`` (loaded by path; its folder need
not be a package). ``get_inputs()`` in the same file returns the call's arguments, and for a
module class ``get_init_inputs()`` (when the file has one) its constructor's. The call is compiled
with ``torch.compile(mode="max-autotune")`` (:func:`tunecache.inductor.pretune.pretune`), checked
against eager, timed against eager, and what max-autotune chose is uploaded to the team cache,
where :func:`tunecache.inductor.enable` finds it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from tunecache.errors import InvalidInput, TuningError, one_line
from tunecache.settings import Settings
from tunecache.userfile import load_name
from tunecache_cli.args import upload_url
from tunecache_cli.tune_forms import INIT_INPUTS


def _call_factory(module: ModuleType, name: str, path: Path, *, required: bool) -> list[Any]:
    factory = getattr(module, name, None)
    if factory is None:
        if required:
            raise InvalidInput(f"--torch: {path} has no {name}() returning the inputs")
        return []
    if not callable(factory):
        raise InvalidInput(f"--torch: {name} in {path} is not a function")
    try:
        value = factory()
    except Exception as exc:
        raise InvalidInput(f"--torch: {name}() failed: {one_line(exc)}") from exc
    if not isinstance(value, list | tuple):
        raise InvalidInput(f"--torch: {name}() returned {type(value).__name__}, not a list")
    return list(value)


def load_target(
    spec: str, inputs_name: str, init_name: str, device: str
) -> tuple[Callable[..., Any], list[Any]]:
    """The callable (a function, or a module built and in eval mode) and its inputs on ``device``.

    Raises:
        InvalidInput: anything about ``FILE.py:NAME`` or its factories is wrong.
    """
    import torch

    module, path, target = load_name("--torch", spec)
    name = spec.rpartition(":")[2]
    if isinstance(target, type):
        if not issubclass(target, torch.nn.Module):
            raise InvalidInput(f"--torch: {name} is a class but not an nn.Module")
        args = _call_factory(module, init_name, path, required=False)
        try:
            target = target(*args)
        except Exception as exc:
            called = f"{name}(*{init_name}())"
            if not hasattr(module, init_name):
                called = f"{name}() ({path.name} has no {init_name}() to give its arguments)"
            hint = " (its arguments another function's of the file? --init-inputs NAME)"
            # the arguments may not fit; not said where --init-inputs was given
            hint = hint if isinstance(exc, TypeError) and init_name == INIT_INPUTS else ""
            raise InvalidInput(f"--torch: {called} failed: {one_line(exc)}{hint}") from exc
    elif not callable(target):
        raise InvalidInput(f"--torch: {name} in {path} is not a function or nn.Module class")
    elif init_name != INIT_INPUTS:  # given, and nothing would call it: never dropped unsaid
        raise InvalidInput(f"--init-inputs {init_name} goes with an nn.Module class; {name} is "
                           "no class: it is called as it is, with --inputs alone")  # fmt: skip
    inputs = _call_factory(module, inputs_name, path, required=True)
    if not inputs or not all(isinstance(x, torch.Tensor) for x in inputs):
        kinds = ", ".join(type(x).__name__ for x in inputs) or "nothing"
        raise InvalidInput(f"--torch: {inputs_name}() must return tensors, not {kinds}")
    _check_arity(target, name, inputs, inputs_name)
    if isinstance(target, torch.nn.Module):
        target = target.to(device).eval()
    return target, [x.to(device) for x in inputs]


def _check_arity(target: Any, name: str, inputs: list[Any], inputs_name: str) -> None:
    """Refuses inputs the callable cannot take, before a compile would fail on them."""
    import inspect

    import torch

    module = isinstance(target, torch.nn.Module)
    call, name = (target.forward, f"{name}.forward") if module else (target, name)
    try:
        signature = inspect.signature(call)
    except (TypeError, ValueError):  # no signature to read (a builtin): the compile will say
        return
    try:
        signature.bind(*inputs)
    except TypeError as exc:
        raise InvalidInput(
            f"--torch: {name}{signature} cannot take the {len(inputs)} tensor(s) "
            f"{inputs_name}() returned: {exc}"
        ) from None


def _device(requested: str | None) -> str:
    import torch

    if requested == "cuda" and not torch.cuda.is_available():
        raise InvalidInput("--device cuda: no CUDA device is visible here")
    return requested or ("cuda" if torch.cuda.is_available() else "cpu")


def _timer() -> Any:
    """How long the compiled call and eager are each timed, in every round of their comparison:
    fixed (``--trials`` and ``--seconds`` set these once, which read as a search budget
    max-autotune never had: both are refused with ``--torch``, see tune_forms)."""
    from tunecache.timing import TimerSettings

    return TimerSettings(min_repeats=15, max_repeats=32, target_s=0.3)


def _run_eagerly(spec: str, fn: Callable[..., Any], inputs: list[Any]) -> None:
    """Runs the model once as written, before any compile: an exception here is a bug in the
    user's own code (bad input), not a failed compile.

    Raises:
        InvalidInput: the eager run raised; one line naming it.
    """
    import torch

    try:
        with torch.no_grad():
            fn(*inputs)
    except Exception as exc:
        raise InvalidInput(
            f"running {spec} failed (eagerly, as written, before any compile): {one_line(exc)}"
        ) from exc


def run(args: argparse.Namespace) -> int:
    """Pretunes ``args.torch`` and uploads its choices (unless ``--no-upload``).

    Raises:
        InvalidInput: a bad ``FILE.py:NAME``, factory, input or device; a model that raises
            when run eagerly; or no write token.
        TuningError: the compile failed or its output is wrong.
        ServerError: the upload failed.
    """
    from tunecache_cli.progress import working

    with working(args.torch, "torch and the model, then running it once", "load"):  # seconds
        device = _device(args.device)
        fn, inputs = load_target(args.torch, args.inputs, args.init_inputs, device)
        _run_eagerly(args.torch, fn, inputs)
    url = upload_url(args)  # after the file's own errors, before the compile

    from tunecache import conditions
    from tunecache.inductor import pretune

    machine = conditions.snapshot(family=True)
    try:
        with working(args.torch, "compiling with max-autotune, then checking and timing it"):
            result = pretune.pretune(fn, inputs, device=device, timer=_timer())
    except Exception as exc:  # Inductor's own failure, said in one line
        raise TuningError(f"compiling {args.torch} failed: {one_line(exc)}") from exc
    _report(args.torch, result, machine)
    if not result.check.ok:
        raise TuningError(
            f"the compiled output differs from {result.check.reference}: relative error "
            f"{result.check.error:.3g} > {result.check.tolerance:g}; nothing uploaded"
        )
    if url is None:
        print("not uploaded (--no-upload)", file=sys.stderr)
        return 0
    return _upload(url, result)


def _upload(url: str, result: Any) -> int:
    from tunecache.artifacts import unserved
    from tunecache.inductor import share_items
    from tunecache.inductor.partition import partition
    from tunecache.inductor.remote import TeamCache
    from tunecache_cli.outbox import kept_upload
    from tunecache_cli.push import push_quietly

    team = TeamCache(url, None, partition(), timeout=Settings.from_env(with_url=False).timeout)
    try:
        items = share_items(team, result.groups, result.best_configs)
        if not items:
            print(
                "nothing autotuned to upload: max-autotune benchmarked no choice of this "
                "module's ops (on a CPU it autotunes matrix multiplies only)",
                file=sys.stderr,
            )
            return 0
        stored = kept_upload(team.client, url, items, "the upload")  # never lost: see outbox
        push_quietly(team.client, url)  # then what earlier tunes could not upload
    finally:
        team.close()
    entries = f"{len(items)} entr{'y' if len(items) == 1 else 'ies'}"
    kept = f", {stored.kept} held already (as fast or faster)" if stored.kept else ""
    listed = unserved(stored) or "; `tunecache artifacts ls` lists them"
    print(f"uploaded {entries} to {url} ({team.partition}): {stored.stored} stored{kept}"
          f"{listed}", file=sys.stderr)  # fmt: skip
    return 0


SLOWER_THAN_THE_WHOLE = 1.25  # a part timed this much longer than the whole is not its run time


def _choice_line(group: Any, compiled_ms: float) -> str:
    """An op's fastest choice as Inductor timed it while compiling; said so where that time is
    longer than the whole compiled model's (on a CPU, 10.98 ms for a GEMM of a 0.026 ms model:
    a time no run of the model shows, told as if it were one)."""
    best = min(group.timings, key=lambda h: group.timings[h])
    ms = group.timings[best]
    line = f"    {group.op}: {best.split('-')[0]} {ms:.4g} ms of {len(group.timings)} choices"
    if ms > compiled_ms * SLOWER_THAN_THE_WHOLE:
        line += (
            f" (Inductor's own timing while compiling, {ms / compiled_ms:.0f}x the whole "
            "compiled model's: not a time the model runs at; it ranks the choices only)"
        )
    return line


def _report(spec: str, result: Any, since: Any) -> None:
    check = result.check
    lines: Sequence[str] = [
        f"{spec} on {result.device}: compiled with max-autotune in {result.compile_s:.1f} s",
        f"  compiled {result.compiled_ms:.4g} ms vs eager {result.eager_ms:.4g} ms: "
        f"{result.versus_eager.text()}",
        f"  checked against {check.reference}: relative error {check.error:.2g} "
        f"({'ok' if check.ok else 'WRONG'}, tolerance {check.tolerance:g})",
        f"  autotune choices recorded: {len(result.groups)} GEMM op(s), "
        f"{sum(len(g.timings) for g in result.groups)} timings; "
        f"{len(result.best_configs)} Triton best config(s)",
    ]
    lines = [*lines, *(_choice_line(group, result.compiled_ms) for group in result.groups)]
    from backends.inductor.observe import other_load

    if (load := other_load(since)) is not None:  # after the list, not between it and its heading
        lines = [*lines, f"  note: other processes keep about {load:.1f} cores busy: "
                         "CPU timings are skewed"]  # fmt: skip
    print("\n".join(lines))
