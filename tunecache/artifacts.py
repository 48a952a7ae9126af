"""Wire schemas of the artifact store: what the integrations share besides tuning records.

Inductor's autotune choices and Triton best configs, and MetaSchedule's workloads and tuning
records, are each a backend's own JSON: tunecache stores them as it gets them, in a namespace per
kind, partitioned by what makes them valid (device and versions, or target and TVM version), under
the backend's own key. Several items may share a key (a workload's tuning records). Each token
keeps its own copy of an item, which only a better ``score`` of its own replaces (lower is
better: milliseconds, seconds); a read serves each item once, from its best copy whose token is
not revoked (a trusted token's first).

Only JSON crosses the wire, never pickles: a server must never be able to run code in a client.
Each namespace has a closed schema (:func:`tunecache.configcheck.artifact_problem`: a MetaSchedule
trace of allowlisted instructions, Inductor's own choice timings and best configs): the server
refuses a value outside it at upload (422 naming the item), and the reader still treats every
value as untrusted (a hostile or broken server): the integrations check each one again before
handing it to their backend.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import Field, field_validator, model_validator

from tunecache.canonical import check_json_size
from tunecache.configcheck import artifact_problem
from tunecache.schemas import MAX_CONFIG_BYTES, MAX_ID, Line, _Strict
from tunecache.strict import UNSIGNED, Utc
from tunecache.vllm_moe import NAMESPACE, imported_name_problem

Namespace = Literal[
    "inductor.choices", "inductor.autotune", "tvm.workload", "tvm.record", "vllm.moe"
]
NAMESPACES: tuple[str, ...] = get_args(Namespace)
MAX_BATCH = 500  # items one request may put
MAX_PAGE = 1000  # items one read may return
# JSON arrays and objects one read of artifacts may hold, all its pages together: a bound on
# the memory and time a hostile answer takes (up to 256 MiB of empty lists would be 87 million
# Python lists); ample for a key's 256 MetaSchedule records or 20,000 of Inductor's groups.
READ_CONTAINERS = 4 * 1024 * 1024
# Values of any kind (an object's member counting 4) one page of artifacts may hold, and one read
# all its pages together: numbers and strings are built as Python objects too (a flat list of 16
# million zeros, 64 MiB, took 10 s and 1.4 GB), so a page's parse takes at most about 1.8 s here
# before the call's deadline is looked at again. A key's 256 MetaSchedule records hold about
# 110,000 on a CPU (430 each); 20,000 of Inductor's choice groups of 200 choices, 16 million.
PAGE_VALUES = 4 * 1024 * 1024
READ_VALUES = 16 * 1024 * 1024
MAX_VALUE_BYTES = MAX_CONFIG_BYTES
ITEM_BYTES = 2 * MAX_VALUE_BYTES + 4096  # one item as served, at most (its value escaped)

Partition = Annotated[Line, Field(min_length=1, max_length=256)]
ArtifactKey = Annotated[Line, Field(min_length=1, max_length=256)]
Item = Annotated[Line, Field(max_length=128)]
Score = Annotated[float, Field(strict=True, ge=0, lt=1e12, allow_inf_nan=False), UNSIGNED]


class ArtifactIn(_Strict):
    """One artifact to store: ``(namespace, partition, key, item)`` names it."""

    namespace: Namespace
    partition: Partition
    key: ArtifactKey
    item: Item = ""
    value: dict[str, Any] | list[Any]
    score: Score | None = None

    @field_validator("value")
    @classmethod
    def _bounded(cls, value: Any) -> Any:
        return check_json_size(value, "value", MAX_VALUE_BYTES)

    @model_validator(mode="after")
    def _closed_value(self) -> ArtifactIn:
        if type(self) is ArtifactIn and (why := artifact_problem(self.namespace, self.value)):
            raise ValueError(f"value is not a {self.namespace} item that may be served: {why}")
        if (
            type(self) is ArtifactIn
            and self.namespace == NAMESPACE
            and (why := imported_name_problem(self.partition, self.key, self.item, self.value))
        ):  # an imported file is stored under its own device and shape, nowhere else
            raise ValueError(why)
        return self


class ArtifactBatch(_Strict):
    """What ``POST /v1/artifacts`` takes: up to :data:`MAX_BATCH` artifacts, stored together."""

    items: Annotated[list[ArtifactIn], Field(min_length=1, max_length=MAX_BATCH)]


class ArtifactPutResult(_Strict):
    """``stored``: items written (new or replaced); ``kept``: items not written, the uploader's
    stored copy scoring better or as well, or holding this very value unscored."""

    stored: int
    kept: int
    # Whether the server's serving policy reads this token's items back at all (they still rank
    # against other tokens' copies): False under the ``verified`` policy for a token not
    # trusted (artifacts have no verifier: stored, never served); None from a server that does
    # not say.
    served: bool | None = None


# How a client says an upload of artifacts is stored but never served (``served`` False).
UNSERVED_NOTE = (
    "this server serves only trusted tokens' artifacts (its verified policy; no verifier checks "
    "artifacts): this token's copies are served to no one"
)


def unserved(result: ArtifactPutResult) -> str:
    """``"; "`` and :data:`UNSERVED_NOTE` where ``result`` says its items are not served, else
    ``""``: what a command's line about an upload ends with."""
    return f"; {UNSERVED_NOTE}" if result.served is False else ""


class ArtifactPublic(ArtifactIn):
    """A stored artifact, as the server returns it."""

    id: Annotated[int, Field(ge=1, le=MAX_ID)]
    updated_at: Utc


class ArtifactList(_Strict):
    """One page of artifacts; ``next_after`` is the ``after`` of the next page, or ``None``."""

    items: Annotated[list[ArtifactPublic], Field(max_length=MAX_PAGE)]
    next_after: int | None = None
