"""A record's trials as ``records show`` lists them: each config in a few words, and the default
config's timing told apart from the search's.

Why: a TVM record's trial table showed ``{"schedule": "meta_schedule", "trace"`` on every row
(its JSON cut at 70 characters, where the trace begins), though its backend summarises a trace
in a few words (``tiles 1x8x2x4/1x1x64x1 unroll 16``); and ``--trials 16`` read as "17 trials",
the 17th being the default config the tuner times beside the winner, no trial of the search.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from tunecache import trialcount
from tunecache.key import BACKENDS
from tunecache.schemas import RecordCreate

CONFIG_CHARS = 70


def default_trial(record: RecordCreate) -> bool:
    """Whether ``record``'s last trial is the default config timed beside the winner, not a
    trial of the search (:func:`tunecache.trialcount.default_last`, which the dashboard uses
    too)."""
    last = record.trials[-1].config if record.trials else None
    return trialcount.default_last(record, last)


def count_text(record: RecordCreate) -> str:
    """``16 trials + the default config`` where the last trial is the default's (see
    :func:`default_trial`), else ``17 trials``: as the dashboard says it
    (:func:`tunecache.trialcount.count_text`)."""
    if default_trial(record):  # a record keeps at most MAX_TRIALS, its search counts all
        return trialcount.count_text(max(len(record.trials), record.search.trials), True)
    return trialcount.count_text(record.search.trials, False)


def _summarizer(backend: str) -> Callable[[Mapping[str, Any]], str] | None:
    """The backend's own ``summarize`` (text from the config's JSON: nothing served is run or
    built), or ``None`` for a backend this CLI does not know."""
    if backend not in BACKENDS:
        return None
    from backends import get_backend

    try:
        return get_backend(backend).summarize
    except Exception:  # a backend that cannot be set up here: the configs' JSON then
        return None


def _text(summarize: Callable[[Mapping[str, Any]], str] | None, config: Mapping[str, Any],
          limit: int) -> str:  # fmt: skip
    text = None
    if summarize is not None:
        try:
            text = summarize(config)
        except Exception:  # a config its backend cannot read: its JSON
            text = None
    return (text or json.dumps(config))[:limit]


def config_text(backend: str, config: Mapping[str, Any], limit: int = CONFIG_CHARS) -> str:
    """``config`` in a few words, as its backend summarises it (its JSON, cut, where the
    backend cannot say): made here from the config itself, never the summary a record's
    uploader wrote (``knobs tile_i=32 ...`` beside a config that was ``{"schedule":
    "default"}``)."""
    return _text(_summarizer(backend), config, limit)


def config_texts(record: RecordCreate) -> list[str]:
    """Each trial's config in a few words (:func:`config_text`)."""
    summarize = _summarizer(record.key.backend) if record.trials else None
    return [_text(summarize, trial.config, CONFIG_CHARS) for trial in record.trials]


def trial_rows(record: RecordCreate) -> list[list[object]]:
    """The rows of ``records show``'s trial table: number (``default`` for the default's
    timing), status, ms, config, error."""
    from tunecache_cli.table import ms

    last = len(record.trials) - 1 if default_trial(record) else None
    texts = config_texts(record)
    return [
        ["default" if i == last else i + 1, t.status, ms(t.time_ms), texts[i], (t.error or "")[:40]]
        for i, t in enumerate(record.trials)
    ]
