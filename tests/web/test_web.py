"""The web viewer through Flask's test client (on SQLite and PostgreSQL): every route, its
JSON twin, filters, sorting and pages, hostile model output shown as text, 404/400/410/500
pages, blob reads per page, and proof that no route changes the pool.  Also the pure
presentation helpers, `Archive.load_sample`, and ``archive-manager serve`` as a real
process."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import torch
from click.testing import CliRunner
from helpers import BACKENDS, Backend, BlobFiles, canon, small_rollout, snapshot_pool, tiny_rollout
from markupsafe import escape

import archive_manager
from archive_manager import ArchiveManager, Sample, TensorRef
from archive_manager.cli import cli
from archive_manager.errors import InvalidInputError
from archive_manager.lens.stats import RolloutStats

flask = pytest.importorskip("flask", reason="the web extra is not installed")

from archive_manager.web import create_app, startup_line  # noqa: E402
from archive_manager.web.charts import (  # noqa: E402
    MAX_POINTS,
    Series,
    drift_charts,
    line_chart,
    logprob_chart,
    mask_runs,
    nice_ticks,
)
from archive_manager.web.present import jsonable, sample_view  # noqa: E402
from archive_manager.web.server import is_loopback  # noqa: E402

HOSTILE_NAME = "<i onmouseover=alert(1)>\"x\"&'y'"
HOSTILE_RESPONSE = "<script>alert('xss')</script><b>bold</b> & done"
HOSTILE_PROMPT = '<img src=x onerror="alert(2)">'
HOSTILE_TASK = "<svg onload=alert(3)>"
HOSTILE_STATUS = "<b>odd</b>"
HOSTILE_KEY = "</pre><script>alert(4)</script>"
#: Raw fragments that must never reach a page unescaped.
RAW = ["<script>alert", "<img src=x", "<svg onload", "<b>odd", "<i onmouseover", "<b>bold"]

# --------------------------------------------------------------------------- the pool


def _fill(pool: ArchiveManager) -> None:
    train = tiny_rollout(10, seed=1, rollout_id=1)
    train[2].status = Sample.Status.TRUNCATED
    train[5].status = Sample.Status.ABORTED
    train[7].reward = None
    train[3].loss_mask = [1, 0, 0] + [1] * (train[3].response_length - 3)
    pool.save("train-1", train, rollout_id=1)
    pool.save("train-2", tiny_rollout(6, seed=2, rollout_id=2), rollout_id=2)
    pool.save("eval-2", tiny_rollout(4, seed=3, rollout_id=2), rollout_id=2, evaluation=True)
    pool.save("old-0", tiny_rollout(4, seed=4, rollout_id=0), rollout_id=0)
    pool.open_archive("old-0").release()
    hostile = tiny_rollout(3, seed=5, rollout_id=3, as_dict=True)
    hostile[0].update(
        response=HOSTILE_RESPONSE,
        prompt=[{"role": "user", "content": HOSTILE_PROMPT}],
        metadata={HOSTILE_KEY: HOSTILE_KEY},
        status=HOSTILE_STATUS,
        label=HOSTILE_KEY,
    )
    pool.save(HOSTILE_NAME, hostile, rollout_id=3, task_keys=[HOSTILE_TASK] * 3)


@pytest.fixture(scope="module", params=BACKENDS)
def viewer_pool(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ArchiveManager]:
    """A pool holding training, evaluation, released and hostile archives (tensors of more
    than 256 bytes are blobs of their own), on each backend; shared by the tests of this
    module, which only read it."""
    server = request.getfixturevalue("pg_server") if request.param == "postgresql" else None
    backend = Backend(request.param, server)
    root = tmp_path_factory.mktemp("viewer") / "pool"
    pool = ArchiveManager.open(root, catalog_url=backend.url(root), inline_limit=256)
    try:
        _fill(pool)
        yield pool
    finally:
        pool.close()
        backend.close()


@pytest.fixture
def own_viewer_pool(open_pool: Callable[..., ArchiveManager]) -> ArchiveManager:
    """The same pool, for one test that changes it."""
    pool = open_pool(inline_limit=256)
    _fill(pool)
    return pool


@pytest.fixture
def client(viewer_pool: ArchiveManager) -> Any:
    return create_app(viewer_pool).test_client()


def get(client: Any, url: str, status: int = 200) -> Any:
    response = client.get(url)
    # Buffered, then closed: a static file's response holds the file open until closed.
    response.get_data()
    response.close()
    assert response.status_code == status, (url, response.status_code, response.text[:500])
    return response


def get_json(client: Any, url: str, status: int = 200) -> Any:
    response = get(client, url, status)
    assert response.mimetype == "application/json"
    return response.get_json()


def archive_url(name: str, *rest: str) -> str:
    return "/".join(["/archive", urllib.parse.quote(name, safe=""), *rest])


class BlobReads:
    """Counts the blob store's reads of one pool (chunks through get or get_view, tensors
    through open or open_private: a blob is read in place where the store can map it)."""

    def __init__(self, pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch) -> None:
        self.get: list[str] = []
        self.open: list[str] = []
        inside: list[str] = []  # a store's get_view or open_private may read through get/open
        for method, log in (
            ("get", self.get),
            ("get_view", self.get),
            ("open", self.open),
            ("open_private", self.open),
        ):
            real = getattr(pool.store, method)

            def counted(digest: str, *a: Any, _real: Any = real, _log: Any = log, **k: Any) -> Any:
                if not inside:
                    _log.append(digest)
                inside.append(digest)
                try:
                    return _real(digest, *a, **k)
                finally:
                    inside.pop()

            monkeypatch.setattr(pool.store, method, counted)

    def reset(self) -> None:
        self.get.clear()
        self.open.clear()


# --------------------------------------------------------------------------- pages


def test_pool_page_lists_archives_with_owners_and_draws_the_charts(
    client: Any, viewer_pool: ArchiveManager
) -> None:
    html = get(client, "/").text
    for name in ("train-1", "train-2", "eval-2", "old-0"):
        assert f">{name}</a>" in html
    assert "archive:train-1" in html  # owners
    assert 'class="state released"' in html
    assert html.count("<svg") == 3 and "Reward by rollout" in html
    assert "Response length by rollout" in html and "Truncated share by rollout" in html
    assert "<polyline" in html
    data = get_json(client, "/?format=json")
    names = [a["name"] for a in data["archives"]]
    # By rollout id, then name; released archives are listed (their rows stay).
    assert names == ["old-0", "train-1", "eval-2", "train-2", HOSTILE_NAME]
    by_name = {a["name"]: a for a in data["archives"]}
    assert by_name["train-1"]["owners"] == ["archive:train-1"]
    assert by_name["old-0"]["owners"] == [] and by_name["old-0"]["state"] == "released"
    assert by_name["train-1"]["samples"] == 10 and by_name["train-1"]["chunks"] >= 1
    created = datetime.fromisoformat(by_name["train-1"]["created_at"])
    assert created == viewer_pool.open_archive("train-1").info().created_at
    assert data["total"] == 5
    assert [(r["rollout_id"], r["evaluation"]) for r in data["stats"]] == [
        (0, False),
        (1, False),
        (2, False),
        (2, True),
        (3, False),
    ]
    assert data["pool"]["archives"] == {"published": 4, "released": 1}


def test_pool_page_filters_and_pages(client: Any) -> None:
    names = lambda url: [a["name"] for a in get_json(client, url)["archives"]]  # noqa: E731
    assert names("/?format=json&state=released") == ["old-0"]
    assert names("/?format=json&state=published&evaluation=yes") == ["eval-2"]
    assert names("/?format=json&rollout_id=1..2&evaluation=no") == ["train-1", "train-2"]
    assert names("/?format=json&rollout_id=3") == [HOSTILE_NAME]
    assert names("/?format=json&per_page=2&page=2") == ["eval-2", "train-2"]
    assert names("/?format=json&per_page=2&page=9") == []
    stats = get_json(client, "/?format=json&rollout_id=2..&evaluation=yes")["stats"]
    assert [(r["rollout_id"], r["evaluation"]) for r in stats] == [(2, True)]
    html = get(client, "/?per_page=2&page=2").text
    assert "page 2 of 3" in html and 'rel="next"' in html and 'rel="prev"' in html
    # The statistics table holds the rollouts of the archives listed (eval-2 and train-2:
    # rollout 2, evaluation and training), and links to all of them.
    assert "Statistics of the rollouts on this page (2 of 5 rows;" in html
    table = html.split('<table class="data stats">')[1].split("</table>")[0]
    assert table.count("<tr><td") == 2
    assert 'href="/stats"' in html


def test_stats_page_and_json(client: Any, viewer_pool: ArchiveManager) -> None:
    every = jsonable([r.as_dict() for r in viewer_pool.stats()])
    assert get_json(client, "/stats?format=json") == {
        "per_page": 100,
        "after": None,
        "next_after": None,
        "stats": every,
    }
    assert get_json(client, "/stats?format=json&rollout_id=..1")["stats"] == jsonable(
        [r.as_dict() for r in viewer_pool.stats((None, 1))]
    )
    html = get(client, "/stats").text
    assert html.count("<svg") == 3 and "1 released" in html
    assert 'rel="next"' not in html and "« first" not in html


def test_stats_page_and_json_page_by_keyset(client: Any, viewer_pool: ArchiveManager) -> None:
    every = jsonable([r.as_dict() for r in viewer_pool.stats()])
    for size in (1, 2, 3):
        seen: list[Any] = []
        url = f"/stats?format=json&per_page={size}"
        while True:
            data = get_json(client, url)
            assert len(data["stats"]) <= size and data["per_page"] == size
            seen += data["stats"]
            if data["next_after"] is None:
                break
            url = f"/stats?format=json&per_page={size}&after={quote(data['next_after'])}"
        assert seen == every
    # Rows 0, 1 | 2 training, 2 evaluation | 3: the keys name the last row of each page.
    first = get_json(client, "/stats?format=json&per_page=2")
    assert first["next_after"] == "1:training"
    second = get_json(client, "/stats?format=json&per_page=2&after=1:training")
    assert second["after"] == "1:training" and second["next_after"] == "2:evaluation"
    assert [(r["rollout_id"], r["evaluation"]) for r in second["stats"]] == [(2, False), (2, True)]
    only_eval = get_json(client, "/stats?format=json&evaluation=yes&after=1:evaluation")
    assert [(r["rollout_id"], r["evaluation"]) for r in only_eval["stats"]] == [(2, True)]
    assert get_json(client, "/stats?format=json&after=none:training")["stats"] == []
    # The page's table holds its rows; its charts still draw every rollout.
    html = get(client, "/stats?per_page=2").text
    table = html.split('<table class="data stats">')[1].split("</table>")[0]
    assert table.count("<tr><td") == 2 and html.count("<svg") == 3
    assert 'rel="next"' in html and "after=1:training" in html and "« first" not in html
    last = get(client, "/stats?per_page=2&after=2:evaluation").text
    table = last.split('<table class="data stats">')[1].split("</table>")[0]
    assert table.count("<tr><td") == 1 and 'rel="next"' not in last and "« first" in last


def test_pool_page_json_holds_the_stats_of_its_archives(
    client: Any, viewer_pool: ArchiveManager
) -> None:
    rows = {(r.rollout_id, r.evaluation): r.as_dict() for r in viewer_pool.stats()}
    for query, keys in (
        ("per_page=2", [(0, False), (1, False)]),  # old-0, train-1
        ("per_page=2&page=2&after=train-1", [(2, False), (2, True)]),  # eval-2, train-2
        ("evaluation=no&rollout_id=2..", [(2, False), (3, False)]),
        ("per_page=2&page=4&after=" + quote(HOSTILE_NAME), []),
    ):
        data = get_json(client, "/?format=json&" + query)
        assert data["stats"] == jsonable([rows[k] for k in keys]), query


def test_archive_page_filters_sorts_and_pages(client: Any, viewer_pool: ArchiveManager) -> None:
    url = archive_url("train-1")
    html = get(client, url).text
    assert "Archive <span" in html and "archive:train-1" in html
    assert html.count('class="sample-link"') == 10
    data = get_json(client, url + "?format=json")
    assert data["total"] == 10 and [s["position"] for s in data["samples"]] == list(range(10))
    assert datetime.fromisoformat(data["archive"]["published_at"]) is not None
    assert data["archive"]["owners"] == ["archive:train-1"]
    assert data["summary"]["status"]["truncated"] >= 1
    keys = viewer_pool.open_archive("train-1").keys()
    assert [(s["sample_key"], s["task_key"]) for s in data["samples"]] == keys

    truncated = get_json(client, url + "?format=json&status=truncated")
    meta = viewer_pool.open_archive("train-1").sample_metadata()
    expected = [i for i, d in enumerate(meta) if d["status"] == "truncated"]
    assert [s["position"] for s in truncated["samples"]] == expected
    assert truncated["total"] == len(expected)
    both = get_json(client, url + "?format=json&status=truncated&status=aborted")
    assert {s["status"] for s in both["samples"]} == {"truncated", "aborted"}

    by_reward = get_json(client, url + "?format=json&sort=reward&order=desc")["samples"]
    rewards = [s["reward"] for s in by_reward]
    assert rewards[-1] is None  # a missing reward sorts last, both ways
    assert rewards[:-1] == sorted(rewards[:-1], reverse=True)
    ascending = get_json(client, url + "?format=json&sort=reward")["samples"]
    assert ascending[-1]["reward"] is None
    by_length = get_json(client, url + "?format=json&sort=response_length")["samples"]
    lengths = [s["response_length"] for s in by_length]
    assert lengths == sorted(lengths)
    long = get_json(client, url + f"?format=json&min_length={lengths[5]}")["samples"]
    assert all(s["response_length"] >= lengths[5] for s in long)
    rich = get_json(client, url + "?format=json&min_reward=0.5&max_reward=1")["samples"]
    assert all(0.5 <= s["reward"] <= 1 for s in rich)
    task = keys[0][1]
    assert {
        s["task_key"] for s in get_json(client, url + f"?format=json&task_key={task}")["samples"]
    } == {task}

    paged = get_json(client, url + "?format=json&per_page=3&page=4")
    assert [s["position"] for s in paged["samples"]] == [9] and paged["total"] == 10
    html = get(client, url + "?status=truncated&per_page=1").text
    # The pager keeps the filter.
    assert re.search(r'href="[^"]*status=truncated[^"]*page=2', html)
    assert "selected>truncated" in html.replace('"', "").replace(" selected", "selected")


def test_sample_page_shows_texts_tokens_logprobs_and_tensor_shapes(
    client: Any, viewer_pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    arc = viewer_pool.open_archive("train-1")
    sample = arc.load_samples()[3]
    reads = BlobReads(viewer_pool, monkeypatch)
    html = get(client, archive_url("train-1", "sample", "3")).text
    # Only the chunk holding the sample is read; its tensor blob stays unread.
    assert len(reads.get) == 1 and reads.open == []
    assert reads.get[0] == arc.chunks()[0]["digest"]
    assert sample.response in html and sample.prompt in html
    length = sample.response_length
    tokens = html[html.index('id="tokens"') :]
    tokens = tokens[: tokens.index("</div>")]
    assert tokens.count('class="tok m1"') == length - 2
    assert tokens.count('class="tok m0"') == 2
    assert f"{length - 2} of {length} tokens" in html
    chart = html[html.index('id="logprob-chart"') :]
    assert "<polyline" in chart and 'class="band"' in chart  # the untrained tokens are shaded
    tensor = sample.rollout_routed_experts
    assert f"{list(tensor.shape)}" in html and "int32" in html and "1 tensor blob" in html
    assert "rollout_routed_experts" in html
    assert f"<dd>{sample.index}</dd>" in html
    assert 'rel="prev"' in html and 'rel="next"' in html

    data = get_json(client, archive_url("train-1", "sample", "3") + "?format=json")
    assert data["sample_key"] == "sample:3" and data["class"] == "archive_manager.Sample"
    assert data["fields"]["tokens"] == sample.tokens
    assert data["fields"]["rollout_routed_experts"] == {"tensor": f"int32{list(tensor.shape)}"}
    assert data["catalog"] == arc.sample_metadata()[3]


def test_tensor_summary_is_loaded_on_demand(
    client: Any, viewer_pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    sample = viewer_pool.open_archive("train-1").load_samples()[1]
    tensor = sample.rollout_routed_experts
    assert isinstance(tensor, TensorRef)
    tensor = tensor.materialize()
    reads = BlobReads(viewer_pool, monkeypatch)
    url = archive_url("train-1", "sample", "1", "tensor", "rollout_routed_experts")
    data = get_json(client, url + "?format=json")
    assert len(reads.open) == 1  # now, and only now, its blob is read
    assert data["shape"] == list(tensor.shape) and data["dtype"] == "int32"
    assert data["min"] == tensor.min().item() and data["max"] == tensor.max().item()
    assert data["first"] == tensor.reshape(-1)[:64].tolist()
    assert "rollout_routed_experts" in get(client, url).text
    for field in ("nope", "prompt", "tokens"):
        error = get_json(
            client, archive_url("train-1", "sample", "1", "tensor", field) + "?format=json", 404
        )
        assert field in error["error"]


def test_all_tokens_on_request(viewer_pool: ArchiveManager) -> None:
    sample = viewer_pool.open_archive("train-1").load_samples()[0]
    view = sample_view(sample, tokens=3)
    assert len(view.tokens) == 3 and view.tokens_hidden == sample.response_length - 3
    assert [c.token for c in view.tokens] == sample.tokens[-sample.response_length :][:3]
    assert [c.log_prob for c in view.tokens] == sample.rollout_log_probs[:3]
    full = sample_view(sample, tokens=None)
    assert len(full.tokens) == sample.response_length and full.tokens_hidden == 0


def test_hostile_text_is_shown_as_text(client: Any, viewer_pool: ArchiveManager) -> None:
    pages = [
        "/",
        "/stats",
        archive_url(HOSTILE_NAME),
        archive_url(HOSTILE_NAME) + "?status=" + HOSTILE_STATUS,
        archive_url(HOSTILE_NAME, "sample", "0"),
        archive_url(HOSTILE_NAME, "sample", "0", "tensor", "rollout_routed_experts"),
        archive_url(HOSTILE_NAME, "sample", "0", "tensor", HOSTILE_KEY.replace("/", "")),
        archive_url(HOSTILE_NAME + "<script>"),
        # Markdown rendered on the server (raw HTML off), the group, compare and search pages.
        archive_url(HOSTILE_NAME, "sample", "0") + "?view=markdown",
        archive_url(HOSTILE_NAME, "group") + "?view=markdown&task_key=" + quote(HOSTILE_TASK),
        archive_url(HOSTILE_NAME, "groups"),
        "/prompt?task_key=" + quote(HOSTILE_TASK),
        "/compare?view=markdown&a_position=0&b_position=1&a="
        + quote(HOSTILE_NAME)
        + "&b="
        + quote(HOSTILE_NAME),
        "/search?fields=response&q=" + quote("<script>alert"),
        "/search?q=" + quote(HOSTILE_PROMPT) + "&regex=0",
    ]
    for url in pages:
        response = client.get(url)
        assert response.status_code in (200, 404), url
        for raw in RAW:
            assert raw not in response.text, (url, raw)
        assert "Content-Security-Policy" in response.headers
        assert "script-src 'self'" in response.headers["Content-Security-Policy"]
    sample_page = get(client, archive_url(HOSTILE_NAME, "sample", "0")).text
    assert (
        "&lt;script&gt;alert(&#39;xss&#39;)&lt;/script&gt;&lt;b&gt;bold&lt;/b&gt; &amp; done"
        in sample_page
    )
    assert "&lt;img src=x onerror=&#34;alert(2)&#34;&gt;" in sample_page
    assert "&lt;svg onload=alert(3)&gt;" in sample_page
    assert "&lt;/pre&gt;&lt;script&gt;alert(4)&lt;/script&gt;" in sample_page
    assert "&lt;b&gt;odd&lt;/b&gt;" in sample_page
    assert "&lt;i onmouseover=alert(1)&gt;" in get(client, "/").text
    # The JSON twin carries the text unchanged (JSON is not HTML).
    data = get_json(client, archive_url(HOSTILE_NAME, "sample", "0") + "?format=json")
    assert data["fields"]["response"] == HOSTILE_RESPONSE
    assert data["task_key"] == HOSTILE_TASK


def test_unknown_archive_position_and_route_are_clear_404s(client: Any) -> None:
    cases = {
        archive_url("nope"): "archive 'nope' not found",
        archive_url("pending..name"): "..",
        archive_url("train-1", "sample", "10"): "no sample at position 10",
        archive_url("train-1", "sample", str(10**30)): "no sample at position",
        archive_url("nope", "sample", "0"): "archive 'nope' not found",
        archive_url("train-1", "sample", "-1"): "not found on the server",
        "/no/such/page": "not found on the server",
    }
    for url, message in cases.items():
        html = get(client, url, 404).text
        assert "404" in html and str(escape(message)) in html, url
        assert "Traceback" not in html
        error = get_json(client, url + "?format=json", 404)
        assert error["status"] == 404 and message in error["error"]


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("page=x", "'page'"),
        ("page=0", "'page'"),
        ("per_page=5000", "'per_page'"),
        ("min_reward=abc", "'min_reward'"),
        ("min_reward=nan", "'min_reward'"),
        ("max_length=-3", "'max_length'"),
        ("sort=evil", "'sort'"),
        ("order=up", "'order'"),
        ("format=xml", "'format'"),
        ("task_key=" + "k" * 300, "'task_key'"),
    ],
)
def test_bad_parameters_are_clear_400s(client: Any, query: str, message: str) -> None:
    response = get(client, archive_url("train-1") + "?" + query, 400)
    assert str(escape(message)) in response.text and "Traceback" not in response.text
    if "format=" not in query:
        error = get_json(client, archive_url("train-1") + "?format=json&" + query, 400)
        assert message in error["error"] and error["status"] == 400


@pytest.mark.parametrize(
    "query", ["rollout_id=x", "rollout_id=5..1", "rollout_id=..", "evaluation=maybe"]
)
def test_bad_pool_and_stats_parameters(client: Any, query: str) -> None:
    assert "bad query parameter" in get(client, "/?" + query, 400).text
    error = get_json(client, "/stats?format=json&" + query, 400)
    assert "bad query parameter" in error["error"]
    assert str(escape("'state'")) in get(client, "/?state=all", 400).text


@pytest.mark.parametrize(
    "query",
    [
        "after=x",
        "after=1",
        "after=1:maybe",
        "after=abc:training",
        "after=:training",
        f"after={2**63}:evaluation",
        "after=1:training" + "0" * 300,
        "per_page=0",
        "per_page=5000",
        "per_page=x",
    ],
)
def test_bad_stats_paging_parameters(client: Any, query: str) -> None:
    name = query.split("=")[0]
    assert str(escape(f"'{name}'")) in get(client, "/stats?" + query, 400).text
    error = get_json(client, "/stats?format=json&" + query, 400)
    assert f"'{name}'" in error["error"] and error["status"] == 400


def test_released_and_reclaimed_archive_is_a_410_and_damage_a_500(
    own_viewer_pool: ArchiveManager, blob_files_of: Callable[[ArchiveManager], BlobFiles]
) -> None:
    viewer_pool = own_viewer_pool
    client = create_app(viewer_pool).test_client()
    viewer_pool.gc(grace=timedelta(0))
    old = get(client, archive_url("old-0"))  # the catalog rows stay
    assert "released" in old.text
    gone = get(client, archive_url("old-0", "sample", "0"), 410)
    assert "was released" in gone.text and "reclaimed" in gone.text
    blobs = blob_files_of(viewer_pool)
    blobs.flip_bit(blobs.chunks("train-2")[0])
    damaged = get(client, archive_url("train-2", "sample", "0"), 500)
    assert "Damaged data" in damaged.text and blobs.chunks("train-2")[0] in damaged.text
    assert "Traceback" not in damaged.text


def test_no_route_changes_the_pool(
    client: Any, viewer_pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = client.application
    for rule in app.url_map.iter_rules():
        assert rule.methods <= {"GET", "HEAD", "OPTIONS"}, rule
    before = snapshot_pool(viewer_pool)
    files_before = _file_hashes(viewer_pool.root)
    reads = BlobReads(viewer_pool, monkeypatch)
    for url in (
        "/",
        "/stats",
        "/?format=json",
        "/stats?format=json",
        "/stats?per_page=2&after=1:training",
        "/stats?format=json&per_page=1&after=2:training&evaluation=yes",
        "/?format=json&per_page=2&page=2&after=train-1",
    ):
        get(client, url)
    for name in ("train-1", "eval-2", "old-0", HOSTILE_NAME):
        get(client, archive_url(name))
        get(client, archive_url(name) + "?format=json&status=completed&sort=reward")
    assert reads.get == [] and reads.open == []  # listings read the catalog only
    for name, size in (("train-1", 10), ("eval-2", 4), (HOSTILE_NAME, 3)):
        for position in range(size):
            reads.reset()
            get(client, archive_url(name, "sample", str(position)))
            assert len(reads.get) == 1 and reads.open == []  # one chunk per sample page
            get(client, archive_url(name, "sample", str(position)) + "?format=json&tokens=all")
            get(
                client,
                archive_url(name, "sample", str(position), "tensor", "rollout_routed_experts"),
            )
    # The RL lens's pages: groups, prompt histories, search, compare, Markdown.
    task = viewer_pool.open_archive("train-1").keys()[0][1]
    assert task is not None
    for url in (
        archive_url("train-1", "group") + "?task_key=" + quote(task),
        archive_url("train-1", "group") + "?view=markdown&format=json&task_key=" + quote(task),
        archive_url("train-1", "groups"),
        archive_url("train-1", "groups") + "?format=json&sort=task_key",
        "/prompt?task_key=" + quote(task),
        "/prompt?format=json&task_key=" + quote(task),
        "/search",
        "/search?q=the&fields=all",
        "/search?q=th.&regex=1&format=json&case=ignore&limit=1000",
        "/compare?a=train-1&a_position=0&b=train-2&b_position=1",
        "/compare?a=train-1&a_position=0&b=eval-2&b_position=1&view=markdown&format=json",
        archive_url("train-1", "sample", "1") + "?view=markdown",
    ):
        get(client, url)
    for method in (client.post, client.put, client.delete, client.patch):
        for url in (
            "/",
            archive_url("train-1"),
            archive_url("train-1", "sample", "0"),
            "/search?q=the",
            "/compare?a=train-1&a_position=0&b=train-2&b_position=1",
        ):
            assert method(url).status_code == 405
    assert snapshot_pool(viewer_pool) == before
    assert _file_hashes(viewer_pool.root) == files_before


def _file_hashes(root: Path) -> dict[str, str]:
    # The -shm file is SQLite's shared-memory index: readers update it, it holds no data.
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.endswith("-shm")
    }


def test_static_files_ship_in_the_package(client: Any) -> None:
    css = get(client, "/static/viewer.css")
    assert css.mimetype == "text/css" and ".tok.m1" in css.text
    assert "tensor-load" in get(client, "/static/viewer.js").text
    html = get(client, "/").text
    assert "http://" not in html.split("<main>")[0] and "https://" not in html  # no CDN
    # No request becomes a path outside the package's static folder.
    for url in ("/static/../app.py", "/static/..%2Fapp.py", "/static/%2e%2e/%2e%2e/catalog.db"):
        assert get(client, url, 404).status_code == 404, url


# --------------------------------------------------------------------------- pure helpers


def test_jsonable_describes_tensors_without_loading_them() -> None:
    ref = TensorRef("0" * 32, torch.int32, [3, 4], 48)  # no loader: loading would raise
    value = {
        "t": torch.zeros(2, dtype=torch.bfloat16),
        "ref": ref,
        "nan": float("nan"),
        "status": Sample.Status.TRUNCATED,
        "nested": [1, (2.5, None)],
    }
    assert jsonable(value) == {
        "t": {"tensor": "bfloat16[2]"},
        "ref": {"tensor": "int32[3, 4]"},
        "nan": "nan",
        "status": "truncated",
        "nested": [1, [2.5, None]],
    }
    assert jsonable(list(range(40)), preview=3) == [0, 1, 2, "… 37 more"]
    assert not ref.loaded


def test_chart_geometry() -> None:
    assert nice_ticks(0, 1, 4) == pytest.approx([0, 0.25, 0.5, 0.75, 1.0])
    assert nice_ticks(-3.2, 7, 5) == pytest.approx([-2, 0, 2, 4, 6])
    assert nice_ticks(1400, 4200, 4) == [2000, 3000, 4000]
    assert nice_ticks(1400, 4200, 6) == [1500, 2000, 2500, 3000, 3500, 4000]
    assert nice_ticks(3, 3) == [3]
    assert mask_runs([1, 1, 0, 0, 0, 1]) == [(1, 0, 2), (0, 2, 5), (1, 5, 6)]
    assert mask_runs([]) == []
    chart = line_chart("t", [Series("a", [0, 1, 2, 3], [1.0, None, 2.0, 3.0])])
    (line,) = chart.lines
    assert len(line.segments) == 2 and len(line.dots) == 3  # the gap breaks the line
    assert all(
        chart.left <= d.x <= chart.right and chart.top <= d.y <= chart.bottom for d in line.dots
    )
    empty = line_chart("t", [Series("a", [0], [None])], empty="nothing here")
    assert empty.empty == "nothing here" and empty.lines == []
    long = logprob_chart([-0.1] * 5000, [1] * 2500 + [0] * 2500)
    assert len(long.lines) == 2  # bucket means and minima
    assert len(long.lines[0].segments[0].split()) <= MAX_POINTS
    assert len(long.bands) == 1 and long.lines[0].dots == []


def test_drift_charts_split_training_and_evaluation(viewer_pool: ArchiveManager) -> None:
    reward, length, truncated = drift_charts(viewer_pool.stats())
    assert [s[0] for s in reward.legend] == [
        "training mean",
        "training p50",
        "training p90",
        "evaluation mean",
        "evaluation p50",
        "evaluation p90",
    ]
    assert [s[0] for s in truncated.legend] == ["training", "evaluation"]
    assert not length.empty
    assert drift_charts([])[0].empty


def _rollout(rollout_id: int, truncated: int | None, evaluation: bool = False) -> RolloutStats:
    """A rollout of 4 samples, ``truncated`` of them truncated (None: no sample at all)."""
    status = () if truncated is None else (("completed", 4 - truncated), ("truncated", truncated))
    return RolloutStats(
        rollout_id=rollout_id,
        evaluation=evaluation,
        archives=1,
        released=0,
        samples=0 if truncated is None else 4,
        bytes=10,
        rewarded=4,
        reward_mean=1.0,
        reward_p50=1.0,
        reward_p90=1.0,
        length_mean=5.0,
        length_p90=6.0,
        status=tuple((s, n) for s, n in status if n),
    )


def test_drift_charts_of_many_rollouts_draw_runs_of_them() -> None:
    """Past MAX_POINTS rollouts a point is the mean of a run of consecutive rollouts: the
    SVG stays small at 10,000 rollouts and the titles say so."""
    rows = [_rollout(i, i % 3 if i != 4 else None) for i in range(3 * MAX_POINTS + 1)]
    rows.append(_rollout(7, 1, evaluation=True))
    reward, length, truncated = drift_charts(rows)
    assert reward.title == "Reward by rollout (means of up to 4 rollouts a point)"
    assert length.title.endswith("(means of up to 4 rollouts a point)")
    assert truncated.title.endswith("(means of up to 4 rollouts a point)")
    training = truncated.lines[0]
    assert training.label == "training"
    points = [p.split(",") for p in " ".join(training.segments).split()]
    assert len(points) == math.ceil((3 * MAX_POINTS + 1) / 4)
    # The share axis is 0..1.  Rollouts 0-3 have truncated shares 0, 1/4, 2/4, 0: mean
    # 0.1875; rollouts 4-7 skip rollout 4, which has no sample: (2/4 + 0 + 1/4) / 3 = 0.25.
    c = truncated
    for (x, y), first, share in zip(points, (0, 4), (0.1875, 0.25), strict=False):
        assert float(y) == round(c.bottom - share * (c.bottom - c.top), 1)
        assert float(x) == round(c.left + first / (3 * MAX_POINTS) * (c.right - c.left), 1)
    assert truncated.lines[1].label == "evaluation" and truncated.lines[1].dots  # one point
    assert drift_charts(rows[:10])[0].title == "Reward by rollout"


# --------------------------------------------------------------------------- Archive.load_sample


def test_load_sample_reads_one_chunk(
    open_pool: Callable[..., ArchiveManager], monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = open_pool(chunk_size=4)
    samples = tiny_rollout(10, seed=8)
    arc = pool.save("a", samples, rollout_id=0)
    everything = arc.load_samples()
    reads = BlobReads(pool, monkeypatch)
    for position in range(10):
        reads.reset()
        assert canon(arc.load_sample(position)) == canon(everything[position])
        assert reads.get == [arc.chunks()[position // 4]["digest"]]
    for bad in (10, -1, 2**40):
        with pytest.raises(IndexError, match=f"no sample at position {bad}"):
            arc.load_sample(bad)
    for wrong in ("1", 1.0, True, None):
        with pytest.raises(InvalidInputError):
            arc.load_sample(wrong)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- serve


def test_startup_line_names_the_address_and_who_can_reach_it(tmp_path: Path) -> None:
    with ArchiveManager.open(tmp_path / "p") as pool:
        local = startup_line(pool, "127.0.0.1", 8123)
        assert "http://127.0.0.1:8123/" in local and "this machine only" in local
        assert "read-only" in local and "werkzeug" in local
        shared = startup_line(pool, "0.0.0.0", 80)
        assert "bound to 0.0.0.0" in shared and "no authentication" in shared
        assert "http://[::1]:9/" in startup_line(pool, "::1", 9)
    assert is_loopback("127.0.0.1") and is_loopback("127.8.9.10") and is_loopback("::1")
    assert is_loopback("localhost") and not is_loopback("0.0.0.0") and not is_loopback("a.b")


def test_serve_reports_a_busy_port_in_one_line(tmp_path: Path) -> None:
    ArchiveManager.open(tmp_path / "p").close()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = CliRunner().invoke(
            cli, ["--root", str(tmp_path / "p"), "serve", "--port", str(port)]
        )
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: cannot listen on 127.0.0.1:{port}")
    assert len(result.stderr.strip().splitlines()) == 1


def test_serve_without_flask_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ArchiveManager.open(tmp_path / "p").close()
    for module in list(sys.modules):
        if module == "archive_manager.web" or module.startswith("archive_manager.web."):
            monkeypatch.delitem(sys.modules, module)
    monkeypatch.setitem(sys.modules, "flask", None)
    result = CliRunner().invoke(cli, ["--root", str(tmp_path / "p"), "serve"])
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        "error: the web viewer needs Flask, which is not installed; install the 'web' extra: "
        "pip install -e '.[web]' in a checkout of archive_manager (or pip install "
        "'rollout-archive-manager[web]' where that distribution is installed)"
    )


def _server_env() -> dict[str, str]:
    # The checkout the tests import, first on the path of the child (an editable install may
    # point elsewhere); none of the caller's pool settings leak in.
    source = str(Path(archive_manager.__file__).resolve().parents[1])
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARCHIVE_MANAGER_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [source, env.get("PYTHONPATH")]))
    return env


@contextlib.contextmanager
def running_server(root: Path, *options: str) -> Iterator[tuple[str, str]]:
    """``archive-manager --root ROOT serve --port 0 [OPTIONS]`` as a real process: yields its
    base URL and its startup line once it answers; killed at exit."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "archive_manager.cli",
            "--root",
            str(root),
            "serve",
            "--port",
            "0",
            *options,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_server_env(),
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        match = re.search(r" at (http://127\.0\.0\.1:\d+/) ", line)
        if match is None:
            proc.kill()
            raise AssertionError(f"no startup line: {line!r} {proc.communicate()[1][-2000:]}")
        url = match.group(1)
        with urllib.request.urlopen(url, timeout=30) as response:  # it answers
            assert response.status == 200
        yield url, line
    finally:
        proc.kill()
        proc.wait(timeout=30)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_serve_as_a_real_process(tmp_path: Path) -> None:
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        pool.save("r-1", tiny_rollout(4, seed=1, rollout_id=1), rollout_id=1)
    with running_server(root) as (url, line):
        assert "bound to 127.0.0.1: this machine only" in line
        with urllib.request.urlopen(url + "archive/r-1?format=json", timeout=30) as response:
            data = json.load(response)
        assert data["total"] == 4
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(url + "archive/missing", timeout=30)
        info.value.close()  # the error holds the response (and its socket) open
        assert info.value.code == 404


