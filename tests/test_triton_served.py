"""What ``tunecache.triton.autotune`` does with what it is served (issue 24).

A served config is launched only when it is one of the kernel's listed configs (the user's own
``triton.Config`` object) or inside a space the user declared, and its launch options fit the
device; anything else is a miss. Through a real server (a write token uploads a config outside the
kernel's space with a self-reported 0.001 ms; a fresh process never launches it) and through a
hostile server at the client's transport. Uploads carry only their own key's trials and say what
they were validated against; ``verify="first"`` catches a listed config that is wrong at the shape
in use and disputes its record.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import LiveServer
from tests.factories import TEST_TOKEN, make_record
from tunecache.client import Client
from tunecache.device import Device, DeviceFingerprint, DeviceLimits
from tunecache.errors import InvalidInput, ServerError
from tunecache.key import Key

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
SCRIPT = """
import json, logging, sys, torch
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
import tests.user_triton_served as m
results = []
for name, n in json.loads(sys.argv[1]):
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    before = len(m.BENCH_CALLS)
    y = m.launch(getattr(m, name), x)
    kernel = getattr(m, name)
    listed = [i for i, c in enumerate(kernel.configs) if c is kernel.best_config]
    results.append({"n": n, "correct": bool(torch.allclose(y, x * 2 + 1)),
                    "bench": len(m.BENCH_CALLS) - before, "listed": listed})
print(json.dumps({"results": results, "launches": m.LAUNCHES, "hooked": m.HOOKED}))
"""


def run_calls(calls: list[tuple[str, int]], env: dict[str, str]) -> tuple[dict[str, Any], str]:
    """A fresh process launching ``calls`` (kernel name, n) of ``tests/user_triton_served.py``."""
    done = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(calls)], capture_output=True,
                          text=True, timeout=300, cwd=REPO,
                          env={**os.environ, "TRITON_INTERPRET": "1", **env})  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1]), done.stderr


def kernel_module() -> Any:
    import tests.user_triton_served as m

    return m


def key_at(jit_fn: Any, n: int) -> Key:
    """The key a call of ``jit_fn`` at ``n`` (float32 ``x``, ``y``) looks up."""
    key: Key = kernel_module().key_at(jit_fn, n)
    return key


def upload(url: str, key: Key, config: dict[str, Any]) -> int | None:
    """Uploads ``config`` as ``key``'s winner at a self-reported 0.001 ms with the tests' admin
    token; the record's id, or ``None`` when the record or the server refused it."""
    try:
        record = make_record(key, time_ms=0.001, config=config)
    except ValueError:  # the closed schema refuses it before it is sent
        return None
    with Client(url, token=TEST_TOKEN) as client:
        try:
            return client.upload(record).record_id
        except ServerError as exc:
            assert "422" in str(exc), exc
            return None


# -- through a real server: configs outside the kernel's space are never launched ------------
OUTSIDE = {
    1000: {"BLOCK": 16, "GROUP_SIZE_M": 0},  # divides by zero in the kernel
    1001: {"BLOCK": 0, "GROUP_SIZE_M": 1},  # raises in the grid
    1002: {"BLOCK": -16, "GROUP_SIZE_M": 1},
    1003: {"BLOCK": 100, "GROUP_SIZE_M": 1},  # not a power of two: tl.arange refuses it
    1004: {"BLOCK": 2**30, "GROUP_SIZE_M": 1},
    1005: {"BLOCK": 1, "GROUP_SIZE_M": 1},  # correct, and ~90x slower on a GPU
}


