"""Start-up: no verb imports what it does not need (docs/architecture/index.md, "Layers", and
docs/architecture/start-up.md, "Start-up").

Importing torch costs seconds, more than any catalog verb; it used to be imported by
``import archive_manager`` and so by every CLI call and every TAB completion.  SQLAlchemy and
numpy cost most of what was left: ``--help`` and completion import neither, and ``ls`` no
numpy and no zstandard.  Each case runs the real entry point in a fresh interpreter (a
process that imported a module once cannot tell) and reports, at exit, which of the heavy
modules were imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import small_rollout

from archive_manager import ArchiveManager
from archive_manager.catalog import migrate

pytestmark = pytest.mark.timeout(600)

WORKTREE = Path(__file__).resolve().parents[1]
MARK = "heavy-imported="
#: The modules whose import a start-up pays for, and that a verb must not import in vain.
HEAVY = ("torch", "sqlalchemy", "sqlalchemy.orm", "numpy", "zstandard", "pyarrow", "alembic")
# The console script's entry point, with a report of sys.modules at exit (after the pool
# was closed and click's completion or --help exited).
ENTRY = (
    "import atexit, sys\n"
    f"HEAVY = {HEAVY!r}\n"
    "def report():\n"
    "    found = ','.join(m for m in HEAVY if m in sys.modules)\n"
    f"    sys.stderr.write('\\n{MARK}' + found + '\\n')\n"
    "atexit.register(report)\n"
    "from archive_manager.cli import main\n"
    "main()\n"
)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ARCHIVE_MANAGER_", "_ARCH"))}
    # The tree under test, not an installed copy.
    env["PYTHONPATH"] = os.pathsep.join([str(WORKTREE), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep
    )
    env.update(extra)
    return env


def _python(*args: str | Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``python *args`` on the tree under test."""
    return subprocess.run(
        [sys.executable, *map(str, args)],
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=300,
    )


def _run_heavy(args: list[str], **env: str) -> tuple[str, set[str]]:
    """Run the CLI with ``args``; its stdout and which of `HEAVY` it imported."""
    done = _python("-c", ENTRY, *args, **env)
    assert done.returncode == 0, f"{args}: {done.stderr}"
    marks = [line for line in done.stderr.splitlines() if line.startswith(MARK)]
    assert len(marks) == 1, done.stderr
    return done.stdout, set(filter(None, marks[0].removeprefix(MARK).split(",")))