# --------------------------------------------------------------------------- host names


#: Host headers a page of another site makes a browser send once its name points here.
FOREIGN_HOSTS = [
    "evil.example",
    "evil.example:8000",
    "localhost.evil.example",
    "127.0.0.1.evil.example",
    "127.0.0.1:8000@evil.example",
    "[::1].evil.example",
    "",
    "::1",  # an IPv6 address needs brackets: not a host header a browser sends
]


# Claim (issue 36, DNS rebinding): the viewer answers only the hosts it was bound to; a request
# for any other name gets a 421 holding no data, on every route (JSON, static files, a URL no
# route matches, a method no route takes); no response lets another origin read it.
def test_only_the_bound_host_names_are_answered(
    hostile_client: tuple[Any, ArchiveManager],
) -> None:
    app, pool = hostile_client
    urls = [*ROUTES, *(r + ("&" if "?" in r else "?") + "format=json" for r in ROUTES)]
    urls += ["/static/viewer.css", "/static/viewer.js", "/no/such/page"]
    evil = "http://evil.example"
    for url in urls:
        for host in ("localhost", "localhost:8000", "127.0.0.1:8000", "[::1]:8000", "LocalHost."):
            response = app.get(url, headers={"Host": host, "Origin": evil})
            response.close()  # a static file's response holds the file open until closed
            assert response.status_code in (200, 404), (url, host, response.status_code)
            assert not [h for h in response.headers if h[0].lower().startswith("access-control")]
        for host in FOREIGN_HOSTS:
            response = app.get(url, headers={"Host": host, "Origin": evil})
            assert response.status_code == 421, (url, host, response.status_code)
            assert response.mimetype == "text/plain"
            assert "--allow-host" in response.text
            for data in ("r1", "r2", "alert", str(pool.root), "sqlite"):
                assert data not in response.text, (url, host, data)
            assert not [h for h in response.headers if h[0].lower().startswith("access-control")]
    # A preflight and the methods no route takes: refused for a foreign host, no CORS grant
    # for the viewer's own.
    for method in ("OPTIONS", "POST", "PUT", "DELETE"):
        assert app.open("/", method=method, headers={"Host": "evil.example"}).status_code == 421
        response = app.open(
            "/",
            method=method,
            headers={"Host": "localhost", "Origin": evil, "Access-Control-Request-Method": "POST"},
        )
        assert response.status_code == (200 if method == "OPTIONS" else 405)
        assert not [h for h in response.headers if h[0].lower().startswith("access-control")]


