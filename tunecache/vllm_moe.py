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

from tunecache.device import DeviceLimits, normalise_name
from tunecache.errors import InvalidInput
from tunecache.folders import shared_mode, write_atomic
from tunecache.jsonsafe import parse_json

# The engine's own Triton kernel as ``tune`` takes it (workloads/vllm_moe.py): its problems are
# M, E, N, K (the hidden size) and topk; its configs the six fields of a file's entry.
KERNEL: Final = "workloads.vllm_moe:FusedMoE"
FIELDS: Final = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps",
                 "num_stages")  # fmt: skip
# Fields some platforms' files add, each optional: a split of K (AMD's, Intel's), ROCm's
# waves per EU, MFMA instruction size and K packing. Written after the six, in this order.
OPTIONAL: Final = ("SPLIT_K", "waves_per_eu", "matrix_instr_nonkdim", "kpack")
# Each field's allowed range, and whether it must be a power of two.
_RANGES: Final[Mapping[str, tuple[int, int, bool]]] = {
    "BLOCK_SIZE_M": (1, 1024, True),
    "BLOCK_SIZE_N": (1, 1024, True),
    "BLOCK_SIZE_K": (1, 1024, True),
    "GROUP_SIZE_M": (1, 1024, False),
    "num_warps": (1, 32, True),
    "num_stages": (0, 16, False),
    "SPLIT_K": (1, 64, False),
    "waves_per_eu": (0, 8, False),
    "matrix_instr_nonkdim": (0, 32, False),
    "kpack": (1, 2, False),
}
# Shared memory a block may opt into, by CUDA arch; a CUDA arch not named: the least (99 KiB:
# sm_86, sm_89, sm_120); a CPU's (Triton's interpreter): the H100 limits it checks against.
SHARED_BY_ARCH: Final[Mapping[str, int]] = {"sm_70": 98304, "sm_75": 65536, "sm_80": 166912,
                                            "sm_87": 166912, "sm_90": 232448, "sm_100": 232448,
                                            "sm_103": 232448}  # fmt: skip
SHARED_LEAST: Final = 101376
# An NVIDIA GPU whose arch its name does not tell: what every arch the engine runs on gives a block
SHARED_ANY: Final = 65536
INTERPRETER_SHARED: Final = DeviceLimits.CPU_INTERPRETER.max_shared_memory_per_block
VERSION_KEY: Final = "triton_version"  # vLLM's tuner writes it first; the engine ignores it
MAX_ENTRIES: Final = 4096  # batch sizes in one file (vLLM's have 18)
MAX_FILE_BYTES: Final = 1 << 20
MAX_M: Final = 1 << 24
BATCH_SIZE: Final = re.compile(r"[1-9][0-9]{0,7}")  # ASCII digits only: int() takes others too
_DEVICE_CHARS = r"[A-Za-z0-9_.+()-]{1,96}"  # Intel(R)_Arc(TM)_…: parentheses, never / or space
_NAME = re.compile(
    rf"E=(?P<E>[1-9][0-9]{{0,5}}),N=(?P<N>[1-9][0-9]{{0,6}}),device_name=(?P<device>{_DEVICE_CHARS})"
    r"(?:,dtype=(?P<dtype>[a-z0-9_]{1,32}))?(?:,block_shape=\[(?P<bn>[1-9][0-9]{0,4}),"
    r"(?P<bk>[1-9][0-9]{0,4})\])?\.json"
)
_DEVICE = re.compile(_DEVICE_CHARS)
VERSION = re.compile(r"[0-9A-Za-z.+_-]{1,64}")
Entry = dict[str, int]


def engine_device_name(name: str) -> str:
    """A device's name as the engine writes it in file names: ``NVIDIA H100 80GB HBM3`` →
    ``NVIDIA_H100_80GB_HBM3`` (spaces and slashes as ``_``), and every H200 ``NVIDIA_H200``."""
    name = re.sub(r"[\s/]+", "_", name)
    return "NVIDIA_H200" if "H200" in name.split("_") else name


