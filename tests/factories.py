"""Hand-built keys and records for tests of the server and the client (not of the tuner)."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

from tunecache.device import DeviceFingerprint
from tunecache.kernels import get_kernel
from tunecache.key import Key
from tunecache.schemas import (
    BaselineModel,
    CheckModel,
    KeyModel,
    RecordCreate,
    SearchModel,
    TimingModel,
    Trial,
    ValidationReport,
)
from tunecache.tokens import new_token

# The admin token of every server the tests start: conftest gives it to the servers as their
# bootstrap token and to clients and CLI runs as TUNECACHE_TOKEN. Raw requests send AUTH.
TEST_TOKEN = new_token()
AUTH = {"Authorization": f"Bearer {TEST_TOKEN}"}

# How long each record's search took: never twice the same, as two tunes never send the same
# record (the server stores one record sent twice once: cache_server.queries.upload_digest);
# shown, it is "1.0 s" however many records a test run makes.
# (A count, not a generator: threads make records at once, and a generator refuses that.)
_RECORDS_MADE = itertools.count()


def builtin_problems(
    gemm: dict[str, int], rows: dict[str, int], **own: dict[str, int]
) -> dict[str, dict[str, int]]:
    """A problem of each built-in workload: ``gemm`` for matmul and bias_gelu, ``rows`` for the
    row-wise ones (softmax, layernorm, rmsnorm); ``own`` gives a workload a problem of its own."""
    return {"matmul": dict(gemm), "softmax": dict(rows), "layernorm": dict(rows),
            "rmsnorm": dict(rows), "bias_gelu": dict(gemm), **own}  # fmt: skip


# Problems small enough to compile and check every workload in a second, with ragged sizes.
TINY = builtin_problems({"M": 24, "N": 40, "K": 16}, {"M": 8, "N": 48})
CPU = DeviceFingerprint(kind="cpu", arch="cpu-avx2", name="test-cpu", units=2, flags=("avx2",))

# A user's y = 2x + 1 kernel for TVM as source text: its class's attributes and math (to
# ``flops``), indented as a class body. A test writing a user's module puts it under a class line
# and adds the rest (``tvm_compute``, imports).
AFFINE_TVM_BODY = """\
    params = ("M", "N")
    inputs = (("M", "N"),)
    output = ("M", "N")
    bucket = ("M",)
    backend_dtypes = {"tvm": ("float32",)}

    def torch_fn(self, x):
        return x * 2.0 + 1.0

    def reference(self, x):
        return x.double() * 2.0 + 1.0

    def flops(self, problem):
        return 2 * problem["M"] * problem["N"]"""


def issue_token(url: str, scope: str) -> str:
    """A new token of ``scope`` from the server at ``url`` (made with the admin test token)."""
    import httpx

    for n in range(1, 100):  # live names are unique: test-write, then test-write-2, ...
        name = f"test-{scope}" if n == 1 else f"test-{scope}-{n}"
        answer = httpx.post(f"{url}/v1/tokens", json={"name": name, "scope": scope},
                            headers=AUTH, timeout=30)  # fmt: skip
        if answer.status_code != 409:
            break
    assert answer.status_code == 201, answer.text
    made: str = answer.json()["token"]
    return made


def miss(detail: str = "miss") -> Any:
    """A tunecache server's 404 (it carries the server's identity): what a lookup miss gets."""
    import httpx

    from tunecache.http import IDENTITY_HEADER

    return httpx.Response(404, json={"status": 404, "detail": detail, "errors": []},
                          headers={IDENTITY_HEADER: "tunecache/test"})  # fmt: skip


def make_key(
    m: int = 64, *, kernel: str = "matmul", backend: str = "tvm", dtype: str = "float32"
) -> Key:
    return Key(
        kernel=kernel,
        source_hash="0123456789abcdef",
        backend=backend,
        problem={p: m if p == "M" else 64 for p in get_kernel(kernel).params},
        dtype=dtype,
        device=CPU,
        environment={"apache-tvm": "0.27.0.post1"},
    )


# A config each backend's closed schema admits (tunecache.configcheck), for records of any kernel.
CONFIGS: dict[str, dict[str, Any]] = {
    "tvm": {"schedule": "knobs", "tile_i": 4, "tile_j": 8, "tile_k": 8, "unroll": 16,
            "vectorize": True, "parallel": True},
    "inductor": {"mode": "default"},
    "triton-gemm": {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4,
                    "num_stages": 3},
    "triton-rows": {"BLOCK_N": 64, "ROWS_PER_PROGRAM": 1, "num_warps": 4, "num_stages": 1},
}  # fmt: skip


def knobs(tile: int, **more: Any) -> dict[str, Any]:
    """A TVM knob config whose ``tile_i`` tells records apart (the closed schema admits it)."""
    return {"schedule": "knobs", "tile_i": tile, "tile_j": 8, **more}


def default_config(key: Key) -> dict[str, Any]:
    """A config the closed schema of ``key``'s backend (and built-in kernel) admits."""
    if key.backend != "triton":
        return dict(CONFIGS[key.backend])
    gemm = key.kernel in ("matmul", "bias_gelu") or ":" in key.kernel
    return dict(CONFIGS["triton-gemm" if gemm else "triton-rows"])


def timing(ms: float) -> TimingModel:
    return TimingModel(median_ms=ms, min_ms=ms * 0.9, max_ms=ms * 1.2, iqr_ms=ms * 0.05, repeats=50)


