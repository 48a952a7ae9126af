"""Serving engines' fused-MoE tuned-config files (vLLM's, and SGLang's of the same form): names and
contents, read and written exactly.

A file is named ``E={experts},N={intermediate size per shard},device_name={the device's name,
spaces as _}[,dtype={fp8_w8a8|int8_w8a16|…}][,block_shape=[{n},{k}]].json`` and holds a JSON object
from the batch size M (a decimal string) to the kernel's Triton config: ``BLOCK_SIZE_M``,
``BLOCK_SIZE_N``, ``BLOCK_SIZE_K``, ``GROUP_SIZE_M``, ``num_warps``, ``num_stages``. The engine
takes the entry whose M is nearest the batch it runs; ``VLLM_TUNED_CONFIG_FOLDER`` names a folder
it searches first. Files are written as the engine's tuner writes them (``json.dumps(indent=4)``
and a newline), so a file read and written again is the same bytes.

Everything here is data: a name or an entry that does not parse raises
:class:`~tunecache.errors.InvalidInput` naming the file and the entry, and nothing in a file is
ever run. Entries are held to a closed schema (the six fields, whole numbers in the ranges a
Triton launch takes); a field the engine's other platforms add (ROCm's ``waves_per_eu``, …) is
refused by name rather than dropped.

Example:
    >>> shape = MoeShape.parse("E=128,N=384,device_name=NVIDIA_H200.json")
    >>> shape.experts, shape.intermediate, shape.device_name, shape.dtype
    (128, 384, 'NVIDIA_H200', None)
    >>> shape.file_name()
    'E=128,N=384,device_name=NVIDIA_H200.json'
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tunecache.errors import InvalidInput

FIELDS: Final = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps",
                 "num_stages")  # fmt: skip
# Each field's allowed range (block sizes and warps: powers of two within it).
_RANGES: Final[Mapping[str, tuple[int, int, bool]]] = {
    "BLOCK_SIZE_M": (1, 1024, True),
    "BLOCK_SIZE_N": (1, 1024, True),
    "BLOCK_SIZE_K": (1, 1024, True),
    "GROUP_SIZE_M": (1, 1024, False),
    "num_warps": (1, 32, True),
    "num_stages": (0, 16, False),
}
MAX_ENTRIES: Final = 4096  # batch sizes in one file (vLLM's have 18)
MAX_FILE_BYTES: Final = 1 << 20
MAX_M: Final = 1 << 24
BATCH_SIZE: Final = re.compile(r"[1-9][0-9]{0,7}")  # ASCII digits only: int() takes others too
_NAME = re.compile(
    r"E=(?P<E>[1-9][0-9]{0,5}),N=(?P<N>[1-9][0-9]{0,6}),device_name=(?P<device>[A-Za-z0-9_.+-]{1,96})"
    r"(?:,dtype=(?P<dtype>[a-z0-9_]{1,32}))?(?:,block_shape=\[(?P<bn>[1-9][0-9]{0,4}),"
    r"(?P<bk>[1-9][0-9]{0,4})\])?\.json"
)
_DEVICE = re.compile(r"[A-Za-z0-9_.+-]{1,96}")
Entry = dict[str, int]


def check_device_name(name: str) -> str:
    """``name`` if it is a device name as the engine writes it in file names.

    Raises:
        InvalidInput: it is not (spaces, slashes, over 96 characters…).
    """
    if not _DEVICE.fullmatch(name) or set(name) == {"."}:
        raise InvalidInput(f"{name!r} is not a device name as the engine writes it (letters, "
                           "digits and _.+- only, spaces as _: NVIDIA_H100_80GB_HBM3)")  # fmt: skip
    return name


@dataclass(frozen=True)
class MoeShape:
    """What a config file is for: experts, intermediate size per shard, device, dtype, block."""

    experts: int
    intermediate: int
    device_name: str  # as the engine writes it: torch's device name, spaces as underscores
    dtype: str | None = None  # None: the engine's default (bf16 / fp16 activations)
    block_shape: tuple[int, int] | None = None  # block-quantisation's [n, k]

    @classmethod
    def parse(cls, name: str) -> MoeShape:
        """The shape a file name gives.

        Raises:
            InvalidInput: the name is not ``E=…,N=…,device_name=…[,dtype=…][,block_shape=[n,k]]
                .json``.
        """
        found = _NAME.fullmatch(name)
        if found is None:
            raise InvalidInput(f"{name!r} is not a fused-MoE config file name (expected "
                               "E=<experts>,N=<size>,device_name=<device>[,dtype=<dtype>]"
                               "[,block_shape=[<n>,<k>]].json)")  # fmt: skip
        block = (int(found["bn"]), int(found["bk"])) if found["bn"] else None
        return cls(int(found["E"]), int(found["N"]), found["device"], found["dtype"], block)

    def file_name(self) -> str:
        """The engine's name for this shape's file."""
        return f"E={self.experts},N={self.intermediate},device_name={self.device_name}" + (
            self._selectors() + ".json"
        )

    def artifact_key(self) -> str:
        """The shape without its device: its key in the artifact store (the device is the
        partition), ``E=128,N=384,dtype=fp8_w8a8,block_shape=[128,128]``."""
        return f"E={self.experts},N={self.intermediate}{self._selectors()}"

    @classmethod
    def of_artifact(cls, device_name: str, key: str) -> MoeShape:
        """The shape an artifact's partition and key name.

        Raises:
            InvalidInput: they do not make a config file's name.
        """
        head, comma, rest = key.partition(",")
        second, comma2, rest = rest.partition(",")
        name = f"{head},{second},device_name={device_name}{comma2}{rest}.json"
        if not comma:
            name = key  # not E=…,N=…: refused below, named as it came
        return cls.parse(name)

    def _selectors(self) -> str:
        dtype = f",dtype={self.dtype}" if self.dtype else ""
        block = (
            f",block_shape=[{self.block_shape[0]},{self.block_shape[1]}]"
            if self.block_shape
            else ""
        )
        return dtype + block


def parse_entries(text: str | bytes, where: str) -> dict[int, Entry]:
    """The table of a file's contents: batch size M → config, in the file's order.

    Raises:
        InvalidInput: not a JSON object of M → entry, or an entry outside the closed schema; the
            message names ``where`` and the entry.
    """
    if len(text) > MAX_FILE_BYTES:
        raise InvalidInput(f"{where}: over {MAX_FILE_BYTES} bytes")
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise InvalidInput(f"{where}: not JSON ({exc})") from None
    if not isinstance(document, dict) or not document:
        raise InvalidInput(f"{where}: expected a non-empty object of batch size M -> config")
    if len(document) > MAX_ENTRIES:
        raise InvalidInput(f"{where}: {len(document)} entries, over {MAX_ENTRIES}")
    table: dict[int, Entry] = {}
    for m, entry in document.items():
        if not BATCH_SIZE.fullmatch(m) or int(m) > MAX_M:
            raise InvalidInput(
                f"{where}: entry {m[:40]!r}: M is not a batch size from 1 to {MAX_M}"
            )
        table[int(m)] = check_entry(entry, f"{where}: entry M={m}")
    return table


def check_entry(entry: object, where: str) -> Entry:
    """``entry`` if it is exactly the six fields, each a whole number in its range.

    Raises:
        InvalidInput: what is wrong, after ``where``.
    """
    if not isinstance(entry, dict):
        raise InvalidInput(f"{where}: expected an object of {', '.join(FIELDS)}")
    unknown = sorted(set(entry) - set(FIELDS))
    missing = [field for field in FIELDS if field not in entry]
    if unknown or missing:
        what = [f"unknown field(s) {', '.join(map(repr, unknown))}"] if unknown else []
        what += [f"missing {', '.join(missing)}"] if missing else []
        raise InvalidInput(f"{where}: {'; '.join(what)}")
    for field in FIELDS:
        value, (low, high, power) = entry[field], _RANGES[field]
        if type(value) is not int or not low <= value <= high or (power and value & (value - 1)):
            kind = "a power of two" if power else "a whole number"
            raise InvalidInput(f"{where}: {field}={value!r} is not {kind} from {low} to {high}")
    return {field: entry[field] for field in FIELDS}


def read_file(path: Path) -> tuple[MoeShape, dict[int, Entry]]:
    """A config file's shape (from its name) and table.

    Raises:
        InvalidInput: the name or the contents do not parse (naming the file and the entry).
    """
    shape = MoeShape.parse(path.name)
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise InvalidInput(f"{path}: cannot be read ({exc.strerror})") from None
    return shape, parse_entries(text, path.name)


def file_text(table: Mapping[int, Mapping[str, int]]) -> str:
    """A file's contents as the engine's tuner writes them: M ascending, fields in order."""
    document = {str(m): {field: table[m][field] for field in FIELDS} for m in sorted(table)}
    return json.dumps(document, indent=4) + "\n"


def write_file(folder: Path, shape: MoeShape, table: Mapping[int, Mapping[str, int]]) -> Path:
    """Writes ``shape``'s file into ``folder`` (whole, by a rename: a reader never sees half)."""
    for m, entry in table.items():
        check_entry(dict(entry), f"{shape.file_name()}: entry M={m}")
    path = folder / shape.file_name()
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(file_text(table))
    partial.replace(path)
    return path


NAMESPACE: Final = "vllm.moe"  # imported entries in the artifact store: one per (device, shape, M)
_TEXT = re.compile(r"[^\x00-\x1f\x7f]{1,512}")


def imported_value(entry: Mapping[str, int], file: str, origin: str) -> dict[str, object]:
    """An imported entry as the artifact store keeps it: the config and where it came from."""
    return {"config": dict(entry), "file": file, "origin": origin}


def imported_value_problem(value: object) -> str | None:
    """Why ``value`` is not an imported entry (:func:`imported_value`), or ``None``: the
    artifact store's closed schema for :data:`NAMESPACE`, checked at upload and after download."""
    if not isinstance(value, dict) or set(value) != {"config", "file", "origin"}:
        return "expected exactly config, file and origin"
    for field in ("file", "origin"):
        text = value[field]
        if not isinstance(text, str) or not (
            _TEXT.fullmatch(text) or (field == "origin" and not text)
        ):
            return f"{field} is not a line of text (at most 512 characters)"
    try:
        MoeShape.parse(value["file"])
        check_entry(value["config"], "config")
    except InvalidInput as exc:
        return str(exc)
    return None
