"""How long a client leaves a server alone after it failed (or shed) ``times`` calls in a row:
0.1 s, doubled for each before, up to 2^10 times that (102 s), whatever the server asks for less.

>>> backoff(1), backoff(4), backoff(40)
(0.1, 0.8, 102.4)
"""

from __future__ import annotations


def backoff(times: int) -> float:
    """The least pause after ``times`` failures in a row (``times`` ≥ 1)."""
    return 0.1 * 2 ** min(max(times, 1) - 1, 10)
