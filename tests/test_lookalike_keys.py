"""A shape holding a string never reads as another key's shape, wherever a shape is shown.

A problem's parameter may be a string (a layout, a mode). Shown bare, ``N="6144"`` read as
``N=6144``: an uploader's record of the string key (no kernel takes it for the size) stood beside
a teammate's unvalidated key of the same kernel, each shown ``K=4096,M=16,N=6144`` by ``records
ls``, ``records show`` and the dashboard, and the report's coverage grid merged the two into one
cell shown *tuned*. Found by a hostile review. Through a real server on loopback, the CLI, the
dashboard and the report's grid.
"""

from __future__ import annotations

import httpx

from tests.conftest import LiveServer
from tests.factories import AUTH, CPU, make_record
from tests.test_auth import tunecache
from tunecache import Client, Key
from tunecache.key import problem_text
from tunecache.report.grid import coverage_grid, record_states


def _key(n: int | str) -> Key:
    return Key(kernel="teampkg.ops:Gemm", source_hash="0123456789abcdef", backend="tvm",
               problem={"M": 16, "N": n, "K": 4096}, dtype="float32", device=CPU,
               environment={"apache-tvm": "0.27.0.post1"})  # fmt: skip


def test_a_string_is_quoted_and_its_separators_stay_inside_it() -> None:
    assert problem_text({"M": 16, "N": 6144}) == "M=16,N=6144"
    assert problem_text({"M": 16, "N": "6144"}) == 'M=16,N="6144"'
    assert problem_text({"N": '64", K="8'}, ", ") == 'N="64\\", K=\\"8"'  # one parameter
    assert problem_text({"causal": True, "mode": "True"}) == 'causal=True,mode="True"'
    assert problem_text({"layout": "a\u202eb\x1b"}) == 'layout="a\\u202eb\\u001b"'
    assert problem_text({"layout": "b\u0455hd"}) == 'layout="b\\u0455hd"'  # not "bshd"
    assert _key(6144).short() != _key("6144").short()


def test_records_of_a_size_and_of_its_text_are_told_apart_everywhere(server: LiveServer) -> None:
    url = server.url
    with Client(url, token=AUTH["Authorization"].removeprefix("Bearer ")) as client:
        victim = client.upload(make_record(_key(6144), passed=False)).record_id
        lookalike = client.upload(make_record(_key("6144"))).record_id
        records = client.list_records(kernel="teampkg.ops:Gemm").items
    as_admin = {"TUNECACHE_TOKEN": AUTH["Authorization"].removeprefix("Bearer ")}
    listed = tunecache("records", "ls", "--all", "--server", url, env=as_admin)
    assert listed.returncode == 0, listed.stderr
    lines = {line.split()[0]: line for line in listed.stdout.splitlines() if "#" in line}
    assert "K=4096,M=16,N=6144 " in lines[f"#{victim}"]
    assert 'K=4096,M=16,N="6144"' in lines[f"#{lookalike}"]
    shown = tunecache("records", "show", str(lookalike), "--server", url, env=as_admin)
    assert 'teampkg.ops:Gemm[K=4096,M=16,N="6144"]' in shown.stdout, shown.stdout
    html = httpx.get(f"{url}/", params={"all": "true"}, headers=AUTH, timeout=30).text
    assert "K=4096, M=16, N=&#34;6144&#34;" in html and "K=4096, M=16, N=6144<" in html
    grid = coverage_grid(record_states(records))
    assert len(grid.rows) == 2 and grid.counts() == {"tuned": 1, "unvalidated": 1}


def test_keys_of_another_version_of_the_kernels_code_are_rows_of_their_own() -> None:
    """A record of the same shape under another source hash (another version of the kernel's
    code, never served for this one) merged into the teammate's cell and showed it *tuned*."""
    import dataclasses

    teammates = _key(6144)
    other = dataclasses.replace(teammates, source_hash="ffffffffffffffff")
    grid = coverage_grid([(teammates, "unvalidated"), (other, "tuned")])
    assert grid.rows == (
        "teampkg.ops:Gemm K=4096,M=16,N=6144 (source 01234567)",
        "teampkg.ops:Gemm K=4096,M=16,N=6144 (source ffffffff)",
    )
    assert grid.counts() == {"tuned": 1, "unvalidated": 1}
    same = coverage_grid([(teammates, "unvalidated"), (dataclasses.replace(teammates), "tuned")])
    assert same.rows == ("teampkg.ops:Gemm K=4096,M=16,N=6144",)  # one version: one row
    chosen = dataclasses.replace(teammates, source_hash="01234567ffffffff")  # its first 8 alike
    apart = coverage_grid([(teammates, "unvalidated"), (chosen, "tuned")])
    assert set(apart.rows) == {
        "teampkg.ops:Gemm K=4096,M=16,N=6144 (source 012345678)",
        "teampkg.ops:Gemm K=4096,M=16,N=6144 (source 01234567f)",
    }


