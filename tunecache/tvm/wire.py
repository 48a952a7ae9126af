"""What a MetaSchedule database puts on the wire: partitions, keys and artifacts.

MetaSchedule looks records up by workload alone (it ignores the target) and keys workloads by a
structural hash that only one TVM build reproduces, so the server's copy is laid out differently:

- **partition**: ``<sha256(target)[:16]>-tvm<version>``, the same string as
  :func:`tunecache.tvm.target.partition_name`, which the tuner's own database uses too:
  records tuned for one CPU or one TVM release never answer for another;
- **key**: ``sha256(mod.script())``, the TVMScript text of the normalised one-function module
  that ``tune_tir`` tunes and ``compile_tir`` looks up;
- namespace ``tvm.workload``: one item per key, ``{"script_sha": key, "mod": <tvm.ir.save_json>}``,
  for people and tools to see what a key is. Clients never load it: ``tvm.ir.load_json``
  segfaults on malformed JSON, and nothing from a server may be able to crash a client;
- namespace ``tvm.record``: one item per distinct (trace, argument info) of a key, the value
  ``TuningRecord.as_json()`` as it is (plain JSON), the score its mean run time in seconds.
  Records that failed to build or run are not uploaded.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from tunecache.artifacts import MAX_VALUE_BYTES, ArtifactIn
from tunecache.canonical import canonical_json, digest
from tunecache.configcheck.tvm import mean_seconds, record_value_problem
from tunecache.errors import InvalidInput
from tunecache.tvm.jsonutil import plain_json
from tunecache.tvm.target import partition_name

if TYPE_CHECKING:
    from tvm.ir import IRModule
    from tvm.s_tir.meta_schedule.database import TuningRecord
    from tvm.target import Target

logger = logging.getLogger(__name__)
WORKLOAD: Final = "tvm.workload"
RECORD: Final = "tvm.record"


def partition_for(target: Target | Mapping[str, Any] | str) -> str:
    """The partition of ``target`` (a ``Target``, a target dict or string) and this TVM.

    Example:
        >>> partition_for({"kind": "llvm", "num-cores": 2})  # doctest: +SKIP
        '5b0c…-tvm0.27.0.post1'
    """
    return partition_name(target_json(target))


def target_json(target: Target | Mapping[str, Any] | str) -> dict[str, Any]:
    """``target`` (a ``Target``, a target dict or string) as a plain target dict."""
    from tvm.target import Target

    if isinstance(target, Mapping):
        return dict(target)
    if not isinstance(target, Target):
        target = Target(target)
    exported: dict[str, Any] = plain_json(target.export())
    return exported


def workload_key(mod: IRModule) -> str:
    """``sha256(mod.script())``: the same text, hence key, in every process and on every host."""
    return hashlib.sha256(mod.script().encode()).hexdigest()


def record_item(value: Sequence[Any]) -> str:
    """The item name of a record's JSON: a digest of its trace and argument info (not its time).

    Raises:
        InvalidInput: ``value`` is not a ``[trace, run_secs, target, args_info]`` list of data.
    """
    if not isinstance(value, list) or len(value) != 4:
        raise InvalidInput("a tuning record is [trace, run_secs, target, args_info]")
    return digest([value[0], value[3]])


def record_artifact(partition: str, key: str, record: TuningRecord) -> ArtifactIn | None:
    """The ``tvm.record`` artifact of ``record``, or ``None`` for a failed or oversized one, or
    one outside the closed schema (its trace uses an instruction the allowlist does not have:
    no consumer could use it, so it is kept local)."""
    value = record.as_json()
    seconds = mean_seconds(value[1])
    if seconds is None or _too_big(value):
        return None
    if (why := record_value_problem(value)) is not None:
        logger.info("a MetaSchedule record is kept local, not shared: %s", why)
        return None
    return ArtifactIn(
        namespace=RECORD,
        partition=partition,
        key=key,
        item=record_item(value),
        value=value,
        score=seconds,
    )


def workload_artifact(partition: str, key: str, mod: IRModule) -> ArtifactIn | None:
    """The ``tvm.workload`` artifact of ``mod``, or ``None`` when its JSON is over the limit.

    Records need no workload artifact to be found (lookups go by key); it says what a key is.
    """
    import tvm

    value = {"script_sha": key, "mod": json.loads(tvm.ir.save_json(mod))}
    if _too_big(value):
        return None
    return ArtifactIn(namespace=WORKLOAD, partition=partition, key=key, value=value)


def _too_big(value: Any) -> bool:
    try:
        return len(canonical_json(value).encode()) > MAX_VALUE_BYTES
    except InvalidInput:
        return True
