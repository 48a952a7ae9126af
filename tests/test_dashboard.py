"""The dashboard (``/``, ``/ui/...``) and ``/docs``, on a real server with records uploaded
through the API: what the pages show, escaping, read auth, no URL off the machine, and headless
Chromium rendering each page with the network cut off.

Screenshots go to ``$TUNECACHE_ARTIFACTS`` (default: a pytest temporary directory).
"""

from __future__ import annotations

import functools
import html
import http.server
import re
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cache_server.dashboard.templating import spread
from tests.conftest import LiveServer, start_server
from tests.dashboard_browser import visit
from tests.factories import AUTH, TEST_TOKEN, make_key, make_record, timing
from tunecache.schemas import BaselineModel, Provenance, RecordCreate, Trial
from tunecache.triton import hostbench
from tunecache.triton.record import timing_of

HOSTILE = "<script>alert('tc')</script>"
HOSTILE_SUMMARY = '"><img src=x onerror=alert(1)>'
HOSTILE_WORKER = "<b>node&3</b>"
Ids = dict[str, int]  # what _seed made: record ids by name, and "job"


def _upload(url: str, record: RecordCreate) -> int:
    response = httpx.post(
        f"{url}/v1/records", json=record.model_dump(mode="json", by_alias=True), headers=AUTH
    )
    assert response.status_code == 201, response.text
    record_id: int = response.json()["record_id"]
    return record_id


def _post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    response = httpx.post(f"{url}{path}", json=body, headers=AUTH)
    assert response.status_code < 300, response.text
    return response


def _hostile_record() -> RecordCreate:
    """A record whose user-controlled strings are markup (a kernel name cannot be: the server
    allows only ``[A-Za-z0-9_.:-]`` in one)."""
    base = make_record(make_key(m=512, kernel="layernorm"), time_ms=3.0, trials=2)
    key = base.key.model_copy(
        update={"device": base.key.device.model_copy(update={"name": "<i>gpu</i>"})}
    )
    trials = [Trial(config={"note": HOSTILE}, status="runtime_error", error=HOSTILE), *base.trials]
    return base.model_copy(
        update={
            "key": key,
            # A config holds no text (closed schemas); its trials' configs and the rest may.
            "config_summary": HOSTILE_SUMMARY,
            "provenance": Provenance(machine=HOSTILE, tool_version="<v>"),
            "trials": trials,
        }
    )


def _triton_record() -> RecordCreate:
    """A record of Triton's autotuner: its timing is ``do_bench``'s median, p20 and p80."""
    record = make_record(make_key(m=96, kernel="softmax", backend="triton"), time_ms=0.25)
    measured = timing_of([0.25, 0.2375, 0.28125])
    assert measured is not None
    return record.model_copy(update={"timing": measured})


def _seed(url: str) -> Ids:
    """Uploads the records and makes the jobs every test here reads; returns their ids."""
    matmul = make_record(make_key(m=64), time_ms=0.8125, trials=12).model_copy(
        update={
            "baselines": [
                BaselineModel(name="torch_eager", timing=timing(1.625)),
                BaselineModel(name="default_config", timing=timing(1.21875)),
            ]
        }
    )
    seeded = {
        "matmul": _upload(url, matmul),
        "softmax": _upload(url, _triton_record()),
        "invalid": _upload(url, make_record(make_key(m=128), time_ms=0.0625, passed=False)),
        "hostile": _upload(url, _hostile_record()),
    }
    # Job A: claimed, failed with an error, claimed again (running, leased). Job B: queued.
    a = _post(url, "/v1/jobs", {"key": make_key(m=256).to_json(), "priority": 5}).json()["job"]
    _post(url, "/v1/jobs", {"key": make_key(m=320, kernel="rmsnorm").to_json()})
    _post(url, "/v1/jobs/claim", {"worker": "gpu-node-1", "lease_seconds": 600})
    _post(url, f"/v1/jobs/{a['id']}/fail", {"worker": "gpu-node-1", "error": HOSTILE})
    _post(url, "/v1/jobs/claim", {"worker": HOSTILE_WORKER, "lease_seconds": 600})
    seeded["job"] = a["id"]
    return seeded