def check_device_name(name: str) -> str:
    """``name`` if it is a device name as the engine writes it in file names.

    Raises:
        InvalidInput: it is not (spaces, slashes, over 96 characters…).
    """
    if not _DEVICE.fullmatch(name) or set(name) == {"."}:
        raise InvalidInput(f"{name!r} is not a device name as the engine writes it (letters, "
                           "digits and _.+-() only, spaces as _: NVIDIA_H100_80GB)")  # fmt: skip
    return name


# The arch of the GPU families the engine ships files for (and their kin), by the start of the
# name as a CUDA key holds it (:func:`key_device_name`): a file named for one is held to that arch.
_ARCH_BY_FAMILY: Final = (
    (re.compile(r"(v100|titan-v)\b"), "sm_70"),
    (re.compile(r"(t4|titan-rtx|quadro-rtx-[0-9]+|geforce-rtx-20[0-9]0)\b"), "sm_75"),
    (re.compile(r"(a100|a800|a30)\b"), "sm_80"),
    (re.compile(r"(a10g?|a40|a16|a2|rtx-a[0-9]+|geforce-rtx-30[0-9]0)\b"), "sm_86"),
    (re.compile(r"(l4|l40[sg]?|l20y?|rtx-[0-9]+(-sff)?-ada|geforce-rtx-40[0-9]0)\b"), "sm_89"),
    (re.compile(r"(h100|h200|h800|h20|gh200)\b"), "sm_90"),
    (re.compile(r"(b100|b200|gb200)\b"), "sm_100"),
    (re.compile(r"(b300|gb300)\b"), "sm_103"),
    (re.compile(r"(geforce-rtx-50[0-9]0|rtx-pro-[0-9]+-blackwell)\b"), "sm_120"),
    (re.compile(r"gb10\b"), "sm_121"),
)
_NVIDIA_PREFIXES: Final = ("NVIDIA", "Tesla", "Quadro")  # torch's names of NVIDIA's GPUs


def key_device_name(name: str) -> str:
    """A GPU's name as a CUDA key holds it (:func:`tunecache.device.normalise_name`), from the
    engine's name or the key's own: ``NVIDIA_H100_80GB_HBM3`` and ``h100-80gb-hbm3`` →
    ``h100-80gb-hbm3``; every H200 ``h200`` (the engine names them all ``NVIDIA_H200``)."""
    slug = normalise_name(name.replace("_", " "))
    return "h200" if "h200" in slug.split("-") else slug


@dataclass(frozen=True)
class EngineDevice:
    """The device a file is for, and what goes in it: records keyed to its kind (and a GPU's
    arch), entries whose tiles fit its shared memory. All of it comes from the device (this
    machine's GPU, or the name asked), never from a record: a write token keys a record to any
    device it likes, and a file the engine reads must launch on the device it is named for.

    Attributes:
        name: the engine's name, as in the file's (``NVIDIA_H100_80GB_HBM3``).
        kind: ``cuda``; ``cpu`` for Triton's interpreter, named as a CPU key names the CPU
            (``intel-xeon-platinum-8481c``: tests and the interpreter's runs of the engine);
            ``None`` for another platform (AMD's, Intel's) or a name not known here.
        arch: a GPU's arch (``sm_90``); ``None`` where its name does not tell (records of its
            name are taken, held to :data:`SHARED_ANY`).
        shared: bytes of shared memory a block may use.

    Example:
        >>> EngineDevice.named("NVIDIA_A10")
        EngineDevice(name='NVIDIA_A10', kind='cuda', arch='sm_86', shared=101376)
    """

    name: str
    kind: str | None
    arch: str | None
    shared: int

    @classmethod
    def named(cls, name: str) -> EngineDevice:
        """The device the engine's ``name`` is (``--device``).

        Raises:
            InvalidInput: ``name`` is not a device name as the engine writes it.
        """
        name = check_device_name(name)
        if normalise_name(name) == name:  # as a CPU key names a CPU: no GPU is named so
            return cls(name, "cpu", None, INTERPRETER_SHARED)
        slug = key_device_name(name)
        family_name = slug.removeprefix("tesla-")  # Tesla_T4, Tesla_V100-SXM2-32GB
        arch = next((a for family, a in _ARCH_BY_FAMILY if family.match(family_name)), None)
        nvidia = arch is not None or name.split("_")[0] in _NVIDIA_PREFIXES
        limit = SHARED_BY_ARCH.get(arch, SHARED_LEAST) if arch else SHARED_ANY
        return cls(name, "cuda" if nvidia else None, arch, limit)

    @property
    def what(self) -> str:
        """How messages name it: ``NVIDIA_A10 (sm_86)``."""
        return f"{self.name} ({self.arch or self.kind or 'platform not known here'})"

    def takes(self, kind: str, arch: str, name: str) -> bool:
        """Whether a record whose key's device is of ``kind``, ``arch`` and ``name`` is one of
        this device's: a CPU's of that CPU (the interpreter's), a GPU's of its kind, arch and name
        (as a CUDA key holds it: :func:`key_device_name`)."""
        if self.kind == "cpu":
            return kind == "cpu" and name == self.name
        same_gpu = key_device_name(name) == key_device_name(self.name)
        same_arch = self.arch is None or arch == self.arch  # not known: held to SHARED_ANY
        return self.kind == kind == "cuda" and same_arch and same_gpu


