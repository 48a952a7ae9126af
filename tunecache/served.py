"""What a client checks before it uses a served record: the server is not trusted.

A server (or whatever sits between it and the client) may answer anything. A record is used only
when all of these hold, whichever source it came from (the server, a snapshot file):

- it passed its uploader's validation (``validation.passed``, its errors within its tolerances:
  :meth:`~tunecache.schemas.ValidationReport.contradiction`) and is not ``disputed`` or
  ``rejected`` (:data:`tunecache.schemas.RecordStatus`);
- its key may serve the key asked for under the lookup rules (:func:`tunecache.rules.match`):
  the same kernel, source, backend and dtype, the same device arch, versions the policy admits,
  and the problem itself or one of its bucket; when the server names the rule that matched, the
  rules must agree;
- its config passes its backend's closed schema (:func:`tunecache.configcheck.config_problem`),
  including a built-in kernel's enumerated space.

What fits the device (shared memory, warps) is the integration's own ``fits`` check, after these.
"""

from __future__ import annotations

from typing import Any

from tunecache.configcheck import config_problem
from tunecache.key import Key
from tunecache.policies import VersionPolicy
from tunecache.rules import Rule, match
from tunecache.schemas import RecordCreate
from tunecache.strict import shown

UNSERVED_STATUSES = ("disputed", "rejected")


def served_problem(
    key: Key, record: RecordCreate, rule: Rule | None, policy: VersionPolicy
) -> str | None:
    """Why ``record`` must not be used for ``key`` (served by ``rule`` under ``policy``), or
    ``None`` when it may; one line, its served text escaped (:func:`tunecache.strict.shown`):
    a device's name holding a terminal's controls would forge the log line it is put in."""
    why = _problem(key, record, rule, policy)
    return None if why is None else shown(why)


def checked_answer(key: Key, answer: Any, policy: VersionPolicy) -> tuple[Any, str | None]:
    """A server's lookup answer (a :class:`~tunecache.schemas.LookupResponse`, ``None`` on a
    miss) as a process would take it: ``(answer, None)`` when its record may serve ``key``,
    ``(None, why)`` when it must not (a hit a process refuses is no hit for any command either),
    ``(None, None)`` on a miss."""
    if answer is None:
        return None, None
    why = served_problem(key, answer.record, answer.match, policy)
    return (answer, None) if why is None else (None, f"record #{answer.record.id} refused: {why}")


def _problem(
    key: Key, record: RecordCreate, rule: Rule | None, policy: VersionPolicy
) -> str | None:
    if not record.validation.passed:
        return "it did not pass validation"
    if why := record.validation.contradiction():  # uploaded before the server checked it
        return f"its figures say it failed: {why}"
    status = getattr(record, "status", None)
    if status in UNSERVED_STATUSES:
        return f"it is {status}"
    tuned = record.key
    matched = match(key.to_json(), tuned.model_dump(mode="json", by_alias=True), policy)
    if matched is None:
        return (
            f"its key ({tuned.kernel} {tuned.backend} {tuned.dtype} {dict(tuned.problem)} on "
            f"{tuned.device.arch} {tuned.device.name}) may not serve {key.short()} under the "
            f"lookup rules and the {policy} version policy"
        )
    if rule is not None and matched != rule:
        return f"the server says it matched by rule {rule!r}; the rules say {matched!r}"
    why = config_problem(key.backend, record.config, kernel=key.kernel, device=key.device.kind)
    return None if why is None else f"its config is not a {key.backend} config: {why}"