@pytest.fixture(scope="module")
def token_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A server whose reads need a token (``READS=token``)."""
    tmp = tmp_path_factory.mktemp("dashboard")
    live = start_server(
        f"sqlite:///{tmp / 'cache.db'}",
        tmp / "cache.db",
        tmp / "server.log",
        env={"TUNECACHE_SERVER_READS": "token"},
    )
    yield live
    live.stop()


@pytest.fixture(scope="module")
def ids(token_server: LiveServer) -> Ids:
    """The ids of what :func:`_seed` put on ``token_server``."""
    return _seed(token_server.url)


def page(live: LiveServer, path: str, **params: Any) -> httpx.Response:
    """``path`` read with the admin token in the header, as a script would."""
    return httpx.get(f"{live.url}{path}", params=params, headers=AUTH, timeout=30)


class TestPages:
    def test_index_shows_winners_with_their_speedups(
        self, token_server: LiveServer, ids: Ids
    ) -> None:
        response = page(token_server, "/")
        assert response.status_code == 200
        html = response.text
        for kernel in ("matmul", "softmax", "layernorm"):
            assert f'<td class="kernel">{kernel}</td>' in html
        assert "0.8125" in html  # matmul's median time, ms
        assert "2.00× faster" in html and "1.50× faster" in html  # vs eager, vs default
        assert "1.0e-06" in html  # its validation error
        assert f"/ui/records/{ids['matmul']}" in html
        assert f"/ui/records/{ids['invalid']}" not in html  # not a winner

    def test_index_filters(self, token_server: LiveServer, ids: Ids) -> None:
        softmax = page(token_server, "/", kernel="softmax").text
        assert '<td class="kernel">softmax</td>' in softmax
        assert '<td class="kernel">matmul</td>' not in softmax
        tvm = page(token_server, "/", backend="tvm").text
        assert '<td class="kernel">softmax</td>' not in tvm  # softmax's is a Triton record
        assert "No winners match" in page(token_server, "/", device_arch="sm_90").text
        every = page(token_server, "/", all="true").text
        assert f"/ui/records/{ids['invalid']}" in every

    def test_record_page_plots_every_trial(self, token_server: LiveServer, ids: Ids) -> None:
        html = page(token_server, f"/ui/records/{ids['matmul']}").text
        assert "matmul" in html and "12 trials" in html
        # A record's seconds are the whole tune's, not the search's alone.
        assert "12 trials; tuned in 1.0 s;" in html
        assert "tolerance 1.0e-04" in html and "2.00× faster" in html and "1.50× faster" in html
        assert "compile_error" in html and "boom" in html  # the failed last trial
        best = re.search(r'<path class="best" d="([^"]+)"', html)
        assert best is not None
        points = re.findall(r"[ML]([\d.]+),([\d.]+)", best.group(1))
        assert len(points) == 12  # one per trial: the last failed, the best holds
        assert html.count('<circle class="trial"') == 11  # the ones that ran
        xs = [float(x) for x, _ in points]
        assert xs == sorted(xs) and len(set(xs)) == 12

    def test_a_timing_shows_the_bounds_its_timer_measured(
        self, token_server: LiveServer, ids: Ids
    ) -> None:
        ours = page(token_server, f"/ui/records/{ids['matmul']}").text
        assert "min 0.7313 · max 0.975 · IQR 0.04063 · perf_counter" in ours
        # do_bench gives a median, a 20th and an 80th percentile, and no quartiles.
        triton = page(token_server, f"/ui/records/{ids['softmax']}").text
        assert "p20 0.2375 · p80 0.2812 · triton do_bench (median, p20, p80)" in triton
        assert "min 0.2375" not in triton and "IQR" not in triton
        # The interpreter's host clock: min and max of its runs, and no quartiles either.
        interpreted = timing_of([2.0, 1.5, 3.0], hostbench.TIMER)
        assert interpreted is not None and spread(interpreted) == "min 1.5 · max 3"

    def test_unknown_record_is_an_html_404(self, token_server: LiveServer, ids: Ids) -> None:
        response = page(token_server, "/ui/records/999999")
        assert response.status_code == 404
        assert "no record 999999" in response.text.lower()
        assert response.headers["content-type"].startswith("text/html")

    def test_a_bad_address_is_an_html_422_naming_it(
        self, token_server: LiveServer, ids: Ids
    ) -> None:
        """A filter or a row out of range answered the API's JSON, a wall of text in a browser:
        now a page naming what was wrong, escaped as all the server's text is."""
        for path, params, says in (("/", {"start": "-1"}, "query.start"),
                                   ("/", {"backend": "<b>x"}, "query.backend"),
                                   ("/ui/jobs", {"state": "nope"}, "query.state"),
                                   ("/ui/records/0", {}, "path.record_id")):  # fmt: skip
            response = page(token_server, path, **params)
            assert response.status_code == 422, (path, response.text)
            assert response.headers["content-type"].startswith("text/html")
            assert says in response.text and "<b>x" not in response.text
        zero = page(token_server, "/ui/records/0").text  # spelled well: said to be out of range
        assert "ids start at 1" in zero and "without a sign" not in zero

    def test_jobs_page_shows_leases_attempts_and_errors(
        self, token_server: LiveServer, ids: Ids
    ) -> None:
        html = page(token_server, "/ui/jobs").text
        counts = dict(re.findall(r"state-(\w+)[^>]*>\1 <b>(\d+)</b>", html))
        assert counts == {"queued": "1", "running": "1", "done": "0", "failed": "0"}
        # who holds the lease: the worker's name, its own word, and the token that claimed
        assert (
            '&lt;b&gt;node&amp;3&lt;/b&gt; <span class="muted">(its word; token bootstrap)' in html
        )
        assert "2 / 3" in html  # attempts of the job that failed once
        # its error, and the token that reported it
        assert "reported by token bootstrap:</span> &lt;script&gt;alert(&#39;tc&#39;)" in html
        assert "rmsnorm" in html
        queued = page(token_server, "/ui/jobs", state="queued").text
        assert "rmsnorm" in queued and "node&amp;3" not in queued


