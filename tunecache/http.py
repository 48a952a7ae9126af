"""The HTTP pieces every API call shares: timeouts, the server's error answers, parsing answers.

Example:
    >>> Timeout(lookup=0.5).for_lookup()
    Timeout(timeout=0.5)
    >>> Timeout(lookup=0.5).for_write()
    Timeout(connect=5.0, read=60.0, write=60.0, pool=60.0)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from tunecache.errors import ServerError

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Timeout:
    """Seconds a lookup may spend connecting and reading; writes get ``write`` seconds in all."""

    lookup: float = 0.5
    connect: float | None = None  # defaults to ``lookup``
    write: float = 60.0

    def for_lookup(self) -> httpx.Timeout:
        return httpx.Timeout(self.lookup, connect=self.connect or self.lookup)

    def for_write(self) -> httpx.Timeout:
        return httpx.Timeout(self.write, connect=self.connect or min(self.write, 5.0))


def rejected(method: str, path: str, response: httpx.Response) -> ServerError:
    """The server's error answer as a :class:`ServerError` carrying its status and reason."""
    try:
        detail = response.json().get("detail", response.text)
    except (ValueError, AttributeError):
        detail = response.text
    return ServerError(
        f"{method} {path} → {response.status_code}: {detail}", status_code=response.status_code
    )


def parse(model: type[M], response: httpx.Response, path: str) -> M:
    """The answer of ``path`` as ``model``.

    Raises:
        ServerError: the answer is not a valid ``model`` (a broken or hostile server).
    """
    try:
        return model.model_validate_json(response.content)
    except ValidationError as exc:
        raise ServerError(f"{path} gave a bad answer: {exc}") from exc