def _run(args: list[str], **env: str) -> tuple[str, bool]:
    """Run the CLI with ``args``; its stdout and whether it imported torch."""
    out, heavy = _run_heavy(args, **env)
    return out, "torch" in heavy


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A small pool whose archives hold tensors, in-chunk and as tensor blobs."""
    root = tmp_path_factory.mktemp("startup") / "pool"
    with ArchiveManager.open(root, inline_limit=256) as pool:
        for i in range(3):
            pool.save(f"rollout-{i}", small_rollout(6, seed=i, r3_layers=2), rollout_id=i)
        pool.save("eval-0", small_rollout(3, seed=9, r3_layers=2), rollout_id=0, evaluation=True)
    yield root


READ_VERBS = [
    ["--help"],
    ["--version"],
    ["ls"],
    ["ls", "--json"],
    ["show", "rollout-1"],
    ["keys", "rollout-1"],
    ["query", "--limit", "5"],
    ["info"],
    ["stats"],
    ["owners"],
    ["gc", "--dry-run"],
    ["verify"],
    ["db", "--help"],
    ["db", "current"],
    ["db", "upgrade"],
    ["groups", "rollout-1"],
    ["release", "--dry-run", "rollout-1"],
    ["release-owner", "--dry-run", "checkpoint:nobody"],
    ["forget", "--dry-run", "--keep-last", "1"],
]


@pytest.mark.parametrize("args", READ_VERBS, ids=" ".join)
def test_catalog_verbs_never_import_torch(root: Path, args: list[str]) -> None:
    out, imported = _run(["--root", str(root), *args])
    assert out
    assert not imported, f"archive-manager {' '.join(args)} imported torch"


# A lean install (no torch extra): torch cannot be imported at all.
NO_TORCH = "import sys\nsys.modules['torch'] = None\nfrom archive_manager.cli import main\nmain()\n"


@pytest.mark.parametrize(
    "args",
    [["ls"], ["stats"], ["show", "rollout-1"], ["verify"], ["keys", "rollout-1"]],
    ids=" ".join,
)
def test_catalog_verbs_run_without_torch_installed(root: Path, args: list[str]) -> None:
    done = _python("-c", NO_TORCH, "--root", root, *args)
    assert done.returncode == 0, done.stderr
    assert done.stdout


def test_what_needs_torch_names_the_extra_in_one_line(root: Path, tmp_path: Path) -> None:
    done = _python("-c", NO_TORCH, "--root", root, "export", "rollout-1", tmp_path / "out.pt")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        "error: this needs PyTorch, which is not installed; install the 'torch' extra: "
        "pip install -e '.[torch]' in a checkout of archive_manager (or pip install "
        "'rollout-archive-manager[torch]' where that distribution is installed)"
    ]
    assert not (tmp_path / "out.pt").exists()
    # Reading a sample that holds a tensor needs torch: the record is sound, the install lacks it.
    done = _python("-c", NO_TORCH, "--root", root, "sample", "rollout-1")
    assert done.returncode != 0
    assert "pip install -e '.[torch]'" in done.stderr
    assert "malformed" not in done.stderr
    done = _python("-c", "import sys\nsys.modules['torch'] = None\nimport archive_manager.data")
    assert "MissingDependencyError: the torch datasets need PyTorch" in done.stderr


def test_the_demo_runs_without_torch_installed(tmp_path: Path) -> None:
    done = _python("-c", NO_TORCH, "--root", tmp_path / "pool", "demo")
    assert done.returncode == 0, done.stderr
    assert "routed experts     int32" in done.stdout
    # Its "Try next" export runs there too (it suggested a .pt, which needs torch).
    (export,) = [line.split() for line in done.stdout.splitlines() if " export " in line]
    assert export[-1] == "rollout-1.jsonl"
    ran = _python("-c", NO_TORCH, *export[1:-1], tmp_path / export[-1])
    assert ran.returncode == 0, ran.stderr
    assert (tmp_path / "rollout-1.jsonl").is_file()


def test_changing_verbs_never_import_torch(tmp_path: Path) -> None:
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        pool.save("a", small_rollout(4, seed=1, r3_layers=2), rollout_id=1)
    for args in (
        ["retain", "checkpoint:step-1", "a"],
        ["forget", "--yes", "--keep-within", "1h", "--rollout-id", "5.."],
        ["release", "--yes", "a"],
        ["release-owner", "--yes", "checkpoint:step-1"],
        ["gc", "--yes", "--grace", "0s"],
    ):
        _, imported = _run(["--root", str(root), *args])
        assert not imported, f"archive-manager {' '.join(args)} imported torch"
    with ArchiveManager.open(root) as pool:
        assert pool.find(state=None)[0].state == "released"


def _complete(root: Path, words: str, shell: str = "bash") -> tuple[list[str], set[str]]:
    """Complete ``words``; the completions and which heavy modules that imported."""
    cword = len(words.split()) - (0 if words.endswith(" ") else 1)
    out, heavy = _run_heavy(
        [],
        _ARCHIVE_MANAGER_COMPLETE=f"{shell}_complete",
        COMP_WORDS=f"archive-manager --root {root} {words}",
        COMP_CWORD=str(cword + 3),  # after archive-manager --root ROOT
    )
    return [line for line in out.splitlines() if line], heavy


def test_completion_of_archive_names_reads_only_the_catalog(root: Path) -> None:
    # Not even SQLAlchemy: a SQLite catalog is read with sqlite3 (cli/_complete.py).
    lines, heavy = _complete(root, "show ")
    assert lines == [f"plain,{n}" for n in ("eval-0", "rollout-0", "rollout-1", "rollout-2")]
    assert not heavy, heavy
    lines, heavy = _complete(root, "retain checkpoint:x roll")
    assert lines == [f"plain,rollout-{i}" for i in range(3)]
    assert not heavy, heavy


def test_completion_of_verbs_and_names_elsewhere(root: Path, tmp_path: Path) -> None:
    lines, heavy = _complete(root, "re")
    assert {"plain,release", "plain,release-owner", "plain,retain"} <= set(lines)
    assert not heavy, heavy
    # No pool there: nothing to offer, no error in the user's shell, nothing created.
    lines, heavy = _complete(tmp_path / "nothing", "keys ")
    assert lines == [] and not heavy, heavy
    assert not (tmp_path / "nothing").exists()
    # zsh gets each name's rollout and state as its description.
    lines, _ = _complete(root, "keys eval", shell="zsh")
    assert lines == ["plain", "eval-0", "rollout 0, published"]


def test_import_archive_manager_does_not_import_torch() -> None:
    for module in ("archive_manager", "archive_manager.cli", "archive_manager.web"):
        done = _python("-c", f"import sys, {module}; print('torch' in sys.modules)")
        assert done.stdout.strip() == "False", (module, done.stderr)


def test_import_archive_manager_and_its_cli_import_no_heavy_module() -> None:
    # The package's names come on first use (PEP 562), and the CLI's modules import the
    # library inside their verbs: loading either costs no SQLAlchemy, numpy, zstandard.
    for module in ("archive_manager", "archive_manager.cli"):
        done = _python(
            "-c", f"import sys, {module}; print(sorted(set({HEAVY!r}) & set(sys.modules)))"
        )
        assert done.stdout.strip() == "[]", (module, done.stdout, done.stderr)


LAZY_NAMES = """
import sys, archive_manager
assert "sqlalchemy" not in sys.modules
namespace = {}
exec("from archive_manager import *", namespace)
exported = sorted(k for k in namespace if k != "__builtins__")
assert exported == sorted(archive_manager.__all__), exported
from archive_manager.manager import ArchiveManager
from archive_manager.samples import Sample
from archive_manager.codec import TensorRef
assert namespace["ArchiveManager"] is ArchiveManager is archive_manager.ArchiveManager
assert namespace["Sample"] is Sample and namespace["TensorRef"] is TensorRef
assert set(archive_manager.__all__) <= set(dir(archive_manager))
assert archive_manager.errors.__name__ == "archive_manager.errors"  # a public submodule, on first use
for missing in ("Nope", "__wrapped__"):
    try:
        getattr(archive_manager, missing)
    except AttributeError as exc:
        assert missing in str(exc), exc
    else:
        raise AssertionError(missing)
