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
timed itself, and never touches a local file it cannot read.

The file is persistent state, read by every later compile on that cache folder, tunecache on or
off: a served group merged into it would be used long after the server stopped serving it. So the
groups merged are recorded beside the file (:mod:`tunecache.inductor.served`); on each
``enable()`` that read the server, those still exactly as merged that the server no longer serves
so (a revoked token's, a disputed one, one served with other times now) are taken out before
merging (:func:`refresh_groups`), and the one served now, a teammate's, can be merged again. An
upload shares only the groups this machine's Inductor timed or re-timed (:func:`own_groups`).

What a server can make the client write is bounded, as Inductor reads the whole file and parses it
on every autotuned GEMM, and rewrites it on every miss, in every later compile sharing the cache
folder, with tunecache on or off. A served group whose choice names are longer than Inductor's
(:data:`MAX_SERVED_NAME`) is refused; one :func:`merge_groups` adds at most
:data:`MAX_MERGE_GROUPS` groups and :data:`MAX_MERGE_BYTES`, never grows the file past
:data:`MAX_FILE_BYTES`, leaves a file already past it alone, and stops adding at its deadline. The
groups a compile will look up (op and inputs key) are not known when the file is filled, before
``torch.compile``: a served group for an op or shape this process never compiles costs only its
bytes, which these bounds cap. (A server that answered groups for made-up ops grew the file by
32 MB per ``enable()``, and every later compile on that cache paid for it.)
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from tunecache import folders
from tunecache.configcheck.inductor import (
    MAX_CHOICES,
    MAX_NAME,
    MAX_PRECISION,
    choice_group_problem,
    finite_ms,
    text,
)
from tunecache.inductor import served
from tunecache.jsonsafe import parse_json

logger = logging.getLogger(__name__)

NAMESPACE: Final = "inductor.choices"
MAX_KEY = 256  # the server's limit on an artifact key
# Inductor's choice hashes (``ChoiceCaller.hash_key()``) on torch 2.13: a 52-character code hash
# behind the kernel's name and arguments, 72 and 85 characters in a CPU max-autotune compile
# (``CppMicroGemmFP32Vec-c…``, ``_mkl_linear-B=None-batch_size=64-c…``), about 62 for Triton and
# CUTLASS templates (``triton_mm-c…``). Three times the longest seen; the schema allows 512.
MAX_SERVED_NAME: Final = 256
# Inductor's file: a CPU group is about 500 bytes as Inductor writes it, a CUDA max-autotune group
# of some 20 candidates about 2 KB, so 8 MiB holds thousands of shapes. Inductor parses the file
# at every autotuned GEMM: 8 MiB is about 0.1 s a GEMM here, where 96 MB cost 10 s a compile.
MAX_FILE_BYTES: Final = 8 * 1024 * 1024
MAX_MERGE_BYTES: Final = 4 * 1024 * 1024  # one merge: a hostile one fills half the file at most
MAX_MERGE_GROUPS: Final = 2048  # one merge; the next one adds the groups left out, if they fit


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

    def pair(self) -> served.Pair:
        """Its identity and the digest of its times, as the served record holds them
        (:mod:`tunecache.inductor.served`)."""
        return served.identity(self.op, self.inputs, self.precision), served.digest(self.timings)

    def to_value(self) -> dict[str, Any]:
        """The artifact value (JSON: a failed choice's ``inf`` becomes ``null``)."""
        timings = {h: (ms if math.isfinite(ms) else None) for h, ms in self.timings.items()}
        return {"op": self.op, "inputs": self.inputs, "precision": self.precision,
                "timings": timings}  # fmt: skip

    @classmethod
    def from_value(cls, value: Any) -> ChoiceGroup | None:
        """A served group from an artifact value, its failed choices dropped (:meth:`timed`), or
        ``None`` if it is outside the closed schema or has no time left."""
        if (why := served_group_problem(value)) is not None:
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


def served_group_problem(value: Any) -> str | None:
    """Why a served artifact value is not a group this client merges, or ``None``.

    The closed schema (:func:`choice_group_problem`, the server's check at upload too), then what
    Inductor really writes: a choice name no longer than :data:`MAX_SERVED_NAME`. The schema's
    512 characters let a server fill its 256 KiB values with a few hundred made-up names.
    """
    if (why := choice_group_problem(value)) is not None:
        return why
    long = next((name for name in value["timings"] if len(name) > MAX_SERVED_NAME), None)
    if long is not None:
        return f"choice name of {len(long)} characters: Inductor's have at most {MAX_SERVED_NAME}"
    return None


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
    return list(_groups_in(document.get("cache", {})))


def own_groups(path: Path) -> list[ChoiceGroup]:
    """The groups of the file that this machine's Inductor timed (or re-timed): every one but
    those still exactly as :func:`merge_groups` merged them from the server (its record,
    :func:`tunecache.inductor.served.read_record`). What an upload shares: a merged copy uploaded
    under this process's token would stay served after its uploader's token is revoked."""
    with served.locked(path):
        merged = served.read_record(path)
        return [group for group in read_groups(path) if group.pair() not in merged]


def _groups_in(cache: Mapping[str, Any]) -> Iterator[ChoiceGroup]:
    for op, by_inputs in cache.items():
        if not isinstance(by_inputs, dict):
            continue
        for inputs, by_precision in by_inputs.items():
            if not isinstance(by_precision, dict):
                continue
            for precision, timings in by_precision.items():
                group = ChoiceGroup.checked(op, inputs, precision, timings, failed=math.inf)
                if group is not None:
                    yield group


@dataclass
class _Budget:
    """What one merge may still add: groups, bytes of the merge and of the file, groups the
    served record holds, and time."""

    file_bytes: int  # the file as it will be written before any group is added
    deadline: float | None
    recorded: int = 0  # served groups the file keeps from before
    added: int = 0
    added_bytes: int = 0
    left_out: int = 0

    def admits(self, cost: int) -> bool:
        """Whether a group of ``cost`` bytes still fits (counted as added when it does)."""
        if (
            self.added >= MAX_MERGE_GROUPS
            or self.recorded + self.added >= served.MAX_RECORDED
            or self.added_bytes + cost > MAX_MERGE_BYTES
            or self.file_bytes + self.added_bytes + cost > MAX_FILE_BYTES
        ):
            self.left_out += 1
            return False
        self.added += 1
        self.added_bytes += cost
        return True

    def expired(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline


def _cost(group: ChoiceGroup) -> int:
    """At least the bytes ``group`` adds to the file as ``json.dumps(…, indent=4)`` writes it:
    alone, plus the 4 spaces a line more that it is indented there, plus a separator."""
    alone = json.dumps({group.op: {group.inputs: {group.precision: dict(group.timings)}}}, indent=4)
    return len(alone) + 4 * alone.count("\n") + 8


def _lacks(cache: Mapping[str, Any], group: ChoiceGroup) -> bool:
    """Whether the file has no times for the group's op, inputs key and precision."""
    by_inputs = cache.get(group.op, {})
    by_precision = by_inputs.get(group.inputs, {}) if isinstance(by_inputs, dict) else None
    return isinstance(by_precision, dict) and not by_precision.get(group.precision)


@dataclass(frozen=True)
class Merged:
    """What :func:`refresh_groups` did to the file: groups added, and served copies taken out."""

    added: int = 0
    removed: int = 0


def _take_out_unserved(
    cache: dict[str, Any], merged: set[served.Pair], now: Mapping[str, ChoiceGroup] | None
) -> tuple[set[served.Pair], int]:
    """Takes out of ``cache`` each group still exactly as merged from the server (its pair in
    ``merged``) that the server no longer serves so (``now``: identity → served group; ``None``:
    not known, nothing taken out). Groups timed or re-timed here are never touched.

    Returns:
        The pairs of the served groups the file keeps, and how many were taken out.
    """
    kept: set[served.Pair] = set()
    removed = 0
    for group in list(_groups_in(cache)):
        ident, timed = group.pair()
        if (ident, timed) not in merged:
            continue  # Inductor timed it here, or re-timed what was merged: its own
        serving = now.get(ident) if now is not None else None
        if now is None or (serving is not None and serving.pair()[1] == timed):
            kept.add((ident, timed))
            continue
        by_inputs = cache[group.op]
        del by_inputs[group.inputs][group.precision]
        if not by_inputs[group.inputs]:
            del by_inputs[group.inputs]
        if not by_inputs:
            del cache[group.op]
        removed += 1
    return kept, removed


def merge_groups(
    path: Path,
    groups: Iterable[ChoiceGroup],
    system: Mapping[str, Any],
    *,
    deadline: float | None = None,
) -> int:
    """Adds the groups the file lacks (:func:`refresh_groups`, nothing taken out); how many."""
    return refresh_groups(path, groups, system, deadline=deadline).added


def refresh_groups(
    path: Path,
    groups: Iterable[ChoiceGroup],
    system: Mapping[str, Any],
    *,
    deadline: float | None = None,
    complete: bool = False,
) -> Merged:
    """Adds the groups the file lacks to Inductor's choice file, atomically, within bounds, and
    records them as served (:mod:`tunecache.inductor.served`).

    With ``complete`` (``groups`` is everything the server serves now), the groups merged before
    that are still exactly as merged and that the server no longer serves so (revoked, disputed,
    served with other times) are taken out first: a group replaced on the server is merged anew,
    one no longer served is benchmarked by Inductor. A group the file has otherwise (same op,
    inputs key and precision) is kept as it is: this machine's Inductor timed it, or re-timed
    the one merged. Only the groups' times are written (:meth:`ChoiceGroup.timed`): a failure
    from elsewhere would stop Inductor timing that choice, or fail the compile. A file that
    cannot be read is left alone, and so is one already past :data:`MAX_FILE_BYTES` (unparsed):
    every compile on it pays for its size, and served data must not add to it.

    Args:
        path: the file (:func:`local_cache_path`).
        groups: well-formed groups (:meth:`ChoiceGroup.from_value`).
        system: Inductor's system description, written into a new file.
        deadline: a ``time.monotonic()`` after which no more groups are checked or added, nor
            any taken out (the file is still written with those added before).
        complete: whether ``groups`` is all the server serves now.

    Raises:
        OSError: the file or its record cannot be written.
    """
    with served.locked(path):  # the file and its record read and written as one
        return _refreshed(path, groups, system, deadline, complete)


def _refreshed(path: Path, groups: Iterable[ChoiceGroup], system: Mapping[str, Any],
               deadline: float | None, complete: bool) -> Merged:  # fmt: skip
    """:func:`refresh_groups` under the file's lock."""
    if path.is_file() and path.stat().st_size > MAX_FILE_BYTES:
        logger.warning("Inductor's choice file %s is past %d bytes: the team's choices are not "
                       "merged into it", path, MAX_FILE_BYTES)  # fmt: skip
        return Merged()
    document = _read_file(path)
    if document is None:
        return Merged()
    cache: dict[str, Any] = document.setdefault("cache", {})
    document.setdefault("system", dict(system))
    # Each group's times and identity within the deadline too (a page of 1,000 groups of 1,000
    # choices took 1.9 s to pass over here, past a 1.5 s timeout): one not reached is not
    # offered, and what was served is then not known in full.
    expired, cut = _Budget(0, deadline).expired, False
    offered: list[ChoiceGroup] = []
    for group in groups:
        if cut := expired():
            break
        if (timed := group.timed()) is not None:
            offered.append(timed)
    now: dict[str, ChoiceGroup] = {}
    for group in offered if complete and not cut else ():  # the first of one identity: added
        if cut := expired():
            break
        now.setdefault(group.pair()[0], group)
    if cut:
        complete = False
        logger.warning("the served choice groups were not all checked within the timeout: "
                       "%d offered, none taken out", len(offered))  # fmt: skip
    before = served.read_record(path)
    kept, removed = _take_out_unserved(cache, before, now if complete else None)
    added = _add(path, cache, offered, _Budget(len(json.dumps(document, indent=4)), deadline,
                                               recorded=len(kept)))  # fmt: skip
    after = kept | {group.pair() for group in added}
    if (added or removed) and not _write(path, document, before | after):
        return Merged()
    if after != before:
        served.write_record(path, after)
    if removed:
        logger.info("%d choice groups merged from the server before and no longer served so were "
                    "taken out of %s", removed, path)  # fmt: skip
    return Merged(len(added), removed)


def _write(path: Path, document: Mapping[str, Any], recorded: set[served.Pair]) -> bool:
    """Writes the file, ``recorded`` (the served pairs before and after) first: whichever file a
    crash leaves, its served groups are known. ``False`` when it would pass its bound."""
    written = json.dumps(document, indent=4)  # ASCII: as many bytes as characters
    if len(written) > MAX_FILE_BYTES:  # _cost over-counts; a guard, never expected to hold
        logger.warning("choice groups not merged: %s would pass %d bytes", path, MAX_FILE_BYTES)
        return False
    served.write_record(path, recorded)
    write_atomic(path, written)
    return True


def _add(
    path: Path, cache: dict[str, Any], groups: Iterable[ChoiceGroup], budget: _Budget
) -> list[ChoiceGroup]:
    """Adds to ``cache`` the groups it lacks, within ``budget``; those added."""
    added: list[ChoiceGroup] = []
    for group in groups:
        if not _lacks(cache, group):
            continue
        if budget.expired():
            budget.left_out += 1
        elif budget.admits(_cost(group)):
            by_precision = cache.setdefault(group.op, {}).setdefault(group.inputs, {})
            by_precision[group.precision] = dict(group.timings)
            added.append(group)
    if budget.left_out:
        logger.warning("%d served choice groups not merged into %s: past what one merge adds "
                       "(%d groups, %d bytes), the file's %d bytes, or the time", budget.left_out,
                       path, MAX_MERGE_GROUPS, MAX_MERGE_BYTES, MAX_FILE_BYTES)  # fmt: skip
    return added


def write_atomic(path: Path, text: str) -> None:
    """Writes ``text`` to ``path`` whole (:func:`tunecache.folders.write_atomic`), its folder
    made if missing, keeping the mode of the file it replaces
    (:func:`tunecache.folders.shared_mode`: a team's shared cache folder holds one choice file
    every user's compiles read; it was rewritten 0600, unreadable to them)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    folders.write_atomic(path, text.encode("utf-8"), mode=folders.shared_mode(path))
