"""Configs as rows of choice indices: the array form the model-based strategies search over."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tunecache.space import Config, Scalar, SearchSpace


def is_ordered(choices: Sequence[Scalar]) -> bool:
    """Whether every choice is a number (not a bool): its choices then have an order (a local
    search steps between neighbours, a model places them on a scale)."""
    return all(isinstance(c, int | float) and not isinstance(c, bool) for c in choices)


def choice_indices(space: SearchSpace, configs: Sequence[Config]) -> np.ndarray:
    """``result[i, j]``: the index of ``configs[i]``'s value among parameter ``j``'s choices
    (parameters in ``space.params``' order). Every config must set every parameter to one of
    its choices (the space's own configs do).

    A config's items are sorted by name, so each row is read in one pass over them rather than
    a lookup per parameter (20,736 configs of seven parameters: 0.05 s, was 0.15 s).

    Example:
        >>> space = SearchSpace({"b": (1, 2), "a": ("x", "y", "z")})
        >>> choice_indices(space, [Config.of({"a": "z", "b": 2})]).tolist()
        [[1, 2]]
    """
    names = list(space.params)
    by_name = sorted(names)
    lookup = [{value: i for i, value in enumerate(space.params[name])} for name in by_name]
    rows = [[lookup[j][value] for j, (_, value) in enumerate(config.pairs)] for config in configs]
    sorted_index = np.asarray(rows, dtype=np.int64).reshape(len(configs), len(names))
    return sorted_index[:, [by_name.index(name) for name in names]]
