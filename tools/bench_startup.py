#!/usr/bin/env python3
"""Start-up time of the CLI against a bare interpreter (docs/architecture/index.md, "Layers").

Runs, each in a fresh process and interleaved round by round (so a burst of load elsewhere
hits every command alike): ``python -c pass``, ``import archive_manager``,
``archive-manager --help``, ``archive-manager ls`` (read with sqlite3:
``archive_manager/_util/sqlite_read.py``), the same ``ls`` through the library's full open (a
catalog URL with an option, which the sqlite3 listing leaves to the open) and an
archive-name completion, on a pool of ``--archives`` archives; it prints the median (and
fastest) wall time of each, with the difference to and ratio over bare python, and the
median CPU time (user + system) of each, which other jobs on the machine inflate far less
than the wall time.  Target (issue 18): ``--help`` and ``ls`` within 0.3 s of bare python on
a quiet machine.

The children read compiled bytecode from a cache of their own (``PYTHONPYCACHEPREFIX``, filled
by a warm-up run), as an installed package's ``.pyc`` files are read: with bytecode writing
off (``PYTHONDONTWRITEBYTECODE``) a source tree is compiled again by every process, which is
not what a user's start-up costs.  ``--no-bytecode-cache`` measures that case instead.

``--baseline TREE`` times the same commands on another source tree of the package too (an
earlier commit, e.g. ``git archive <commit> | tar -x -C TREE``), in the same rounds, so a
change is measured before and after under one load; its rows end in ``(baseline)``.

``--other-python PY`` times bare python and this tree's commands with another interpreter
too (a lean virtual environment's, without torch: ``python3 -m venv lean &&
lean/bin/pip install dist/rollout_archive_manager-*.whl``), in the same rounds; its rows
end in ``(<its environment's folder name>)`` and are compared with its own bare python.

    python3 tools/bench_startup.py [--runs 21] [--archives 100] [--root DIR] [--json]
                                   [--no-bytecode-cache] [--baseline TREE] [--other-python PY]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TARGET_SECONDS = 0.3
TARGETS = ("archive-manager --help", "archive-manager ls")
# What the console script runs (its wrapper imports main and calls it).
ENTRY = "from archive_manager.cli import main; main()"


def make_pool(root: Path, archives: int) -> None:
    """A pool of ``archives`` small archives (four samples, no tensors) at ``root``."""
    from archive_manager import ArchiveManager
    from archive_manager.interop.synthetic import make_rollout

    shape = {"prompt_len": 8, "response_min": 4, "response_max": 12, "group_size": 2}
    with ArchiveManager.open(root) as pool:
        for i in range(archives):
            pool.save(f"rollout-{i:04d}", make_rollout(4, seed=i, **shape), rollout_id=i)


BASELINE = " (baseline)"


def commands(
    root: Path, tree: Path = REPO, py: str = sys.executable
) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Each measured command of the package in ``tree`` run by ``py``: argv and extra
    environment."""
    cli = [py, "-c", ENTRY, "--root", str(root)]
    tree_env = {"PYTHONPATH": str(tree)}
    measured: dict[str, tuple[list[str], dict[str, str]]] = {
        "import archive_manager": ([py, "-c", "import archive_manager"], {}),
        "archive-manager --help": ([py, "-c", ENTRY, "--help"], {}),
        "archive-manager ls": ([*cli, "ls"], {}),
        # The open's path (SQLAlchemy), which every other catalog and any pool not plainly
        # as an open leaves it takes: a URL with an option is never read with sqlite3.
        "archive-manager ls (full open)": (
            [*cli, "--catalog-url", f"sqlite:///{root / 'catalog.db'}?timeout=30", "ls"],
            {},
        ),
        "completion: show rollout-00<TAB>": (
            [py, "-c", ENTRY],
            {
                "_ARCHIVE_MANAGER_COMPLETE": "bash_complete",
                "COMP_WORDS": f"archive-manager --root {root} show rollout-00",
                "COMP_CWORD": "4",
            },
        ),
    }
    return {name: (argv, {**tree_env, **extra}) for name, (argv, extra) in measured.items()}


BARE = "python -c pass"


def other_suffix(python: str) -> str:
    """The suffix of the rows of another interpreter: its environment's folder name."""
    return f" ({Path(python).absolute().parent.parent.name})"


def all_commands(
    root: Path, baseline: Path | None = None, other_python: str | None = None
) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Bare python, this tree's commands, the baseline tree's (if any), and bare python and
    this tree's commands run by another interpreter (if any)."""
    todo = {BARE: ([sys.executable, "-c", "pass"], {})}
    todo.update(commands(root))
    if baseline is not None:
        for name, command in commands(root, baseline).items():
            todo[name + BASELINE] = command
    if other_python is not None:
        suffix = other_suffix(other_python)
        todo[BARE + suffix] = ([other_python, "-c", "pass"], {})
        for name, command in commands(root, py=other_python).items():
            todo[name + suffix] = command
    return todo