def test_each_backends_own_source_of_one_kernel_is_one_row() -> None:
    """A built-in hashes its code per backend (its TVM and its Inductor code): ``report``'s
    coverage split matmul in two rows, "(source 6cec13dd)" and "(source 88b2224d)", read as
    two versions of the kernel's code."""
    import dataclasses

    tvm = _key(64)
    inductor = dataclasses.replace(tvm, backend="inductor", source_hash="88b2224d88b2224d")
    grid = coverage_grid([(tvm, "tuned"), (inductor, "tuned")])
    assert grid.rows == ("teampkg.ops:Gemm K=4096,M=16,N=64",) and len(grid.columns) == 2
    older = dataclasses.replace(inductor, source_hash="ffffffffffffffff")  # two versions there
    split = coverage_grid([(tvm, "tuned"), (inductor, "tuned"), (older, "missing")])
    assert set(split.rows) == {"teampkg.ops:Gemm K=4096,M=16,N=64",
                               "teampkg.ops:Gemm K=4096,M=16,N=64 (source 88b2224d)",
                               "teampkg.ops:Gemm K=4096,M=16,N=64 (source ffffffff)"}  # fmt: skip


def test_listings_name_the_source_where_a_kernels_code_differs(server: LiveServer) -> None:
    """Two winners of one kernel and shape under two source hashes (two versions of its code,
    one maybe an uploader's look-alike hash sharing the first eight characters) read as one key
    listed twice: each names its source, as the shortest prefix telling them apart, in ``records
    ls`` and on the dashboard."""
    import dataclasses

    token = AUTH["Authorization"].removeprefix("Bearer ")
    teammates = _key(6144)
    chosen = dataclasses.replace(teammates, source_hash="01234567ffffffff")
    other = dataclasses.replace(teammates, kernel="teampkg.ops:Other")
    with Client(server.url, token=token) as client:
        mine = client.upload(make_record(teammates)).record_id
        theirs = client.upload(make_record(chosen)).record_id
        alone = client.upload(make_record(other)).record_id
    listed = tunecache("records", "ls", "--server", server.url, env={"TUNECACHE_TOKEN": token})
    assert listed.returncode == 0, listed.stderr
    lines = {line.split()[0]: line for line in listed.stdout.splitlines() if "#" in line}
    assert "teampkg.ops:Gemm (source 012345678) " in lines[f"#{mine}"]
    assert "teampkg.ops:Gemm (source 01234567f) " in lines[f"#{theirs}"]
    assert "teampkg.ops:Other " in lines[f"#{alone}"] and "source" not in lines[f"#{alone}"]
    html = httpx.get(f"{server.url}/", headers=AUTH, timeout=30).text
    assert ">teampkg.ops:Gemm (source 012345678)<" in html
    assert ">teampkg.ops:Gemm (source 01234567f)<" in html and ">teampkg.ops:Other<" in html


def test_a_device_name_no_client_makes_is_quoted_on_the_dashboard(server: LiveServer) -> None:
    """Every client's key holds a normalised device name (``h100-80gb-hbm3``); an uploader's
    ``NVIDIA Н100 80GB HBM3`` (a Cyrillic letter, a trailing space, spaces HTML collapses) read
    as the real H100's: it is shown quoted in ASCII, as JSON writes it."""
    import dataclasses

    honest = dataclasses.replace(_key(64), device=dataclasses.replace(CPU, name="h100-80gb-hbm3"))
    named = "NVIDIA \u041d100 80GB  HBM3 "
    spoofed = dataclasses.replace(_key(65), device=dataclasses.replace(CPU, name=named))
    with Client(server.url, token=AUTH["Authorization"].removeprefix("Bearer ")) as client:
        client.upload(make_record(honest))
        record_id = client.upload(make_record(spoofed)).record_id
    html = httpx.get(f"{server.url}/", headers=AUTH, timeout=30).text
    assert ">h100-80gb-hbm3 <" in html  # as it is
    quoted = "&#34;NVIDIA \\u041d100 80GB  HBM3 &#34;"
    assert quoted in html and "\u041d" not in html
    page = httpx.get(f"{server.url}/ui/records/{record_id}", headers=AUTH, timeout=30).text
    assert quoted in page and "\u041d" not in page
