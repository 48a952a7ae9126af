"""Canonical JSON, key hashing, device fingerprints, environment versions and settings."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest

from tests.factories import CPU, make_key
from tunecache.canonical import canonical_json, digest
from tunecache.device import cpu_fingerprint, cuda_fingerprint_from_properties, normalise_name
from tunecache.environment import environment_for
from tunecache.errors import InvalidInput
from tunecache.key import Key
from tunecache.settings import Settings


def test_canonical_json_sorts_keys_and_is_compact() -> None:
    assert (
        canonical_json({"b": [1, {"d": 2, "c": 1}], "a": "é"}) == '{"a":"é","b":[1,{"c":1,"d":2}]}'
    )


def test_canonical_json_keeps_ints_and_floats_distinct() -> None:
    assert canonical_json({"x": 1}) != canonical_json({"x": 1.0})


@pytest.mark.parametrize("bad", [{"x": float("nan")}, {"x": float("inf")}, {1: 2}, {"x": object()}])
def test_canonical_json_rejects_non_json(bad: object) -> None:
    with pytest.raises(InvalidInput):
        canonical_json(bad)


def test_digest_is_sha256_of_canonical_json() -> None:
    value = {"z": 1, "a": [True, None, 2.5]}
    expected = hashlib.sha256(
        json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()
    assert digest(value) == expected


def test_key_digest_ignores_construction_order() -> None:
    a = Key(
        kernel="matmul", source_hash="ab", backend="tvm", problem={"M": 1, "N": 2, "K": 3},
        dtype="float32", device=CPU, environment={"b": "1", "a": "2"},
    )  # fmt: skip
    b = Key(
        kernel="matmul", source_hash="ab", backend="tvm", problem={"K": 3, "N": 2, "M": 1},
        dtype="float32", device=CPU, environment={"a": "2", "b": "1"},
    )  # fmt: skip
    assert a == b and a.digest() == b.digest() and hash(a) == hash(b)


@pytest.mark.parametrize(
    "change",
    [
        {"kernel": "softmax"},
        {"source_hash": "ffff"},
        {"backend": "inductor"},
        {"problem": {"M": 65, "N": 64, "K": 64}},
        {"dtype": "float16"},
        {"device": CPU.__class__(kind="cpu", arch="cpu-avx512", name="test-cpu", units=2)},
        {"device": CPU.__class__(kind="cpu", arch="cpu-avx2", name="test-cpu", units=4)},
        {"environment": {"apache-tvm": "0.28.0"}},
    ],
)
def test_every_field_changes_the_digest(change: dict) -> None:
    base = make_key()
    assert dataclasses.replace(base, **change).digest() != base.digest()


def test_key_json_round_trip() -> None:
    key = make_key()
    again = Key.from_json(json.loads(json.dumps(key.to_json())))
    assert again == key and again.digest() == key.digest()


def test_key_digest_is_stable_across_processes() -> None:
    code = "from tests.factories import make_key; print(make_key().digest())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == make_key().digest()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"backend": "cuda"}, "unknown backend"),
        ({"dtype": "fp32"}, "unknown dtype"),
        ({"kernel": "has space"}, "not an identifier"),
        ({"problem": {"M": 0}}, "outside"),
        ({"problem": {"M": 1.5}}, "not an integer"),
        ({"problem": {}}, "at least one"),
    ],
)
def test_bad_keys_are_rejected_with_a_reason(fields: dict, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        dataclasses.replace(make_key(), **fields)


def test_from_json_names_a_missing_field() -> None:
    data = make_key().to_json()
    del data["dtype"]
    with pytest.raises(InvalidInput, match="'dtype'"):
        Key.from_json(data)


CPUINFO_AVX512 = """processor : 0
model name : Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags : fpu sse4_2 avx avx2 fma f16c avx512f avx512bw avx512vl avx512_bf16 amx_tile
processor : 1
model name : Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags : fpu sse4_2 avx avx2 fma f16c avx512f avx512bw avx512vl avx512_bf16 amx_tile
"""


def test_cpu_fingerprint_from_cpuinfo() -> None:
    fp = cpu_fingerprint(cpuinfo=CPUINFO_AVX512, cores=2)
    assert fp.kind == "cpu" and fp.arch == "cpu-avx512" and fp.units == 2
    assert fp.name == "intel-xeon-platinum-8481c"
    assert {"avx2", "avx512f", "avx512_bf16", "amx_tile"} <= set(fp.flags)
    assert "fpu" not in fp.flags
    assert cpu_fingerprint(cpuinfo="model name : X\nflags : avx avx2\n", cores=1).arch == "cpu-avx2"
    assert cpu_fingerprint(cpuinfo="Features : fp asimd sve\n", cores=1).arch == "cpu-sve"


def test_local_cpu_fingerprint_reads_this_machine() -> None:
    fp = cpu_fingerprint()
    assert fp.kind == "cpu" and fp.units >= 1 and fp.arch.startswith("cpu-")


def test_cuda_fingerprint_normalises_the_name() -> None:
    props = SimpleNamespace(
        name="NVIDIA H100 80GB HBM3", major=9, minor=0, multi_processor_count=132,
        total_memory=85 * 2**30,
    )  # fmt: skip
    fp = cuda_fingerprint_from_properties(props)
    assert (fp.arch, fp.name, fp.units, fp.memory_gb) == ("sm_90", "h100-80gb-hbm3", 132, 85)
    assert fp.raw_name == "NVIDIA H100 80GB HBM3"
    assert normalise_name("H100_80GB_HBM3") == fp.name


def test_environment_names_each_backends_packages() -> None:
    tvm_env = environment_for("tvm")
    assert set(tvm_env) <= {"apache-tvm"}
    assert "torch" in environment_for("inductor")
    with pytest.raises(ValueError, match="unknown backend"):
        environment_for("cuda")


def test_settings_from_env() -> None:
    s = Settings.from_env({"TUNECACHE_URL": "http://cache:9000/", "TUNECACHE_TIMEOUT": "0.25"})
    assert (s.url, s.timeout) == ("http://cache:9000", 0.25)
    assert Settings.from_env({}).url == Settings().url


@pytest.mark.parametrize(
    ("env", "name"),
    [
        ({"TUNECACHE_TIMEOUT": "soon"}, "TUNECACHE_TIMEOUT"),
        ({"TUNECACHE_TIMEOUT": "-1"}, "TUNECACHE_TIMEOUT"),
        ({"TUNECACHE_TIMEOUT": "nan"}, "TUNECACHE_TIMEOUT"),
        ({"TUNECACHE_URL": "cache:9000"}, "TUNECACHE_URL"),
        ({"TUNECACHE_URL": "http://cache"}, None),
        ({"TUNECACHE_URL": "http://:8765"}, "TUNECACHE_URL='http://:8765' names no host"),
        ({"TUNECACHE_URL": "http://cache:99999"}, "names port 99999: a port is 1 to 65535"),
        ({"TUNECACHE_URL": "http://cache:0"}, "names port 0: a port is 1 to 65535"),
        ({"TUNECACHE_URL": "http://cache:65535"}, None),
        ({"TUNECACHE_URL": "http://u:pw@cache"}, "TUNECACHE_URL='http://cache' .* password"),
    ],
)
def test_bad_settings_name_the_variable(env: dict[str, str], name: str | None) -> None:
    if name is None:  # a good one, beside them: the check refuses only what it should
        assert Settings.from_env(env).url == env["TUNECACHE_URL"]
        return
    with pytest.raises(InvalidInput, match=name):
        Settings.from_env(env)


def test_a_client_refuses_a_url_with_a_password_without_showing_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tunecache.client import Client

    monkeypatch.setenv("TUNECACHE_URL", "http://ci:hunter2@cache")  # its own URL overrides it

    with pytest.raises(InvalidInput, match=r"url='https://cache/v1' \(user and") as raised:
        Client(url="https://ci:hunter2@cache/v1")
    assert "hunter2" not in str(raised.value)
    with Client(url="https://cache/v1/") as client:  # and takes one without
        assert client.url == "https://cache/v1"


@pytest.mark.parametrize("token", ["tc_\x01ctrl", "tc_ spaced", "tc_\u00e9secret", "tc_\nsecret"])
def test_a_token_that_no_header_carries_is_refused_naming_where_not_the_token(token: str) -> None:
    """A control character in TUNECACHE_TOKEN was sent anyway: the server's HTTP parser refused
    the request, and its answer (without tunecache's identity) read as "not a tunecache server"."""
    from tunecache.client import Client
    from tunecache.settings import settings_without_bad

    with pytest.raises(
        InvalidInput, match=r"TUNECACHE_TOKEN=\(not shown\) holds .* at position 3"
    ) as refused:
        Settings.from_env({"TUNECACHE_TOKEN": token})
    assert token[4:] not in str(refused.value)  # what it says is where, not the token
    with pytest.raises(InvalidInput, match=r"token=\(not shown\) holds .* at position 3"):
        Client("http://127.0.0.1:9", token=token)
    assert Settings.from_env({"TUNECACHE_TOKEN": "tc_AbC-12_x.y"}).token == "tc_AbC-12_x.y"
    # where a bad variable must not fail a user's import (the Triton decorator): taken as unset
    found, problems = settings_without_bad({"TUNECACHE_TOKEN": token, "TUNECACHE_TIMEOUT": "2"})
    assert (found.token, found.timeout) == (None, 2.0) and len(problems) == 1


@pytest.mark.parametrize("shape", [8, "M=8,N=8,K=8", ["M", "N", "K"], None])
def test_key_for_a_shape_that_is_no_mapping_names_what_a_shape_is(shape: object) -> None:
    """A number raised a bare TypeError; a string's letters were read as its parameters."""
    from tunecache import key_for

    with pytest.raises(InvalidInput, match=r"matmul: a shape maps its parameters to sizes, e\.g\. "
                       r"\{'M': 64, 'N': 64, 'K': 64\}; got "):  # fmt: skip
        key_for("matmul", "tvm", shape, "float32")  # type: ignore[arg-type]


@pytest.mark.parametrize(("ref", "dotted"), [("mypkg/kernels.py:RowScale", "mypkg.kernels:RowScale"),
                                             ("./mypkg/kernels.py:K", "mypkg.kernels:K"),
                                             ("kernels.py:K", "kernels:K")])  # fmt: skip
def test_a_kernel_named_by_its_file_is_told_its_module_name(ref: str, dotted: str) -> None:
    """It was told to put the folder on PYTHONPATH, which does not help a path."""
    from tunecache.kernels import load_ref

    with pytest.raises(InvalidInput, match=f"names a file; a kernel is named by its module, "
                       f"e.g. {re.escape(dotted)} with") as raised:  # fmt: skip
        load_ref(ref)
    assert "PYTHONPATH" not in str(raised.value)