def test_host_policy_of_each_bind_address() -> None:
    from archive_manager.web.hosts import check_allowed_host, host_policy, parse_host

    loopback = host_policy("127.0.0.1")
    for header in ("localhost", "localhost:1", "127.0.0.1", "127.0.0.1:8000", "[::1]", "[::1]:9"):
        assert loopback.allows(header), header
    bad = ["localhost:99999", "localhost:0", "localhost:+1", "local host", "localhost\x00"]
    not_loopback: list[str | None] = [*FOREIGN_HOSTS, *bad, None, "10.0.0.5", "[fd00::5]:80"]
    for foreign in not_loopback:
        assert not loopback.allows(foreign), foreign
    assert host_policy("localhost") == loopback and host_policy("::1") == loopback
    # One address: that address only (its port anyhow: ssh -L arrives on another port).
    one = host_policy("10.0.0.5")
    assert one.allows("10.0.0.5") and one.allows("10.0.0.5:8000")
    assert not one.allows("localhost") and not one.allows("10.0.0.6")
    assert not one.allows("evil.example")
    # Every interface: any address (never a rebinding attack's host), this machine's name.
    every = host_policy("0.0.0.0")
    assert every.allows("10.0.0.5:8000") and every.allows("[fd00::5]") and every.allows("localhost")
    assert every.allows(socket.gethostname().upper())
    assert not every.allows("evil.example") and not every.allows("10.0.0.5.evil.example")
    assert host_policy("::").allows("192.168.1.2")
    # The operator's list: a name with any port, or a name with one port.
    listed = host_policy("127.0.0.1", ["viewer.example.org", "Proxy.Example:8443", "[fd00::5]"])
    assert listed.allows("viewer.example.org") and listed.allows("viewer.example.org:80")
    assert listed.allows("proxy.example:8443") and not listed.allows("proxy.example:8444")
    assert not listed.allows("proxy.example") and listed.allows("[fd00::5]:1")
    assert not listed.allows("x.viewer.example.org") and listed.allows("localhost")
    assert parse_host("[::1]:80") == ("::1", 80) and parse_host("a.B.:7") == ("a.b", 7)
    assert parse_host("[0:0::1]") == ("::1", None) and parse_host("a:b") is None
    for refused in (
        "",
        " ",
        "*",
        "a b",
        "evil.example/x",
        "a:0",
        "[1.2.3.4]",
        "http://a",
        "a" * 300,
    ):
        with pytest.raises(InvalidInputError):
            check_allowed_host(refused)