@dataclass(frozen=True)
class MoeFile:
    """A config file's contents: batch size M → config, and the Triton version its tuner wrote."""

    table: dict[int, Entry]
    triton_version: str | None = None


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


def parse_file_text(text: str | bytes, where: str) -> MoeFile:
    """A file's contents, checked.

    Raises:
        InvalidInput: not a JSON object of M → entry (and vLLM's ``triton_version``), or an entry
            outside the closed schema; the message names ``where`` and the entry.
    """
    if len(text) > MAX_FILE_BYTES:
        raise InvalidInput(f"{where}: over {MAX_FILE_BYTES} bytes")
    try:
        document = parse_json(text)
    except ValueError as exc:
        raise InvalidInput(f"{where}: not JSON ({exc})") from None
    return check_document(document, where)


def check_document(document: object, where: str) -> MoeFile:
    """``document`` (a file's JSON) as a :class:`MoeFile`, if it is one.

    Raises:
        InvalidInput: what is wrong, after ``where``.
    """
    if not isinstance(document, dict):
        raise InvalidInput(f"{where}: expected a non-empty object of batch size M -> config")
    version = document.get(VERSION_KEY)
    if version is not None and not (isinstance(version, str) and VERSION.fullmatch(version)):
        raise InvalidInput(f"{where}: {VERSION_KEY} is not a version such as '3.5.0'")
    entries = {m: e for m, e in document.items() if m != VERSION_KEY}
    if not entries:
        raise InvalidInput(f"{where}: expected a non-empty object of batch size M -> config")
    if len(entries) > MAX_ENTRIES:
        raise InvalidInput(f"{where}: {len(entries)} entries, over {MAX_ENTRIES}")
    table: dict[int, Entry] = {}
    for m, entry in entries.items():
        if not BATCH_SIZE.fullmatch(m) or int(m) > MAX_M:
            raise InvalidInput(
                f"{where}: entry {m[:40]!r}: M is not a batch size from 1 to {MAX_M}"
            )
        table[int(m)] = check_entry(entry, f"{where}: entry M={m}")
    return MoeFile(table, version)


def check_entry(entry: object, where: str) -> Entry:
    """``entry`` if it holds the six fields (and optional ones of :data:`OPTIONAL`), each a whole
    number in its range; its fields in the order files have them.

    Raises:
        InvalidInput: what is wrong, after ``where``.
    """
    if not isinstance(entry, dict):
        raise InvalidInput(f"{where}: expected an object of {', '.join(FIELDS)}")
    unknown = sorted(set(entry) - set(FIELDS) - set(OPTIONAL))
    missing = [field for field in FIELDS if field not in entry]
    if unknown or missing:
        what = [f"unknown field(s) {', '.join(map(repr, unknown))}"] if unknown else []
        what += [f"missing {', '.join(missing)}"] if missing else []
        raise InvalidInput(f"{where}: {'; '.join(what)}")
    for field in [*FIELDS, *(f for f in OPTIONAL if f in entry)]:
        value, (low, high, power) = entry[field], _RANGES[field]
        if type(value) is not int or not low <= value <= high or (power and value & (value - 1)):
            kind = "a power of two" if power else "a whole number"
            raise InvalidInput(f"{where}: {field}={value!r} is not {kind} from {low} to {high}")
    return {field: entry[field] for field in (*FIELDS, *OPTIONAL) if field in entry}


