"""The ranks of a ``torch.distributed`` job agree on one config per (kernel, tuning key), whatever
order they meet keys in, whichever kernels they run, and whether or not the others ever meet the
key (``tunecache.triton.ranks``). Two gloo ranks on the CPU, under Triton's interpreter, each in
its own process; the user's kernels are ``tests/user_triton_ranks.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cache_server.embedded import free_port
from tests.rank_procs import answers as ranks_printed

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
RANK_SCRIPT = """
import datetime, json, sys, torch, torch.distributed as dist
rank, steps = int(sys.argv[1]), json.loads(sys.argv[3])[int(sys.argv[1])]
dist.init_process_group("gloo", init_method=sys.argv[2], rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=20))
import tests.user_triton_ranks as m
done = []
for step, n in steps:
    if step == "affine":
        done.append(m.launch_affine(n))
    elif step == "triple":
        done.append(m.launch_triple(n))
    else:  # the step's gradient sync, on both ranks
        gradient = torch.full((4,), float(rank + 1))
        dist.all_reduce(gradient)
        done.append(gradient.tolist())
cached = {str(k[0]): m.CONFIGS.index(c) for k, c in m.affine.cache.items()}
print(json.dumps({"done": done, "benched": m.BENCHED, "cached": cached}))
dist.barrier()  # rank 0 holds the store: none leaves while another may still use it
dist.destroy_process_group()
"""


def run_ranks(steps: list[list[tuple[str, int]]]) -> list[dict[str, Any]]:
    """Runs ``steps[rank]`` on each of two ranks; what each printed."""
    init = f"tcp://127.0.0.1:{free_port()}"
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "TUNECACHE_URL": "htp://x"}  # fmt: skip  # no server: keys are tuned here
    env.pop("TUNECACHE_TOKEN", None)
    env.pop("TUNECACHE_SNAPSHOT", None)
    ranks = [
        subprocess.Popen([sys.executable, "-c", RANK_SCRIPT, str(rank), init, json.dumps(steps)],
                         cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
        for rank in (0, 1)
    ]  # fmt: skip
    return ranks_printed(ranks, timeout=120)


def decided(answers: list[dict[str, Any]], n: int) -> int:
    """The one rank that benchmarked ``n`` (the others launched its choice)."""
    deciders = [rank for rank, answer in enumerate(answers) if n in answer["benched"]]
    assert len(deciders) == 1, deciders
    return deciders[0]


def test_ranks_meeting_keys_in_different_orders_launch_one_config_per_key() -> None:
    """Uneven batches: rank 0 meets n=1000 then n=2000, rank 1 the reverse. Each key is decided
    once (by whichever rank claimed it) and both ranks launch that rank's pick at that key; a
    collective pairing first calls by order swapped the two keys' configs on one rank."""
    from tests.user_triton_ranks import WINNER

    answers = run_ranks([[("affine", 1000), ("affine", 2000)],
                         [("affine", 2000), ("affine", 1000)]])  # fmt: skip
    launched = [dict(zip((1000, 2000), answers[0]["done"], strict=True)),
                dict(zip((2000, 1000), answers[1]["done"], strict=True))]  # fmt: skip
    for n in (1000, 2000):
        pick = WINNER[(n, decided(answers, n))]
        assert launched[0][n] == launched[1][n] == pick, (n, launched)
        assert answers[0]["cached"][str(n)] == answers[1]["cached"][str(n)] == pick


def test_ranks_running_different_kernels_launch_only_their_own_configs() -> None:
    """Pipeline stages: rank 0 runs ``affine``, rank 1 ``triple``; neither waits for the other
    (different kernels, different keys) and each launches one of its own listed configs."""
    answers = run_ranks([[("affine", 1000)], [("triple", 4096)]])
    assert answers[0]["done"] == [0] and answers[0]["benched"] == [1000]  # rank 0's own pick
    assert answers[1]["done"] == [True]  # one of triple's own configs, none of affine's


def test_a_key_one_rank_meets_alone_neither_hangs_nor_breaks_a_collective() -> None:
    """Rank 1 alone meets n=2000 (rank 0 never does) and decides it alone; the gradient
    all_reduce that follows on both ranks sums as it should, and both then share n=1000."""
    from tests.user_triton_ranks import WINNER

    answers = run_ranks([[("sync", 0), ("affine", 1000)],
                         [("affine", 2000), ("sync", 0), ("affine", 1000)]])  # fmt: skip
    assert answers[0]["done"][0] == answers[1]["done"][1] == [3.0] * 4
    assert answers[1]["done"][0] == 0 and answers[1]["benched"][0] == 2000  # its own pick
    pick = WINNER[(1000, decided(answers, 1000))]
    assert answers[0]["done"][1] == answers[1]["done"][2] == pick


def test_ranks_meeting_the_same_key_launch_the_deciders_choice() -> None:
    """Both ranks meet n=1000 at once and their timings disagree: exactly one rank tunes it and
    both launch that rank's pick."""
    from tests.user_triton_ranks import WINNER

    answers = run_ranks([[("affine", 1000)], [("affine", 1000)]])
    pick = WINNER[(1000, decided(answers, 1000))]
    assert answers[0]["done"] == answers[1]["done"] == [pick]
