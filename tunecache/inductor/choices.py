"""Inductor's GEMM choice timings: its local ``PersistentCache`` file, as artifacts and back.

Max-autotune benchmarks every candidate kernel of a GEMM (``mm``, ``addmm``, ``packed_linear``…)
and writes the timings to one JSON file per system,
``cache_dir()/cache/<system hash>`` (``torch._inductor.codecache.CacheBase``)::

    {"system": {...}, "cache": {op: {inputs_key: {precision: {choice_hash: ms}}}}}

On the next compile, ``PersistentCache.lookup`` finds every candidate's hash under the op's
inputs key and picks the fastest without benchmarking. One ``(op, inputs_key, precision)``
group is one artifact (namespace ``inductor.choices``), its value
``{"op", "inputs", "precision", "timings": {choice_hash: ms or null}}`` (``null``: the choice
failed, Inductor's ``inf``), its score the fastest time.

Values read from the server are untrusted: :meth:`ChoiceGroup.from_value` keeps a group only if
it fits the closed schema the server also checks at upload
(:func:`tunecache.configcheck.inductor.choice_group_problem`): the four fields of the right type
and size, every time a finite, non-negative number (or ``null``), with at least one finite time.
A served group only ever says "this choice was timed at X ms": its failed (``null``) choices are
dropped (:meth:`ChoiceGroup.timed`), and a group left with no time is not merged. Merged as
failed, a choice would never be timed here, and a group whose every candidate failed makes Inductor
raise ``NoValidChoicesError``, in every later compile on that cache: the schema cannot stop it, as
it cannot tell which hashes are Inductor's (all of them ``null`` beside a made-up one passed). The
group is data, not code: ``PersistentCache.lookup`` uses it only when every candidate Inductor
offers for the node has a time in it, and picks only among those candidates; a choice hash no
candidate has is never looked at, and a group lacking one of them misses (Inductor benchmarks every
candidate and writes their times into the group). Merging never replaces a group the local file
already has, and never touches a local file it cannot read.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from tunecache.configcheck.inductor import (
    MAX_CHOICES,
    MAX_NAME,
    MAX_PRECISION,
    choice_group_problem,
    finite_ms,
    text,
)
from tunecache.jsonsafe import parse_json

logger = logging.getLogger(__name__)

NAMESPACE: Final = "inductor.choices"
MAX_KEY = 256  # the server's limit on an artifact key


@dataclass(frozen=True)
class ChoiceGroup:
    """The timings of every candidate of one autotuned op, for one inputs key and precision.

    Attributes:
        op: Inductor's op name (``packed_linear``, ``mm``…).
        inputs: Inductor's inputs key (devices, dtypes, sizes and strides of the inputs).
        precision: ``torch.get_float32_matmul_precision()`` at autotune time.
        timings: choice hash → milliseconds; ``inf`` for a choice that failed.
    """

    op: str
    inputs: str
    precision: str
    timings: Mapping[str, float]

    @property
    def best_ms(self) -> float | None:
        finite = [ms for ms in self.timings.values() if math.isfinite(ms)]
        return min(finite) if finite else None

    def key(self) -> str:
        """The artifact key: readable when it fits in 256 characters, else hashed."""
        readable = f"{self.op}|{self.precision}|{self.inputs}"
        if len(readable) <= MAX_KEY:
            return readable
        raw = json.dumps([self.op, self.precision, self.inputs]).encode()
        return f"{self.op[:64]}|{self.precision[:32]}|sha256:{hashlib.sha256(raw).hexdigest()}"

    def to_value(self) -> dict[str, Any]:
        """The artifact value (JSON: a failed choice's ``inf`` becomes ``null``)."""
        timings = {h: (ms if math.isfinite(ms) else None) for h, ms in self.timings.items()}
        return {"op": self.op, "inputs": self.inputs, "precision": self.precision,
                "timings": timings}  # fmt: skip

    @classmethod
    def from_value(cls, value: Any) -> ChoiceGroup | None:
        """A served group from an artifact value, its failed choices dropped (:meth:`timed`), or
        ``None`` if it is outside the closed schema or has no time left."""
        if (why := choice_group_problem(value)) is not None:
            logger.debug("choice group refused: %s", why)
            return None
        group = cls.checked(value["op"], value["inputs"], value["precision"], value["timings"],
                            failed=None)  # fmt: skip
        return group.timed() if group is not None else None

    def timed(self) -> ChoiceGroup | None:
        """The group without its failed choices; ``None`` when none has a time.

        What another machine's group may say here: a choice was timed at X ms. A failure it
        names is not taken: Inductor never re-times a choice its file says failed, and fails the
        compile when every candidate did. Left out, the choice is benchmarked by Inductor itself.
        """
        finite = {h: ms for h, ms in self.timings.items() if math.isfinite(ms)}
        return replace(self, timings=finite) if finite else None

    @classmethod
    def checked(
        cls, op: Any, inputs: Any, precision: Any, timings: Any, *, failed: Any
    ) -> ChoiceGroup | None:
        """A group if every part is well formed; ``failed`` is how a failed time is written."""
        if not (text(op) and text(inputs) and text(precision, MAX_PRECISION)):
            return None
        if not isinstance(timings, Mapping) or not 0 < len(timings) <= MAX_CHOICES:
            return None
        clean: dict[str, float] = {}
        for choice, raw in timings.items():
            if text(choice, MAX_NAME) is None:
                return None
            ms = finite_ms(raw)
            if ms is None and raw is not failed and not _is_inf(raw):
                return None
            clean[choice] = ms if ms is not None else math.inf
        group = cls(op, inputs, precision, clean)
        return group if group.best_ms is not None else None


def _is_inf(value: Any) -> bool:
    return isinstance(value, float) and value == math.inf


def local_cache_path() -> Path:
    """Inductor's choice file for this system, under the current ``TORCHINDUCTOR_CACHE_DIR``."""
    from torch._inductor.codecache import CacheBase

    return Path(CacheBase.get_local_cache_path())


def _read_file(path: Path) -> dict[str, Any] | None:
    """The file's document, ``{}`` when there is none, ``None`` when it cannot be read."""
    if not path.is_file():
        return {}
    try:
        document = parse_json(path.read_bytes())
    except (OSError, ValueError) as exc:
        logger.warning("Inductor's choice file %s cannot be read (%s); left alone", path, exc)
        return None
    if not isinstance(document, dict) or not isinstance(document.get("cache", {}), dict):
        logger.warning("Inductor's choice file %s is not Inductor's format; left alone", path)
        return None
    return document


def read_groups(path: Path) -> list[ChoiceGroup]:
    """Every well-formed group in Inductor's choice file (none if it is missing or unreadable)."""
    document = _read_file(path) or {}
    groups: list[ChoiceGroup] = []
    for op, by_inputs in document.get("cache", {}).items():
        if not isinstance(by_inputs, dict):
            continue
        for inputs, by_precision in by_inputs.items():
            if not isinstance(by_precision, dict):
                continue
            for precision, timings in by_precision.items():
                group = ChoiceGroup.checked(op, inputs, precision, timings, failed=math.inf)
                if group is not None:
                    groups.append(group)
    return groups


def merge_groups(path: Path, groups: Iterable[ChoiceGroup], system: Mapping[str, Any]) -> int:
    """Adds the groups the file lacks to Inductor's choice file, atomically.

    A group the file has already (same op, inputs key and precision) is kept as it is: it was
    timed on this machine. Only the groups' times are written (:meth:`ChoiceGroup.timed`): a
    failure from elsewhere would stop Inductor timing that choice, or fail the compile. A file
    that cannot be read is left alone.

    Args:
        path: the file (:func:`local_cache_path`).
        groups: well-formed groups (:meth:`ChoiceGroup.from_value`).
        system: Inductor's system description, written into a new file.

    Returns:
        How many groups were added.
    """
    document = _read_file(path)
    if document is None:
        return 0
    cache: dict[str, Any] = document.setdefault("cache", {})
    added = 0
    timed = [t for t in (g.timed() for g in groups) if t is not None]
    for group in timed:
        by_inputs = cache.setdefault(group.op, {})
        if not isinstance(by_inputs, dict):
            continue
        by_precision = by_inputs.setdefault(group.inputs, {})
        if not isinstance(by_precision, dict) or by_precision.get(group.precision):
            continue
        by_precision[group.precision] = dict(group.timings)
        added += 1
    if added:
        document.setdefault("system", dict(system))
        write_atomic(path, json.dumps(document, indent=4))
    return added


def write_atomic(path: Path, text: str) -> None:
    """Writes ``text`` to ``path`` through a temporary file in the same folder and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
