"""Warm starts from the cache: the winners of neighbouring keys, nearest shape first."""

from __future__ import annotations

import math

from tests.conftest import LiveServer
from tests.factories import make_key, make_record
from tunecache.client import Client
from tunecache.policies import shape_distance
from tunecache.space import SearchSpace
from tuner.warm_start import neighbour_configs

SPACE = SearchSpace({"tile": (4, 8, 16, 32), "unroll": (0, 16)})


def test_shape_distance() -> None:
    assert shape_distance({"M": 64, "N": 64}, {"M": 64, "N": 64}) == 0
    assert shape_distance({"M": 64, "N": 64}, {"M": 128, "N": 32}) == 2
    assert math.isinf(shape_distance({"M": 1}, {"Q": 1}))


def test_neighbours_nearest_first_in_space_not_self(server: LiveServer) -> None:
    target = make_key(m=256)
    uploads = [
        (make_key(m=256), {"tile": 4, "unroll": 0}),  # the key itself: not a neighbour
        (make_key(m=1024), {"tile": 32, "unroll": 16}),  # 2 octaves away
        (make_key(m=128), {"tile": 16, "unroll": 0}),  # 1 octave away
        (make_key(m=512), {"tile": 64, "unroll": 0}),  # outside the space
        (make_key(m=128, dtype="float16"), {"tile": 8, "unroll": 0}),  # other dtype
    ]
    with Client(server.url) as client:
        for key, config in uploads:
            client.upload(make_record(key, config=config))
        found = neighbour_configs(client, target, SPACE)
    assert [c.to_json() for c in found] == [{"tile": 16, "unroll": 0}, {"tile": 32, "unroll": 16}]


def test_unreachable_cache_gives_no_warm_start() -> None:
    from cache_server.embedded import free_port

    with Client(f"http://127.0.0.1:{free_port()}", timeout=0.5) as client:
        assert neighbour_configs(client, make_key(), SPACE) == []
