"""The API calls about artifacts: the integrations' own JSON (:mod:`tunecache.inductor`,
:mod:`tunecache.tvm`), stored in batches and read a page at a time.

A part of :class:`tunecache.client.Client` (which it is mixed into): each call goes through the
client's ``_call`` (one deadline per call; a :class:`~tunecache.errors.ServerError` on failure).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx

from tunecache.artifacts import (
    ITEM_BYTES,
    MAX_BATCH,
    MAX_PAGE,
    PAGE_VALUES,
    READ_CONTAINERS,
    READ_VALUES,
    ArtifactBatch,
    ArtifactIn,
    ArtifactList,
    ArtifactPublic,
    ArtifactPutResult,
    Namespace,
)
from tunecache.http import MAX_ANSWER_BYTES, Timeout, answer_limit, deadline, parse
from tunecache.jsonsafe import counts


class ArtifactCalls:
    """Artifact calls (mixed into :class:`tunecache.client.Client`)."""

    timeout: Timeout

    def _call(
        self, method: str, path: str, timeout: float | None = None, *, read: bool = False,
        again: bool = False, small: bool = False, **kwargs: Any,
    ) -> httpx.Response:  # fmt: skip
        raise NotImplementedError  # the client's

    def put_artifacts(self, items: Sequence[ArtifactIn]) -> ArtifactPutResult:
        """Stores ``items`` (in batches of :data:`~tunecache.artifacts.MAX_BATCH`).

        Raises:
            ServerError: the server is unreachable or rejected a batch; earlier batches stay.
        """
        stored = kept = 0
        served: set[bool | None] = set()
        for start in range(0, len(items), MAX_BATCH):
            batch = ArtifactBatch(items=list(items[start : start + MAX_BATCH]))
            body = batch.model_dump(mode="json")
            response = self._call("POST", "/v1/artifacts", small=True, json=body)
            result = parse(ArtifactPutResult, response, "/v1/artifacts")
            stored, kept = stored + result.stored, kept + result.kept
            served.add(result.served)
        # not served where a batch said so; served where every batch did; else not said
        said = False if False in served else (True if served == {True} else None)
        return ArtifactPutResult(stored=stored, kept=kept, served=said)

    def get_artifacts(
        self,
        namespace: Namespace,
        partition: str,
        *,
        key: str | None = None,
        limit: int | None = None,
        timeout: float | None = None,
    ) -> list[ArtifactPublic]:
        """The items of a partition (every page), or of one key in it (best score first); an
        item the server sent of another namespace, partition or key is left out.

        Args:
            limit: at most this many items; a key's items come in one page of up to
                :data:`~tunecache.artifacts.MAX_PAGE`.
            timeout: seconds the whole read may take, every page (default: the write timeout).

        Raises:
            ServerError: the server is unreachable, refused, or gave a bad answer.
        """
        wanted = MAX_PAGE if key is not None and limit is None else limit
        most = MAX_ANSWER_BYTES  # a key's one page holds no more than its items can
        if key is not None and wanted is not None:  # (a key's 256 TVM records: 129 MiB)
            most = min(most, wanted * ITEM_BYTES)
        with deadline(timeout or self.timeout.write), answer_limit(most):
            return self._artifact_pages(namespace, partition, key, wanted, timeout)

    def _artifact_pages(
        self, namespace: Namespace, partition: str, key: str | None, wanted: int | None,
        timeout: float | None,
    ) -> list[ArtifactPublic]:  # fmt: skip
        items: list[ArtifactPublic] = []
        after: int | None = None
        left = READ_CONTAINERS  # arrays and objects left to this read's pages
        values = READ_VALUES  # and values of any kind
        while wanted is None or len(items) < wanted:
            page_size = MAX_PAGE if wanted is None else min(MAX_PAGE, wanted - len(items))
            params: dict[str, Any] = {"namespace": namespace, "partition": partition,
                                      "limit": page_size}  # fmt: skip
            params.update({"key": key} if key is not None else {})
            params.update({"after": after} if after is not None else {})
            response = self._call("GET", "/v1/artifacts", timeout, read=True, again=True,
                                  params=params)  # fmt: skip
            held, count = counted = counts(response.content)
            page = parse(ArtifactList, response, "/v1/artifacts", max_containers=left,
                         max_values=min(values, PAGE_VALUES), counted=counted)  # fmt: skip
            left, values = left - held, values - count
            items.extend(item for item in page.items if item.namespace == namespace
                         and item.partition == partition and key in (None, item.key))  # fmt: skip
            if page.next_after is None or key is not None:
                break
            after = page.next_after
        return items