def test_serve_refuses_a_bad_allow_host_before_opening_the_pool(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli, ["--root", str(tmp_path / "none"), "serve", "--allow-host", "evil example"]
    )
    assert result.exit_code == 2 and "--allow-host" in result.stderr, result.output
    assert "is not a host name" in result.stderr and not (tmp_path / "none").exists()


def _raw_get(url: str, host: str) -> tuple[int, str]:
    """A GET of ``url`` sent over a socket with the ``Host`` header ``host`` (what a browser
    sends once a page's name points at this address): status and body."""
    parsed = urllib.parse.urlsplit(url)
    assert parsed.hostname is not None and parsed.port is not None
    with socket.create_connection((parsed.hostname, parsed.port), timeout=30) as sock:
        sock.sendall(
            f"GET {parsed.path or '/'} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
            "Origin: http://evil.example\r\n\r\n".encode("ascii")
        )
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    assert b"access-control" not in head.lower()
    return status, body.decode("utf-8", "replace")


def test_serve_as_a_real_process_answers_only_its_host_names(tmp_path: Path) -> None:
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        pool.save("r-1", tiny_rollout(4, seed=1, rollout_id=1), rollout_id=1)
    with running_server(root, "--allow-host", "viewer.example.org") as (url, line):
        assert "localhost" in line and "viewer.example.org" in line and "--allow-host" in line
        port = urllib.parse.urlsplit(url).port
        for path in ("", "archive/r-1?format=json", "stats?format=json"):
            status, body = _raw_get(url + path, "evil.example")
            assert status == 421 and "r-1" not in body and str(root) not in body, body
            status, body = _raw_get(url + path, f"evil.example:{port}")
            assert status == 421
            for host in (f"127.0.0.1:{port}", f"localhost:{port}", "viewer.example.org"):
                assert _raw_get(url + path, host)[0] == 200