def test_user_data_is_escaped_everywhere(token_server: LiveServer, ids: Ids) -> None:
    record = ids["hostile"]
    for path in ("/", "/?all=true", f"/ui/records/{record}", "/ui/jobs"):
        html = page(token_server, path).text
        assert "<script" not in html.lower(), path  # the dashboard has no script of its own
        assert "<img" not in html and "<i>gpu" not in html and "<b>node" not in html, path
    html = page(token_server, f"/ui/records/{record}").text
    assert "&lt;i&gt;gpu&lt;/i&gt;" in html  # the device name
    # the config summary, said to be its uploader's words below the config itself
    assert "summary (their words, not read from the config): &#34;&gt;&lt;img src=x" in html
    assert html.index('<pre class="config">') < html.index("summary (their words")
    assert "&lt;script&gt;alert(&#39;tc&#39;)&lt;/script&gt;" in html  # machine, trial error
    assert "\\u003cscript\\u003e" in html  # inside a trial's config, as JSON


class TestReadAuth:
    def test_no_token_is_a_401_page_saying_how(self, token_server: LiveServer, ids: Ids) -> None:
        for path in ("/", "/ui/jobs", f"/ui/records/{ids['matmul']}"):
            response = httpx.get(f"{token_server.url}{path}")
            assert response.status_code == 401
            assert response.headers["www-authenticate"] == "Bearer"
            assert "?token=" in response.text and "matmul" not in response.text

    def test_unknown_token_is_refused(self, token_server: LiveServer, ids: Ids) -> None:
        response = httpx.get(f"{token_server.url}/", params={"token": "tc_not-a-real-token"})
        assert response.status_code == 401
        assert "set-cookie" not in response.headers

    def test_query_token_becomes_a_cookie(self, token_server: LiveServer, ids: Ids) -> None:
        with httpx.Client(base_url=token_server.url) as browser:
            first = browser.get("/ui/jobs", params={"token": TEST_TOKEN, "state": "queued"})
            assert first.status_code == 303
            assert first.headers["location"] == "/ui/jobs?state=queued"  # the token is gone
            cookie = first.headers["set-cookie"].lower()
            assert "httponly" in cookie and "samesite=strict" in cookie
            again = browser.get(first.headers["location"])  # with the cookie only
            assert again.status_code == 200 and "rmsnorm" in again.text

    def test_a_dead_cookie_is_cleared(self, token_server: LiveServer, ids: Ids) -> None:
        response = httpx.get(f"{token_server.url}/", cookies={"tunecache_token": "tc_revoked"})
        assert response.status_code == 401
        assert 'tunecache_token=""' in response.headers["set-cookie"]

    def test_open_reads_need_no_token(self, server: LiveServer) -> None:
        _upload(server.url, make_record(make_key(m=80), time_ms=0.5))
        response = httpx.get(f"{server.url}/")
        assert response.status_code == 200 and "matmul" in response.text


