"""API tokens: their scopes, their format, and their wire models.

A token is ``tc_`` followed by 43 URL-safe characters (32 random bytes). The server stores only its
SHA-256 and its first characters (the *prefix*, enough to tell tokens apart in a list); the token
itself is shown once, when it is created. A fast hash is the right one here: a token has 256 bits
of entropy, so unlike a password it cannot be guessed by trying hashes.

Scopes are ordered, each including the ones before it:

- ``read``: look keys up, list and read records, export snapshots, report misses, list jobs,
  dispute a served record (disputes always need a token, even where reads are open);
- ``write``: also upload records, import snapshots, create, claim and finish tuning jobs;
- ``verify``: also claim records to re-check and store the findings (``tunecache daemon
  --verify``): a verifier can mark records verified or rejected;
- ``admin``: also create, list and revoke tokens, and mark tokens trusted (their uploads are
  served as verified at once).

Whether reads need a token at all is a server setting (``TUNECACHE_SERVER_READS``).

Example:
    >>> grants("write", "read"), grants("read", "write")
    (True, False)
    >>> fingerprint("tc_" + "x" * 43)[:12]
    '72e5ecce6e8c'
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from typing import Annotated, Final, Literal, get_args

from pydantic import (
    AfterValidator,
    Field,
    NonNegativeInt,
    StrictBool,
    ValidationInfo,
    field_validator,
)

from tunecache.schemas import _Strict
from tunecache.strict import Utc

Scope = Literal["read", "write", "verify", "admin"]
SCOPES: Final[tuple[Scope, ...]] = get_args(Scope)
TOKEN_PREFIX: Final = "tc_"
SHOWN_CHARS: Final = 8  # of the token, stored in clear to tell tokens apart
MIN_TOKEN_CHARS: Final = 32  # a token given to the server (bootstrap) must be at least this long


def grants(held: Scope, needed: Scope) -> bool:
    """Whether a token with scope ``held`` may do what needs ``needed``."""
    return SCOPES.index(held) >= SCOPES.index(needed)


def new_token() -> str:
    """A fresh random token."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def fingerprint(token: str) -> str:
    """The SHA-256 of a token, in hex: what the server stores and looks tokens up by."""
    return hashlib.sha256(token.encode()).hexdigest()


def shown_part(token: str) -> str:
    """The start of a token, kept in clear so a list can show which token is which."""
    return token[:SHOWN_CHARS]


# A token's name as servers have stored, served and exported it (snapshots state it as their
# uploader's and verifier's): no comma, no control or invisible character. It is read as it is,
# so what an older server accepted stays readable; a NEW name is a NewTokenName.
MAX_LISTED_TOKENS = 100_000  # tokens one listing holds at most (the first, by id)
NAME_CHARACTERS = r"[\w.@:/ -]+"
TokenName = Annotated[str, Field(min_length=1, max_length=128, pattern=f"^{NAME_CHARACTERS}$")]
# A new token's name: ASCII letters, digits and _.@:/- in words one space apart (no leading,
# trailing or doubled space). The name is who the dashboard and records say uploaded or
# verified something, and Unicode's \w let "оps" (a Cyrillic о), "ⅰ" or "ops " pass for another.
NEW_NAME = r"^[A-Za-z0-9_.@:/-]+( [A-Za-z0-9_.@:/-]+)*$"
_NAME_RULE = "a new token's name is ASCII letters, digits and _.@:/- in words one space apart"


TRUSTED_UPLOADER = " (trusted uploader)"  # a trusted token's name, as the verifier it is


def name_text(name: str) -> str:
    """A token's name as shown (records' uploaders and verifiers, the dashboard, the CLI): as it
    is where a new token may be named so, else quoted in ASCII as JSON writes it: a snapshot's
    stated uploader ``"\\u0430dmin1"`` (a Cyrillic а) or ``"ops  w1"`` read as a token of this
    team's, and a verifier's name as a teammate's. A trusted uploader's keeps its suffix.

    >>> name_text("ci-sync"), name_text("\u0430dmin"), name_text("ci (trusted uploader)")
    ('ci-sync', '"\\\\u0430dmin"', 'ci (trusted uploader)')
    """
    base = name.removesuffix(TRUSTED_UPLOADER)
    shown = base if re.fullmatch(NEW_NAME, base) else json.dumps(base)
    return shown if base == name else shown + TRUSTED_UPLOADER