def _env(extra: dict[str, str], pycache: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARCHIVE_MANAGER_")}
    if pycache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
    extra = dict(extra)
    # The tree measured (``extra``'s PYTHONPATH), whatever copy of the package is installed.
    tree = extra.pop("PYTHONPATH", str(REPO))
    env["PYTHONPATH"] = os.pathsep.join([tree, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_once(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """Wall time and CPU time (user + system) of one run of ``argv`` in the folder ``cwd``.

    NOTE: ``python -c`` puts its working folder first on ``sys.path``, before
    ``PYTHONPATH``: run from a checkout, every child imported that checkout's package, the
    baseline tree's rows included.  The children run in a folder of the benchmark's own.
    """
    cpu = _children_cpu()
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{argv} failed: {done.stderr.decode(errors='replace')}")
    # Runs are sequential: the children's total grew by this child's time alone.
    return elapsed, _children_cpu() - cpu


def measure(
    root: Path,
    runs: int,
    pycache: Path | None,
    baseline: Path | None = None,
    other_python: str | None = None,
) -> dict[str, list[tuple[float, float]]]:
    cwd = Path(tempfile.mkdtemp(prefix="bench-startup-cwd-"))  # empty: nothing to import
    try:
        return _measure(root, runs, pycache, baseline, other_python, cwd)
    finally:
        shutil.rmtree(cwd, ignore_errors=True)


def _measure(
    root: Path,
    runs: int,
    pycache: Path | None,
    baseline: Path | None,
    other_python: str | None,
    cwd: Path,
) -> dict[str, list[tuple[float, float]]]:
    todo = {
        name: (argv, _env(extra, pycache))
        for name, (argv, extra) in all_commands(root, baseline, other_python).items()
    }
    for argv, env in todo.values():  # warm the page cache and .pyc files first
        time_once(argv, env, cwd)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in todo}
    for _ in range(runs):
        for name, (argv, env) in todo.items():
            times[name].append(time_once(argv, env, cwd))
    return times


def summarize(
    times: dict[str, list[tuple[float, float]]], other_python: str | None = None
) -> dict[str, Any]:
    """Per command: wall time (median, fastest, over and times bare python: the same
    interpreter's) and the median CPU time, which a loaded machine inflates far less than
    the wall time."""
    suffix = None if other_python is None else other_suffix(other_python)
    rows = {}
    for name, runs in times.items():
        own = BARE + suffix if suffix is not None and name.endswith(suffix) else BARE
        bare = statistics.median(wall for wall, _ in times[own])
        bare_cpu = statistics.median(cpu for _, cpu in times[own])
        values = [wall for wall, _ in runs]
        median = statistics.median(values)
        cpu = statistics.median(c for _, c in runs)
        rows[name] = {
            "median_s": round(median, 4),
            "min_s": round(min(values), 4),
            "over_python_s": round(median - bare, 4),
            "ratio": round(median / bare, 2),
            "cpu_median_s": round(cpu, 4),
            "cpu_over_python_s": round(cpu - bare_cpu, 4),
        }
    met = {name: rows[name]["over_python_s"] <= TARGET_SECONDS for name in TARGETS}
    return {"commands": rows, "target_s": TARGET_SECONDS, "target_met": met}


def print_table(result: dict[str, Any], runs: int, archives: int) -> None:
    print(f"start-up, median of {runs} runs each, pool of {archives} archives")
    print(
        f"{'command':47} {'median':>8} {'fastest':>8} {'- python':>9} {'x python':>9}"
        f" {'cpu':>8} {'cpu - py':>9}"
    )
    for name, row in result["commands"].items():
        print(
            f"{name:47} {row['median_s']:7.3f}s {row['min_s']:7.3f}s "
            f"{row['over_python_s']:+8.3f}s {row['ratio']:8.1f}x "
            f"{row['cpu_median_s']:7.3f}s {row['cpu_over_python_s']:+8.3f}s"
        )
    for name, met in result["target_met"].items():
        verdict = "met" if met else "NOT met"
        print(f"target: {name} within {result['target_s']} s of bare python: {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21, help="runs of each command")
    parser.add_argument("--archives", type=int, default=100, help="archives in the pool")
    parser.add_argument("--root", type=Path, help="an existing pool to list (default: a new one)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another source tree of the package (holding archive_manager/) to time alongside",
    )
    parser.add_argument(
        "--other-python",
        help="another interpreter (a lean venv's python) whose start-up to time alongside",
    )
    parser.add_argument(
        "--no-bytecode-cache",
        action="store_true",
        help="run the children with the environment's bytecode settings as they are",
    )
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.baseline is not None and not (args.baseline / "archive_manager").is_dir():
        parser.error(f"--baseline {args.baseline} holds no archive_manager package")
    work = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    try:
        root = args.root
        if root is None:
            root = work / "pool"
            make_pool(root, args.archives)
        pycache = None if args.no_bytecode_cache else work / "pycache"
        times = measure(root, args.runs, pycache, args.baseline, args.other_python)
        result = summarize(times, args.other_python)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result.update(runs=args.runs, archives=args.archives if args.root is None else None)
    result["baseline"] = None if args.baseline is None else str(args.baseline)
    result["other_python"] = args.other_python
    result["bytecode_cache"] = not args.no_bytecode_cache
    result["load_average"] = list(os.getloadavg())
    result["cpus"] = os.cpu_count()
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result, args.runs, args.archives)
        load = ", ".join(f"{v:.1f}" for v in result["load_average"])
        print(f"load average at the end: {load} on {result['cpus']} cpus")


if __name__ == "__main__":
    main()