LINK = re.compile(r"""(?:src|href)=["']([^"']+)["']""")
ABSOLUTE = re.compile(r"""https?://[^\s"'<>)\\]+""")
SVG_NAMESPACE = "http://www.w3.org/2000/svg"  # a name, never fetched


def _foreign_urls(text: str, own: str) -> list[str]:
    return [u for u in ABSOLUTE.findall(text) if not u.startswith(own) and u != SVG_NAMESPACE]


class TestNoCdn:
    def test_docs_load_only_local_files(self, token_server: LiveServer, ids: Ids) -> None:
        response = httpx.get(f"{token_server.url}/docs")  # open, like /openapi.json
        assert response.status_code == 200
        links = LINK.findall(response.text)
        assert {"/ui/swagger/swagger-ui-bundle.js", "/ui/swagger/swagger-ui.css"} <= set(links)
        for link in links:
            assert link.startswith("/"), link
            assert httpx.get(f"{token_server.url}{link}").status_code == 200, link
        assert "'/openapi.json'" in response.text and "cdn" not in response.text.lower()
        assert httpx.get(f"{token_server.url}/openapi.json").status_code == 200
        assert httpx.get(f"{token_server.url}/redoc").status_code == 404

    def test_only_swagger_files_the_page_needs_are_served(
        self, token_server: LiveServer, ids: Ids
    ) -> None:
        for name in ("index.html", "swagger-initializer.js", "..%2Fswagger-ui.css"):
            assert httpx.get(f"{token_server.url}/ui/swagger/{name}").status_code == 404

    def test_no_served_page_or_style_names_another_host(
        self, token_server: LiveServer, ids: Ids
    ) -> None:
        own = token_server.url
        texts = {
            path: page(token_server, path).text
            for path in ("/", "/ui/jobs", f"/ui/records/{ids['matmul']}", "/docs",
                         "/ui/static/dashboard.css", "/ui/swagger/swagger-ui.css")
        }  # fmt: skip
        for path, text in texts.items():
            assert _foreign_urls(text, own) == [], path
        assert _foreign_urls('<img src="https://cdn.example/x.png">', own)  # the scan sees one

    def test_pages_tell_the_browser_to_load_from_this_server_only(
        self, token_server: LiveServer, ids: Ids
    ) -> None:
        csp = page(token_server, "/").headers["content-security-policy"]
        assert "default-src 'none'" in csp and "script-src" not in csp
        docs = httpx.get(f"{token_server.url}/docs").headers["content-security-policy"]
        assert "default-src 'self'" in docs and "http" not in docs


# --- headless Chromium ------------------------------------------------------------------------


def assert_drawn(png: Path) -> None:
    """A 1280×900 PNG with more on it than a background."""
    image = pytest.importorskip("matplotlib.image").imread(png)
    assert image.shape[:2] == (900, 1280), image.shape
    colours, counts = pytest.importorskip("numpy").unique(
        image.reshape(-1, image.shape[2]), axis=0, return_counts=True
    )
    assert len(colours) > 20, f"{png}: {len(colours)} colours"
    assert 1 - counts.max() / counts.sum() > 0.02, f"{png}: almost all one colour"


PAGES = {
    "index": ("/", ["Winners by kernel", "matmul", "0.8125", "2.00×"]),
    "record": ("/ui/records/{matmul}", ["12 trials", 'class="best"', "tolerance 1.0e-04"]),
    "jobs": ("/ui/jobs", ["Job queue", "rmsnorm", "2 / 3"]),
    "docs": ("/docs", ["opblock", "/v1/lookup", "/v1/records/{record_id}"]),
}


@pytest.mark.parametrize("name", PAGES)
def test_chromium_renders_offline(
    name: str, token_server: LiveServer, ids: Ids, chromium: str, artifacts: Path
) -> None:
    """Every page renders in a browser that can reach nothing but this server, requests nothing
    from anywhere else, and logs no error (a resource the CSP blocked would be one); the
    dashboard's pages are opened with ``?token=`` (the cookie path)."""
    path, expected = PAGES[name]
    url = f"{token_server.url}{path.format(**ids)}?token={TEST_TOKEN}"
    seen = visit(chromium, url, artifacts, f"dashboard-{name}")
    for text in expected:
        assert text in seen.dom, (name, text)
    assert "Unable to render" not in seen.dom  # Swagger UI read the OpenAPI document
    assert seen.console == []  # no error, no resource the Content-Security-Policy refused
    assert seen.requests, "the net log recorded none of the page's requests"
    assert [u for u in seen.requests if not u.startswith(token_server.url)] == []
    assert_drawn(seen.screenshot)