def test_served_configs_outside_the_listed_ones_are_never_launched(server: LiveServer) -> None:
    m = kernel_module()
    served = {n: upload(server.url, key_at(m._grouped, n), {**config, "num_warps": 1,
                                                                "num_stages": 3})
              for n, config in OUTSIDE.items()}  # fmt: skip
    listed = upload(server.url, key_at(m._grouped, 1006),
                    {"BLOCK": 32, "GROUP_SIZE_M": 4, "num_warps": 1, "num_stages": 3})  # fmt: skip
    assert listed is not None

    calls = [("grouped", n) for n in [*OUTSIDE, 1006]]
    out, stderr = run_calls(calls, {"TUNECACHE_URL": server.url, "TEST_ON_MISS": "default"})
    results = {r["n"]: r for r in out["results"]}
    launched = [meta for name, meta in out["launches"]]
    for n, config in OUTSIDE.items():
        assert config not in launched, (n, config)  # 0 launches of any of them
        assert results[n] == {"n": n, "correct": True, "bench": 0, "listed": [0]}  # the default
    # The listed config served is launched with zero benchmarks: the user's own object.
    assert results[1006] == {"n": 1006, "correct": True, "bench": 0, "listed": [3]}
    assert out["hooked"] == [16] * len(OUTSIDE) + [32]  # its pre_hook ran (and the default's)
    assert "Traceback" not in stderr
    if any(served.values()):  # one warning for the kernel, however many keys it was served
        assert stderr.count("is not one of the kernel's listed configs") == 1, stderr


# -- launch options held to the device ----------------------------------------------------------
def gpu(arch: str, warp_size: int = 32) -> Device:
    return Device(DeviceFingerprint(kind="cuda", arch=arch, name="gpu", units=100),
                  DeviceLimits("gpu", 232448, 1024, 100, warp_size))  # fmt: skip


CPU = Device(DeviceFingerprint(kind="cpu", arch="cpu-avx2", name="cpu", units=2))


@pytest.mark.parametrize(
    ("options", "device", "refused"),
    [
        ({"num_warps": 4.0}, CPU, "num_warps=4.0 is not an integer"),
        ({"num_warps": 4.0}, gpu("sm_90"), "num_warps=4.0 is not an integer"),
        ({"num_warps": True}, gpu("sm_90"), "num_warps=True is not an integer"),
        ({"num_stages": 3.0}, CPU, "num_stages=3.0 is not an integer"),
        ({"num_ctas": 2}, CPU, "num_ctas=2 needs thread-block clusters"),
        ({"num_ctas": 2}, gpu("sm_80"), "num_ctas=2 needs thread-block clusters"),
        ({"num_ctas": 2}, gpu("sm_90"), None),
        ({"num_ctas": 2}, gpu("sm_100"), None),
        ({"num_warps": 32}, gpu("sm_90"), None),  # 1024 threads
        ({"num_warps": 32}, gpu("sm_90", warp_size=64), "is 2048 threads"),
        ({"num_warps": 8, "maxnreg": 255}, gpu("sm_90"), None),  # 65280 registers
        ({"num_warps": 16, "maxnreg": 255}, gpu("sm_90"), "is 130560 registers"),
        ({"num_warps": 4, "maxnreg": 65536}, CPU, "maxnreg=65536 is not in 1..255"),
        ({"num_warps": 32, "maxnreg": 255}, CPU, None),  # the interpreter: no device limits
    ],
)
def test_launch_options_are_held_to_the_device(
    options: dict[str, Any], device: Device, refused: str | None
) -> None:
    from tunecache.triton.keys import KernelIdentity, misfit

    m = kernel_module()
    config = {"BLOCK": 32, "GROUP_SIZE_M": 4, **options}
    why = misfit(config, KernelIdentity.of(m._grouped), m.grouped.meta, device)
    if refused is None:
        assert why is None
    else:
        assert why is not None and refused in why, why


# -- through a hostile server at the client's transport ---------------------------------------
def hostile(monkeypatch: pytest.MonkeyPatch, answers: dict[int, dict[str, Any]],
            jit_fn: Any) -> None:  # fmt: skip
    """Every drop-in's client talks to a server answering ``answers[n]`` for ``jit_fn`` at n."""
    import tunecache.triton.autotuner as autotuner

    client = kernel_module().hostile_client(jit_fn, answers)
    monkeypatch.setattr(autotuner, "shared_client", lambda *a: client)


