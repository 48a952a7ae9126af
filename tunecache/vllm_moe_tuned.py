"""A team's tuned winners of the engine's fused-MoE kernel as the engine's config files.

``tune workloads.vllm_moe:FusedMoE`` (a preset: :mod:`tunecache.presets`) stores one record per
(M, E, N, K, topk, dtype, device); a file holds one config per M for an (E, N, device). This
module turns the records a server sends into files, trusting none of them: a record is taken only
if it is of the engine's kernel on the Triton backend, passed its validation, is not disputed or
rejected, is keyed to the device asked (:meth:`tunecache.vllm_moe.EngineDevice.takes`: a GPU's
file takes only CUDA records of its arch, whatever name a CPU record gives itself; a CPU's, for
Triton's interpreter, only that CPU's), and its problem and config are what a file holds (the six
fields in range, :func:`tunecache.vllm_moe.check_entry`) inside the engine's tuner's space, with
tiles that fit the shared memory of the device the file is for, never the one the record claims
(:func:`tunecache.vllm_moe_launch.engine_entry_problem`), and no other field (ROCm's ``kpack``…): an
entry that cannot launch would fail the engine while it serves, not in a benchmark. Every other
one is skipped and counted, as are entries past a file's
:data:`~tunecache.vllm_moe.MAX_ENTRIES`; a Triton version that is not one is left out.

Unquantized bfloat16 and float16 share a file (the engine's file names have no ``dtype=`` for
them): where both were tuned at an M, bfloat16's is written. Where records of several hidden
sizes or top-k give an (E, N, M) — two models sharing a file name — the newest is written.

Example:
    >>> from tunecache.vllm_moe import MoeShape
    >>> MoeShape(8, 14336, "NVIDIA_H100").file_name()
    'E=8,N=14336,device_name=NVIDIA_H100.json'
"""

from __future__ import annotations

from collections.abc import Iterable

from tunecache.errors import InvalidInput
from tunecache.schemas import RecordPublic
from tunecache.served import UNSERVED_STATUSES
from tunecache.vllm_moe import (
    FIELDS,
    KERNEL,
    MAX_ENTRIES,
    MAX_M,
    VERSION,
    EngineDevice,
    MoeFile,
    MoeShape,
    check_entry,
)
from tunecache.vllm_moe_launch import engine_entry_problem

DTYPES = ("bfloat16", "float16")  # a file without dtype=: the engine's unquantized activations


def tuned_files(
    records: Iterable[RecordPublic], device: EngineDevice | str
) -> tuple[dict[MoeShape, MoeFile], int]:
    """The files of ``device`` (or of the engine's device name: :meth:`EngineDevice.named`) that
    ``records`` make, and how many records were skipped as not such a winner (see the module
    docstring)."""
    if isinstance(device, str):
        device = EngineDevice.named(device)
    chosen: dict[tuple[MoeShape, int], RecordPublic] = {}
    skipped = 0
    for record in records:
        shape_m = _shape_and_m(record, device)
        if shape_m is None:
            skipped += 1
            continue
        held = chosen.get(shape_m)
        if held is None or _rank(record) > _rank(held):
            chosen[shape_m] = record
    tables: dict[MoeShape, dict[int, dict[str, int]]] = {}
    versions: dict[MoeShape, str | None] = {}
    for (shape, m), record in sorted(chosen.items(), key=lambda kv: _rank(kv[1])[1]):
        table = tables.setdefault(shape, {})
        if len(table) >= MAX_ENTRIES:  # a file the engine and tunecache still read
            skipped += 1
            continue
        table[m] = check_entry(record.config, "")
        version = record.key.environment.get("triton")  # the newest record's
        versions[shape] = version if version and VERSION.fullmatch(version) else None
    return {s: MoeFile(t, versions[s]) for s, t in tables.items()}, skipped


def _shape_and_m(record: RecordPublic, device: EngineDevice) -> tuple[MoeShape, int] | None:
    """The file and M ``record`` is an entry of, if it is a served winner for ``device``."""
    key, config, keyed = record.key, record.config, record.key.device
    if (key.kernel != KERNEL or key.backend != "triton" or key.dtype not in DTYPES
            or not device.takes(keyed.kind, keyed.arch, keyed.name) or not record.validation.passed
            or record.status in UNSERVED_STATUSES or set(config) != set(FIELDS)):  # fmt: skip
        return None  # (another platform's fields, kpack…, would fail the engine's CUDA launch)
    e, n, m = key.problem.get("E"), key.problem.get("N"), key.problem.get("M")
    if type(e) is not int or type(n) is not int or type(m) is not int:  # not True, not "16"
        return None
    try:
        if engine_entry_problem(check_entry(config, ""), device) is not None:
            return None  # the limits of the device the file is for, not the record's claim
        shape = MoeShape(e, n, device.name)
        MoeShape.parse(shape.file_name())  # E and N in the file name's range
    except InvalidInput:
        return None
    return (shape, m) if 1 <= m <= MAX_M else None


def _rank(record: RecordPublic) -> tuple[bool, float]:
    """bfloat16 before float16, then the newer (read in UTC: :data:`tunecache.strict.Utc`)."""
    return record.key.dtype == "bfloat16", record.created_at.timestamp()
