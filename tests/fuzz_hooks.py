"""schemathesis hooks for ``tests/test_contract_fuzz.py`` (loaded through ``SCHEMATHESIS_HOOKS``).

One rule of the API has no plain JSON Schema: a problem holds at least one integer size
(:func:`tunecache.key.check_problem`); saying "some value is an integer" needs ``not``, which
schemathesis's coverage phase mishandles. So generated bodies whose problem has none are dropped:
a filter only removes cases, it never turns an invalid body into a valid one.
"""

from __future__ import annotations

from typing import Any

import schemathesis


def _no_size(problem: Any) -> bool:
    """Whether ``problem`` is a non-empty object with no integer size in it."""
    return isinstance(problem, dict) and bool(problem) and not any(
        type(v) is int or (type(v) is float and v.is_integer()) for v in problem.values()
    )  # fmt: skip


@schemathesis.hook
def filter_body(context: Any, body: Any) -> bool:
    """Keeps a body unless a problem in it (the key's, a dispute's, its check's) has no size."""
    if not isinstance(body, dict):
        return True
    key, check = body.get("key"), body.get("check")
    problems = [body.get("problem")]
    problems += [key.get("problem")] if isinstance(key, dict) else []
    problems += [check.get("problem")] if isinstance(check, dict) else []
    return not any(_no_size(problem) for problem in problems)
