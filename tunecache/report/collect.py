"""Reads what the report draws from the server: every matching record, and the trials of a few
winners (the record list leaves trials out; each search is one more request)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tunecache.pages import fetch_first
from tunecache.report.labels import fair_order, key_label, natural, several_archs
from tunecache.report.series import Convergence, convergence
from tunecache.schemas import RecordPublic


@dataclass(frozen=True)
class Searches:
    """The convergence series drawn, and the winners left out (``without_trials`` of them were
    read and had no successful trial)."""

    series: list[Convergence]
    not_shown: int
    without_trials: int


def fetch_records(client: Any, **filters: Any) -> list[RecordPublic]:
    """Every record matching ``filters`` (``kernel``, ``backend``, ``device_arch`` …), page by
    page, without trials.

    Raises:
        ServerError: the server is unreachable or refused.
    """
    return fetch_first(client, None, **filters).items


def fetch_searches(client: Any, winners: Sequence[RecordPublic], *, keys: int) -> Searches:
    """The convergence of up to ``keys`` winners, in label order, kept in the order of
    :func:`tunecache.report.labels.fair_order` (verified first, then each uploader's in turn:
    one token's keys named to sort first took every panel); a winner without a successful trial
    is passed over for the next.

    Raises:
        ServerError: the server is unreachable or refused.
    """
    with_arch = several_archs([w.key for w in winners])
    ordered = fair_order(winners, label=lambda w: key_label(w.key, with_arch=with_arch),
                         verified=lambda w: w.status == "verified",
                         uploader=lambda w: w.uploaded_by or "")  # fmt: skip
    series: list[Convergence] = []
    read = 0
    for winner in ordered:
        if len(series) == keys:
            break
        read += 1
        if winner.search.trials == 0:
            continue  # nothing to ask for
        full = client.get_record(winner.id)
        found = convergence(full, key_label(full.key, with_arch=with_arch))
        if found is not None:
            series.append(found)
    series.sort(key=lambda found: natural(found.label))
    return Searches(series, len(winners) - len(series), read - len(series))
