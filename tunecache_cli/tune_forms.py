"""Which options each form of ``tune`` uses, in one table: the refusal of the others is derived
from it, so an option is never dropped without a word.

``tune`` has three forms: a kernel key (``KERNEL --backend B --shape S``), your torch code
(``--torch FILE.py:NAME``) and your TVM module (``--tvm FILE.py:NAME``). Each form's checks once
listed the options it refused by hand, and the lists fell behind: ``--inputs get_inputs`` (the
default's value, so it looked unset) was tuned past with a kernel key, and ``--dtype float16``
with ``--torch`` tuned float32 while the user believed fp16 was tuned. Here every option of
``tune`` names the forms that use it, with why the others do not; an option is "given" when it
is not ``None`` (or ``False``), which is why none of them has a default of its own in the parser:
:func:`fill_defaults` sets the defaults once the check has passed.
``tests/test_newcomer_walk.py`` fails when the parser has an option the table lacks.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from tunecache.errors import InvalidInput

KEY, TORCH, TVM = "KERNEL", "--torch", "--tvm"
FORMS = (KEY, TORCH, TVM)
DEFAULT_TRIALS = 32
INIT_INPUTS = "get_init_inputs"  # --init-inputs's default: a module class's arguments, if any

_SEARCH = {
    TORCH: "max-autotune benchmarks every choice Inductor has, as Inductor runs it",
    TVM: "MetaSchedule searches on its own, on this machine's cores",
}
_OWN_INPUTS = "for --torch: a kernel key runs on the kernel's own inputs"
_KEY_ONLY = {
    TORCH: "they name a kernel key; --torch tunes FILE.py:NAME",
    TVM: "they name a kernel key; --tvm tunes FILE.py:NAME",
}


@dataclass(frozen=True)
class Option:
    """An option of ``tune``: its flag, the forms that use it, and for each other form why it
    does not (where the form alone does not say it)."""

    flag: str
    used_by: frozenset[str]
    why_not: dict[str, str] = field(default_factory=dict)
    default: Any = None  # set by :func:`fill_defaults` for the forms that use it


def _option(
    flag: str, *used_by: str, why_not: dict[str, str] | None = None, default: Any = None
) -> Option:
    return Option(flag, frozenset(used_by), why_not or {}, default)


OPTIONS: dict[str, Option] = {  # the argparse dest of each option of `tune`
    "workload": _option("KERNEL", KEY, why_not=_KEY_ONLY),
    "backend": _option("--backend", KEY, why_not=_KEY_ONLY),
    "shape": _option("--shape", KEY, why_not=_KEY_ONLY),
    "dtype": _option("--dtype", KEY, default="float32", why_not={
        TORCH: "your code runs in the dtypes of the tensors get_inputs() returns: set it there",
        TVM: "the module's buffers declare their dtypes: set it there"}),
    "torch": _option("--torch", TORCH),
    "tvm": _option("--tvm", TVM),
    "inputs": _option("--inputs", TORCH, default="get_inputs", why_not={
        KEY: _OWN_INPUTS, TVM: "MetaSchedule times the module on random inputs"}),
    "init_inputs": _option("--init-inputs", TORCH, default=INIT_INPUTS, why_not={
        KEY: _OWN_INPUTS, TVM: "a TVM module has no constructor"}),
    "device": _option("--device", TORCH, TVM, why_not={
        KEY: "for --torch / --tvm: a kernel key is tuned on this machine's device for its "
        "backend"}),
    "strategy": _option("--strategy", KEY, why_not=_SEARCH),
    "trials": _option("--trials", KEY, TVM, default=DEFAULT_TRIALS, why_not={
        TORCH: _SEARCH[TORCH] + ", whatever the count"}),
    "seconds": _option("--seconds", KEY, TVM, why_not={
        TORCH: "max-autotune's compile is not cut, so no time budget holds"}),
    "patience": _option("--patience", KEY, why_not=_SEARCH),
    "seed": _option("--seed", KEY, why_not=_SEARCH),
    "workers": _option("--workers", KEY, why_not=_SEARCH),
    "landscape": _option("--landscape", KEY, why_not=dict.fromkeys(
        (TORCH, TVM), "it measures a kernel key's config space")),
    "no_upload": _option("--no-upload", *FORMS),
    "json": _option("--json", KEY, why_not=dict.fromkeys(
        (TORCH, TVM), "it prints a kernel key's record")),
    "server": _option("--server", *FORMS),
}  # fmt: skip
NOT_OPTIONS = frozenset({"command", "verbose", "run"})  # set by the top-level parser


def form_of(args: argparse.Namespace) -> str:
    """The form of ``tune`` the command line asks for.

    Raises:
        InvalidInput: both ``--torch`` and ``--tvm``.
    """
    if args.torch and args.tvm:
        raise InvalidInput("give one of --torch and --tvm, not both")
    return TORCH if args.torch else TVM if args.tvm else KEY


def given(value: Any) -> bool:
    """Whether an option was given: every option of ``tune`` is ``None`` (a flag ``False``)
    unless it was (an empty ``--inputs ''`` was given, and is refused where unused)."""
    return value is not None and value is not False


def check_unused(args: argparse.Namespace, form: str) -> None:
    """Refuses, by name and with why, each option ``form`` does not use.

    Raises:
        InvalidInput: naming each such option, grouped by the reason it is not used.
    """
    reasons: dict[str, list[str]] = {}
    for dest, option in OPTIONS.items():
        if form in option.used_by or not given(getattr(args, dest, None)):
            continue
        why = option.why_not.get(form) or "for " + " / ".join(sorted(option.used_by))
        reasons.setdefault(why, []).append(option.flag)
    if not reasons:
        return
    flags = [flag for group in reasons.values() for flag in group]
    parts = [f"{', '.join(group)} ({why})" for why, group in reasons.items()]
    name = "a kernel key" if form == KEY else form
    raise InvalidInput(
        f"tune {name} does not use {'; '.join(parts)}: leave "
        f"{'them' if len(flags) > 1 else 'it'} out"
    )


def fill_defaults(args: argparse.Namespace, form: str) -> None:
    """Each unset option ``form`` uses takes its default (once :func:`check_unused` passed)."""
    for dest, option in OPTIONS.items():
        if form in option.used_by and option.default is not None and not given(getattr(args, dest)):
            setattr(args, dest, option.default)


def unset_defaults(parser: argparse.ArgumentParser) -> None:
    """Every option of ``parser`` (``tune``'s) without a default of its own: whether it was
    given is then whether it is set (``--dtype``'s default comes from :func:`add_key`, shared
    with ``get``)."""
    parser.set_defaults(**{dest: None for dest in OPTIONS if given(parser.get_default(dest))})