print("ok")
"""


def test_the_lazy_package_keeps_every_public_name() -> None:
    done = _python("-c", LAZY_NAMES)
    assert done.stdout.strip() == "ok", done.stderr


@pytest.mark.parametrize(
    "args",
    [["--help"], ["--version"], ["ls", "--help"], ["export", "--help"], ["db", "--help"]],
    ids=" ".join,
)
def test_help_imports_neither_sqlalchemy_nor_numpy(root: Path, args: list[str]) -> None:
    out, heavy = _run_heavy(["--root", str(root), *args])
    assert out
    assert not heavy, f"archive-manager {' '.join(args)} imported {sorted(heavy)}"


CATALOG_VERBS = [
    ["show", "rollout-1"],
    ["keys", "rollout-1"],
    ["info"],
    ["owners"],
    ["query", "--limit", "2"],
    ["stats"],
    ["groups", "rollout-1"],
]


@pytest.mark.parametrize("args", CATALOG_VERBS, ids=" ".join)
def test_catalog_verbs_import_no_codec(root: Path, args: list[str]) -> None:
    # They read the catalog only: SQLAlchemy Core, not its ORM (the catalog declares Core
    # tables), and not numpy or zstandard (the codec's).
    out, heavy = _run_heavy(["--root", str(root), *args])
    assert out
    assert heavy == {"sqlalchemy"}, f"archive-manager {' '.join(args)} imported {sorted(heavy)}"


LISTINGS = [
    ["ls"],
    ["ls", "--json"],
    ["ls", "--rollout-id", "1.."],
    ["ls", "--state", "all", "--format", "csv"],
    ["ls", "--limit", "2", "--after", "rollout-0"],
    ["ls", "--task-key", "0", "--no-evaluation", "--since", "1d"],
]


@pytest.mark.parametrize("args", LISTINGS, ids=" ".join)
def test_listing_a_sqlite_pool_imports_no_sqlalchemy(root: Path, args: list[str]) -> None:
    # Read with sqlite3 (_sqlite_listing.py), as the open would find it: not even SQLAlchemy.
    out, heavy = _run_heavy(["--root", str(root), *args])
    assert out
    assert not heavy, f"archive-manager {' '.join(args)} imported {sorted(heavy)}"


def test_listing_falls_back_to_the_open_with_a_catalog_url_with_options(root: Path) -> None:
    url = f"sqlite:///{root / 'catalog.db'}?timeout=5"
    out, heavy = _run_heavy(["--root", str(root), "--catalog-url", url, "ls"])
    assert "rollout-1" in out
    assert heavy == {"sqlalchemy"}, heavy


SAVE_AND_LOAD = """
import sys
from archive_manager import ArchiveManager
from archive_manager.interop.synthetic import make_rollout

