"""``tunecache report``: PNG figures of a server's records — speedups, search convergence,
coverage.

The numbers each figure shows are pure functions of records (:mod:`tunecache.report.series`,
:mod:`tunecache.report.grid`), so they are tested without drawing; :mod:`tunecache.report.figures`
draws them on matplotlib's Agg canvas. Importing this package does not import matplotlib (an
optional extra: ``pip install -e '.[report]'``); :func:`write_report` does, when it draws.

Example:
    >>> from tunecache.report import fetch_records, speedups
    >>> with Client(url) as client:  # doctest: +SKIP
    ...     winners = [r for r in fetch_records(client, kernel="matmul") if r.is_winner]
    >>> [(s.label, s.vs_eager) for s in speedups(winners)]  # doctest: +SKIP
    [('matmul tvm float32 M=64,N=64,K=64', 2.1)]
"""

from __future__ import annotations

from tunecache.folders import output_dir
from tunecache.report.build import Report, Written, require_matplotlib, write_report
from tunecache.report.collect import Searches, fetch_records, fetch_searches
from tunecache.report.grid import STATUSES, CoverageGrid, coverage_grid, record_states
from tunecache.report.labels import key_label
from tunecache.report.series import Convergence, Speedup, convergence, speedups

__all__ = [
    "STATUSES",
    "Convergence",
    "CoverageGrid",
    "Report",
    "Searches",
    "Speedup",
    "Written",
    "convergence",
    "coverage_grid",
    "fetch_records",
    "fetch_searches",
    "key_label",
    "output_dir",
    "record_states",
    "require_matplotlib",
    "speedups",
    "write_report",
]
