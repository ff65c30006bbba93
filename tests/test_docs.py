"""The documentation site as a reader gets it: built strictly, readable with the network off.

The site loaded mermaid and web fonts from CDNs, so every protocol diagram showed as raw
``sequenceDiagram`` source offline; and a ``;`` inside a sequence diagram's message (a statement
separator in mermaid) made one diagram fail to render even online.  The build is checked for
external scripts, styles and fonts, and a headless Chromium with every host but the loopback
unresolvable renders each page that has a diagram: every diagram must become an SVG.
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
REQUIRE_ENV = "ARCHIVE_MANAGER_REQUIRE_BROWSER"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    pytest.importorskip("mkdocs")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _pages_with_diagrams(site: Path) -> list[Path]:
    return sorted(p for p in site.rglob("index.html") if 'class="mermaid"' in p.read_text())


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_site_loads_nothing_from_another_host(site: Path) -> None:
    external = re.compile(r"""<(script|link)\b[^>]*\b(src|href)=["']https?://[^"']+["']""")
    for page in site.rglob("*.html"):
        for match in external.finditer(page.read_text()):
            tag = match.group(0)
            if match.group(1) == "link" and "stylesheet" not in tag and "preconnect" not in tag:
                continue  # a plain hyperlink-like <link> (canonical, etc.) fetches nothing
            pytest.fail(f"{page.relative_to(site)} loads {tag}")
    assert _pages_with_diagrams(site), "no page has a diagram: the check below checks nothing"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_every_diagram_renders_with_the_network_off(site: Path, served: str) -> None:
    if not CHROMIUM.exists():
        reason = "no Chromium (apt-get install chromium)"
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(reason)
        pytest.skip(reason)
    for page in _pages_with_diagrams(site):
        url = f"{served}/{page.parent.relative_to(site).as_posix()}/"
        dom = subprocess.run(
            [
                str(CHROMIUM),
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                f"--user-data-dir={site.parent / 'chromium-profile'}",
                # Offline: no name resolves except the loopback server's address.
                "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
                "--virtual-time-budget=15000",
                "--dump-dom",
                url,
            ],
            capture_output=True,
            text=True,
            timeout=180,
        ).stdout
        # Material swaps each <pre class="mermaid"> for a <div class="mermaid"> whose shadow
        # root holds the SVG; a diagram that failed (no script, a parse error) stays a <pre>.
        expected = page.read_text().count('<pre class="mermaid"')
        left = re.findall(r'<pre class="mermaid"[^>]*>(.{0,80})', dom, re.S)
        assert not left, f"{url}: diagrams left as source: {left}"
        assert dom.count('<div class="mermaid"') == expected, f"{url}: {dom[-2000:]}"


def test_no_sequence_message_holds_a_statement_separator() -> None:
    # Found by the render above, kept as a fast check of the docs' sources.
    for doc in (ROOT / "docs").rglob("*.md"):
        for block in re.findall(r"```mermaid\n(.*?)```", doc.read_text(), re.S):
            if block.startswith("sequenceDiagram"):
                assert ";" not in block, f"{doc.name}: ';' ends a mermaid statement early"


def test_the_api_page_shows_every_public_member_of_the_pool() -> None:
    # The page lists ArchiveManager's members one by one, in a user's order: a new member
    # must be placed there, or it is missing from the reference.
    from archive_manager import ArchiveManager

    page = (ROOT / "docs" / "api.md").read_text()
    public = [n for n in vars(ArchiveManager) if not n.startswith("_")]
    missing = [n for n in public if f"::: archive_manager.manager.ArchiveManager.{n}\n" not in page]
    assert not missing, f"add to docs/api.md: {missing}"
    first = page.index("ArchiveManager.open\n")
    assert first < page.index("ArchiveManager.save\n") < page.index("ArchiveManager.root\n")


# A citation of the architecture names a page and a section of it: `docs/architecture/<page>.md,
# "Section"` in code, tests, tools and docs (or a link `(architecture/<page>.md), "Section"` in
# the site's pages), the name broken across comment lines where it is long.  A bold paragraph
# label ("**Native list conversion.**") counts as a section: the pages name their parts so.
_CITATION = re.compile(
    r'architecture/([a-z0-9-]+)\.md(?:#[\w-]*)?\)?`?,?(?:\s*\n\s*(?:#:?|//|\*)?)?\s*"([^"]{1,80})"'
)
_BREAK = re.compile(r"\s*\n\s*(?:#:?|//|\*)?\s*")
_HEADING = re.compile(r"^#{1,6} (.+?)\s*$", re.M)
_LABEL = re.compile(r"^\s*(?:[-*] )?\*\*([^*]+?)\.?\*\*", re.M)
_CITING = ("archive_manager", "tests", "tools", "migrations", "docs", ".ci")


def architecture_sections(docs: Path) -> dict[str, set[str]]:
    """Every page of docs/architecture/ and the names a citation may give of its parts."""
    sections: dict[str, set[str]] = {}
    for page in sorted((docs / "architecture").glob("*.md")):
        text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
        # "Layers (imports point down only)" is cited as "Layers"
        names = {
            n for m in _HEADING.finditer(text) for n in (m.group(1), m.group(1).split(" (")[0])
        }
        sections[page.name] = names | {m.group(1) for m in _LABEL.finditer(text)}
    return sections


def bad_architecture_citations(where: str, text: str, sections: dict[str, set[str]]) -> list[str]:
    """The citations in ``text`` of a page that does not exist, or of a section its page lacks;
    and every mention of the single file the architecture was before it was split."""
    bad = [
        f"{where}: docs/architecture.md is split" for _ in re.finditer(r"architecture\.md", text)
    ]
    for m in _CITATION.finditer(text):
        page, name = m.group(1) + ".md", _BREAK.sub(" ", m.group(2)).strip()
        if page not in sections:
            bad.append(f"{where}: no page docs/architecture/{page}")
        elif name not in sections[page]:
            bad.append(f"{where}: docs/architecture/{page} has no section {name!r}")
    return bad


def test_every_architecture_citation_names_a_section_of_its_page() -> None:
    sections = architecture_sections(ROOT / "docs")
    assert "index.md" in sections and "Layers (imports point down only)" in sections["index.md"]
    files = [
        ROOT / n for n in ("README.md", "CHANGELOG.md", "pyproject.toml", "setup.py", "mkdocs.yml")
    ]
    for top in _CITING:
        files += (p for p in (ROOT / top).rglob("*") if p.suffix in (".py", ".c", ".md", ""))
    bad: list[str] = []
    cited = 0
    for path in files:
        # this file cites missing sections on purpose, in the test below
        if not path.is_file() or path.name == "mermaid.min.js" or path == Path(__file__):
            continue
        text = path.read_text(errors="replace")
        cited += len(_CITATION.findall(text))
        bad += bad_architecture_citations(str(path.relative_to(ROOT)), text, sections)
    assert not bad, "\n".join(bad)
    assert cited > 300, "the citations were not found: the check checks nothing"


def test_a_citation_of_a_missing_section_or_page_is_found() -> None:
    sections = {"search.md": {"Search", "Patterns"}, "index.md": {"Words"}}
    page = "docs/architecture/search.md"
    assert (
        bad_architecture_citations(
            "a.py", f'# ({page}, "Search") and ({page},\n# "Patterns")', sections
        )
        == []
    )
    assert bad_architecture_citations("a.py", f'# ({page},\n# "Save protocol")', sections) == [
        "a.py: docs/architecture/search.md has no section 'Save protocol'"
    ]
    assert bad_architecture_citations(
        "a.md", '[x](architecture/gc.md), "GC protocol"', sections
    ) == ["a.md: no page docs/architecture/gc.md"]
    old = "docs/architecture" + ".md"
    assert bad_architecture_citations("a.py", f'({old}, "Search")', sections) == [
        "a.py: docs/architecture.md is split"
    ]


# A path of the repository as scripts, docs and comments name it: tests/pool/test_save.py,
# tools/crash_matrix.py, tests/crash/test_crash_matrix*.py (a glob), .ci/run.
_PATH = re.compile(
    r"(?<![\w/.-])((?:tests|tools|archive_manager|docs|migrations|\.ci)/[\w.*/-]*[\w*])"
)


def missing_paths(text: str, root: Path) -> list[str]:
    """The repository paths ``text`` names that match nothing under ``root``.

    A name may be a glob or the start of one (``archive_manager/codec/_native`` names the
    built extension, whatever its suffix).
    """
    missing = []
    for name in sorted(set(_PATH.findall(text))):
        if not any(root.glob(name)) and not any(root.glob(name + "*")):
            missing.append(name)
    return missing


def test_every_path_the_scripts_docs_and_comments_name_exists() -> None:
    # CI went red for a day because .ci/dist-check still ran tests/codec/test_roundtrip.py after
    # it moved to tests/interop/ (pytest found no tests and exited 5); docs named modules that
    # had moved into packages.  The CHANGELOG names paths as they were and .gitignore paths that
    # may never exist: both are left out.
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout")
    # the tests of this check and of the layering name paths that must not exist
    made_up = {"tests/test_docs.py", "tests/test_layering.py", "tests/test_packaging.py"}
    suffixes = {".py", ".c", ".md", ".toml", ".yml", ".ini", ".cfg", ".in", ".sh", ""}
    bad = []
    for name in tracked:
        path = ROOT / name
        if name in ("CHANGELOG.md", ".gitignore") or name in made_up or path.suffix not in suffixes:
            continue
        if not path.is_file() or path.name == "mermaid.min.js":
            continue
        bad += [f"{name}: {p}" for p in missing_paths(path.read_text(errors="replace"), ROOT)]
    assert len(tracked) > 200
    assert not bad, "\n".join(bad)


def test_a_moved_test_file_is_found(tmp_path: Path) -> None:
    (tmp_path / "tests" / "interop").mkdir(parents=True)
    (tmp_path / "tests" / "interop" / "test_roundtrip.py").write_text("")
    (tmp_path / "archive_manager" / "codec").mkdir(parents=True)
    (tmp_path / "archive_manager" / "codec" / "_native.cpython-311.so").write_text("")
    text = (
        "pytest tests/codec/test_roundtrip.py tests/interop/test_roundtrip.py\n"
        "# tests/interop/test_*.py and archive_manager/codec/_native, not tests/crash/\n"
    )
    assert missing_paths(text, tmp_path) == ["tests/codec/test_roundtrip.py", "tests/crash"]
