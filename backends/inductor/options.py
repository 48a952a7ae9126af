"""The Inductor settings a tunecache config stands for, applied as scoped config patches.

Nothing here changes global state: :func:`compile_scope` patches ``torch._inductor.config`` (and
``torch._functorch.config``) for the duration of one compile and restores them afterwards. Every
field is looked up before it is patched, so a field a torch version lacks is skipped, not an error
(torch 2.11 on the GPU machines, 2.13 here).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

# The schema's vocabulary (modes, GEMM backends) lives with the schema the server checks.
from tunecache.configcheck.inductor import GEMM_BACKENDS, MODE_MAX_AUTOTUNE
from tunecache.configcheck.inductor import MODE_DEFAULT as MODE_DEFAULT

# Caches that could hand back an earlier compile (or earlier benchmark timings) instead of
# benchmarking again: off during a search and during max-autotune builds. The C++ code cache
# (compiled kernels keyed by their source hash) stays on: it cannot change what is chosen.
INDUCTOR_CACHES_OFF: tuple[str, ...] = (
    "fx_graph_cache",
    "fx_graph_remote_cache",
    "autotune_local_cache",
    "autotune_remote_cache",
    "bundled_autotune_remote_cache",
)
FUNCTORCH_CACHES_OFF: tuple[str, ...] = ("enable_autograd_cache", "enable_remote_autograd_cache")


def inductor_patches(config: Mapping[str, Any]) -> dict[str, Any]:
    """The ``torch._inductor.config`` fields a config sets while it compiles.

    Args:
        config: ``{"mode": "default"}`` or a max-autotune config from a search.

    Returns:
        Field name → value, limited to fields this torch version has.
    """
    from torch._inductor import config as inductor_config

    wanted: dict[str, Any] = {
        # One compile thread: no subprocess pool warming up (importing torch) on the same cores
        # while candidates are benchmarked. It changes how kernels are compiled, not which.
        "compile_threads": 1,
        # Inductor's own stderr table of choices; the choices are logged here instead.
        "autotune_num_choices_displayed": 0,
        "max_autotune_report_choices_stats": False,
    }
    if config.get("mode") == MODE_MAX_AUTOTUNE:
        wanted["freezing"] = bool(config.get("freezing", True))
        # The frozen parameters share the caller's input storage: never let Inductor free them.
        wanted["freezing_discard_parameters"] = False
        wanted.update(dict.fromkeys(INDUCTOR_CACHES_OFF, False))
        backend = config.get("backend")
        if isinstance(backend, str) and backend in GEMM_BACKENDS:
            # Pin the GEMM to the winner's backend: a rebuild (new weights, the edge problem)
            # then compiles the chosen kernel without benchmarking again.
            wanted["max_autotune_gemm_backends"] = backend
    return {name: value for name, value in wanted.items() if hasattr(inductor_config, name)}


def functorch_patches(config: Mapping[str, Any]) -> dict[str, Any]:
    """The ``torch._functorch.config`` fields a config sets (the AOTAutograd cache, off)."""
    from torch._functorch import config as functorch_config

    if config.get("mode") != MODE_MAX_AUTOTUNE:
        return {}
    return {name: False for name in FUNCTORCH_CACHES_OFF if hasattr(functorch_config, name)}


@contextlib.contextmanager
def compile_scope(config: Mapping[str, Any]) -> Iterator[None]:
    """Applies ``config``'s Inductor settings while the body runs (dynamo traces and compiles)."""
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config

    with (
        inductor_config.patch(inductor_patches(config)),
        functorch_config.patch(functorch_patches(config)),
        warnings.catch_warnings(),
    ):
        # select_algorithm sizes CPU benchmark outputs through the deprecated TypedStorage API.
        warnings.filterwarnings("ignore", message="TypedStorage is deprecated")
        yield
