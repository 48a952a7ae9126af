"""A declared ``space=`` widens only the parameters it names (``docs/integrations.md``).

The parameters it does not name keep their values as the listed configs pair them: a served
config's values of all of them must be one listed config's. Checked one parameter at a time,
:func:`rowsum`'s listed ``SPLIT=1, ATOMIC=False`` and ``SPLIT=4, ATOMIC=True`` let a served
``SPLIT=4, ATOMIC=False`` launch (each value is a listed one): four programs each stored their
part of a row's sum over the others', a wrong result and no warning. Every path that admits a
config from outside (the server, a snapshot file, another rank's choice, ``verify="first"``)
asks :meth:`~tunecache.triton.keys.KernelSpace.place`.

The kernel runs under Triton's interpreter in a fresh process (``TRITON_INTERPRET=1``), where
this module is imported for it and :func:`main` runs the calls against a hostile server at the
client's transport.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
ROWS, N = 8, 256
# SPLIT > 1 is right only with ATOMIC (the parts add into a zeroed output).
LISTED = [{"BLOCK": 32, "SPLIT": 1, "ATOMIC": False}, {"BLOCK": 32, "SPLIT": 4, "ATOMIC": True}]
SPACE = {"num_warps": (1, 2, 4)}
MIXED = {"BLOCK": 32, "SPLIT": 4, "ATOMIC": False, "num_warps": 2, "num_stages": 3}  # wrong
HONEST = {**MIXED, "ATOMIC": True}  # a listed config at num_warps=2: inside, and right
SCRIPT = """
import json, logging, sys
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
import tests.test_triton_declared_space as m
print(json.dumps(m.main(json.loads(sys.argv[1]))))
"""


@triton.jit
def rowsum(x_ptr, y_ptr, n, BLOCK: tl.constexpr, SPLIT: tl.constexpr, ATOMIC: tl.constexpr):
    row = tl.program_id(0)
    part = tl.program_id(1)
    chunk = tl.cdiv(n, SPLIT)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, chunk, BLOCK):
        offsets = part * chunk + start + tl.arange(0, BLOCK)
        mask = (offsets < n) & (start + tl.arange(0, BLOCK) < chunk)
        acc += tl.load(x_ptr + row * n + offsets, mask=mask, other=0.0)
    total = tl.sum(acc, axis=0)
    if ATOMIC:
        tl.atomic_add(y_ptr + row, total)
    else:
        tl.store(y_ptr + row, total)


def listed_configs() -> list[Any]:
    return [triton.Config(dict(values), num_warps=1) for values in LISTED]


def main(answers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each served config in ``answers``: a fresh drop-in of :func:`rowsum` (``space=``
    :data:`SPACE`, the first listed config on a miss) served it at ``N``; whether its row sums
    are right, the config it launched, and whether the served config's own are (launched
    without the drop-in)."""
    import torch

    import tunecache.triton
    import tunecache.triton.autotuner as autotuner
    from tests.user_triton_served import hostile_client
    from tunecache.triton.record import config_json

    results = []
    for served in answers:
        client = hostile_client(rowsum, {N: served})
        autotuner.shared_client = lambda *a, c=client: c  # type: ignore[assignment]
        kernel = tunecache.triton.autotune(configs=listed_configs(), key=["n"],
                                           on_miss="default", space=SPACE)(rowsum)  # fmt: skip
        x = torch.randn(ROWS, N, generator=torch.Generator().manual_seed(0))
        y, alone = torch.zeros(ROWS), torch.zeros(ROWS)
        kernel[lambda meta: (ROWS, meta["SPLIT"])](x, y, N)
        meta = {k: v for k, v in served.items() if k not in ("num_warps", "num_stages")}
        rowsum[(ROWS, served["SPLIT"])](x, alone, N, **meta)  # the served config itself
        results.append({"correct": bool(torch.allclose(y, x.sum(dim=1), atol=1e-3)),
                        "launched": config_json(kernel.best_config),
                        "alone": bool(torch.allclose(alone, x.sum(dim=1), atol=1e-3))})  # fmt: skip
    return results


def scenario(answers: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """:func:`main` on ``answers`` in a fresh process under Triton's interpreter."""
    done = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(answers)],
                          capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**os.environ, "TRITON_INTERPRET": "1"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return json.loads(done.stdout.splitlines()[-1]), done.stderr


def test_a_served_config_mixing_two_listed_configs_is_refused_and_the_fallback_is_right() -> None:
    """The mixed config is refused with one warning naming its parameters and what the listed
    configs hold; the first listed config runs instead, and its sums are right. The same config
    with ``ATOMIC=True`` (a listed config at another ``num_warps``) is inside: it launches."""
    results, stderr = scenario([MIXED, HONEST])
    first = {**LISTED[0], "num_warps": 1, "num_stages": 3}
    assert results[0] == {"correct": True, "launched": first, "alone": False}, results
    assert results[1] == {"correct": True, "launched": HONEST, "alone": True}, results
    warnings = [line for line in stderr.splitlines() if "never launched" in line]
    assert len(warnings) == 1, stderr
    assert "{'ATOMIC': False, 'SPLIT': 4} are no listed config's together" in warnings[0]
    assert "[{'ATOMIC': False, 'SPLIT': 1}, {'ATOMIC': True, 'SPLIT': 4}]" in warnings[0]


def test_a_declared_space_admits_each_listed_config_across_its_named_values_only() -> None:
    """What ``place`` admits (every path that takes a config from outside asks it): each listed
    config at every named value (what an honest tune of the declared space serves); no mix of
    two listed configs' unnamed values, whichever the space names or however it is declared."""
    from tunecache.space import SearchSpace
    from tunecache.triton.keys import KernelSpace

    for declared in (SPACE, SearchSpace(SPACE)):
        space = KernelSpace(listed_configs(), declared)
        for listed, warps in itertools.product(LISTED, SPACE["num_warps"]):
            assert space.find({**listed, "num_warps": warps}) is not None, (listed, warps)
        for split, atomic, warps in itertools.product((1, 4), (False, True), (1, 2, 4)):
            served = {"BLOCK": 32, "SPLIT": split, "ATOMIC": atomic, "num_warps": warps}
            inside = {"BLOCK": 32, "SPLIT": split, "ATOMIC": atomic} in LISTED
            assert (space.find(served) is not None) == inside, served
            if not inside:
                assert "are no listed config's together" in space.outside(served)
    # A space naming SPLIT widens it with each listed config's other values (the user's word
    # that any of them goes with either ATOMIC); a launch option it does not name stays listed.
    by_split = KernelSpace(listed_configs(), {"SPLIT": (1, 2, 4)})
    for listed, split in itertools.product(LISTED, (1, 2, 4)):
        assert by_split.find({**listed, "SPLIT": split, "num_warps": 1}) is not None
    assert by_split.find({**LISTED[1], "SPLIT": 2, "num_warps": 2}) is None