def test_sample_page_renders_every_field_kind(tmp_path: Path) -> None:
    """Rewards as dicts, token tensors, numpy arrays, lists and dicts of tensors, no mask,
    no log-probs, non-finite log-probs, chat prompts with parts: shown, never a 500."""
    import numpy as np

    odd = {
        "prompt": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        ],
        "tokens": torch.arange(12, dtype=torch.int64),
        "response": "ok",
        "response_length": 4,
        "reward": {"accuracy": 1.0, "format": float("nan")},
        "rollout_log_probs": [-0.5, float("-inf"), -0.1, float("nan")],
        "status": "completed",
        "rollout_routed_experts": [
            torch.zeros(5, 2, 2, dtype=torch.int32),
            torch.ones(6, 2, 2, dtype=torch.int32),
        ],
        "multimodal_inputs": {"pixel_values": torch.rand(2, 3, dtype=torch.float16)},
        "scores": np.arange(6, dtype=np.float32).reshape(2, 3),
        "metadata": {"when": "now", "nested": {"deep": [1, 2, 3]}},
    }
    bare: dict[str, Any] = {"response": "", "status": None, "tokens": [], "response_length": 0}
    with ArchiveManager.open(tmp_path / "pool", inline_limit=100) as pool:
        pool.save("odd", [odd, bare], rollout_id=1)
        client = create_app(pool).test_client()
        html = get(client, archive_url("odd", "sample", "0")).text
        assert "accuracy" in html and "int32" in html and "[11, 2, 2]" in html
        assert "multimodal_inputs.pixel_values" in html and "float16" in html
        assert "scores" in html and "[2, 3]" in html
        tokens = html[html.index('id="tokens"') :]
        # No mask: the four response tokens are neither trained nor untrained.
        assert tokens[: tokens.index("</div>")].count('class="tok mn"') == 4
        assert "SYSTEM" in html.upper() and "be brief" in html
        data = get_json(client, archive_url("odd", "sample", "0") + "?format=json")
        assert data["fields"]["reward"] == {"accuracy": 1.0, "format": "nan"}
        assert data["fields"]["rollout_log_probs"] == [-0.5, "-inf", -0.1, "nan"]
        joined = get_json(
            client,
            archive_url("odd", "sample", "0", "tensor", "rollout_routed_experts") + "?format=json",
        )
        assert joined["shape"] == [11, 2, 2] and joined["chunks"] == 2 and joined["max"] == 1
        pixels = get_json(
            client,
            archive_url("odd", "sample", "0", "tensor", "multimodal_inputs.pixel_values")
            + "?format=json",
        )
        assert pixels["dtype"] == "float16" and pixels["shape"] == [2, 3]
        scores = get_json(
            client, archive_url("odd", "sample", "0", "tensor", "scores") + "?format=json"
        )
        assert scores["first"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
        empty = get(client, archive_url("odd", "sample", "1")).text
        assert "empty response" in empty and "no log-probs recorded" in empty
        assert "no status" in empty and "no tensor fields" in empty
        assert "no response token ids" in empty


# --------------------------------------------------------------------------- hostile requests

#: Query keys that are `url_for`'s own arguments or the views' path arguments.
FOREIGN_QUERY = "name=x&endpoint=x&_anchor=x&_external=1&_scheme=javascript&position=7&field=y"


@pytest.mark.parametrize(
    "path",
    ["/", "/stats", archive_url("train-1"), archive_url("train-1", "sample", "0")],
)
def test_links_keep_only_the_viewers_own_query_parameters(client: Any, path: str) -> None:
    """Any query key once went into `url_for`: ``?name=x`` or ``?_external=1`` made every
    page with a pager or a JSON link a 500.  Links carry only the parameters pages read."""
    html = get(client, f"{path}?{FOREIGN_QUERY}&per_page=2&tokens=some").text
    links = [urllib.parse.unquote(h) for h in re.findall(r'href="([^"]*)"', html)]
    own = [h for h in links if "format=json" in h or "page=" in h]
    assert own, "the page has a JSON link"
    for link in own:
        assert link.startswith("/") and "#" not in link and "javascript" not in link
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(link).query)
        assert not set(query) & {
            "name",
            "endpoint",
            "_anchor",
            "_external",
            "_scheme",
            "position",
            "field",
        }
        assert query.get("per_page") == ["2"]  # the viewer's own parameters are kept
    json_link = next(h for h in own if "format=json" in h)
    assert urllib.parse.urlsplit(json_link).path == urllib.parse.unquote(path)


