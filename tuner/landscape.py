"""Landscapes: every config of one key with its measured times or its failure, recorded once.

Each config's entry is a :class:`~tunecache.schemas.Trial` (:func:`entry`). A landscape replays
as a simulated device (:meth:`Landscape.evaluator`), so search strategies are
compared offline, deterministically and on CPU (``bench/search_efficiency.py``). The file is
JSON::

    {"format": "tunecache-landscape/1", "key": {...}, "device": "NVIDIA H100 80GB HBM3",
     "note": "", "space": {"BLOCK_M": [32, 64], ...},
     "entries": [{"config": {...}, "status": "ok", "times_ms": [0.1, 0.11], "error": ""}, ...]}

Example:
    >>> from tunecache.space import SearchSpace
    >>> space = SearchSpace({"BLOCK": (16, 32, 64)})
    >>> def measure(config):
    ...     return entry(config.to_json(), "ok", (float(config["BLOCK"]), 99.0, 1.0))
    >>> landscape = record_landscape(space, measure, key={"kernel": "demo"}, device="test")
    >>> landscape.optimum().config, landscape.optimum().time_ms
    ({'BLOCK': 16}, 16.0)
    >>> [t.time_ms for t in landscape.evaluator()([Config.of({"BLOCK": 32})])]
    [32.0]
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import statistics
import tempfile
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from backends.base import Progress, ProgressFn, Trial, TrialStatus
from tunecache.errors import InvalidInput
from tunecache.schemas import MAX_TRIAL_ERROR
from tunecache.space import Config, SearchSpace
from tunecache.strict import printable_text

logger = logging.getLogger(__name__)

FORMAT = "tunecache-landscape/1"
STATUSES: tuple[str, ...] = typing.get_args(TrialStatus)


def entry(config: Mapping[str, Any], status: str, times_ms: Sequence[float] = (),
          error: str = "") -> Trial:  # fmt: skip
    """One config's landscape entry, a :class:`~tunecache.schemas.Trial`: ``ok`` with every
    repeat's time (``times_ms``; its ``time_ms`` is their median), or a failure and its error.

    Raises:
        InvalidInput: a status no trial has, an ``ok`` entry without times, or a bad time.
    """
    if status not in STATUSES:
        raise InvalidInput(f"landscape entry status {status!r} is not one of {STATUSES}")
    try:
        times = tuple(float(t) for t in times_ms)
        median = statistics.median(times) if status == "ok" and times else None
        return Trial(config=dict(config), status=typing.cast(TrialStatus, status),
                     time_ms=median, times_ms=times,
                     error=printable_text(error, MAX_TRIAL_ERROR))  # fmt: skip
    except (TypeError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        if status == "ok" and not times_ms:
            raise InvalidInput(f"landscape entry {dict(config)} is ok but has no times") from None
        raise InvalidInput(f"landscape entry {dict(config)} is malformed: {_why(exc)}") from None


def _why(exc: Exception) -> str:
    """What a trial's validation refused, in a few words (pydantic's first error)."""
    if isinstance(exc, ValidationError) and exc.errors():
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        return f"{where}: {first['msg']}" if where else str(first["msg"])
    return str(exc) or type(exc).__name__


def _entry_json(trial: Trial) -> dict[str, Any]:
    return {
        "config": trial.config,
        "status": trial.status,
        "times_ms": list(trial.times_ms),
        "error": trial.error,
    }


def _entry_from_json(data: Any) -> Trial:
    """An entry from :func:`_entry_json`'s output.

    Raises:
        InvalidInput: a field is missing or malformed.
    """
    try:
        return entry(
            Config.of(data["config"]).to_json(),
            data["status"],
            data.get("times_ms", ()),
            str(data.get("error", "")),
        )
    except InvalidInput:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InvalidInput(f"malformed landscape entry {data!r}: {exc!r}") from exc


@dataclass
class Landscape:
    """Every config of one key, measured on one device."""

    key: dict[str, Any]  # Key.to_json() of the key measured
    space: dict[str, list[Any]]  # SearchSpace.to_json()
    entries: list[Trial]  # one per config, in the order recorded (see :func:`entry`)
    device: str  # e.g. "AMD EPYC, 2 cores" or "NVIDIA H100 80GB HBM3"
    note: str = ""
    _configs: tuple[tuple[Trial, ...], list[Config]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "key": self.key,
            "device": self.device,
            "note": self.note,
            "space": self.space,
            "entries": [_entry_json(trial) for trial in self.entries],
        }

    def save(self, path: Path) -> None:
        """Writes the landscape as JSON, atomically (a temp file beside it, then ``os.replace``)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(self.to_json(), out, indent=1)
                out.write("\n")
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: Path) -> Landscape:
        """Reads a landscape written by :meth:`save` (gzipped or not).

        Raises:
            InvalidInput: the file is unreadable, not JSON, of another format, or malformed.
        """
        try:
            raw = Path(path).read_bytes()
            if raw[:2] == b"\x1f\x8b":  # gzip's magic number: a .json.gz landscape
                raw = gzip.decompress(raw)
            data = json.loads(raw.decode("utf-8"))
        except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InvalidInput(f"cannot read landscape {path}: {exc}") from exc
        try:
            return cls.from_json(data)
        except InvalidInput as exc:
            raise InvalidInput(f"landscape {path}: {exc}") from exc

    @classmethod
    def from_json(cls, data: Any) -> Landscape:
        """Builds a landscape from :meth:`to_json`'s output.

        Raises:
            InvalidInput: another format, or a missing or malformed field.
        """
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise InvalidInput(f"format is {found!r}, not {FORMAT!r}")
        for name, kind in (("key", dict), ("space", dict), ("entries", list), ("device", str)):
            if not isinstance(data.get(name), kind):
                raise InvalidInput(f"field {name!r} is missing or not a {kind.__name__}")
        if not all(isinstance(choices, list) for choices in data["space"].values()):
            raise InvalidInput(f"space {data['space']!r} does not map names to lists of choices")
        landscape = cls(
            key=data["key"],
            space=data["space"],
            entries=[_entry_from_json(e) for e in data["entries"]],
            device=data["device"],
            note=str(data.get("note", "")),
        )
        space = landscape.search_space()  # the space must be well formed
        seen: set[Config] = set()
        for config in landscape.configs():
            if config in seen:
                raise InvalidInput(f"config {config} is recorded twice")
            if (reason := space.prune_reason(config)) is not None:
                raise InvalidInput(f"config {config} is outside the space: {reason}")
            seen.add(config)
        return landscape

    def configs(self) -> list[Config]:
        """The entries' configs, in order (worked out again only when the entries change)."""
        entries = tuple(self.entries)
        if self._configs is None or self._configs[0] != entries:  # identical items: no compare
            self._configs = (entries, [Config.of(trial.config) for trial in entries])
        return list(self._configs[1])

    def optimum(self) -> Trial:
        """The fastest ``ok`` entry (the first recorded on a tie).

        Raises:
            InvalidInput: no entry is ``ok``.
        """
        ok = [trial for trial in self.entries if trial.status == "ok"]
        if not ok:
            raise InvalidInput(f"landscape of {self.key} has no ok entry")
        return min(ok, key=lambda trial: trial.time_ms or 0.0)

    def search_space(self) -> SearchSpace:
        """The recorded space: its configs are the recorded ones (whatever the product's size)."""
        try:
            params = {name: tuple(choices) for name, choices in self.space.items()}
            return SearchSpace(params, members=tuple(self.configs()))
        except (TypeError, ValueError) as exc:
            raise InvalidInput(f"malformed landscape space {self.space!r}: {exc}") from exc

    def evaluator(self) -> Callable[[list[Config]], list[Trial]]:
        """Replays the landscape as a simulated device.

        An ``ok`` config gives its median time, a failed one its status and error, and a config
        not recorded ``invalid``. Deterministic: the same configs always give the same trials.
        """
        by_config = dict(zip(self.configs(), self.entries, strict=True))

        def evaluate(configs: list[Config]) -> list[Trial]:
            trials = []
            for config in configs:
                found = by_config.get(config)
                if found is None:
                    why = "not in the landscape"
                    trials.append(Trial(config=config.to_json(), status="invalid", error=why))
                else:
                    trials.append(found.model_copy(update={"config": config.to_json()}))
            return trials

        return evaluate


