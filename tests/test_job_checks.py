"""``POST /v1/jobs`` refuses a job no daemon can run, naming the field (422).

A write token queued jobs with a strategy no daemon knows (``evil_strategy``: any name of
``[a-z_]`` passed) and in a dtype the kernel's backend lacks (``int8`` for matmul on TVM): every
daemon claimed each one and failed it, attempt after attempt, and an honest ``daemon --once``
exited 1. The server refuses what it can know: each backend's strategies, and a built-in
kernel's backends and dtypes (a user's kernel's are known only where it is imported).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from cache_server.api.routes.jobs import JOB_STRATEGIES
from tests.conftest import LiveServer
from tests.factories import AUTH, make_key
from tunecache.kernels import BACKENDS
from tunecache.key import Key

USER_KERNEL = "mypkg.kernels:Gemm"  # never imported by the server


@pytest.fixture
def http(shared_server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=shared_server.url, headers=AUTH, timeout=30) as client:
        yield client


def create(http: httpx.Client, key: Key, **fields: Any) -> httpx.Response:
    return http.post("/v1/jobs", json={"key": key.to_json(), **fields})


def job_count(http: httpx.Client) -> int:
    count: int = http.get("/v1/jobs").json()["count"]
    return count


@pytest.mark.parametrize(
    ("key", "fields", "field", "named"),
    [
        (make_key(11), {"strategy": "evil_strategy"}, "strategy", "'evil_strategy'"),
        (make_key(12, backend="inductor"), {"strategy": "random"}, "strategy", "'random'"),
        (make_key(13, dtype="int8"), {}, "key.dtype", "'int8'"),
        (make_key(14, backend="triton", dtype="int8"), {}, "key.dtype", "'int8'"),
        # A bare name no built-in has: a daemon imports no kernel by one (a review's bypass).
        (
            dataclasses.replace(make_key(15), kernel="nosuchkernel"),
            {},
            "key.kernel",
            "'nosuchkernel'",
        ),
        # Names no import finds: queued, claimed and failed on every attempt (a review's)
        (dataclasses.replace(make_key(16), kernel="matmul:"), {}, "key.kernel", "'matmul:'"),
        (dataclasses.replace(make_key(17), kernel="a:b:c"), {}, "key.kernel", "'a:b:c'"),
        (dataclasses.replace(make_key(18), kernel="my-pkg:K"), {}, "key.kernel", "'my-pkg:K'"),
    ],
    ids=[
        "unknown strategy",
        "no space on inductor",
        "int8 on tvm",
        "int8 on triton",
        "no such kernel",
        "no class",
        "two colons",
        "no module name",
    ],
)
def test_a_job_no_daemon_can_run_is_refused_naming_its_field(
    http: httpx.Client, key: Key, fields: dict[str, Any], field: str, named: str
) -> None:
    before = job_count(http)
    answer = create(http, key, **fields)
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"]
    assert detail.startswith(f"{field}: ") and named in detail, detail
    assert job_count(http) == before  # nothing queued


@pytest.mark.parametrize(
    ("key", "strategy"),
    [
        (make_key(21), "meta_schedule"),
        (make_key(22), "random"),
        (make_key(23, backend="inductor"), "inductor_max_autotune"),
        (make_key(24, backend="triton", dtype="float16"), "portfolio"),
        (make_key(25), None),
        # A user's kernel: its dtypes are known only where it is imported, not here.
        (dataclasses.replace(make_key(26), kernel=USER_KERNEL, dtype="int8"), "exhaustive"),
    ],
)
def test_a_job_a_daemon_can_run_is_queued(
    http: httpx.Client, key: Key, strategy: str | None
) -> None:
    answer = create(http, key, **({} if strategy is None else {"strategy": strategy}))
    assert answer.status_code == 201, answer.text


def test_a_miss_no_daemon_can_run_queues_no_job(http: httpx.Client) -> None:
    before = job_count(http)
    answer = http.post("/v1/misses", json={"key": make_key(31, dtype="int8").to_json()})
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"].startswith("key.dtype: "), answer.text
    assert job_count(http) == before


def test_the_servers_strategies_are_the_tuners() -> None:
    """The server cannot import the tuner: its list of each backend's strategies is a copy,
    held here to what a daemon takes (:func:`tuner.tune.strategy_problem`)."""
    from backends import get_backend
    from tuner.search import STRATEGIES
    from tuner.tune import strategy_problem

    tuners = {}
    for name in BACKENDS:
        backend = get_backend(name)
        native = {backend.native_strategy} if backend.native_strategy else set()
        tuners[name] = {s for s in STRATEGIES if strategy_problem(backend, s) is None} | native
    assert {name: set(known) for name, known in JOB_STRATEGIES.items()} == tuners
    # what an unknown strategy's error lists is what the backend takes: inductor's listed
    # random, then refused it ("inductor has no space to search with 'random'")
    for name, known in tuners.items():
        said = strategy_problem(get_backend(name), "nosuch")
        assert said is not None and said.endswith(f"known: {', '.join(sorted(known))}"), said
    # a typo is named as one (--strategy optuan said only what is known)
    said = strategy_problem(get_backend("tvm"), "optuan")
    assert said is not None and "'optuan' for tvm (did you mean 'optuna'?); known:" in said, said
    assert "did you mean" not in (strategy_problem(get_backend("tvm"), "nosuch") or "")