def test_huge_finite_rewards_draw_the_pages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rewards of +-1.7e308 overflow the reward mean and the charts' span: the pages and
    their JSON still answer, and the JSON builds no chart."""
    with ArchiveManager.open(tmp_path / "pool") as pool:
        pool.save("a", [{"reward": 1.7e308}, {"reward": 1.7e308}], rollout_id=1)
        pool.save("b", [{"reward": -1.7e308}], rollout_id=2)
        client = create_app(pool).test_client()
        for url in ("/", "/stats"):
            html = get(client, url).text
            assert "Reward by rollout" in html and "1.7e+308" in html
        reward = drift_charts(pool.stats())[0]
        assert reward.empty is None and reward.y_ticks and reward.lines[0].segments

        def no_charts(rows: Any) -> Any:
            raise AssertionError("a JSON response built the charts")

        monkeypatch.setattr("archive_manager.web.app.drift_charts", no_charts)
        assert get_json(client, "/?format=json")["total"] == 2
        assert len(get_json(client, "/stats?format=json")["stats"]) == 2


def test_charts_cope_with_the_largest_floats() -> None:
    top = sys.float_info.max
    ticks = nice_ticks(-1.7e308, 1.7e308)
    assert ticks and all(-1.7e308 <= t <= 1.7e308 for t in ticks) and 0.0 in ticks
    assert nice_ticks(0.9 * top, top, 4)  # ends (once it never did: high + step overflowed)
    assert nice_ticks(float("-inf"), 1.0) == []
    for ys in ([top, top], [-top, top], [top, None, float("inf"), -top], [5e-324, 5e-324]):
        chart = line_chart("t", [Series("a", [1.0, 1.0, 2.0, 3.0][: len(ys)], ys)])
        assert chart.empty is None and chart.y_ticks, ys
        for dot in chart.lines[0].dots:
            assert chart.left <= dot.x <= chart.right and chart.top <= dot.y <= chart.bottom
    chart = logprob_chart([1e308, 1e308, -1e308] * 500, None)
    assert chart.empty is None and chart.y_ticks
    wide = line_chart("t", [Series("a", [2.0**63, 2.0**63], [1.0, 2.0])])
    assert wide.x_ticks and wide.lines[0].segments


def test_a_tensor_sample_on_a_lean_install_is_a_501_naming_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without torch the sample page of a sample holding a tensor showed the one-line "needs
    PyTorch" message with status 500, as if the viewer had crashed: it is a 501 (this install
    lacks the feature), HTML and JSON alike; a sample without tensors still shows."""
    with ArchiveManager.open(tmp_path / "pool") as pool:
        pool.save("a", [{"tokens": torch.arange(4)}, {"tokens": [1, 2]}], rollout_id=1)
        client = create_app(pool).test_client()
        monkeypatch.setitem(sys.modules, "torch", None)  # a lean install: import torch fails
        html = get(client, archive_url("a", "sample", "0"), 501).text
        assert (
            "this needs PyTorch, which is not installed; install the &#39;torch&#39; extra" in html
        )
        body = get_json(client, archive_url("a", "sample", "0") + "?format=json", 501)
        assert body["status"] == 501 and "pip install -e '.[torch]'" in body["error"]
        get(client, archive_url("a", "sample", "1"))