def drop_in(configs: list[Any], **options: Any) -> Any:
    """A fresh ``tunecache.triton.autotune`` of the grouped kernel over ``configs``."""
    import tunecache.triton

    m = kernel_module()
    options = {"on_miss": "default", "do_bench": m.counting_bench, **options}
    return tunecache.triton.autotune(configs=configs, key=["n"], **options)(m._grouped)


def launch_at(kernel: Any, n: int) -> Any:
    import torch

    m = kernel_module()
    x = torch.randn(n)
    before = len(m.BENCH_CALLS)
    assert torch.allclose(m.launch(kernel, x), x * 2 + 1)
    assert len(m.BENCH_CALLS) == before  # nothing benchmarked: served or the default
    return kernel.best_config


def test_a_listed_config_is_the_users_own_object(monkeypatch: pytest.MonkeyPatch) -> None:
    m = kernel_module()
    hostile(monkeypatch, {500: {"BLOCK": 32, "GROUP_SIZE_M": 1, "num_warps": 1,
                                "num_stages": 3}}, m._grouped)  # fmt: skip
    kernel = drop_in(m.GROUPED_CONFIGS)
    m.HOOKED.clear()
    assert launch_at(kernel, 500) is m.GROUPED_CONFIGS[2]
    assert m.HOOKED == [32]  # the user's pre_hook ran: Triton launched the user's Config