samples = make_rollout(5, seed=3, prompt_len=10, response_min=5, response_max=20, r3_layers=0)
with ArchiveManager.open(sys.argv[1]) as pool:
    pool.save("plain", samples, rollout_id=0)
    back = pool.open_archive("plain").load_samples()
    arrays = pool.open_archive("plain").load_samples(as_arrays=True)
assert [s.tokens for s in back] == [s.tokens for s in samples]
assert [list(s.tokens) for s in arrays] == [s.tokens for s in samples]
print("torch" in sys.modules)
"""


def test_a_rollout_without_tensors_saves_and_loads_without_torch(tmp_path: Path) -> None:
    done = _python("-c", SAVE_AND_LOAD, tmp_path / "pool")
    assert done.stdout.strip() == "False", done.stderr


def test_numpy_arrays_stored_as_blobs_save_and_load_without_torch(tmp_path: Path) -> None:
    """slime's numpy routed experts, above the inline limit, are blobs read by numpy alone."""
    script = (
        "import sys\nimport numpy as np\nfrom archive_manager import ArchiveManager\n"
        "from archive_manager.interop.synthetic import make_rollout\n"
        "samples = make_rollout(3, seed=3, prompt_len=300, response_min=200, response_max=300,"
        " r3_layers=4, r3_numpy=True)\n"
        "with ArchiveManager.open(sys.argv[1], inline_limit=1024) as pool:\n"
        "    pool.save('np', samples, rollout_id=0)\n"
        "    back = pool.open_archive('np').load_samples()\n"
        "    same = all(np.array_equal(a.rollout_routed_experts, b.rollout_routed_experts)"
        " for a, b in zip(back, samples))\n"
        "    blobs = pool.verify().blobs_checked\n"
        "print(type(back[0].rollout_routed_experts).__name__, same, blobs, 'torch' in sys.modules)\n"
    )
    done = _python("-c", script, tmp_path / "pool")
    # a chunk, a manifest and three array blobs
    assert done.stdout.split() == ["ndarray", "True", "5", "False"], done.stderr