def _new_name(value: str) -> str:
    if re.fullmatch(NEW_NAME, value) is None:
        odd = next((c for c in value if not (c.isascii() and (c.isalnum() or c in "_.@:/- "))),
                   None)  # fmt: skip
        why = "has a leading, trailing or doubled space"
        if odd is not None:
            why = f"holds {odd!r} (U+{ord(odd):04X})"
        raise ValueError(f"{why}: {_NAME_RULE}")
    return value


NewTokenName = Annotated[str, Field(min_length=1, max_length=128,
                                    json_schema_extra={"pattern": NEW_NAME}),
                         AfterValidator(_new_name)]  # fmt: skip


class TokenCreate(_Strict):
    """A request for a new token; ``trusted``: its uploads are served as verified at once.

    ``name``: a :data:`NewTokenName`, which no live token goes by (the server checks that).
    """

    name: NewTokenName
    scope: Scope
    trusted: StrictBool = False

    @field_validator("trusted")
    @classmethod
    def _trusted_uploads(cls, trusted: bool, info: ValidationInfo) -> bool:
        scope = info.data.get("scope")  # absent where it failed its own check
        if trusted and scope is not None and not grants(scope, "write"):  # was taken, said so
            raise ValueError("a read token uploads nothing to trust; give it the write scope "
                             "(or more), or leave trusted out")  # fmt: skip
        return trusted


class TokenPublic(_Strict):
    """A token as the server lists it: never the token itself."""

    id: int
    name: str
    scope: Scope
    prefix: str
    created_at: Utc
    last_used_at: Utc | None = None
    revoked_at: Utc | None = None
    trusted: bool = False
    # The bytes of records, artifacts and jobs it has stored (cache_server.quota); None: a
    # server that counts none (before 0022).
    stored_bytes: NonNegativeInt | None = None


class TokenRevoked(TokenPublic):
    """A token just revoked, with the records standing on its word (its uploads and imports no
    verifier of the server passed, and a verify token's passes and rejections:
    :mod:`cache_server.withdrawal`): ``withdrawn`` by this revocation (disputed: out of service
    until another verifier checks each) and ``standing``, those still standing (revoked without
    withdrawing them). ``None``: a server that knows no withdrawal (it ignored ``withdraw``)."""

    # None: a server that knows no withdrawal (before 0019), which ignored ``withdraw``.
    withdrawn: NonNegativeInt | None = None
    standing: NonNegativeInt | None = None
    # The artifacts it stored (Inductor's choices, MetaSchedule's records...), served no more
    # where no live token holds a copy; None: a server that does not say.
    artifacts: NonNegativeInt | None = None


class WhoAmI(_Strict):
    """Who the server takes the caller for: the token (``None`` without one) and its scope, and
    whether the server lets reads through without a token (``reads``: ``open`` or ``token``)."""

    token: TokenPublic | None
    scope: Scope | None
    reads: Literal["open", "token"]


class TokenCreated(_Strict):
    """A new token: ``token`` is its only appearance in clear (as :func:`new_token` makes it:
    a server's answer holding anything else, a terminal's controls, is refused, not printed)."""

    token: Annotated[str, Field(pattern=r"^tc_[A-Za-z0-9_-]{43}$")]
    info: TokenPublic


class TokenList(_Strict):
    items: Annotated[list[TokenPublic], Field(max_length=MAX_LISTED_TOKENS)]


def byte_size(size: int) -> str:
    """``size`` bytes for a person: exact below a KiB, else to three significant figures.

    Example:
        >>> byte_size(512), byte_size(14_994_023), byte_size(4 * 2**30)
        ('512 B', '14.3 MiB', '4.00 GiB')
    """
    if size < 1024:
        return f"{size} B"
    value, exponent = float(size), 0
    while value >= 999.5 and exponent < len(_UNITS):  # 1,000 KiB is shown as 0.977 MiB
        value, exponent = value / 1024, exponent + 1
    return f"{value:#.3g} {_UNITS[exponent - 1]}".replace(". ", " ")


_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
