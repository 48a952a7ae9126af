"""A config's launch as Triton's ``Autotuner.run`` makes the first one at a new tuning key.

Triton's ``run`` benchmarks a new key, then calls the autotuner's ``pre_hook(nargs,
reset_only=True)`` (``reset_to_zero``: an output a split-K kernel adds into starts at zero; a
user's own ``pre_hook`` told it is the reset) before the chosen config's ``pre_hook`` and its
launch (Triton 3.6 and 3.9 alike). A key the drop-in decides without Triton's benchmark (served,
the default, another rank's choice, the server down) must get the same reset, or its first
result differs from Triton's; and a check's launch on fresh copies must be that same launch, or
it judges a config by a run the caller never gets.

Not ``_bench``'s launch: its ``restore_value`` copy and ``post_hook`` exist so that repeated
timing runs see the same inputs; applied to a check they would undo an output before it is
compared (a reference that writes it in place would then disagree with every config).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from triton import Config


def full_arguments(arg_names: Sequence[str], config: Config | None, args: Sequence[Any],
                   kwargs: Mapping[str, Any]) -> dict[str, Any]:  # fmt: skip
    """Triton's ``full_nargs``: the call's arguments by name, then ``config``'s meta-parameters
    and launch options."""
    named = {**dict(zip(arg_names, args, strict=False)), **kwargs}
    return named if config is None else {**named, **config.all_kwargs()}


def reset(tuner: Any, config: Config, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """The reset Triton applies before the first launch at a key it benchmarked."""
    tuner.pre_hook(full_arguments(tuner.arg_names, config, args, kwargs), reset_only=True)


def reset_for_reference(tuner: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """``reset_to_zero`` before a user's ``reference=`` runs: an output the kernel adds into
    starts at zero for the reference too (a reference that overwrites it is unaffected). A
    user's own ``pre_hook`` is not called: it may need a config's meta-parameters."""
    named = full_arguments(tuner.arg_names, None, args, kwargs)
    for name in getattr(tuner, "reset_to_zero", ()):
        if named.get(name) is not None:
            named[name].zero_()


def launch(tuner: Any, config: Config, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    """``config`` launched as Triton launches it first at a new key: the reset, the config's own
    ``pre_hook``, then the kernel."""
    reset(tuner, config, args, kwargs)
    if config.pre_hook is not None:
        config.pre_hook(full_arguments(tuner.arg_names, config, args, kwargs))
    return tuner.fn.run(*args, **kwargs, **config.all_kwargs())
