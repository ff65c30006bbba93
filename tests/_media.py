"""Writers onto media that fail, for tests/interop/test_export_files.py: CLI calls run in
process, each onto a fresh medium, and what each left there.

Run as a script inside a private mount namespace (``unshare -m python tests/_media.py ROOT
OUT MEDIA CALLS``, root only) for real tmpfs mounts: torch is then imported once for every
medium and call.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from archive_manager.cli import cli

__all__ = ["held_files", "run_calls"]


def held_files(folder: Path) -> list[str]:
    """The files under ``folder`` this process has open (one left open after a failed
    export would keep its removed temp file's blocks until the process ends)."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            name = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:  # the listing's own descriptor
            continue
        if name.startswith(f"{folder}/"):
            held.append(name)
    return held


def run_calls(
    root: str, out: Path, calls: list[list[str]], mount: str | None = None, fill: bool = False
) -> list[dict[str, Any]]:
    """Each ``archive-manager --root ROOT --read-only CALL`` onto ``out``, with a fresh
    tmpfs mounted there first (``mount``: its options; ``fill``: filled up before the call)
    or as it is; per call its exit code, stderr, whether it raised (not a one-line exit),
    what ``out`` then holds and which of its files stay open."""
    results = []
    for args in calls:
        if mount is not None:
            subprocess.run(["mount", "-t", "tmpfs", "-o", mount, "tmpfs", str(out)], check=True)
            if fill:
                filler = ["dd", "if=/dev/zero", f"of={out}/.filler", "bs=4096"]
                subprocess.run(filler, capture_output=True, check=False)
        result = CliRunner().invoke(cli, ["--root", root, "--read-only", *args])
        results.append(
            {
                "args": args,
                "code": result.exit_code,
                "stderr": result.stderr,
                "raised": not isinstance(result.exception, (SystemExit, type(None))),
                "left": sorted(
                    str(p.relative_to(out)) for p in out.rglob("*") if p.name != ".filler"
                ),
                "held": held_files(out),
            }
        )
        if mount is not None:
            subprocess.run(["umount", str(out)], check=True)
    return results


if __name__ == "__main__":
    _root, _out, _media, _calls = sys.argv[1:]
    print(
        json.dumps(
            {
                name: run_calls(_root, Path(_out), json.loads(_calls), options, fill)
                for name, (options, fill) in json.loads(_media).items()
            }
        )
    )
