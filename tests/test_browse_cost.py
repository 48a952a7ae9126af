"""What an anonymous page or listing may cost, whatever uploaders stored (a hostile review's
findings): a listing carries each record's worst check, not its 256; a record's page lists its
first trials, not 20,000; the index's filters offer at most ``MAX_CHOICES`` values each, of the
serving policy's winners. A real server on loopback where the pages are read; the filters' query
on a real SQLite database."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from cache_server.dashboard import queries as dashboard_queries
from cache_server.dashboard.pages import TRIALS_SHOWN
from cache_server.dashboard.templating import ENV
from cache_server.db import make_engine, make_sessionmaker
from cache_server.migrate import upgrade
from cache_server.models import VerifiedWinnerRow, WinnerRow
from cache_server.queries import RecordFilters, add_record
from tests.conftest import LiveServer
from tests.factories import AUTH, make_key, make_record
from tunecache.schemas import CheckModel, RecordCreate, Trial, ValidationReport


def _upload(url: str, record: RecordCreate) -> int:
    answer = httpx.post(f"{url}/v1/records", json=record.model_dump(mode="json", by_alias=True),
                        headers=AUTH, timeout=30)  # fmt: skip
    assert answer.status_code == 201, answer.text
    made: int = answer.json()["record_id"]
    return made


def _checked(record: RecordCreate, errors: list[float]) -> RecordCreate:
    """``record`` with one passed check per error, the worst in the middle."""
    problem = dict(record.key.problem)
    checks = [CheckModel(problem=problem, seed=i, rel_error=e, max_abs_error=e, tolerance=1e-4,
                         passed=True, note=f"check {i}") for i, e in enumerate(errors)]  # fmt: skip
    validation = ValidationReport(passed=True, tolerance=1e-4, max_rel_error=max(errors),
                                  checks=checks)  # fmt: skip
    return record.model_copy(update={"validation": validation})


def test_a_listing_carries_each_records_worst_check_and_the_record_every_one(
    server: LiveServer,
) -> None:
    record_id = _upload(server.url, _checked(make_record(make_key(m=48)), [1e-7, 5e-6, 2e-6]))
    listed = httpx.get(f"{server.url}/v1/records", params={"kernel": "matmul"}).json()["items"]
    (item,) = [r for r in listed if r["id"] == record_id]
    assert [c["note"] for c in item["validation"]["checks"]] == ["check 1"]  # the worst
    assert item["validation"]["max_rel_error"] == 5e-6 and item["validation"]["passed"] is True
    whole = httpx.get(f"{server.url}/v1/records/{record_id}").json()
    assert [c["note"] for c in whole["validation"]["checks"]] == ["check 0", "check 1", "check 2"]
    # The dashboard's index reads the same listing, and shows the worst error.
    assert "5.0e-06" in httpx.get(f"{server.url}/", params={"all": "true"}).text


def test_a_record_page_lists_its_first_trials_and_plots_them_all(server: LiveServer) -> None:
    stored = TRIALS_SHOWN + 50
    trials = [Trial(config={"tile_i": i % 7 + 1}, status="ok", time_ms=1.0 + i % 13)
              for i in range(stored)]  # fmt: skip
    record = make_record(make_key(m=80), trials=stored).model_copy(update={"trials": trials})
    record_id = _upload(server.url, record)
    html = httpx.get(f"{server.url}/ui/records/{record_id}", timeout=30).text
    table = html.split('<table class="trials">', 1)[1].split("</table>", 1)[0]
    assert table.count("<tr class=") == TRIALS_SHOWN
    assert f"The first {TRIALS_SHOWN} of {stored} trials" in html
    assert f"{stored} stored." in html
    assert html.count('<circle class="trial"') == stored  # the plot: every one
    assert f'href="/v1/records/{record_id}"' in html
    whole = httpx.get(f"{server.url}/v1/records/{record_id}", timeout=30).json()
    assert len(whole["trials"]) == stored


@pytest.fixture
def sessions(tmp_path: Path) -> Any:
    url = f"sqlite:///{tmp_path}/choices.db"
    upgrade(url)
    engine = make_engine(url)
    yield make_sessionmaker(engine)
    engine.dispose()


def test_the_filters_offer_the_serving_policys_winners_up_to_a_cap(
    sessions: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with sessions.begin() as session:
        for kernel in ("matmul", "softmax", "layernorm"):
            record = make_record(make_key(kernel=kernel))
            add_record(session, key_hash=record.key.digest(), record=record)
    with sessions() as session:
        offered = dashboard_queries.choices(session, WinnerRow)
        assert offered["kernel"] == ["layernorm", "matmul", "softmax"]
        # Pending records: the verified policy serves none, so its filters offer none.
        assert dashboard_queries.choices(session, VerifiedWinnerRow)["kernel"] == []
        monkeypatch.setattr(dashboard_queries, "MAX_CHOICES", 2)
        capped = dashboard_queries.choices(session, WinnerRow)
        assert capped["kernel"] is None and capped["backend"] == ["tvm"]


def test_past_the_cap_a_filter_is_typed_in() -> None:
    html = ENV.get_template("index.html").render(
        root="", request=None, records=[], filters=RecordFilters(kernel="k<1>"), all=False,
        choices={"kernel": None, "backend": ["tvm"], "device_arch": []},
        pages={}, query={},
    )  # fmt: skip
    field = re.search(r'<input type="text" name="kernel"[^>]*>', html)
    assert field is not None and 'value="k&lt;1&gt;"' in field.group(0)
    assert '<select name="backend">' in html and '<select name="kernel">' not in html


def test_a_check_names_only_the_keys_parameters(server: LiveServer) -> None:
    """A record of 256 checks, each of 32 made-up parameters, was 1.75 MB that every listing
    and page read; a check ran the key's kernel, at a problem of the key's parameters."""
    record = make_record(make_key(m=96)).model_dump(mode="json", by_alias=True)
    record["validation"]["checks"][0]["problem"]["p" + "x" * 100] = 64
    answer = httpx.post(f"{server.url}/v1/records", json=record, headers=AUTH, timeout=30)
    assert answer.status_code == 422
    assert "problem does not have: p" + "x" * 100 in answer.text
    listed = httpx.get(f"{server.url}/v1/records", params={"kernel": "matmul"}).json()
    assert listed["count"] == 0  # nothing stored