def test_outside_the_space_with_on_miss_tune_tunes_the_listed_configs_here(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    m = kernel_module()
    hostile(monkeypatch, {550: {"BLOCK": 0, "GROUP_SIZE_M": 1, "num_warps": 1,
                                "num_stages": 3}}, m._grouped)  # fmt: skip
    kernel = drop_in(m.GROUPED_CONFIGS, on_miss="tune")
    x, before = torch.randn(550), len(m.BENCH_CALLS)
    assert torch.allclose(m.launch(kernel, x), x * 2 + 1)
    assert len(m.BENCH_CALLS) - before == len(m.GROUPED_CONFIGS)  # a miss: tuned as Triton does
    assert any(kernel.best_config is c for c in m.GROUPED_CONFIGS)


def test_launch_options_off_the_device_are_refused_from_the_transport(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``num_ctas=2`` is listed, but a CPU (or a GPU before sm_90) has no clusters; ``4.0``
    warps is not the listed ``4``."""
    import triton

    m = kernel_module()
    listed = [triton.Config({"BLOCK": 16, "GROUP_SIZE_M": 1}, num_warps=1),
              triton.Config({"BLOCK": 32, "GROUP_SIZE_M": 1}, num_warps=4, num_ctas=2),
              triton.Config({"BLOCK": 32, "GROUP_SIZE_M": 4}, num_warps=4)]  # fmt: skip
    hostile(monkeypatch, {600: {"BLOCK": 32, "GROUP_SIZE_M": 1, "num_warps": 4, "num_ctas": 2,
                                "num_stages": 3},
                          601: {"BLOCK": 32, "GROUP_SIZE_M": 4, "num_warps": 4.0,
                                "num_stages": 3}}, m._grouped)  # fmt: skip
    kernel = drop_in(listed)
    assert launch_at(kernel, 600) is listed[0]
    assert launch_at(kernel, 601) is listed[0]


def test_a_declared_space_widens_what_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    m = kernel_module()
    base = {"GROUP_SIZE_M": 1, "num_warps": 1, "num_stages": 3}
    hostile(monkeypatch, {700: {"BLOCK": 64, **base},  # inside the declared space
                          701: {"BLOCK": 100, **base},  # outside it
                          702: {"BLOCK": 64, **base, "num_warps": 2},  # warps: the listed 1
                          703: {"BLOCK": 64.0, **base}}, m._grouped)  # fmt: skip
    kernel = drop_in(m.PLAIN_CONFIGS, space={"BLOCK": (16, 32, 64, 128)})
    inside = launch_at(kernel, 700)
    assert inside.kwargs == {"BLOCK": 64, "GROUP_SIZE_M": 1} and inside.num_warps == 1
    for n in (701, 702, 703):
        assert launch_at(kernel, n) is m.PLAIN_CONFIGS[0], n
    # Each listed config with its own pre_hook: which one BLOCK=64 needs cannot be told.
    hooked = drop_in(m.GROUPED_CONFIGS, space={"BLOCK": (16, 32, 64, 128)})
    assert launch_at(hooked, 700) is m.GROUPED_CONFIGS[0]


def test_a_search_space_with_a_constraint_is_a_declared_space(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tunecache.space import SearchSpace

    m = kernel_module()
    base = {"num_warps": 1, "num_stages": 3}
    hostile(monkeypatch, {800: {"BLOCK": 64, "GROUP_SIZE_M": 2, **base},
                          801: {"BLOCK": 128, "GROUP_SIZE_M": 8, **base}}, m._grouped)  # fmt: skip

    def too_big(config: Any) -> str | None:
        return "too big" if config["BLOCK"] * config["GROUP_SIZE_M"] > 512 else None

    space = SearchSpace({"BLOCK": (16, 32, 64, 128), "GROUP_SIZE_M": (1, 2, 4, 8)},
                        constraint=too_big)  # fmt: skip
    kernel = drop_in(m.PLAIN_CONFIGS, space=space)
    assert launch_at(kernel, 800).kwargs == {"BLOCK": 64, "GROUP_SIZE_M": 2}
    assert launch_at(kernel, 801) is m.PLAIN_CONFIGS[0]  # pruned by the constraint


@pytest.mark.parametrize("constraint", [
    lambda c: int(c["BLOCK"]) <= 64,  # a predicate, not a reason
    lambda c: None if c["BLOCK_K"] else "?",  # a parameter the space lacks: KeyError
], ids=["answers-a-bool", "raises"])  # fmt: skip
def test_a_constraint_answering_no_reason_leaves_served_configs_outside(
    monkeypatch: pytest.MonkeyPatch, constraint: Any
) -> None:
    # The user's mistake in the constraint: the served config is a miss (the first listed
    # config runs), not an exception from the user's launch.
    from tunecache.space import SearchSpace

    m = kernel_module()
    hostile(monkeypatch, {900: {"BLOCK": 64, "GROUP_SIZE_M": 2, "num_warps": 1,
                                "num_stages": 3}}, m._grouped)  # fmt: skip
    space = SearchSpace({"BLOCK": (16, 32, 64, 128), "GROUP_SIZE_M": (1, 2, 4, 8)},
                        constraint=constraint)  # fmt: skip
    kernel = drop_in(m.GROUPED_CONFIGS, space=space)
    assert launch_at(kernel, 900) is m.GROUPED_CONFIGS[0]


def test_a_space_naming_an_unknown_parameter_is_refused_at_decoration() -> None:
    m = kernel_module()
    with pytest.raises(InvalidInput, match="space= names \\['SPLIT_K'\\]"):
        drop_in(m.GROUPED_CONFIGS, space={"SPLIT_K": (1, 2)})
    with pytest.raises(InvalidInput, match="verify='always'"):
        drop_in(m.GROUPED_CONFIGS, verify="always")


# -- uploads: only this key's trials, honestly labelled ----------------------------------------
def test_a_key_pruned_to_one_config_uploads_no_stale_trials(server: LiveServer) -> None:
    """n=700 is benchmarked (6 configs) and uploaded; at n=1500 pruning leaves one config,
    Triton launches it unbenchmarked and nothing is uploaded (not n=700's trials again)."""
    out, stderr = run_calls([("pruned", 700), ("pruned", 1500)],
                            {"TUNECACHE_URL": server.url, "TUNECACHE_TOKEN": TEST_TOKEN})  # fmt: skip
    assert [(r["n"], r["bench"], r["correct"]) for r in out["results"]] == [
        (700, 6, True),
        (1500, 0, True),
    ]
    with Client(server.url) as client:
        records = client.list_records(kernel="tests.user_triton_served:_pruned").items
    assert [r.key.problem["n"] for r in records] == [700]
    full = Client(server.url).get_record(records[0].id)
    assert len(full.trials) == 6 and full.search.trials == 6
    assert full.validation.reference == "the first listed config, float32"
    assert "nothing tuned, nothing uploaded" in stderr


def test_the_validation_label_names_the_users_reference(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    import tunecache.triton.autotuner as autotuner
    from tunecache.triton.record import reference_label

    assert reference_label(True, "float16") == "reference= (user function), float16"
    assert reference_label(False, "bfloat16") == "the first listed config, bfloat16"
    m = kernel_module()
    client = Client(server.url, token=TEST_TOKEN)
    monkeypatch.setattr(autotuner, "shared_client", lambda *a: client)
    calls: list[int] = []

    def reference(x: Any, y: Any, n: int) -> None:
        calls.append(n)
        y.copy_(x * 2 + 1)

    kernel = drop_in(m.GROUPED_CONFIGS, on_miss="tune", reference=reference)
    x = torch.randn(900)
    assert torch.allclose(m.launch(kernel, x), x * 2 + 1)
    assert calls == [900]
    assert client.drain()  # the upload goes in the background
    (record,) = client.list_records(kernel="tests.user_triton_served:_grouped").items
    assert record.validation.reference == "reference= (user function), float32"


# -- verify="first" ---------------------------------------------------------------------------
def test_verify_first_catches_a_listed_config_wrong_at_the_shape_in_use(
    server: LiveServer,
) -> None:
    """``EVEN=True`` is listed and right at n=1024; served for n=1000, its first use is checked
    against the first listed config, fails and falls back; with no ``reference=`` the first
    config is no proof, so the record is not disputed (one warning says why)."""
    m = kernel_module()
    even = {"BLOCK": 64, "EVEN": True, "num_warps": 1, "num_stages": 3}
    wrong, right = upload(server.url, key_at(m._masked, 1000), even), \
        upload(server.url, key_at(m._masked, 1024), even)  # fmt: skip
    assert wrong is not None and right is not None
    env = {"TUNECACHE_URL": server.url, "TEST_VERIFY": "first", "TUNECACHE_TOKEN": TEST_TOKEN}
    out, stderr = run_calls([("masked", 1000), ("masked", 1024), ("masked", 1000)], env)
    results = out["results"]
    assert [(r["n"], r["correct"], r["listed"]) for r in results] == [
        (1000, True, [0]),  # fell back to the first listed config
        (1024, True, [1]),  # verified: served
        (1000, True, [0]),  # Triton's cache: no second check
    ]
    assert "differ from the kernel's first config" in stderr, stderr
    with Client(server.url) as client:
        assert client.get_record(wrong).status != "disputed"
        assert client.get_record(right).status != "disputed"


def test_verify_first_never_writes_the_callers_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    m = kernel_module()
    hostile(monkeypatch, {1000: {"BLOCK": 64, "EVEN": True, "num_warps": 1, "num_stages": 3}},
            m._masked)  # fmt: skip
    import tunecache.triton

    kernel = tunecache.triton.autotune(configs=m.MASKED_CONFIGS, key=["n"], on_miss="default",
                                       verify="first")(m._masked)  # fmt: skip
    x = torch.randn(1000)
    y = torch.full_like(x, 7.0)
    seen = x.clone()
    kernel[lambda meta: (1000 // 64 + 1,)](x, y, 1000)
    assert torch.equal(x, seen)  # the checks ran on copies; only the real launch wrote y
    assert kernel.best_config is m.MASKED_CONFIGS[0]
    assert torch.allclose(y, x * 2 + 1)
