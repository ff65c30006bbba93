"""Run by tests/pool/test_shared_pools.py inside a private mount namespace where the pool is a
read-only bind mount: every read verb and API call, then every write, which must fail with
`ReadOnlyPoolError` (the CLI: one line, exit 1).  Prints one JSON object: what was read and
what each write said.

Usage: python _read_only_reader.py ROOT CATALOG_URL|- OUT_DIR POINTER|- [live]
(``live``: after the first reads, print ``READY``, wait for a line on stdin, then list the
archives again: a writer saved one meanwhile.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def main() -> None:
    from archive_manager import ArchiveManager, RolloutArchive
    from archive_manager.errors import ArchiveError, ReadOnlyPoolError

    root, url_arg, out_arg, pointer_arg = sys.argv[1:5]
    live = sys.argv[5:6] == ["live"]
    url = None if url_arg == "-" else url_arg
    out = Path(out_arg)
    result: dict[str, Any] = {}

    with ArchiveManager.open(root, url, create=False) as pool:  # read-only detected
        result["read_only"] = pool.read_only
        result["reason"] = pool.read_only_reason
        result["names"] = [i.name for i in pool.find()]
        result["info_archives"] = pool.info().archives
        name = result["names"][0]
        arc = pool.open_archive(name)
        keys = arc.keys()
        result["keys"] = len(keys)
        result["loaded"] = len(arc.load_samples())
        result["by_key"] = len(arc.load_samples(sample_key=keys[0][0]))
        result["by_task"] = len(arc.load_samples(task_key=keys[0][1]))
        result["as_arrays"] = len(arc.load_samples(as_arrays=True))
        result["one_by_one"] = sum(1 for i in range(len(arc)) if arc.load_sample(i) is not None)
        result["metadata"] = len(arc.sample_metadata())
        result["owners"] = sorted(arc.owners())
        result["query"] = len(pool.query(task_key=keys[0][1]))
        result["stats"] = len(pool.stats())
        result["owners_report"] = len(pool.owners().as_dict()["owners"])
        result["exported"] = arc.export_pt(out / "export.pt").stat().st_size
        result["verify"] = pool.verify().ok
        result["verify_data"] = pool.verify(read_data=True).as_dict()
        result["gc_plan"] = pool.gc(dry_run=True).blobs
        result["release_plan"] = len(pool.release_plan(name=name).as_dict())
        from archive_manager.web import create_app

        client = create_app(pool).test_client()
        pages = [
            "/",
            "/stats",
            f"/archive/{name}",
            f"/archive/{name}/sample/0",
            # Keyset pages of the statistics and of the pool's JSON.
            "/stats?format=json&per_page=1&after=1:training",
            f"/?format=json&per_page=1&after={name}",
        ]
        result["pages"] = [client.get(page).status_code for page in pages]

        writes = {
            "save": lambda: pool.save("new", [{"x": 1}], rollout_id=9),
            "writer": lambda: pool.writer("new2", rollout_id=9),
            "release": lambda: pool.open_archive(name).release(),
            "retain": lambda: pool.retain("checkpoint:x", name),
            "release_owner": lambda: pool.release_owner("checkpoint:keep"),
            "gc": lambda: pool.gc(grace=0),
            "rebuild": lambda: pool.rebuild_catalog(),
        }
        refused = {}
        for what, call in writes.items():
            try:
                call()
                refused[what] = "NOT REFUSED"
            except ReadOnlyPoolError as exc:
                refused[what] = str(exc)
            except ArchiveError as exc:
                refused[what] = f"{type(exc).__name__}: {exc}"
        result["refused"] = refused
        if live:
            print("READY", flush=True)
            sys.stdin.readline()
            result["names_later"] = [i.name for i in pool.find()]

    if pointer_arg != "-":
        with RolloutArchive(pointer_arg) as facade:
            result["facade"] = [facade.pool.read_only, len(facade.load_samples())]
            try:
                facade.release()
                result["facade_release"] = "NOT REFUSED"
            except ReadOnlyPoolError as exc:
                result["facade_release"] = str(exc)

    cli = [sys.executable, "-m", "archive_manager.cli", "--root", root]
    if url is not None:
        cli += ["--catalog-url", url]
    verbs = {
        "info": ["info"],
        "ls": ["ls", "--json"],
        "show": ["show", name],
        "keys": ["keys", name],
        "query": ["query", "--task-key", keys[0][1]],
        "stats": ["stats", "--json"],
        "owners": ["owners", "--json"],
        "export": ["export", name, str(out / "cli-export.pt")],
        "verify": ["verify"],
        "verify_data": ["verify", "--read-data"],
        "gc_dry_run": ["gc", "--dry-run"],
        "release": ["release", name, "--yes"],
        "retain": ["retain", "checkpoint:x", name],
        "gc": ["gc", "--yes", "--grace", "0s"],
        "rebuild": ["rebuild-catalog", "--yes"],
    }
    result["cli"] = {}
    from click.testing import CliRunner

    from archive_manager.cli import cli as group

    for verb, args in verbs.items():
        if verb in ("ls", "release"):
            # A real process too: what an analyst's shell runs.
            done = subprocess.run(cli + args, capture_output=True, text=True, check=False)
            result["cli"][verb] = [done.returncode, done.stderr]
        else:
            ran = CliRunner().invoke(group, cli[3:] + args)
            result["cli"][verb] = [ran.exit_code, ran.stderr]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
