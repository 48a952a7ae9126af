"""What a search's trial times are, beside a record's own time: one sentence, the same in
``records show``, on the dashboard's record page and in ``tune``'s last line.

A search's timings are quick ones (a config timed fast in it may be slower timed again, or fail
its check), and Inductor's are its own benchmark of each choice while compiling: on a CPU,
16 ms for a GEMM whose compiled model runs in 0.04 ms. Beside the record's time, re-timed end to
end and validated, either read as a time the kernel runs at.

Example:
    >>> note("inductor_max_autotune", "inductor", [16.0, 16.2], 0.04, "{:.3g}".format)[:62]
    "the search's timings are Inductor's own, of each choice while "
    >>> note("bayes", "tvm", [1.0, 1.2], 1.0, "{:.3g}".format) is None
    True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

# Strategies whose trials are timed by a compiler's own benchmark of each choice, not the run's,
# with the backend they search (a record of another backend naming one is its uploader's claim).
COMPILER_TIMED: Final = {"inductor_max_autotune": "inductor"}
QUICK_BELOW: Final = 0.9  # a search's fastest this far below the record's is said to be quick
COMPILER_ABOVE: Final = 1.25  # a compiler's timing this far above the record's is no run time


def note(
    strategy: str, backend: str, times: Sequence[float | None], own_ms: float,
    ms: Callable[[float], str], *, default_last: bool = False,
) -> str | None:  # fmt: skip
    """One sentence on the trial ``times`` of a ``strategy`` search on ``backend`` beside the
    record's ``own_ms`` (written with ``ms``), or ``None`` when they read as what they are.
    ``default_last``: the last of ``times`` is the default config's, timed end to end beside
    the winner, no search's (:func:`tunecache.trialcount.default_last`): left out."""
    searched = times[:-1] if default_last else times
    fastest = min((t for t in searched if t is not None), default=None)
    if fastest is None or not own_ms > 0:
        return None
    if COMPILER_TIMED.get(strategy) == backend and fastest > COMPILER_ABOVE * own_ms:
        ratio = fastest / own_ms
        above = f"{ratio:.2f}x" if ratio < 10 else f"{ratio:,.0f}x"
        return (f"the search's timings are Inductor's own, of each choice while compiling (the "
                f"fastest, {ms(fastest)} ms, is {above} the record's {ms(own_ms)} ms): they rank "
                "the choices only, and are no time the kernel runs at; the record's is its "
                "winner's, timed end to end and validated")  # fmt: skip
    if fastest < QUICK_BELOW * own_ms:
        return (f"the search's fastest timing, {ms(fastest)} ms, is below the record's "
                f"{ms(own_ms)} ms: a search's timings are quick ones, and the record's is its "
                "winner's, timed again and validated (a config timed fast in the search may be "
                "slower timed again, or fail its check)")  # fmt: skip
    return None
