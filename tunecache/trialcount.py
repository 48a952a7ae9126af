"""How many trials a record's search ran, in words: the default config, timed beside the winner,
told apart from the search's trials. ``tunecache records show`` and the dashboard both say it
from here (the dashboard cannot import the CLI).

Why: the tuner appends the default config's timing to a record's trials (and counts it in
``search.trials``), so ``tune --trials 8`` uploads 9; ``records show`` said "8 trials + the
default config" while the dashboard's index said 9 and its record page "9 trials".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tunecache.defaults import default_config
from tunecache.schemas import RecordCreate

DROP_IN = "triton_autotune"  # the Triton drop-in's records: every trial is its own bench's


def may_end_with_default(record: RecordCreate) -> bool:
    """Whether ``record``'s last trial may be the default config timed beside the winner: the
    tuner appends it exactly when it compares the winner with the default (the record then has a
    ``default_config`` baseline). The drop-in's records time the default among their own
    configs, none appended. Which config the last trial is, :func:`default_last` checks."""
    if record.search.strategy == DROP_IN:
        return False
    return any(baseline.name == "default_config" for baseline in record.baselines)


def default_last(record: RecordCreate, last: Mapping[str, Any] | None) -> bool:
    """Whether ``record``'s last trial, whose config is ``last`` (``None``: it has none), is the
    default config timed beside the winner, not a trial of the search. Where the backend has
    one default config (TVM's unscheduled function, Inductor's default mode) the trial's config
    must be it; Triton's default depends on the kernel and the shape (knowing it here costs
    importing Triton), so its records go by the baseline alone."""
    if last is None or not may_end_with_default(record):
        return False
    known = default_config(record.key.backend)
    return known is None or dict(last) == known


def count_text(count: int, default: bool) -> str:
    """``count`` trials in words: ``8 trials + the default config`` where the last of them is
    the default's (``default``, :func:`default_last`), else ``9 trials``."""
    if default:
        searched = count - 1
        return f"{searched} trial{'' if searched == 1 else 's'} + the default config"
    return f"{count} trial{'' if count == 1 else 's'}"