def test_the_net_log_sees_a_request_off_the_machine(
    tmp_path: Path, chromium: str, artifacts: Path
) -> None:
    """The check above can fail: a page that loads an image from elsewhere is caught."""
    (tmp_path / "page.html").write_text('<h1>x</h1><img src="http://tunecache-test.invalid/x.png">')
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as local:
        threading.Thread(target=local.serve_forever, daemon=True).start()
        try:
            url = f"http://127.0.0.1:{local.server_address[1]}/page.html"
            seen = visit(chromium, url, tmp_path / "out", "control")
        finally:
            local.shutdown()
    assert "http://tunecache-test.invalid/x.png" in seen.requests


def test_the_templates_are_read_once_with_the_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """A running server whose install was upgraded in place rendered the new ``_pager.html``
    with its old code: every page a 500. The templates are read with the code, so a view reads
    no file (here: opening one fails) and finds every template of the folder."""
    import builtins

    from cache_server.dashboard import templating

    folder = Path(templating.__file__).parent / "templates"
    names = sorted(p.name for p in folder.glob("*.html"))

    def no_file(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a template was read from disk at view time")

    templating.ENV.cache.clear()  # type: ignore[union-attr]
    monkeypatch.setattr(builtins, "open", no_file)
    monkeypatch.setattr(Path, "read_text", no_file)
    assert [templating.ENV.get_template(name).name for name in names] == names
    assert "index.html" in names and "_pager.html" in names


def test_the_jobs_page_tells_the_servers_errors_from_a_workers_and_unrecorded_ones(
    server: LiveServer,
) -> None:
    """A worker's error names its token; the server's own (a last lease run out) names none; an
    error stored before reporters were recorded says so, where it read as the server's."""
    url = server.url
    for m in (601, 602):
        _post(url, "/v1/jobs", {"key": make_key(m=m).to_json(), "max_attempts": 1})
    first = _post(url, "/v1/jobs/claim", {"worker": "w1", "lease_seconds": 0.05}).json()
    _post(url, "/v1/jobs/claim", {"worker": "w2", "lease_seconds": 600})
    time.sleep(0.2)  # the first lease runs out on its last attempt
    assert httpx.post(f"{url}/v1/jobs/claim", json={"worker": "w3"}, headers=AUTH,
                      timeout=30).status_code == 204  # fmt: skip
    jobs = httpx.get(f"{url}/v1/jobs", timeout=30).json()["items"]
    second = next(j for j in jobs if j["id"] != first["id"])
    _post(url, f"/v1/jobs/{second['id']}/fail", {"worker": "w2", "error": "worker's words"})
    html = page(server, "/ui/jobs").text
    assert "reported by token bootstrap:</span> worker&#39;s words" in html
    assert '</td>\n      <td class="error">its worker stopped renewing' in html
    with sqlite3.connect(server.db_path) as db:  # as stored before 0017
        db.execute("update jobs set error_by = null where id = ?", (second["id"],))
    html = page(server, "/ui/jobs").text
    assert "(not recorded):</span> worker&#39;s words" in html


def test_a_record_without_stored_trials_says_why_not_that_they_failed(server: LiveServer) -> None:
    """A snapshot imported back into the server it came from stores trial-less copies; their
    pages said "No trial ran successfully" and "The uploader kept no trials", each false (the
    uploader's record holds them; a newcomer's walk). An upload with no trials keeps its words."""
    from tunecache import Client

    key = make_key(m=72)
    with Client(server.url) as client:
        bare = client.upload(make_record(make_key(m=80), trials=0)).record_id
        first = client.upload(make_record(key, trials=3)).record_id
        document, _ = client.export_snapshot(key.device.arch)
        client.import_snapshot(document)
        copies = [r.id for r in client.list_records(kernel=key.kernel, winners_only=False).items
                  if r.key_hash == key.digest() and r.id != first]  # fmt: skip
    assert copies, "the import stored no copy"
    page = httpx.get(f"{server.url}/ui/records/{copies[0]}", timeout=30).text
    assert "Imported from a snapshot, which carries no trials" in page
    assert "No trial stored: nothing to plot." in page and "ran successfully" not in page
    assert "The uploader kept no trials" not in page
    plain = httpx.get(f"{server.url}/ui/records/{bare}", timeout=30).text
    assert "The uploader kept no trials." in plain and "No trial stored" in plain


def test_inductors_compile_time_timings_are_said_to_be_no_run_time(server: LiveServer) -> None:
    """A built-in Inductor tune stored Inductor's own timings of each choice while compiling
    (16 ms) as its trials, beside the record's 0.04 ms and the default's: records show and the
    record page listed them in one column, 400x slower than the record, unexplained."""
    from tunecache import Client
    from tunecache.measured import BaselineModel

    key = make_key(m=80, backend="inductor")
    record = make_record(key, time_ms=0.04, trials=0)
    compiling = [Trial(config={"mode": "max-autotune", "choice": f"c{i}"}, status="ok",
                       time_ms=ms) for i, ms in enumerate((15.97, 15.99))]  # fmt: skip
    # the default config, timed end to end beside the winner: the last trial, no search's
    default = Trial(config={"mode": "default"}, status="ok", time_ms=0.0422)
    baseline = BaselineModel(name="default_config", timing=make_record(key, time_ms=0.0422).timing)
    search = record.search.model_copy(update={"strategy": "inductor_max_autotune", "trials": 2})
    with Client(server.url) as client:
        stored = client.upload(record.model_copy(update={
            "trials": [*compiling, default], "search": search, "baselines": [baseline]}))  # fmt: skip
    page = html.unescape(httpx.get(f"{server.url}/ui/records/{stored.record_id}", timeout=30).text)
    said = ("he search's timings are Inductor's own, of each choice while compiling (the "
            "fastest, {} ms, is 399x the record's {} ms)")  # fmt: skip
    assert "T" + said.format("15.97", "0.04") in page, page
    shown = subprocess.run([sys.executable, "-m", "tunecache_cli", "records", "show",
                            str(stored.record_id), "--server", server.url], capture_output=True,
                           text=True, timeout=120)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "t" + said.format("16", "0.04") in shown.stdout, shown.stdout
    assert "fastest timing" not in shown.stdout
    # a record of another backend naming Inductor's strategy: its uploader's claim, not said
    tvm = make_record(make_key(m=81), time_ms=0.04, trials=0)
    claimed = tvm.model_copy(update={"search": search, "trials": [
        Trial(config=tvm.config, status="ok", time_ms=15.97)]})  # fmt: skip
    with Client(server.url) as client:
        other = client.upload(claimed).record_id
    assert "Inductor" not in httpx.get(f"{server.url}/ui/records/{other}", timeout=30).text


def test_a_search_timing_far_below_the_records_own_is_explained(server: LiveServer) -> None:
    """A record page's plot said "Best time so far … 4.481e-05 ms at best" of a record timed at
    0.00243 ms (a config timed fast in the search, slower or failing when timed again): it now
    says the search's timings are quick ones and the record's is its re-timed winner's."""
    from tunecache import Client

    record = make_record(make_key(m=88), time_ms=2.0, trials=3)
    quick = [Trial(config={"tile": [1, 8]}, status="ok", time_ms=0.05), *record.trials]
    close = make_record(make_key(m=96), time_ms=2.0, trials=3)  # its trials 2 ms and more
    with Client(server.url) as client:
        fast = client.upload(record.model_copy(update={"trials": quick})).record_id
        plain = client.upload(close).record_id
    page = html.unescape(httpx.get(f"{server.url}/ui/records/{fast}", timeout=30).text)
    assert "The search's fastest timing, 0.05 ms, is below the record's 2 ms" in page
    assert "timed again and validated" in page
    other = httpx.get(f"{server.url}/ui/records/{plain}", timeout=30).text
    assert "fastest timing" not in other and "Best time so far" in other
    for record_id, said in ((fast, True), (plain, False)):  # records show alike
        shown = subprocess.run([sys.executable, "-m", "tunecache_cli", "records", "show",
                                str(record_id), "--server", server.url], capture_output=True,
                               text=True, timeout=120)  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        line = "the search's fastest timing, 0.05 ms, is below the record's 2 ms"
        assert (line in shown.stdout) is said, shown.stdout