def read_file(path: Path) -> tuple[MoeShape, MoeFile]:
    """A config file's shape (from its name) and contents.

    Raises:
        InvalidInput: the name or the contents do not parse (naming the file and the entry), or
            the file cannot be read.
    """
    shape = MoeShape.parse(path.name)
    try:
        if not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
            raise InvalidInput(f"{path.name}: not a file of at most {MAX_FILE_BYTES} bytes")
        text = path.read_bytes()
    except OSError as exc:
        raise InvalidInput(f"{path}: cannot be read ({exc.strerror})") from None
    return shape, parse_file_text(text, path.name)


def file_text(contents: MoeFile) -> str:
    """A file's text as the engine's tuner writes it: its Triton version first (when it has
    one), then M ascending, each entry's fields in order."""
    document: dict[str, object] = {}
    if contents.triton_version is not None:
        document[VERSION_KEY] = contents.triton_version
    for m in sorted(contents.table):
        document[str(m)] = check_entry(contents.table[m], f"entry M={m}")
    return json.dumps(document, indent=4) + "\n"


def write_file(folder: Path, shape: MoeShape, contents: MoeFile) -> Path:
    """Writes ``shape``'s file into ``folder``, whole (a rename: a reader never sees half).

    Raises:
        InvalidInput: an entry outside the schema (nothing written), or the file cannot be
            written (the message names it; no partial file is left).
    """
    text = file_text(contents)
    path = folder / shape.file_name()
    try:  # through a private temporary file: a link planted beside it is never followed
        write_atomic(path, text.encode("utf-8"), mode=shared_mode(path))  # vLLM reads it
    except OSError as exc:
        raise InvalidInput(f"{path}: cannot be written ({exc.strerror or exc})") from None
    return path


NAMESPACE: Final = "vllm.moe"  # imported files in the artifact store: one per (device, shape)
_TEXT = re.compile(r"[^\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]{0,512}")


def imported_value(file: str, origin: str, contents: MoeFile) -> dict[str, object]:
    """An imported file as the artifact store keeps it: its name, where it came from, its
    Triton version and its table (M as text, as in the file)."""
    return {"file": file, "origin": origin, "triton_version": contents.triton_version,
            "configs": {str(m): dict(e) for m, e in sorted(contents.table.items())}}  # fmt: skip


def imported_contents(value: object) -> MoeFile:
    """The file ``value`` (:func:`imported_value`) holds.

    Raises:
        InvalidInput: ``value`` is not one (the artifact store's closed schema for
            :data:`NAMESPACE`, checked at upload and again after download).
    """
    fields = {"file", "origin", "triton_version", "configs"}
    if not isinstance(value, dict) or set(value) != fields:
        raise InvalidInput(f"expected exactly {', '.join(sorted(fields))}")
    for field in ("file", "origin"):
        if not isinstance(value[field], str) or not _TEXT.fullmatch(value[field]):
            raise InvalidInput(f"{field} is not a line of plain text (at most 512 characters)")
    MoeShape.parse(value["file"])
    version = value["triton_version"]
    document = value["configs"]
    if not isinstance(document, dict) or VERSION_KEY in document:
        raise InvalidInput("configs is not an object of batch size M -> config")
    return check_document({**document, **({VERSION_KEY: version} if version is not None else {})},
                          value["file"])  # fmt: skip


def imported_value_problem(value: object) -> str | None:
    """Why ``value`` is not an imported file, or ``None`` (:func:`imported_contents`)."""
    try:
        imported_contents(value)
    except InvalidInput as exc:
        return str(exc)
    return None


def imported_name_problem(partition: str, key: str, item: str, value: object) -> str | None:
    """Why an artifact's name does not match the imported file it holds, or ``None``: the
    partition is the file's device, the key its shape, the item empty."""
    try:
        shape = MoeShape.of_artifact(check_device_name(partition), key)
    except InvalidInput as exc:
        return str(exc)
    file = value.get("file") if isinstance(value, dict) else None
    if item or file != shape.file_name():
        return f"partition, key and item must name the file it holds ({shape.file_name()!r})"
    return None
