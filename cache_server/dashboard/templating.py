"""The dashboard's Jinja2 environment (autoescaped: kernels and configs are user data), its
formatting filters, and :func:`page`, which renders a template with the security headers."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from fastapi import Request
from fastapi.responses import HTMLResponse
from jinja2 import DictLoader, Environment, StrictUndefined

from tunecache import __version__, trialcount
from tunecache.key import device_text, problem_text
from tunecache.measured import TimingModel
from tunecache.schemas import RecordCreate
from tunecache.timing import conditions_text, versus
from tunecache.tokens import name_text
from tunecache.verification import trust_text

HERE = Path(__file__).parent
STATIC_DIR: Final = HERE / "static"
# Only this server: no CDN, no font host, and no script at all on the dashboard's pages.
PAGE_CSP: Final = (
    "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; "
    "base-uri 'none'; frame-ancestors 'none'"
)


def ms(value: float | None) -> str:
    """A time in milliseconds, to 4 significant digits: ``0.01234``, ``12.35``, ``1235``."""
    return "—" if value is None else f"{value:.4g}"


def vs(record: RecordCreate, baseline: str) -> str:
    """The record's speedup over ``baseline`` with its interval where it has one:
    ``1.83× faster (1.79-1.88×)``, ``the same within noise (median 1.01×, 0.96-1.05×)``."""
    return versus(record, baseline, "×", missing="—")


# A timer that names the quantiles its bounds are, as Triton's do_bench's does:
# "triton do_bench (median, p20, p80)".
_QUANTILES = re.compile(r"\(median, (p\d{1,2}), (p\d{1,2})\)$")


def spread(timing: TimingModel) -> str:
    """A timing's spread as what its timer measured: ``min 1.2 · max 1.5 · IQR 0.1``; ``p20 1.2
    · p80 1.5`` for a timer whose bounds are those percentiles (Triton's ``do_bench``: a "min"
    there would be a false claim); no IQR for a timing of one repeat (Triton's timers), which
    measured none, nor where its ``iqr_ms`` is its percentiles' range (its bounds say that)."""
    low, high = "min", "max"
    if named := _QUANTILES.search(timing.timer):
        low, high = named.groups()
    parts = [f"{low} {ms(timing.min_ms)}", f"{high} {ms(timing.max_ms)}"]
    if timing.repeats > 1 and not named:
        parts.append(f"IQR {ms(timing.iqr_ms)}")
    return " · ".join(parts)


def sci(value: float | None) -> str:
    """An error or tolerance: ``1.2e-06``."""
    return "—" if value is None else f"{value:.2g}" if value == 0 else f"{value:.1e}"


def when(value: datetime | None) -> str:
    """A UTC time to the second."""
    return "—" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def past(value: datetime | None) -> bool:
    """Whether ``value`` is before now (a lease that has run out)."""
    return value is not None and value < datetime.now(UTC)


def pretty(value: Any) -> str:
    """JSON, indented, keys in order: a config or a problem as the user wrote it."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def shape(problem: dict[str, Any]) -> str:
    """``M=64, N=64, K=64`` (:func:`tunecache.key.problem_text`: a string quoted)."""
    return problem_text(problem, ", ")


def _environment() -> Environment:
    """The pages' templates, read once with this code: templates read from disk at each view
    broke every page of a running server whose install was upgraded in place (the new
    ``_pager.html`` with the old code: 500)."""
    folder = HERE / "templates"
    env = Environment(
        loader=DictLoader({p.name: p.read_text("utf-8") for p in folder.glob("*.html")}),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(ms=ms, vs=vs, spread=spread, conditions=conditions_text, sci=sci, when=when,
                       pretty=pretty, shape=shape, trust=trust_text, device=device_text,
                       name=name_text, trials=trialcount.count_text)  # fmt: skip
    env.tests["past"] = past
    env.globals["version"] = __version__
    return env


ENV: Final = _environment()


def root_path(request: Request) -> str:
    """The prefix a proxy serves this app under (``""`` at the root), for the pages' links."""
    root: str = request.scope.get("root_path", "")
    return root.rstrip("/")


def page(
    request: Request, name: str, context: dict[str, Any], *, status_code: int = 200
) -> HTMLResponse:
    """Template ``name`` rendered with ``context`` (and ``root``, ``request``), as HTML."""
    html = ENV.get_template(name).render(root=root_path(request), request=request, **context)
    return HTMLResponse(
        html,
        status_code=status_code,
        headers={
            "Content-Security-Policy": PAGE_CSP,
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "same-origin",
            "Cache-Control": "no-store",
        },
    )
