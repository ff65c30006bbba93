"""Reading rollouts as text (issue 19 items 3-5, issue 18 item 3): `pool.search` and
``archive-manager grep``; ``archive-manager sample``; response tokens decoded with a local
tokenizer (a tiny BPE trained here, so nothing is downloaded); and the viewer's search,
compare and Markdown pages, hostile model output included."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers import Backend, open_on, snapshot_pool

import archive_manager
from archive_manager import ArchiveManager
from archive_manager.cli import cli
from archive_manager.errors import (
    InvalidInputError,
    MissingDependencyError,
    SearchTimeoutError,
)
from archive_manager.lens import search
from archive_manager.lens.tokenizer import TokenDecoder, load_tokenizer

LONG = "intro line\n" + "filler words here. " * 40 + "\nthe answer is \\boxed{42}\nbye"
HOSTILE = "<script>alert('x')</script> **bold** [link](javascript:alert(1)) ![i](http://e/x.png)"
LINES = [
    "the answer is 42 because six times seven",
    "let us compute the sum of the first numbers",
    "therefore the result is boxed",
    "a hostile model writes <b>tags</b> and markdown **stars**",
]


def _train_tokenizer(path: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["[UNK]"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(LINES * 4, trainer)
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    return path / "tokenizer.json"


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("tokenizers")
    return _train_tokenizer(tmp_path_factory.mktemp("tok") / "tiny")


def _encode(file: Path, text: str) -> list[int]:
    from tokenizers import Tokenizer

    ids: list[int] = Tokenizer.from_file(str(file)).encode(text).ids
    return ids


def _samples(rid: int, *, response_ids: list[int] | None = None) -> list[dict[str, Any]]:
    out = []
    for i in range(6):
        response = [LONG, "short reply: the answer is 41", "no numbers at all", HOSTILE][i % 4]
        prompt: Any = f"question {i // 2} of rollout {rid}: what is six times seven?"
        if i == 5:
            prompt = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Q?"}]
        ids = response_ids or [5, 6, 7, 8]
        out.append(
            {
                "prompt": prompt,
                "response": response,
                "tokens": [1, 2, 3, *ids],
                "response_length": len(ids),
                "loss_mask": [1, 0] + [1] * (len(ids) - 2),
                "rollout_log_probs": [-0.5 * (k + 1) for k in range(len(ids))],
                "reward": float(i % 2),
                "status": "completed",
                "index": i,
                "task_key": f"q{i // 2}",
            }
        )
    return out


def _fill(pool: ArchiveManager) -> None:
    pool.save("r1", _samples(1), rollout_id=1)
    pool.save("r2", _samples(2), rollout_id=2)
    pool.save("e2", _samples(2), rollout_id=2, evaluation=True)
    pool.save("gone", _samples(0), rollout_id=0)
    pool.open_archive("gone").release()


# --------------------------------------------------------------------------- search


def test_search_literal_regex_fields_filters_and_limit(
    tmp_path: Path, backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open_on(backend, tmp_path / "pool") as pool:
        _fill(pool)
        before = snapshot_pool(pool)
        # Only the texts are decoded: token ids and log-probs (binary arrays) are never read.
        import archive_manager.codec.values as values

        def refuse(*_: Any) -> Any:
            raise AssertionError("a search decoded a numeric array")

        monkeypatch.setattr(values, "_unshuffle", refuse)
        found = pool.search("answer is")
        assert [(m.archive, m.position) for m in found.matches] == [
            (n, p) for n in ("r1", "e2", "r2") for p in (0, 1, 4, 5)
        ]
        first = found.matches[0]
        assert (first.field, first.line_number, first.sample_key, first.task_key) == (
            "response",
            3,
            "sample:0",
            "q0",
        )
        assert first.line[first.start : first.end] == "answer is"
        assert first.line == "the answer is \\boxed{42}" and first.reward == 0.0
        assert found.archives == 3 and found.samples == 18 and not found.limited
        assert pool.search("ANSWER IS").matches == []
        assert len(pool.search("ANSWER IS", ignore_case=True).matches) == 12
        boxed = pool.search(r"\\boxed\{\d+\}", regex=True)
        assert {m.position for m in boxed.matches} == {0, 4}
        assert len(pool.search("six times", fields="prompt").matches) == 15  # chat prompt: no
        assert pool.search("Q?", fields="prompt").matches[0].position == 5
        assert pool.search("six times", fields="response").matches == []
        assert {m.archive for m in pool.search("answer", rollout_ids=(2, 2)).matches} == {
            "r2",
            "e2",
        }
        assert {m.archive for m in pool.search("answer", evaluation=True).matches} == {"e2"}
        limited = pool.search("answer", limit=5)
        assert len(limited.matches) == 5 and limited.limited
        # A literal absent from a record's bytes skips it before its tree is parsed.
        import archive_manager.codec.chunk as chunk

        parsed: list[int] = []
        real = chunk.decode_fields

        def decode_fields(rec: Any, names: Any, *loader: Any) -> Any:
            parsed.append(1)
            return real(rec, names, *loader)

        monkeypatch.setattr(chunk, "decode_fields", decode_fields)

        assert pool.search("zebra").matches == [] and parsed == []
        # a literal the record's tree escapes: its longest piece without what is escaped
        assert pool.search('zebra"').matches == [] and parsed == []
        assert pool.search('"').matches == [] and len(parsed) == 18  # no piece: no prefilter
        assert snapshot_pool(pool) == before  # searching wrote nothing
        # Texts the record's JSON tree escapes, or holds as non-ASCII UTF-8, are found alike.
        odd = ['she said "hi" \\ ok', "café ☕ naïve", "tab\there", "x" * 600 + ' "quoted" é']
        pool.save("odd", [{"response": r, "tokens": [1]} for r in odd], rollout_id=9)
        for needle, position in (
            ('said "hi" \\', 0),
            ("☕ naïve", 1),
            ("tab\th", 2),
            ('"quoted" é', 3),
        ):
            got = pool.search(needle, rollout_ids=(9, 9)).matches
            assert [m.position for m in got] == [position], needle


def test_search_bad_input_and_runaway_regex(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ArchiveManager.open(tmp_path / "pool") as pool:
        pool.save("r", [{"response": "a" * 40 + "!", "tokens": [1]}], rollout_id=1)
        before = snapshot_pool(pool)
        bad: list[tuple[dict[str, Any], str]] = [
            ({"pattern": ""}, "non-empty pattern"),
            ({"pattern": "x" * 1001}, "longer than"),
            ({"pattern": "(a", "regex": True}, "does not compile"),
            ({"pattern": "a*", "regex": True}, "empty string"),
            ({"pattern": "a", "fields": "tokens"}, "cannot search field"),
            ({"pattern": "a", "limit": 0}, "limit"),
            ({"pattern": "a", "limit": 10_001}, "limit"),
            ({"pattern": "a", "timeout": -1}, "timeout"),
            ({"pattern": "a", "rollout_ids": (5, 1)}, "5"),
        ]
        for kwargs, message in bad:
            with pytest.raises(InvalidInputError, match=message):
                pool.search(**kwargs)
        pytest.importorskip("regex")
        # A runaway pattern is an error; a search out of time returns what it found.
        monkeypatch.setattr(search, "_PER_TEXT", 0.05)
        with pytest.raises(SearchTimeoutError, match="backtracks without end"):
            pool.search("(a|aa)+$", regex=True)
        late = pool.search("(a|aa)+$", regex=True, timeout=0.01)
        assert late.timed_out and late.matches == []
        clock = itertools.chain([0.0], itertools.repeat(1e6))  # time is up after the start
        monkeypatch.setattr(search.time, "monotonic", lambda: next(clock))
        stopped = pool.search("a")
        assert stopped.timed_out and stopped.samples == 0
        assert snapshot_pool(pool) == before


def test_grep_cli(tmp_path: Path) -> None:
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        _fill(pool)
    runner = CliRunner()
    base = ["--root", str(root)]
    done = runner.invoke(cli, [*base, "grep", "answer is 4", "--rollout-id", "1"])
    assert done.exit_code == 0, done.output
    assert "the answer is 41" in done.output and "2 matching sample(s)" in done.output
    done = runner.invoke(cli, [*base, "grep", "-E", r"answer is 4[12]", "--json", "--limit", "2"])
    data = json.loads(done.output)
    assert data["limited"] and len(data["matches"]) == 2
    assert data["matches"][0]["archive"] == "r1"
    done = runner.invoke(cli, [*base, "grep", "(", "--regex"])
    assert done.exit_code == 1 and "does not compile" in done.output
    assert "Traceback" not in done.output
    done = runner.invoke(cli, [*base, "grep", "x", "--limit", "99999"])
    assert done.exit_code == 2
    # A real process, and hostile text escaped for the terminal.
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "archive_manager.cli",
            *base,
            "grep",
            "<script>",
            "--field",
            "response",
            "--limit",
            "1",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(archive_manager.__file__).parents[1])},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "<script>alert('x')</script>" in proc.stdout and "1 matching sample(s)" in proc.stdout


# --------------------------------------------------------------------------- sample


def test_sample_cli(tmp_path: Path, tokenizer_file: Path) -> None:
    root = tmp_path / "pool"
    text = LINES[0]
    ids = _encode(tokenizer_file, text)
    samples = _samples(1, response_ids=ids)
    samples[1]["response"] = "bell\x07 and \x1b[31mred\x1b[0m\nsecond line"
    samples[2]["index"] = 1  # two samples share sample:1
    with ArchiveManager.open(root) as pool:
        pool.save("r1", samples, rollout_id=1)
    runner = CliRunner()
    base = ["--root", str(root), "sample", "r1"]
    done = runner.invoke(cli, [*base, "--position", "1"])
    assert done.exit_code == 0, done.output
    assert "\\x07" in done.output and "\\x1b[31mred" in done.output and "\x1b" not in done.output
    assert "  second line" in done.output and "task key    q0" in done.output
    assert "loss_mask: length" in done.output and "ones" in done.output
    done = runner.invoke(cli, [*base, "--key", "sample:3", "--json"])
    data = json.loads(done.output)
    assert data["position"] == 3 and data["response"] == HOSTILE
    assert data["numeric_fields"]["tokens"]["length"] == len(ids) + 3
    done = runner.invoke(cli, [*base, "--position", "1", "--field", "response"])
    assert done.output == samples[1]["response"] + "\n"
    done = runner.invoke(cli, [*base, "--position", "0", "--field", "loss_mask"])
    assert json.loads(done.output) == samples[0]["loss_mask"]
    # Tokens as text: the pieces join to the response; untrained ones are bracketed.
    done = runner.invoke(cli, [*base, "--position", "0", "--tokenizer", str(tokenizer_file)])
    assert done.exit_code == 0, done.output
    line = done.output.split("loss mask 0):\n  ", 1)[1].splitlines()[0]
    pieces = line.split("|")
    assert pieces[1].startswith("[") and pieces[1].endswith("]")
    assert "".join(p.strip("[]") for p in pieces) == text
    done = runner.invoke(
        cli, [*base, "--position", "0", "--json", "--tokenizer", str(tokenizer_file.parent)]
    )
    tokens = json.loads(done.output)["response_tokens"]
    assert "".join(t["text"] for t in tokens) == text and tokens[1]["trained"] is False
    assert tokens[0]["log_prob"] == -0.5
    errors = [
        (["--position", "0", "--key", "sample:0"], 2, "not both"),
        (["--key", "sample:1"], 1, "2 samples"),
        (["--key", "9"], 1, "sample keys look like"),
        (["--position", "99"], 1, "no sample at position 99"),
        (["--position", "0", "--field", "nope"], 1, "no field 'nope'"),
        (["--position", "0", "--tokenizer", str(tmp_path / "missing")], 1, "does not exist"),
        (["--position", "0", "--tokenizer", str(tmp_path)], 1, "no tokenizer.json"),
    ]
    for args, code, message in errors:
        done = runner.invoke(cli, [*base, *args])
        assert done.exit_code == code and message in done.output, (args, done.output)
        assert "Traceback" not in done.output
    proc = subprocess.run(
        [sys.executable, "-m", "archive_manager.cli", *base, "--key", "sample:0"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(archive_manager.__file__).parents[1])},
        timeout=120,
    )
    assert proc.returncode == 0 and "the answer is \\boxed{42}" in proc.stdout, proc.stderr


def test_load_tokenizer(tmp_path: Path, tokenizer_file: Path) -> None:
    decoder = load_tokenizer(tokenizer_file.parent)
    assert isinstance(decoder, TokenDecoder) and decoder.path == tokenizer_file
    ids = _encode(tokenizer_file, LINES[1])
    assert "".join(p or "" for p in decoder.pieces(ids)) == LINES[1]
    assert decoder.pieces([10**6, -1]) == [None, None]
    not_one = tmp_path / "tokenizer.json"
    not_one.write_text('{"not": "a tokenizer"}')
    for path, message in (
        (tmp_path / "nope", "does not exist"),
        (tmp_path / "empty", "no tokenizer.json"),
        (not_one, "not a tokenizer"),
    ):
        if path.name == "empty":
            path.mkdir()
        with pytest.raises(InvalidInputError, match=message):
            load_tokenizer(path)


# --------------------------------------------------------------------------- viewer


@pytest.fixture
def viewer(tmp_path: Path, tokenizer_file: Path) -> Iterator[tuple[Any, ArchiveManager]]:
    pytest.importorskip("flask")
    pytest.importorskip("markdown_it")
    from archive_manager.web import create_app

    ids = _encode(tokenizer_file, LINES[2])
    pool = ArchiveManager.open(tmp_path / "pool")
    pool.save("r1", _samples(1, response_ids=ids), rollout_id=1)
    pool.save("r2", _samples(2, response_ids=ids), rollout_id=2)
    client = create_app(pool, tokenizer=load_tokenizer(tokenizer_file)).test_client()
    try:
        yield client, pool
    finally:
        pool.close()


def test_viewer_search_page(viewer: tuple[Any, ArchiveManager]) -> None:
    client, _ = viewer
    page = client.get("/search?q=answer+is+4&rollout_id=2")
    assert page.status_code == 200 and 'id="search-results"' in page.text
    assert "<mark>answer is 4</mark>" in page.text and "/archive/r2/sample/1" in page.text
    data = client.get("/search?q=answer&format=json&limit=3").json
    assert data["limited"] and len(data["matches"]) == 3
    regex = client.get("/search", query_string={"q": r"\\boxed", "regex": "1", "format": "json"})
    assert {m["position"] for m in regex.json["matches"]} == {0, 4}
    hostile = client.get("/search", query_string={"q": "<script>", "fields": "response"})
    assert "<script>alert" not in hostile.text and "&lt;script&gt;" in hostile.text
    assert client.get("/search").status_code == 200  # the empty form
    assert 'id="search-box"' in client.get("/").text
    for query, message in (
        ("format=json", "'q'"),
        ("q=(&regex=1", "does not compile"),
        ("q=a&limit=5000", "'limit'"),
        ("q=a&fields=tokens", "'fields'"),
        ("q=" + "x" * 1001, "'q'"),
        ("q=a%01b", "'q'"),
    ):
        response = client.get("/search?format=json&" + query)
        assert response.status_code == 400 and message in response.json["error"], query


def test_viewer_tokens_markdown_and_compare(viewer: tuple[Any, ArchiveManager]) -> None:
    client, _pool = viewer
    page = client.get("/archive/r1/sample/0").text
    assert 'class="tok piece m0" title="id ' in page and "log-prob -1.0000" in page
    assert "tokenizer.json" in page
    data = client.get("/archive/r1/sample/0?format=json").json
    assert "".join(t["text"] for t in data["response_tokens"]) == LINES[2]
    # Markdown, server-rendered with raw HTML off: model markup stays text.
    md = client.get("/archive/r1/sample/3?view=markdown").text
    assert 'id="response-markdown"' in md and "<strong>bold</strong>" in md
    assert "<script>alert" not in md and "&lt;script&gt;" in md
    assert 'href="javascript' not in md  # markdown-it refuses the URL: the text stays text
    assert "<img" not in md
    assert 'id="response"' in client.get("/archive/r1/sample/3?view=text").text
    group = client.get("/archive/r1/group?task_key=q1&view=markdown").text
    assert 'class="markdown response"' in group and "<script>alert" not in group
    assert client.get("/archive/r1/sample/3?view=html").status_code == 400
    # The prompt history links each rollout to the one before on the compare page.
    prompt = client.get("/prompt?task_key=q1").text
    link = prompt.split('class="compare-link" href="')[1].split('"')[0].replace("&amp;", "&")
    assert urllib.parse.parse_qs(urllib.parse.urlsplit(link).query) == {
        "a": ["r1"],
        "a_position": ["2"],
        "b": ["r2"],
        "b_position": ["2"],
    }
    compare = client.get(link + "&view=markdown")
    assert compare.status_code == 200 and 'id="side-a"' in compare.text
    assert "<script>alert" not in compare.text
    data = client.get(link + "&format=json").json
    assert (data["a"]["archive"], data["b"]["archive"]) == ("r1", "r2")
    assert data["a"]["task_key"] == data["b"]["task_key"] == "q1"
    for query, status in (
        ("a=r1&a_position=0", 400),
        ("a=r1&a_position=0&b=r9&b_position=0", 404),
        ("a=r1&a_position=0&b=r2&b_position=99", 404),
        ("a=r1&a_position=x&b=r2", 400),
    ):
        assert client.get("/compare?" + query).status_code == status, query


def test_serve_refuses_a_bad_tokenizer_in_one_line(tmp_path: Path) -> None:
    with ArchiveManager.open(tmp_path / "pool"):
        pass
    done = CliRunner().invoke(
        cli, ["--root", str(tmp_path / "pool"), "serve", "--tokenizer", str(tmp_path / "x")]
    )
    assert done.exit_code == 1 and "does not exist" in done.output
    assert "Traceback" not in done.output


def test_markdown_without_the_library(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("flask")
    from archive_manager.web import markdown

    markdown._renderer.cache_clear()
    monkeypatch.setitem(sys.modules, "markdown_it", None)
    try:
        assert not markdown.markdown_available()
        with pytest.raises(MissingDependencyError, match="markdown-it-py"):
            markdown.render_markdown("x")
    finally:
        markdown._renderer.cache_clear()