def test_a_rollout_with_tensors_still_loads_them(tmp_path: Path) -> None:
    # The other side of the rule: where a tensor is decoded, torch comes in by itself.
    script = (
        "import sys\nfrom archive_manager import ArchiveManager\n"
        "with ArchiveManager.open(sys.argv[1]) as pool:\n"
        "    (s,) = pool.open_archive('t').load_samples()\n"
        "    print(type(s.rollout_routed_experts).__name__, 'torch' in sys.modules)\n"
    )
    with ArchiveManager.open(tmp_path / "pool") as pool:
        pool.save("t", small_rollout(1, seed=4, r3_layers=2), rollout_id=0)
    done = _python("-c", script, tmp_path / "pool")
    assert done.stdout.split() == ["Tensor", "True"], done.stderr


def test_bench_startup_quick_run(tmp_path: Path) -> None:
    done = _python(
        WORKTREE / "tools" / "bench_startup.py", "--runs", "1", "--archives", "3", "--json"
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert set(result["commands"]) >= {
        "python -c pass",
        "archive-manager --help",
        "archive-manager ls",
    }
    assert result["commands"]["python -c pass"]["ratio"] == 1.0
    assert set(result["target_met"]) == {"archive-manager --help", "archive-manager ls"}
    assert all(row["cpu_median_s"] > 0 for row in result["commands"].values())


def test_bench_startup_times_a_baseline_tree_alongside(tmp_path: Path) -> None:
    # The tree itself as its own baseline: every command again, under "(baseline)".
    done = _python(
        WORKTREE / "tools" / "bench_startup.py",
        *("--runs", "1", "--archives", "2", "--json", "--baseline", WORKTREE),
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    names = set(result["commands"])
    assert "archive-manager ls (baseline)" in names and "archive-manager ls" in names
    assert "python -c pass (baseline)" not in names
    assert result["baseline"] == str(WORKTREE)
    refused = _python(WORKTREE / "tools" / "bench_startup.py", "--baseline", tmp_path)
    assert refused.returncode == 2 and "holds no archive_manager" in refused.stderr


def test_bench_startup_times_another_interpreter_alongside(tmp_path: Path) -> None:
    # A lean venv's python in the same rounds (here this interpreter through a link in a
    # folder named like a venv): its rows compared with its own bare python.
    (tmp_path / "lean" / "bin").mkdir(parents=True)
    other = tmp_path / "lean" / "bin" / "python"
    other.symlink_to(sys.executable)
    done = _python(
        WORKTREE / "tools" / "bench_startup.py",
        *("--runs", "1", "--archives", "2", "--json", "--other-python", other),
    )
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["commands"]
    assert {"python -c pass (lean)", "archive-manager ls (lean)", "archive-manager ls"} <= set(rows)
    assert rows["python -c pass (lean)"]["ratio"] == 1.0


def test_the_head_revision_constant_is_alembics_head() -> None:
    # Opens compare a catalog with HEAD_REVISION, not with what Alembic would parse.
    assert migrate.script_head_revision() == migrate.HEAD_REVISION


def test_listing_an_up_to_date_pool_does_not_import_alembic(root: Path) -> None:
    script = (
        "import sys\nfrom archive_manager.cli import main\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
        "print('alembic' in sys.modules, 'torch' in sys.modules)\n"
    )
    done = _python("-c", script, "--root", root, "ls")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-2:] == ["False", "False"], done.stdout


def test_python_m_archive_manager_runs_the_cli() -> None:
    # Break: `python -m archive_manager` failed ("No module named archive_manager.__main__");
    # only `python -m archive_manager.cli` worked.
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARCHIVE_MANAGER_")}
    env["PYTHONPATH"] = str(WORKTREE)
    script = (
        "import runpy, sys\n"
        "sys.argv = ['archive_manager', '--help']\n"
        "try:\n"
        "    runpy.run_module('archive_manager', run_name='__main__')\n"
        "except SystemExit as exit:\n"
        "    heavy = [m for m in ('torch', 'sqlalchemy', 'numpy') if m in sys.modules]\n"
        "    print('heavy=' + ','.join(heavy), 'code=' + str(exit.code))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert "Usage: archive-manager" in done.stdout, done.stderr
    assert done.stdout.splitlines()[-1] == "heavy= code=0"