def record_landscape(
    space: SearchSpace,
    measure: Callable[[Config], Trial],
    *,
    key: dict[str, Any],
    device: str,
    note: str = "",
    progress: ProgressFn | None = None,
) -> Landscape:
    """Measures every config of ``space`` (after pruning), in order, into a landscape.

    Args:
        space: the space to record.
        measure: times one config (several repeats) or reports its failure, as an
            :func:`entry` (whose :class:`InvalidInput` stops the recording). Another exception it
            raises is recorded as a ``runtime_error`` entry (and logged) rather than losing the run.
        key: ``Key.to_json()`` of the key measured.
        device: the device's name, for reports.
        note: free text (the timer settings, the harness version).
        progress: called after every config.
    """
    configs = list(space.configs())
    entries: list[Trial] = []
    best: float | None = None
    for done, config in enumerate(configs, start=1):
        try:
            found = measure(config)
        except InvalidInput:  # an entry no trial can be (too many repeats): not the config's fault
            raise
        except Exception as exc:
            logger.warning(
                "landscape: measuring %s raised %r; recorded as runtime_error", config, exc
            )
            found = entry(config.to_json(), "runtime_error", error=repr(exc))
        if Config.of(found.config) != config:
            raise InvalidInput(f"measure({config}) returned an entry for {found.config}")
        if found.status == "ok" and not found.times_ms:
            raise InvalidInput(f"measure({config}) returned an ok entry without its times")
        entries.append(found)
        if found.time_ms is not None and (best is None or found.time_ms < best):
            best = found.time_ms
        if progress is not None:
            progress(Progress(done, len(configs), best, f"{config}: {found.status}"))
    return Landscape(
        key=dict(key), space=space.to_json(), entries=entries, device=device, note=note
    )
