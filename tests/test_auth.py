"""API tokens: scopes on every route, 401 and 403, tokens stored hashed, revocation, the CLI."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from cache_server.db import make_engine
from tests.conftest import LiveServer, start_server
from tests.factories import AUTH, TEST_TOKEN, make_key, make_record
from tunecache.client import Client
from tunecache.errors import ServerError
from tunecache.tokens import fingerprint

KEY = make_key(m=64).to_json()
RECORD = make_record(make_key(m=64)).model_dump(mode="json", by_alias=True)
SNAPSHOT = {"schema": 1, "filters": {"device_arch": "cpu-avx2"}, "records": []}
ARTIFACTS = {"items": [{"namespace": "tvm.record", "partition": "p", "key": "k", "value": {}}]}
CHECK = {"problem": KEY["problem"], "seed": 1, "rel_error": 0.5, "max_abs_error": 1.0,
         "tolerance": 1e-4, "passed": False}  # fmt: skip
DISPUTE = {"problem": KEY["problem"], "check": CHECK}
VERIFY_CLAIM = {"worker": "w", "device_arch": "cpu-avx2", "backends": ["tvm"]}
VERIFICATION = {"worker": "w", "outcome": "unverifiable", "device_name": "cpu", "error": "no"}
QUERY = {
    ("GET", "/v1/snapshot"): {"device_arch": "cpu-avx2"},
    ("GET", "/v1/artifacts"): {"namespace": "tvm.record", "partition": "p"},
}

# Every route of the API and the scope it needs; test_every_route_is_in_the_table keeps it whole.
ROUTES: list[tuple[str, str, dict[str, Any] | None, str]] = [
    ("POST", "/v1/lookup", {"key": KEY}, "read"),
    ("GET", "/v1/records", None, "read"),
    ("GET", "/v1/records/{record_id}", None, "read"),
    ("GET", "/v1/snapshot", None, "read"),
    ("POST", "/v1/misses", {"key": KEY}, "read"),
    ("GET", "/v1/jobs", None, "read"),
    ("GET", "/v1/jobs/{job_id}", None, "read"),
    ("POST", "/v1/records", RECORD, "write"),
    ("POST", "/v1/snapshot", SNAPSHOT, "write"),
    ("POST", "/v1/jobs", {"key": KEY}, "write"),
    ("POST", "/v1/jobs/claim", {"worker": "w"}, "write"),
    ("POST", "/v1/jobs/{job_id}/heartbeat", {"worker": "w"}, "write"),
    ("POST", "/v1/jobs/{job_id}/release", {"worker": "w"}, "write"),
    ("POST", "/v1/jobs/{job_id}/complete", {"worker": "w", "record_id": 1}, "write"),
    ("POST", "/v1/jobs/{job_id}/fail", {"worker": "w"}, "write"),
    ("POST", "/v1/jobs/{job_id}/cancel", None, "write"),
    ("POST", "/v1/tokens", {"name": "x", "scope": "read"}, "admin"),
    ("GET", "/v1/tokens", None, "admin"),
    ("DELETE", "/v1/tokens/{token_id}", None, "admin"),
    ("GET", "/v1/whoami", None, "read"),
    ("GET", "/v1/artifacts", None, "read"),
    ("POST", "/v1/artifacts", ARTIFACTS, "write"),
    # A token of any scope, even where reads are open: a dispute stops a record being served.
    ("POST", "/v1/records/{record_id}/disputes", DISPUTE, "token"),
    ("POST", "/v1/verifications/claim", VERIFY_CLAIM, "verify"),
    ("POST", "/v1/records/{record_id}/verification", VERIFICATION, "verify"),
    ("POST", "/v1/records/{record_id}/verification/release", {"worker": "w"}, "verify"),
    ("POST", "/v1/records/{record_id}/verification/heartbeat", {"worker": "w"}, "verify"),
]
OPEN = {"/health", "/metrics", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"}
LEVEL = {"none": -1, "token": 0, "read": 0, "write": 1, "verify": 2, "admin": 3}
SCOPES = ("read", "write", "verify", "admin")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def create(url: str, name: str, scope: str, by: str = TEST_TOKEN) -> str:
    response = httpx.post(
        f"{url}/v1/tokens", json={"name": name, "scope": scope}, headers=bearer(by), timeout=30
    )
    assert response.status_code == 201, response.text
    token: str = response.json()["token"]
    return token


def call(url: str, method: str, route: str, body: Any, headers: dict[str, str]) -> httpx.Response:
    path = route.format(record_id=1, job_id=1, token_id=999)
    params = QUERY.get((method, route))
    return httpx.request(
        method, f"{url}{path}", json=body, params=params, headers=headers, timeout=30
    )


def test_every_route_is_in_the_table(server: LiveServer) -> None:
    paths = httpx.get(f"{server.url}/openapi.json").json()["paths"]
    served = {(method.upper(), path) for path, methods in paths.items() for method in methods} - {
        ("GET", path) for path in OPEN
    }
    assert served == {(method, route) for method, route, *_ in ROUTES}


def test_each_route_needs_its_scope(any_server: LiveServer) -> None:
    url = any_server.url
    held = {scope: create(url, f"{scope}-holder", scope) for scope in SCOPES}
    for method, path, body, needed in ROUTES:
        for scope in ("none", *SCOPES):
            headers = {} if scope == "none" else bearer(held[scope])
            response = call(url, method, path, body, headers)
            where = f"{method} {path} with {scope}: {response.status_code} {response.text}"
            allowed = LEVEL[scope] >= LEVEL[needed] or (scope == "none" and needed == "read")
            if allowed:  # a 403 not of the scope: a thing not the caller's (another's job)
                assert response.status_code != 401, where
                assert response.status_code != 403 or "scope" not in response.text, where
                assert response.status_code < 500, where
            elif scope == "none":
                assert response.status_code == 401, where
                assert response.headers["www-authenticate"] == "Bearer", where
                scope_named = "read" if needed == "token" else needed
                assert f"a token with the {scope_named!r} scope" in response.json()["detail"], where
            else:
                assert response.status_code == 403, where
                detail = response.json()["detail"]
                assert f"has the {scope!r} scope; this needs {needed!r}" in detail, where
    # An unknown token is refused even where no token was needed.
    for method, path, body, _needed in ROUTES:
        response = call(url, method, path, body, bearer("tc_" + "0" * 43))
        assert response.status_code == 401, f"{method} {path}: {response.status_code}"
        assert "not known to this server" in response.json()["detail"]


def _stored_bytes(live: LiveServer) -> bytes:
    """Everything the database holds, as bytes to search."""
    if live.db_path is not None:
        files = [p for p in live.db_path.parent.glob(live.db_path.name + "*") if p.is_file()]
        return b"".join(p.read_bytes() for p in files)  # the file, its WAL and shm
    with make_engine(live.db).connect() as conn:
        tables = [row[0] for row in conn.execute(sa.text(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
        ))]  # fmt: skip
        dump = [
            conn.execute(sa.text(f'SELECT t::text FROM "{t}" t')).scalars().all() for t in tables
        ]
    return repr(dump).encode()


def test_tokens_are_stored_hashed_and_never_listed(any_server: LiveServer) -> None:
    url = any_server.url
    token = create(url, "ci", "write")
    assert token.startswith("tc_") and len(token) >= 40
    assert httpx.post(f"{url}/v1/records", json=RECORD, headers=bearer(token)).status_code == 201
    stored = _stored_bytes(any_server)
    assert fingerprint(token).encode() in stored  # the hash is there, so the search works
    for secret in (token, TEST_TOKEN):
        assert secret.encode() not in stored
        assert secret[8:].encode() not in stored  # nor any of it beyond the shown prefix
    listed = httpx.get(f"{url}/v1/tokens", headers=AUTH).text
    assert token not in listed and TEST_TOKEN not in listed
    items = {
        item["name"]: item for item in httpx.get(f"{url}/v1/tokens", headers=AUTH).json()["items"]
    }
    assert items["ci"]["prefix"] == token[:8]
    assert items["ci"]["last_used_at"] is not None
    assert items["bootstrap"]["scope"] == "admin"


def test_a_revoked_token_is_refused_at_once_and_listed_only_on_request(server: LiveServer) -> None:
    url = server.url
    token = create(url, "node-3", "write")
    upload = {"json": RECORD, "headers": bearer(token)}
    assert httpx.post(f"{url}/v1/records", **upload).status_code == 201  # type: ignore[arg-type]
    token_id = next(
        t["id"] for t in httpx.get(f"{url}/v1/tokens", headers=AUTH).json()["items"]
        if t["name"] == "node-3"
    )  # fmt: skip
    revoked = httpx.delete(f"{url}/v1/tokens/{token_id}", headers=AUTH)
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    refused = httpx.post(f"{url}/v1/records", **upload)  # type: ignore[arg-type]
    assert refused.status_code == 401
    live = httpx.get(f"{url}/v1/tokens", headers=AUTH).json()["items"]
    everything = httpx.get(f"{url}/v1/tokens?include_revoked=true", headers=AUTH).json()["items"]
    assert "node-3" not in {t["name"] for t in live}
    assert "node-3" in {t["name"] for t in everything}
    assert httpx.delete(f"{url}/v1/tokens/4242", headers=AUTH).status_code == 404
    assert httpx.get(f"{url}/health").json()["records"] == 1  # the refused upload stored nothing


def test_two_authorization_headers_are_400_whichever_they_name(server: LiveServer) -> None:
    """The first was used: a read token then an admin's read as the reader, an admin's then
    anything as the admin; a proxy adding its own and the server could disagree on who called."""
    url = server.url
    reader = create(url, "reader-2", "read")
    for first, second in ((reader, TEST_TOKEN), (TEST_TOKEN, "garbage")):
        both = [("authorization", f"Bearer {first}"), ("authorization", f"Bearer {second}")]
        for method, path in (("GET", "/v1/whoami"), ("POST", "/v1/records")):
            answer = httpx.request(method, f"{url}{path}", headers=both, json=RECORD)
            assert answer.status_code == 400, (path, answer.text)
            assert "more than one Authorization header" in answer.json()["detail"]
    assert httpx.get(f"{url}/health").json()["records"] == 0


def test_reads_need_a_read_token_when_the_server_says_so(tmp_path: Path) -> None:
    db_path = tmp_path / "cache.db"
    live = start_server(
        f"sqlite:///{db_path}",
        db_path,
        tmp_path / "server.log",
        env={"TUNECACHE_SERVER_READS": "token"},
    )
    try:
        reader = create(live.url, "prod", "read")
        lookup = {"key": KEY}
        assert httpx.post(f"{live.url}/v1/lookup", json=lookup).status_code == 401
        assert httpx.get(f"{live.url}/v1/records").status_code == 401
        assert (
            httpx.post(f"{live.url}/v1/lookup", json=lookup, headers=bearer(reader)).status_code
            == 404
        )
        assert httpx.get(f"{live.url}/health").status_code == 200  # probes stay open
        assert httpx.get(f"{live.url}/metrics").status_code == 200
    finally:
        live.stop()


def test_the_bootstrap_token_is_stored_once_and_stays_revoked(tmp_path: Path) -> None:
    db_path = tmp_path / "cache.db"
    db = f"sqlite:///{db_path}"
    live = start_server(db, db_path, tmp_path / "server.log")
    items = httpx.get(f"{live.url}/v1/tokens", headers=AUTH).json()["items"]
    (boot,) = [t for t in items if t["name"] == "bootstrap"]
    other = create(live.url, "other-admin", "admin")
    assert (
        httpx.delete(f"{live.url}/v1/tokens/{boot['id']}", headers=bearer(other)).status_code == 200
    )
    live.stop()
    again = start_server(db, db_path, tmp_path / "server.log")  # same bootstrap token in env
    try:
        assert httpx.get(f"{again.url}/v1/tokens", headers=AUTH).status_code == 401
        everything = httpx.get(
            f"{again.url}/v1/tokens?include_revoked=true", headers=bearer(other)
        ).json()["items"]
        assert [t["name"] for t in everything].count("bootstrap") == 1
    finally:
        again.stop()


def test_client_sends_its_token_and_reports_refusals(
    server: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    reader = create(server.url, "reader", "read")
    with Client(server.url, token=reader) as client:
        with pytest.raises(ServerError) as refused:
            client.upload(make_record(make_key(m=80)))
        assert refused.value.status_code == 403 and "needs 'write'" in str(refused.value)
    with Client(server.url, token="") as client:
        with pytest.raises(ServerError) as missing:
            client.upload(make_record(make_key(m=80)))
        assert missing.value.status_code == 401
        assert f"(no token sent (token=''), and {server.url} asks for one)" in str(missing.value)
    with (
        Client(server.url, token="tc_wrong", timeout=5) as client,
        caplog.at_level(logging.WARNING),
    ):
        result = client.lookup(make_key(m=64), default={"fallback": True})
    assert result.source == "default" and result.config == {"fallback": True}
    assert "401" in caplog.text and "not known to this server" in caplog.text
    # the warning (the Triton drop-in's too) names the token refused and the server
    assert f"(the token given as token=, sent to {server.url})" in caplog.text, caplog.text
    with Client(server.url, token=create(server.url, "writer", "write")) as client:
        assert client.upload(make_record(make_key(m=80))).is_winner


def tunecache(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tunecache_cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_cli_bootstraps_on_the_database_then_manages_through_the_server(
    tmp_path: Path,
) -> None:
    db_path = tmp_path / "cache.db"
    db = f"sqlite:///{db_path}"
    made = tunecache("token", "create", "--db", db, "--name", "ops", "--scope", "admin")
    assert made.returncode == 0, made.stderr
    admin = made.stdout.strip()
    assert admin.startswith("tc_") and "\n" not in admin and "shown only now" in made.stderr
    assert f"with the 'admin' scope in {db}; it is shown" in made.stderr  # which database
    # made now: said (a shell without the team's TUNECACHE_SERVER_DB made a stray SQLite file)
    assert f"{db} was a new database, made now" in made.stderr
    assert "A server on this database knows the token; one started on another" in made.stderr
    again = tunecache("token", "create", "--db", db, "--name", "ops2", "--scope", "read")
    assert again.returncode == 0 and "was a new database" not in again.stderr, again.stderr
    live = start_server(
        db, db_path, tmp_path / "server.log", env={"TUNECACHE_SERVER_BOOTSTRAP_TOKEN": ""}
    )
    try:
        as_admin = {"TUNECACHE_TOKEN": admin}
        server = ["--server", live.url]
        writer = tunecache(
            "token", "create", "--name", "ci", "--scope", "write", *server, env=as_admin
        )
        assert writer.returncode == 0, writer.stderr
        assert f"with the 'write' scope in {live.url}; it is shown" in writer.stderr
        me = tunecache("token", "whoami", *server, env={"TUNECACHE_TOKEN": writer.stdout.strip()})
        assert me.returncode == 0, me.stderr
        assert (
            re.match(r"token \d+ 'ci' \(tc_", me.stdout) and "scope write; stored 0 B" in me.stdout
        )
        nobody = tunecache("token", "whoami", *server, env={"TUNECACHE_TOKEN": ""})
        assert nobody.returncode == 1 and nobody.stdout.startswith("no token"), nobody.stdout
        listed = tunecache("token", "list", *server, env=as_admin)
        assert listed.returncode == 0 and "ops" in listed.stdout and "ci" in listed.stdout
        assert admin not in listed.stdout and writer.stdout.strip() not in listed.stdout
        unknown = tunecache("records", "ls", *server, env={"TUNECACHE_TOKEN": "tc_unknown"})
        assert unknown.returncode == 4 and "401" in unknown.stderr  # names the token and server
        assert (f"(the token in $TUNECACHE_TOKEN, sent to {live.url}); make one it knows on "
                "its machine: `tunecache token create --db [URL] --name NAME --scope SCOPE`, URL "
                "its --db") in unknown.stderr, unknown.stderr  # fmt: skip
        as_writer = {"TUNECACHE_TOKEN": writer.stdout.strip()}
        refused = tunecache("token", "list", *server, env=as_writer)
        assert (
            refused.returncode == 4  # refused: 401 / 403
            and "403" in refused.stderr
            and "Traceback" not in refused.stderr
        )
        ci_id = next(
            line.split()[0] for line in listed.stdout.splitlines() if " ci " in f" {line} "
        )  # fmt: skip
        revoked = tunecache("token", "revoke", ci_id, *server, env=as_admin)
        assert revoked.returncode == 0, revoked.stderr
        after = tunecache("token", "list", "--all", "--json", *server, env=as_admin)
        assert any(t["name"] == "ci" and t["revoked_at"] for t in json.loads(after.stdout))
        assert tunecache("token", "revoke", "999", *server, env=as_admin).returncode == 1
        assert tunecache("token", "revoke", "999", "--db", db).returncode == 1
    finally:
        live.stop()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["token", "create", "--name", "x", "--scope", "root", "--db", "sqlite:///{tmp}/a.db"], "--scope"),
        (["token", "create", "--name", "bad\nname", "--scope", "read", "--db", "sqlite:///{tmp}/a.db"], "--name"),
        (["token", "create", "--name", "x", "--scope", "read", "--db", "mysql://x"], "sqlite://, postgresql:// or postgres://"),
        (["token", "revoke", "seven", "--db", "sqlite:///{tmp}/a.db"], "invalid int"),
        (["token", "revoke", "--db", "sqlite:///{tmp}/a.db", "--", "-5"], "ID -5: a token ID is a whole number from 1"),
        # A mistyped path said "no tokens" (exit 0) and left an empty database behind.
        (["token", "list", "--db", "sqlite:///{tmp}/a.db"], "there is no database at"),
        (["token", "revoke", "1", "--db", "sqlite:///{tmp}/a.db"], "there is no database at"),
    ],
)  # fmt: skip
def test_cli_bad_input_exits_2(tmp_path: Path, argv: list[str], message: str) -> None:
    done = tunecache(*[a.format(tmp=tmp_path) for a in argv])
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "a.db").exists()


def test_tune_without_a_token_stops_before_tuning(server: LiveServer) -> None:
    done = tunecache(
        "tune", "matmul", "--backend", "tvm", "--shape", "M=8,N=8,K=8", "--server", server.url,
        env={"TUNECACHE_TOKEN": ""},
    )  # fmt: skip
    assert done.returncode == 2
    assert "needs a token with the 'write' scope" in done.stderr and "Traceback" not in done.stderr


def test_the_last_live_admin_token_cannot_be_revoked(server: LiveServer, tmp_path: Path) -> None:
    url = server.url
    second = create(url, "second-admin", "admin")
    me = httpx.get(f"{url}/v1/whoami", headers=AUTH).json()["token"]["id"]
    # Another admin remains: a token may revoke itself.
    assert httpx.delete(f"{url}/v1/tokens/{me}", headers=AUTH).status_code == 200
    last = httpx.get(f"{url}/v1/whoami", headers=bearer(second)).json()["token"]["id"]
    refused = httpx.delete(f"{url}/v1/tokens/{last}", headers=bearer(second))
    assert refused.status_code == 409
    assert "last live admin token" in refused.json()["detail"]
    assert "tunecache token create --db" in refused.json()["detail"]
    still = httpx.get(f"{url}/v1/tokens", headers=bearer(second))
    assert still.status_code == 200  # the admin can still manage tokens
    by_db = tunecache("token", "revoke", str(last), "--db", server.db)
    assert by_db.returncode == 1 and "last live admin token" in by_db.stderr


def revoke_at_once(url: str, calls: list[tuple[str, int]]) -> list[httpx.Response]:
    """``DELETE /v1/tokens/{id}`` by each ``(token, id)`` of ``calls``, all sent at once."""
    answers: list[httpx.Response | None] = [None] * len(calls)
    start = threading.Barrier(len(calls))

    def revoke(i: int) -> None:
        token, token_id = calls[i]
        start.wait()
        answers[i] = httpx.delete(f"{url}/v1/tokens/{token_id}", headers=bearer(token), timeout=60)

    threads = [threading.Thread(target=revoke, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(answer is not None for answer in answers)
    return [answer for answer in answers if answer is not None]


def whoami(url: str, token: str) -> int:
    found: int = httpx.get(f"{url}/v1/whoami", headers=bearer(token)).json()["token"]["id"]
    return found


def test_two_admins_revoking_at_once_both_go_through(any_server: LiveServer) -> None:
    """Each admin's request writes its own row's last use as it is authenticated, and a
    revocation locks every live admin row: held to the end, two admins revoking at once each
    waited for the other's row (PostgreSQL ended one of them: 3 pairs in 15 were a 500)."""
    url = any_server.url
    codes: list[int] = []
    for n in range(12):
        admins = [create(url, f"admin-{n}-{i}", "admin") for i in range(2)]  # never used yet
        doomed = [whoami(url, create(url, f"w-{n}-{i}", "write")) for i in range(2)]
        answers = revoke_at_once(url, list(zip(admins, doomed, strict=True)))
        codes += [answer.status_code for answer in answers]
    assert codes == [200] * 24, codes