def test_sample_fields_that_cannot_be_drawn_are_named_not_a_500(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tokens with a NaN, a mask with a string, complex log-probs (all accepted by a save)
    are listed as not shown, with the reason; tokens and a mask stored as tensor blobs say
    so, with the on-demand summary link, and the page reads no blob."""
    samples = [
        {"tokens": torch.tensor([1.0, float("nan"), 3.0]), "response_length": 2},
        {"tokens": [1, 2, 3], "loss_mask": [1, "x"], "response_length": 2},
        {"tokens": [1, 2, 3], "rollout_log_probs": torch.tensor([1 + 2j, 3j])},
        {
            "tokens": torch.arange(100),
            "loss_mask": torch.ones(50, dtype=torch.int64),
            "response_length": 50,
            "response": "fine",
        },
    ]
    with ArchiveManager.open(tmp_path / "pool", inline_limit=64) as pool:
        pool.save("a", samples, rollout_id=1)
        client = create_app(pool).test_client()
        expected = [
            ("tokens", "item 1 is nan, not a whole number"),
            ("loss_mask", "item 1 is &#39;x&#39;, not a whole number"),
            ("rollout_log_probs", "its dtype is complex64"),
        ]
        for position, (field, reason) in enumerate(expected):
            html = get(client, archive_url("a", "sample", str(position))).text
            assert f'<span class="mono">{field}</span> not shown: {reason}' in html
            get_json(client, archive_url("a", "sample", str(position)) + "?format=json")
        assert "loss mask not shown: item 1" in get(client, archive_url("a", "sample", "1")).text
        reads = BlobReads(pool, monkeypatch)
        reads.reset()
        html = get(client, archive_url("a", "sample", "3")).text
        assert reads.open == []  # no tensor blob read for the page
        assert "no loss mask" not in html
        assert "loss mask not shown: stored as a tensor blob (int64[50])" in html
        for field in ("tokens", "loss_mask"):
            link = archive_url("a", "sample", "3", "tensor", field)
            assert f'<span class="mono">{field}</span> not shown: stored as a tensor blob' in html
            assert f'class="tensor-load" href="{link}"' in html
        assert 'id="response">fine' in html


def test_no_page_shows_the_catalog_password(tmp_path: Path, pg_server: Any) -> None:
    secret = "s3cret-pw"
    url = pg_server.create_database()
    database = url.rsplit("/", 1)[1]
    try:
        # The password in the URL's user part, then as libpq's query parameter.
        for n, secret_url in enumerate(
            (url.replace("://postgres@", f"://postgres:{secret}@", 1), f"{url}?password={secret}")
        ):
            with ArchiveManager.open(tmp_path / "pool", catalog_url=secret_url) as pool:
                if n == 0:
                    pool.save("train-1", tiny_rollout(3, seed=1, rollout_id=1), rollout_id=1)
                client = create_app(pool).test_client()
                pages = [
                    get(client, page).text
                    for page in ("/", "/?format=json", "/stats", "/stats?format=json")
                ]
                pages.append(get(client, archive_url("train-1")).text)
                assert database in pages[0]  # the catalog is shown ...
                assert not [p for p in pages if secret in p]  # ... without its password
    finally:
        pg_server.drop_database(url)


# --------------------------------------------------------------------------- hostile output


@pytest.fixture
def hostile_client(tmp_path: Path) -> Iterator[tuple[Any, ArchiveManager]]:
    pytest.importorskip("flask")
    from archive_manager.web import create_app

    pool = ArchiveManager.open(tmp_path / "pool")
    samples = [
        {
            "prompt": f"q{i // 2}",
            "response": HOSTILE_MARKDOWN[i % len(HOSTILE_MARKDOWN)],
            "tokens": [1, 2, 3],
            "reward": float(i % 2),
            "task_key": f"k{i // 2}",
            "status": "completed",
        }
        for i in range(8)
    ]
    pool.save("r1", samples, rollout_id=1)
    pool.save("r2", samples, rollout_id=2)
    try:
        yield create_app(pool).test_client(), pool
    finally:
        pool.close()


HOSTILE_MARKDOWN = [
    "<script>alert(1)</script> and <img src=x onerror=alert(2)>",
    "[click](javascript:alert(3)) [b](JaVaScRiPt:alert(4)) [c](&#106;avascript:alert(5))",
    "![img](https://evil.example/x.png) ![x](x onerror=alert(6))",
    "<javascript:alert(7)> <https://ok.example> <a href='javascript:alert(8)'>x</a>",
    "[r][ref]\n\n[ref]: javascript:alert(9)",
    "[d](data:text/html;base64,PHNjcmlwdD5hbGVydCgxMCk8L3NjcmlwdD4=) [v](vbscript:msgbox)",
    '<div onmouseover="alert(11)">x</div>\n\n<iframe src=x></iframe>',
    "`<script>` **bold** | a | b |\n|---|---|\n| <b>c</b> | d |",
]


ROUTES = [
    "/",
    "/stats",
    "/archive/r1",
    "/archive/r1/sample/0",
    "/archive/r1/group?task_key=k0",
    "/archive/r1/groups",
    "/prompt?task_key=k0",
    "/search?q=alert",
    "/compare?a=r1&a_position=0&b=r2&b_position=1",
]


HOSTILE_QUERIES = [
    "page=0",
    "page=99999999999999999999",
    "per_page=0",
    "rollout_id=5..1",
    "rollout_id=..",
    "rollout_id=99999999999999999999999",
    "task_key=%00",
    "task_key=%ff%fe",
    "task_key=%ED%A0%80",
    "task_key=" + "x" * 5000,
    "q=%ED%A0%80",
    "q=a&q=b",
    "task_key=k0&task_key=k1",
    "view=markdown&view=text",
    "view=markdown",
    "format=xml",
    "limit=-5",
    "limit=1e3",
    "regex=1&q=(%3FR)",
    "regex=1&q=(",
    "regex=1&q=%5Cb",
    "case=ignore&q=%C3%9F",
    "min_reward=nan",
    "a=r1&a_position=-1",
    "a=..%2F..%2Fetc&a_position=0&b=r1",
    "evaluation=maybe",
    "after=x",
    "tokens=all",
    "sort=reward&order=x",
]


# Claim: hostile query strings get 400 or 404 pages on every route, never a 500.
def test_hostile_query_strings_are_400_or_404(hostile_client: tuple[Any, ArchiveManager]) -> None:
    app, pool = hostile_client
    before = snapshot_pool(pool)
    for route in ROUTES:
        for query in HOSTILE_QUERIES:
            url = route + ("&" if "?" in route else "?") + query
            for extra in ("", "&format=json"):
                response = app.get(url + extra)
                assert response.status_code in (200, 400, 404), (url + extra, response.text[:300])
    assert snapshot_pool(pool) == before  # every route left catalog and blobs as they were


# Claim: a parameter given twice with different values is a 400 (the viewer's one-value-per-parameter rule), and an unknown
# task key is a 404 page.  Fixed: /search read the first ``q`` and ignored the other, and
# /prompt answered an unknown task key with an empty 200 page.
def test_search_and_prompt_refuse_what_they_cannot_answer(
    hostile_client: tuple[Any, ArchiveManager],
) -> None:
    app, _ = hostile_client
    twice = app.get("/search?format=json&q=alert&q=zzz")
    assert twice.status_code == 400 and "'q'" in twice.json["error"]
    assert app.get("/search?format=json&q=alert&q=alert").status_code == 200
    assert app.get("/prompt?task_key=nope").status_code == 404
    unknown = app.get("/prompt?format=json&task_key=nope")
    assert unknown.status_code == 404 and "nope" in unknown.json["error"]
    assert app.get("/prompt?format=json&task_key=k0&rollout_id=7").status_code == 404
    assert app.get("/prompt?format=json&task_key=k0").status_code == 200
    assert app.get("/archive/r1/group?task_key=nope").status_code == 404


# A tag model output could have smuggled in: a script-capable element, an event handler, or
# a URL scheme that runs code.
_ACTIVE_TAG = re.compile(r"<(script|iframe|img|object|embed|svg)\b", re.IGNORECASE)


_ACTIVE_ATTRIBUTE = re.compile(
    r"\son\w+\s*=|(href|src)\s*=\s*[\"']?\s*(javascript|vbscript|data):", re.IGNORECASE
)


# Claim: Markdown is rendered with raw HTML, images and script URLs off: model output never
# becomes markup (raw tags, javascript:/vbscript:/data: links, entity-hidden schemes,
# reference links, autolinks, image onerror), on the sample, group and compare pages.
def test_markdown_never_lets_model_output_become_markup(
    hostile_client: tuple[Any, ArchiveManager],
) -> None:
    app, _ = hostile_client
    pages = [f"/archive/r1/sample/{i}?view=markdown" for i in range(len(HOSTILE_MARKDOWN))]
    pages += [f"/archive/r1/group?task_key=k{i}&view=markdown" for i in range(4)]
    pages += [f"/compare?a=r1&a_position={i}&b=r2&b_position={i}&view=markdown" for i in range(8)]
    rendered = 0
    for url in pages:
        page = app.get(url)
        assert page.status_code == 200, url
        body = page.text.split("<body", 1)[1]
        for tag in re.findall(r"<[^>]*>", body):
            assert "alert(" not in tag and "msgbox" not in tag, (url, tag)
            assert _ACTIVE_TAG.match(tag) is None or "src=" not in tag.lower(), (url, tag)
            assert _ACTIVE_ATTRIBUTE.search(tag) is None, (url, tag)
        rendered += "<strong>bold</strong>" in body
    assert rendered  # the Markdown was rendered, not only escaped


# Claim: every page shows model output as it is stored, lone surrogates included (stored and
# loaded with surrogatepass).  Fixed: UTF-8 cannot encode one, and every HTML page showing
# such a text (sample, Markdown, group, compare, search) was a 500; it shows as an escape.
def test_pages_show_a_lone_surrogate(tmp_path: Path) -> None:
    pytest.importorskip("flask")
    from archive_manager.web import create_app

    with ArchiveManager.open(tmp_path / "pool") as pool:
        samples = [
            {"prompt": "p\udc80q", "response": f"x\ud800y {i}", "task_key": "k", "reward": 1.0}
            for i in range(2)
        ]
        pool.save("a", samples, rollout_id=1)
        app = create_app(pool).test_client()
        for url in (
            "/archive/a/sample/0",
            "/archive/a/sample/0?view=markdown",
            "/archive/a/group?task_key=k",
            "/archive/a/group?task_key=k&view=markdown",
            "/compare?a=a&a_position=0&b=a&b_position=1",
            "/search?q=x.y&regex=1",
            "/search?q=x",
        ):
            page = app.get(url)
            assert page.status_code == 200, (url, page.text[:300])
            assert b"\\ud800" in page.data, url
        data = app.get("/archive/a/sample/0?format=json").get_data(as_text=True)
        assert json.loads(data)["fields"]["response"] == "x\ud800y 0"


# Claim (issue 19, "Groups"): the group page is "linked from the archive page (a group column
# or a groups tab, sortable by reward std)".  Fixed: the archive page linked each sample's task
# key to its group, but nothing listed or ordered the groups by their reward spread (what finds
# the groups that teach GRPO nothing, or the most); /archive/<name>/groups does, linked from it.
def test_the_archive_page_orders_groups_by_reward_std(
    hostile_client: tuple[Any, ArchiveManager],
) -> None:
    app, pool = hostile_client
    page = app.get("/archive/r1")
    assert page.status_code == 200 and 'id="groups-link" href="/archive/r1/groups"' in page.text
    before = snapshot_pool(pool)
    groups: dict[Any, Any] = {g.task_key: g for g in pool.groups("r1")}
    listing = app.get("/archive/r1/groups")
    assert listing.status_code == 200
    for key, group in groups.items():
        assert f"/archive/r1/group?task_key={key}" in listing.text
        assert group.reward_std is None or f"{group.reward_std:.3f}" in listing.text
    assert "sort=reward_std" in listing.text and "sort=reward_mean" in listing.text
    data = app.get("/archive/r1/groups?format=json").json
    stds = [g["reward_std"] for g in data["groups"]]
    assert data["total"] == len(groups) and data["sort"] == "reward_std"
    assert stds == sorted(stds, key=lambda v: (v is None, -(v or 0)))
    assert "members" not in data["groups"][0]
    by_key = app.get("/archive/r1/groups?format=json&sort=task_key&per_page=2&page=2").json
    assert [g["task_key"] for g in by_key["groups"]] == sorted(groups)[2:4]
    for query, status in (("sort=reward", 400), ("page=0", 400), ("sort=size&sort=std", 400)):
        assert app.get("/archive/r1/groups?" + query).status_code == status, query
    assert app.get("/archive/nope/groups").status_code == 404
    assert snapshot_pool(pool) == before


def test_markdown_rendering_is_bounded_per_text_and_per_page(tmp_path: Path) -> None:
    """Rendering Markdown is CPU-bound (an 800 KB table took 14 s), and a group page shows up
    to 256 responses: one text past `MAX_MARKDOWN` and a page's text past
    `MAX_MARKDOWN_PAGE` are shown as plain text, so one hostile rollout cannot hold a worker."""
    pytest.importorskip("flask")
    pytest.importorskip("markdown_it")
    from archive_manager.web import create_app
    from archive_manager.web.markdown import MAX_MARKDOWN, MAX_MARKDOWN_PAGE

    unit = "**bold** "
    fits = unit * (MAX_MARKDOWN // len(unit))
    samples = [
        {"prompt": "q", "response": fits, "tokens": [1], "reward": float(i), "task_key": "k"}
        for i in range(12)
    ]
    samples.append({"prompt": "q", "response": fits + unit, "tokens": [1], "task_key": "big"})
    with ArchiveManager.open(tmp_path / "pool") as pool:
        pool.save("r", samples, rollout_id=1)
        hostile_client = create_app(pool).test_client()
        page = hostile_client.get("/archive/r/group?task_key=k&view=markdown")
        assert page.status_code == 200
        html = page.get_data(as_text=True)
        per_response = len(fits) // len(unit)
        assert html.count("<strong>bold</strong>") % per_response == 0
        rendered = html.count("<strong>bold</strong>") // per_response
        assert 0 < rendered == MAX_MARKDOWN_PAGE // len(fits) < 12
        one = hostile_client.get("/archive/r/sample/12?view=markdown").get_data(as_text=True)
        assert "<strong>bold</strong>" not in one and "**bold**" in one
        small = hostile_client.get("/archive/r/sample/0?view=markdown").get_data(as_text=True)
        assert "<strong>bold</strong>" in small  # each request has its own budget


@pytest.fixture
def stats_pool(tmp_path: Path) -> Iterator[ArchiveManager]:
    root = tmp_path / "stats_pool"
    with ArchiveManager.open(root) as made:
        for i, (rollout_id, evaluation) in enumerate([(1, False), (1, True), (10, False)]):
            made.save(
                f"r-{i}", small_rollout(2, seed=i), rollout_id=rollout_id, evaluation=evaluation
            )
    opened = ArchiveManager.open(root)
    yield opened
    opened.close()


# Fixed: the viewer reads numbers as ASCII digits with an optional minus (`web.app._whole`).
@pytest.mark.parametrize(
    "query",
    [
        "after=1_0:training",  # silently the key (10, training): a page starts elsewhere
        "after=%D9%A1:training",  # U+0661 ARABIC-INDIC DIGIT ONE, read as 1
        "per_page=1_0",
        "rollout_id=1_0",
    ],
)
def test_stats_numbers_in_python_literal_spellings_are_not_400(
    stats_pool: ArchiveManager, query: str
) -> None:
    response = create_app(stats_pool).test_client().get(f"/stats?{query}")
    assert response.status_code == 400


# Fixed: a parameter given twice is a 400 (`web.app._raw`); ``page`` (an offset on the other
# pages, meaningless on /stats, which pages by ``after``) is a 400 naming ``after=``.
@pytest.mark.parametrize(
    "query",
    [
        "after=1:training&after=zzz",
        "after=1:training&after=10:training",
        "page=abc",
        "page=2",
    ],
)
def test_stats_drops_parameters_it_does_not_use_without_400(
    stats_pool: ArchiveManager, query: str
) -> None:
    response = create_app(stats_pool).test_client().get(f"/stats?{query}")
    assert response.status_code == 400
    if query.startswith("page="):
        assert b"after=" in response.data


def test_a_name_saved_again_shows_only_the_archive_it_points_at(
    own_viewer_pool: ArchiveManager,
) -> None:
    """Issue 35, item 1: a step saved again (``supersede=True``) after its archive was
    released: the pool page, its statistics and the archive page count only the new one."""
    pool = own_viewer_pool
    pool.open_archive("train-2").release()
    again = tiny_rollout(9, seed=7, rollout_id=2)
    pool.save("train-2", again, rollout_id=2, supersede=True)
    client = create_app(pool).test_client()
    data = get_json(client, "/?format=json")
    listed = [(a["name"], a["samples"], a["state"]) for a in data["archives"]]
    assert [row for row in listed if row[0] == "train-2"] == [("train-2", 9, "published")]
    assert data["total"] == 5
    (row,) = [r for r in data["stats"] if (r["rollout_id"], r["evaluation"]) == (2, False)]
    assert (row["archives"], row["samples"]) == (1, 9)
    every = get_json(client, "/stats?format=json")["stats"]
    (row,) = [r for r in every if (r["rollout_id"], r["evaluation"]) == (2, False)]
    assert (row["archives"], row["samples"]) == (1, 9)
    page = get_json(client, archive_url("train-2") + "?format=json")
    assert page["archive"]["samples"] == 9 and page["archive"]["state"] == "published"


def _dict_rewards(n: int) -> list[dict[str, Any]]:
    """slime-shaped samples without task keys whose rewards are dicts (``score`` differs from
    the ``acc`` flag), and one plain number."""
    out: list[dict[str, Any]] = [
        {
            "group_index": i // 4,
            "index": i,
            "response": f"answer {i}",
            "reward": {"score": (i % 4) / 4, "acc": i % 3 == 0, "pred": str(i)},
        }
        for i in range(n)
    ]
    out.append({"group_index": 99, "index": n, "response": "plain", "reward": 0.5})
    return out


def test_the_pages_say_which_reward_key_they_read(tmp_path: Path) -> None:
    """The viewer reads dict rewards with the key given at save, or the one of
    ``?reward_key=``, and says which; without either it counts what it could not score and
    says how to choose a key; a group by ``group_index`` has its page."""
    with ArchiveManager.open(tmp_path / "pool") as pool:
        pool.save("keyed", _dict_rewards(8), rollout_id=1, reward_key="score")
        pool.save("bare", _dict_rewards(8), rollout_id=2)
        client = create_app(pool).test_client()
        (saved,) = get_json(client, "/stats?rollout_id=1&format=json")["stats"]
        assert saved["reward_keys"] == ["score"] and saved["unscored"] == 0
        (chosen,) = get_json(client, "/stats?rollout_id=1&reward_key=acc&format=json")["stats"]
        assert chosen["reward_keys"] == ["acc"] and chosen["reward_mean"] == pytest.approx(
            (3 + 0.5) / 9
        )
        bare = get(client, "/stats?rollout_id=2").text
        assert 'id="reward-note"' in bare and "8 sample(s)" in bare and "acc, score" in bare
        page = get(client, archive_url("keyed") + "?reward_key=acc").text
        assert 'id="saved-reward-key"' in page and ">score</span> (given at save)" in page
        rows = get_json(client, archive_url("keyed") + "?reward_key=acc&format=json")
        assert rows["reward_key"] == "acc"
        assert [s["reward"] for s in rows["samples"]][:4] == [1, 0, 0, 1]
        groups = get(client, archive_url("keyed", "groups") + "?reward_key=acc").text
        assert ">acc</span> (chosen here)" in groups
        assert "group_index=0" in groups and "reward_key=acc" in groups
        data = get_json(client, archive_url("keyed", "groups") + "?format=json")
        assert data["reward_key"] == "score"
        group = get(client, archive_url("bare", "group") + "?group_index=1&reward_key=score")
        assert ">score</span> (chosen here)" in group.text and "answer 5" in group.text
        unscored = get(client, archive_url("bare", "group") + "?group_index=1").text
        assert "4 completion(s) with a reward that is not a number" in unscored
        get(client, "/stats?reward_key=" + "x" * 300, 400)


def test_long_prompt_task_keys_show_their_text(tmp_path: Path) -> None:
    """A group whose task key is the digest of a long prompt shows the prompt (groups, group
    and prompt pages), and is linked by its key."""
    prompt = "<b>Solve</b> the following problem and explain each step. " * 6
    with ArchiveManager.open(tmp_path / "pool") as pool:
        pool.save("r", [{"reward": 0.0}, {"reward": 1.0}], rollout_id=1, task_keys=[prompt] * 2)
        (group,) = pool.groups("r")
        assert group.task_key is not None
        client = create_app(pool).test_client()
        groups = get(client, archive_url("r", "groups")).text
        assert str(escape(prompt[:40])) in groups and f'title="{group.task_key}"' in groups
        page = get(client, archive_url("r", "group") + "?task_key=" + quote(group.task_key))
        assert f'id="task-text">{escape(prompt)}</pre>' in page.text
        assert "<b>Solve</b>" not in page.text
        shown = get(client, "/prompt?task_key=" + quote(group.task_key)).text
        assert f'id="task-text">{escape(prompt)}</pre>' in shown
        data = get_json(client, "/prompt?format=json&task_key=" + quote(group.task_key))
        assert data["task_text"] == prompt
