"""Warm starts from the cache: the winners of neighbouring keys, nearest shape first."""

from __future__ import annotations

import math

from tests.conftest import LiveServer
from tests.factories import make_key, make_record
from tunecache.client import Client
from tunecache.policies import shape_distance
from tunecache.space import SearchSpace
from tuner.warm_start import neighbour_configs

# A TVM knob space (records must hold configs the closed schema of their backend admits).
SPACE = SearchSpace({"schedule": ("knobs",), "tile_i": (4, 8, 16, 32), "unroll": (0, 16)})


def knob(tile: int, unroll: int) -> dict[str, object]:
    return {"schedule": "knobs", "tile_i": tile, "unroll": unroll}


def test_shape_distance() -> None:
    assert shape_distance({"M": 64, "N": 64}, {"M": 64, "N": 64}) == 0
    assert shape_distance({"M": 64, "N": 64}, {"M": 128, "N": 32}) == 2
    assert math.isinf(shape_distance({"M": 1}, {"Q": 1}))


def test_neighbours_nearest_first_in_space_not_self(server: LiveServer) -> None:
    target = make_key(m=256)
    uploads = [
        (make_key(m=256), knob(4, 0)),  # the key itself: not a neighbour
        (make_key(m=1024), knob(32, 16)),  # 2 octaves away
        (make_key(m=128), knob(16, 0)),  # 1 octave away
        (make_key(m=512), knob(64, 0)),  # outside the space
        (make_key(m=128, dtype="float16"), knob(8, 0)),  # other dtype
    ]
    with Client(server.url) as client:
        for key, config in uploads:
            client.upload(make_record(key, config=config))
        found = neighbour_configs(client, target, SPACE)
    assert [c.to_json() for c in found] == [knob(16, 0), knob(32, 16)]


def test_unreachable_cache_gives_no_warm_start() -> None:
    from cache_server.embedded import free_port

    with Client(f"http://127.0.0.1:{free_port()}", timeout=0.5) as client:
        assert neighbour_configs(client, make_key(), SPACE) == []


def test_a_prior_scores_configs_by_the_nearest_winners_trials_on_any_device(
    server: LiveServer,
) -> None:
    import dataclasses

    from tunecache.schemas import Trial
    from tuner.warm_start import FAILED_FACTOR, neighbour_prior

    target = make_key(m=256)
    other_gpu = dataclasses.replace(target.device, arch="cpu-avx512", name="another-cpu")

    def with_trials(key, timings):  # type: ignore[no-untyped-def]
        trials = [Trial(config=knob(t, 0), status="ok" if ms else "runtime_error",
                        time_ms=ms, error="" if ms else "out of resources")
                  for t, ms in timings]  # fmt: skip
        return make_record(key, config=knob(8, 0)).model_copy(update={"trials": trials})

    with Client(server.url) as client:
        client.upload(with_trials(target, [(4, 1.0), (8, 100.0)]))  # the key itself: ignored
        other = dataclasses.replace(target, device=other_gpu)
        client.upload(with_trials(other, [(4, 2.0), (8, 1.0), (16, None)]))
        prior = neighbour_prior(client, target, SPACE)
    scores = {c["tile_i"]: s for c, s in prior.items()}
    assert math.isclose(scores[8], 1.0) and math.isclose(scores[4], 2.0)  # over its best
    assert math.isclose(scores[16], FAILED_FACTOR * 2.0)  # failed there: 10x its slowest
    with Client(f"http://127.0.0.1:{9}", timeout=0.5) as down:
        assert neighbour_prior(down, target, SPACE) == {}
