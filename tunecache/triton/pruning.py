"""Whether the kernel's own ``early_config_prune`` keeps a served config for this call.

``triton.autotune(prune_configs_by={"early_config_prune": prune})`` lets a kernel drop configs
that are wrong or unusable for a call's arguments (``EVEN=True`` where ``BLOCK`` does not divide
``n``): Triton never runs a config it pruned. A served config is held to the same rule: the prune
runs as Triton's ``Autotuner.prune_configs`` runs it (``prune(configs, named_args, **kwargs)``:
the call's positional arguments by name, its keyword arguments as they were passed), over the
listed configs (and a config from a declared space with them), and the served config must be
among the configs it keeps, compared by their values. ``perf_model`` and ``top_k`` only choose
what to benchmark: they are not applied.

It runs when a served answer is fitted, once per tuning key, never on a launch Triton's cache
answers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from triton import Config

from tunecache.errors import one_line
from tunecache.triton.keys import flat_of, identity_of

Prune = Callable[..., Any]


def early_config_prune(autotuner: Any, prune_configs_by: Any) -> Prune | None:
    """The decoration's ``early_config_prune``: Triton's ``Autotuner`` keeps it under that name
    (3.x); taken from the ``prune_configs_by`` given where an ``Autotuner`` does not."""
    if hasattr(autotuner, "early_config_prune"):
        found = autotuner.early_config_prune
    elif isinstance(prune_configs_by, Mapping):
        found = prune_configs_by.get("early_config_prune")
    else:
        found = None
    return found if callable(found) else None


class CallPrune:
    """``prune`` for one call's arguments, run at most once per set of candidates.

    Args:
        prune: the decoration's ``early_config_prune``.
        listed: the kernel's listed configs.
        args: the call's positional arguments, by name.
        kwargs: the call's keyword arguments (Triton's ``grid`` and ``warmup`` among them).
    """

    def __init__(self, prune: Prune, listed: Sequence[Config], args: Mapping[str, Any],
                 kwargs: Mapping[str, Any]) -> None:  # fmt: skip
        self.prune, self.listed = prune, list(listed)
        self.args, self.kwargs = dict(args), dict(kwargs)
        # candidates ("": the listed ones) → the configs kept, in order, or why it cannot tell
        self._kept: dict[str, list[Config] | str] = {}

    def problem(self, chosen: Config) -> str | None:
        """Why ``chosen`` (a listed config, or one built from a declared space) must not be
        launched for this call: the prune drops it, or raised; else ``None``."""
        mine = identity_of(flat_of(chosen))
        extra = None if any(config is chosen for config in self.listed) else chosen
        kept = self._survivors(extra, "" if extra is None else mine)
        if isinstance(kept, str):
            return kept
        if mine in {identity_of(flat_of(config)) for config in kept}:
            return None
        return "pruned for this call by the kernel's early_config_prune"

    def first(self) -> Config:
        """The first config the prune keeps of the listed ones, as Triton would run it: what a
        wrong winner falls back to, and what a winner is compared with when there is no
        reference (the first listed config may be one the prune drops as wrong at this call).
        The first listed where the prune raises or keeps none."""
        kept = self._survivors(None, "")
        return self.listed[0] if isinstance(kept, str) or not kept else kept[0]

    def kept(self) -> list[Config]:
        """The listed configs the prune keeps for this call, in order (all of them where the
        prune raises or keeps none): what a wrong winner's replacement is sought among."""
        kept = self._survivors(None, "")
        return list(self.listed) if isinstance(kept, str) or not kept else list(kept)

    def _survivors(self, extra: Config | None, candidates: str) -> list[Config] | str:
        """The configs the prune keeps from the listed ones (and ``extra``), run once per set of
        candidates, or why it could not tell: a user's function may raise, or return anything."""
        if candidates in self._kept:
            return self._kept[candidates]
        offered = [*self.listed, *([] if extra is None else [extra])]
        try:
            found: list[Config] | str = list(self.prune(offered, dict(self.args), **self.kwargs))
            for config in found:
                identity_of(flat_of(config))  # a config, or it raises: anything may come back
        except Exception as exc:  # never into the user's launch: the served config is a miss
            found = f"not judged by the kernel's early_config_prune, which raised {one_line(exc)}"
        self._kept[candidates] = found
        return found
