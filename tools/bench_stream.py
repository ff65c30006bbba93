#!/usr/bin/env python3
"""Memory and time of scanning one archive: `Archive.iter_samples` against `load_samples`
(docs/architecture.md, "Reading").

Saves a realistic rollout (``archive_manager.interop.synthetic``, routed-expert tensors off), then, each
in a fresh process so that peaks do not mix, scans it three ways summing every sample's
response length: ``load_samples()`` (the whole list), ``iter_samples()`` and
``iter_samples(as_arrays=True)``.  Prints the seconds and the peak resident memory each scan
added over what the process held before it (``VmHWM`` after a reset by
``/proc/self/clear_refs``, against ``VmRSS`` before; Linux).

    python3 tools/bench_stream.py [--samples 1024] [--rounds 3] [--root DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MODES = ("load_samples", "iter_samples", "iter_samples_arrays")

# Run in the child: open, measure the baseline, scan, report.
CHILD = """
import json, sys, time
from archive_manager import ArchiveManager

def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key))

root, mode = sys.argv[1], sys.argv[2]
with ArchiveManager.open(root, read_only=True) as pool:
    arc = pool.open_archive("rollout")
    arc.keys()  # the catalog's connection is open and warm before the baseline
    # NOTE: ru_maxrss survives exec (it would report the parent's peak), so the peak is
    # VmHWM, reset to the resident size now by writing 5 to clear_refs.
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = status("VmRSS:")
    start = time.perf_counter()
    if mode == "load_samples":
        total = sum(int(s.response_length) for s in arc.load_samples())
    else:
        total = sum(
            int(s.response_length)
            for s in arc.iter_samples(as_arrays=mode == "iter_samples_arrays")
        )
    seconds = time.perf_counter() - start
    peak = status("VmHWM:")
print(json.dumps({"seconds": seconds, "added_kib": peak - before, "total": total}))
"""


def make_pool(root: Path, samples: int) -> dict[str, Any]:
    """Save the rollout; return its shape (samples, chunks)."""
    from archive_manager import ArchiveManager
    from archive_manager.interop.synthetic import make_rollout

    with ArchiveManager.open(root) as pool:
        arc = pool.save("rollout", make_rollout(samples, seed=0), rollout_id=0)
        return {"samples": len(arc), "chunks": len(arc.chunks())}


def scan(root: Path, mode: str) -> dict[str, Any]:
    """One scan in a fresh process."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(root), mode],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--root", type=Path, help="work folder (default: a temp folder)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.root) as work:
        root = Path(work) / "pool"
        shape = make_pool(root, args.samples)
        runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
        for _ in range(args.rounds):  # interleaved: load elsewhere hits every mode alike
            for mode in MODES:
                runs[mode].append(scan(root, mode))
    totals = {r["total"] for rs in runs.values() for r in rs}
    assert len(totals) == 1, f"the scans disagree: {totals}"
    figures = {
        **shape,
        "results": {
            mode: {
                "seconds": statistics.median(r["seconds"] for r in rs),
                "added_mib": statistics.median(r["added_kib"] for r in rs) / 1024,
            }
            for mode, rs in runs.items()
        },
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(f"{shape['samples']} samples in {shape['chunks']} chunks, median of {args.rounds}:")
    for mode, fig in figures["results"].items():
        print(f"  {mode:<22} {fig['seconds']:7.3f} s   peak +{fig['added_mib']:7.1f} MiB")


if __name__ == "__main__":
    main()