def test_two_admins_revoking_each_other_leave_one(any_server: LiveServer) -> None:
    """The only two live admins revoke each other at once: one revocation goes through and the
    other is refused because its own token was revoked meanwhile (401, not the 409 of the last
    admin, nor a second 200: on SQLite both read the other live, neither holding the write lock
    yet, and both went through, leaving no admin at all)."""
    url = any_server.url
    survivor = TEST_TOKEN
    for n in range(15):
        pair = [create(url, f"admin-{n}-{i}", "admin", survivor) for i in range(2)]
        ids = [whoami(url, token) for token in pair]  # their last use an instant ago
        me = whoami(url, survivor)
        assert httpx.delete(f"{url}/v1/tokens/{me}", headers=bearer(survivor)).status_code == 200
        answers = revoke_at_once(url, [(pair[0], ids[1]), (pair[1], ids[0])])
        codes = sorted(answer.status_code for answer in answers)
        assert codes == [200, 401], [answer.text for answer in answers]
        won = 0 if answers[0].status_code == 200 else 1
        survivor = pair[won]
        live = httpx.get(f"{url}/v1/tokens", headers=bearer(survivor)).json()["items"]
        assert [t["id"] for t in live if t["scope"] == "admin"] == [ids[won]]


def test_a_read_token_cannot_be_trusted_and_the_listing_shows_the_trusted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--scope read --trusted`` was taken, and said "its uploads are served as verified" of a
    token that cannot upload; ``token list`` showed no sign of which tokens are trusted (the
    docs ask for the care of an admin token's), but in ``--json``."""
    from tunecache_cli import main

    db = f"sqlite:///{tmp_path / 'cache.db'}"
    assert main(["token", "create", "--db", db, "--name", "r", "--scope", "read",
                 "--trusted"]) == 2  # fmt: skip
    assert "a read token uploads nothing to trust" in capsys.readouterr().err
    assert main(["token", "create", "--db", db, "--name", "ci", "--scope", "write",
                 "--trusted"]) == 0  # fmt: skip
    assert main(["token", "create", "--db", db, "--name", "me", "--scope", "admin"]) == 0
    capsys.readouterr()
    assert main(["token", "list", "--db", db]) == 0
    rows = {line.split()[1]: line.split()[3] for line in capsys.readouterr().out.splitlines()[2:]}
    assert rows == {"ci": "yes", "me": "-"}


def test_pretune_takes_local_or_ray_not_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both were taken: the keys were tuned here, then a Ray instance started and found none."""
    from tunecache_cli import main

    manifest = tmp_path / "m.toml"
    manifest.write_text(
        '[[keys]]\nkernel = "matmul"\nbackend = "tvm"\nshape = {M = 16, N = 16, K = 16}\n'
    )
    with pytest.raises(SystemExit) as ended:
        main(["pretune", str(manifest), "--local", "--ray", "--server", "http://127.0.0.1:9"])
    assert ended.value.code == 2
    assert "not allowed with argument --local" in capsys.readouterr().err
