"""Whether a served config may be launched at a call: inside the kernel's space, kept by its
``early_config_prune`` for the call, within the device's means (:class:`Admission`, a part of
:class:`~tunecache.triton.autotuner.CachedAutotuner`: the same rules for a served config and
for one another rank decided).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from triton import Config

from tunecache.problem import describe
from tunecache.triton.keys import call_device, misfit
from tunecache.triton.shared import shared_misfit

Admit = Callable[[dict[str, Any]], Config | str]  # a served config's launch, or why never
Fits = Callable[[dict[str, Any]], str | None]  # why a config is never launched, or None
Refuse = Callable[[str, dict[str, Any], str], str]  # (what, config, why) -> why, warned or not


class Admission:
    """The admission of served configs; needs the autotuner's ``arg_names``, ``fn``,
    ``identity``, ``meta``, ``space``, ``_pruning`` and ``_warn_once``."""

    arg_names: list[str]
    fn: Any
    meta: dict[str, type]
    space: Any
    identity: Any
    _pruning: Callable[..., Any]
    _warn_once: Callable[[str, str], None]

    def _fits(self, args: tuple[Any, ...], kwargs: dict[str, Any],
              refuse: Refuse | None = None) -> tuple[Admit, Fits]:  # fmt: skip
        """``admit`` (:meth:`_admission`) and ``fits(config)``: why a config must not be
        launched at this call (outside the kernel's space or the device's means), or ``None``."""
        arguments = {**dict(zip(self.arg_names, args, strict=False)), **kwargs}
        named = {k: v for k, v in arguments.items() if k in self.arg_names}
        device = call_device([v for v in arguments.values() if hasattr(v, "data_ptr")])
        admit = self._admission(args, kwargs, refuse)

        def fits(config: dict[str, Any]) -> str | None:
            why = misfit(config, self.identity, self.meta, device)
            if why is None and isinstance(placed := admit(config), str):
                why = placed
            return why or shared_misfit(self.fn, named, config, device)

        return admit, fits

    def _admission(self, args: tuple[Any, ...], kwargs: dict[str, Any],
                   refuse: Refuse | None = None) -> Admit:  # fmt: skip
        """``admit(config)``: the ``triton.Config`` to launch for a served config at this call,
        or why it is never launched (warned once per kernel): outside the kernel's space, or
        dropped by its ``early_config_prune`` for this call's arguments (run as Triton runs it,
        at most once per candidate set; a prune that raises is a miss, not the user's error)."""
        call = self._pruning(args, kwargs)
        refused = refuse or self._refused

        def admit(config: dict[str, Any]) -> Config | str:
            placed = self.space.place(config)
            if isinstance(placed, str):
                return refused("outside", config, placed)
            if call is not None and (why := call.problem(placed)) is not None:
                return refused("pruned", config, why)
            return placed

        return admit

    def _refused(self, what: str, config: dict[str, Any], why: str) -> str:
        """``why``, warned once per kernel and ``what``: a served config never launched."""
        self._warn_once(what, f"{self.identity.name}: a served config {describe(config, 200)} "
                              f"is {why}: never launched, treated as a miss")  # fmt: skip
        return why