def make_record(
    key: Key | None = None,
    *,
    time_ms: float = 1.0,
    passed: bool = True,
    trials: int = 3,
    config: dict[str, Any] | None = None,
) -> RecordCreate:
    key = key or make_key()
    error = 1e-6 if passed else 0.5
    check = CheckModel(
        problem=dict(key.problem),
        seed=1,
        rel_error=error,
        max_abs_error=error,
        tolerance=1e-4,
        passed=passed,
    )
    return RecordCreate(
        key=KeyModel.from_key(key),
        config=config or default_config(key),
        config_summary="tile 4x8",
        timing=timing(time_ms),
        baselines=[BaselineModel(name="torch_eager", timing=timing(time_ms * 2))],
        validation=ValidationReport(
            passed=passed, tolerance=1e-4, max_rel_error=error, checks=[check]
        ),
        search=SearchModel(
            strategy="test", trials=trials, seconds=1.0 + next(_RECORDS_MADE) * 1e-9
        ),
        trials=[
            Trial(config={"tile": [i, 8]}, status="ok", time_ms=time_ms + i)
            for i in range(trials - 1)
        ]
        + [Trial(config={"tile": [99, 8]}, status="compile_error", error="boom")][:trials],
    )


def build_default(backend: Any, name: str) -> tuple[Any, dict[str, int], Any]:
    """``(workload, TINY problem, runnable)``: the built-in ``name``'s default config built by
    ``backend`` (a backend test's starting point)."""
    from workloads import get_workload

    workload = get_workload(name)
    problem = TINY[name]
    return workload, problem, backend.build(workload, problem, "float32",
                                            workload.default_config(backend.name))  # fmt: skip


def store_behind_the_api(db_url: str, items: list[dict[str, Any]]) -> int:
    """Writes artifacts straight into a server's database, past the API's closed schemas: what a
    compromised server or database would serve. Returns how many were written."""
    from cache_server.artifacts import put_artifacts
    from cache_server.db import make_engine, make_sessionmaker
    from tunecache.artifacts import ArtifactIn

    models = [ArtifactIn.model_construct(**{"item": "", "score": None, **item}) for item in items]
    engine = make_engine(db_url)
    try:
        with make_sessionmaker(engine).begin() as session:
            return put_artifacts(session, items=models)
    finally:
        engine.dispose()


def queue_at(db_url: str, revision: str, jobs: dict[str, tuple[dict[str, Any], str]]) -> None:
    """Creates a database at migration ``revision`` holding queued ``jobs`` (key hash -> the
    key's JSON and its backend), as a server of that revision stored them."""
    from datetime import UTC, datetime

    import sqlalchemy as sa

    from cache_server.db import make_engine
    from cache_server.migrate import upgrade

    upgrade(db_url, revision)
    engine = make_engine(db_url)
    table = sa.Table("jobs", sa.MetaData(), autoload_with=engine)
    now = datetime.now(UTC)
    try:
        with engine.begin() as conn:
            for key_hash, (key, backend) in jobs.items():
                conn.execute(table.insert().values(
                    key_hash=key_hash, key=key, state="queued", priority=0, source="api",
                    attempts=0, max_attempts=3, error="", created_at=now, updated_at=now,
                    backend=backend, device_arch="cpu-avx2",
                ))  # fmt: skip
    finally:
        engine.dispose()


@contextlib.contextmanager
def hostile_artifacts(values: list[Any]) -> Iterator[str]:
    """A compromised cache server on loopback: every artifact read is answered with ``values``,
    each an item of the namespace, partition and key asked for (best first); anything else is a
    404. Yields its URL."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import parse_qs, urlsplit

    class Hostile(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlsplit(self.path)
            asked = {k: v[0] for k, v in parse_qs(url.query).items()}
            if url.path != "/v1/artifacts":
                return self._send(404, {"status": 404, "detail": "no", "errors": []})
            items = [{"namespace": asked.get("namespace"), "partition": asked.get("partition"),
                      "key": asked.get("key", f"k{i}"), "item": f"i{i}", "value": value,
                      "score": 1e-9, "id": i + 1, "updated_at": "2026-01-01T00:00:00Z"}
                     for i, value in enumerate(values)]  # fmt: skip
            self._send(200, {"items": items, "next_after": None})

        def _send(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Tunecache-Server", "tunecache/test")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def claimed_job(key: Key, job_id: int = 7) -> Any:
    """A job for ``key`` as a server answers a worker's claim (running, attempt 1 of 3)."""
    from tunecache.jobs import JobPublic
    from tunecache.schemas import KeyModel

    now = "2026-01-01T00:00:00Z"
    return JobPublic.model_validate({
        "id": job_id, "key_hash": key.digest(),
        "key": KeyModel.from_key(key).model_dump(by_alias=True), "state": "running",
        "priority": 0, "source": "api", "attempts": 1, "max_attempts": 3, "lease_owner": "w",
        "lease_expires_at": now, "error": "", "record_id": None, "created_at": now,
        "updated_at": now,
    })  # fmt: skip


def run_daemon(client: Any, options: Any, *, timeout: float) -> tuple[Any, bool]:
    """A tuning daemon of ``client`` and ``options`` run in a thread until it returns or
    ``timeout`` s pass, then stopped (and waited for as long again). Returns the daemon and
    whether it was still running at the timeout: looping where it should have stopped."""
    import threading

    from tuner.daemon import Daemon

    worker = Daemon(client, options)
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    runner.join(timeout=timeout)
    looping = runner.is_alive()
    worker.stop()
    runner.join(timeout=timeout)
    return worker, looping
