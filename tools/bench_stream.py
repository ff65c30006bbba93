#!/usr/bin/env python3
"""Memory and time of scanning one archive: `Archive.iter_samples` against `load_samples`
(docs/architecture/reading.md, "Reading"), numeric lists as lists, as int64/float64 arrays
(``as_arrays=True``) and as narrow arrays (``dtypes=``: int32 token ids, int8 loss masks,
float32 log-probs).

Saves a realistic rollout (``archive_manager.interop.synthetic``, routed-expert tensors off;
``--response-min/--response-max`` for longer responses; streamed through `pool.writer` a
group at a time), then, each in a fresh process so that peaks do not mix, scans it in each
``--modes`` summing every sample's response length and the items of its numeric lists:
``load_samples`` (the whole list), ``load_arrays`` and ``load_arrays_narrow`` (the whole
list, as arrays), ``iter_samples``, ``iter_samples_arrays`` and
``iter_samples_arrays_narrow``.  Prints the seconds, samples per second and the peak
resident memory each scan added over what the process held before it (``VmHWM`` after a
reset by ``/proc/self/clear_refs``, against ``VmRSS`` before; Linux).

    python3 tools/bench_stream.py [--samples 1024] [--rounds 3] [--modes ...] [--root DIR] [--json]
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

MODES = (
    "load_samples",
    "load_arrays",
    "load_arrays_narrow",
    "iter_samples",
    "iter_samples_arrays",
    "iter_samples_arrays_narrow",
)
DEFAULT_MODES = ("load_samples", "iter_samples", "iter_samples_arrays")

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
    narrow = {"tokens": "int32", "loss_mask": "int8", "rollout_log_probs": "float32"}
    options = {}
    if "arrays" in mode:
        options["as_arrays"] = True
    if mode.endswith("_narrow"):
        options["dtypes"] = narrow
    start = time.perf_counter()
    if mode.startswith("load_"):
        samples = arc.load_samples(**options)  # every sample held at once
    else:
        samples = arc.iter_samples(**options)
    total = items = 0
    for s in samples:
        total += int(s.response_length)
        items += len(s.tokens) + len(s.loss_mask) + len(s.rollout_log_probs)
    seconds = time.perf_counter() - start
    peak = status("VmHWM:")
print(json.dumps({"seconds": seconds, "added_kib": peak - before, "total": total, "items": items}))
"""


def make_pool(root: Path, samples: int, shape: dict[str, int]) -> dict[str, Any]:
    """Save the rollout, a group of 64 samples generated at a time; return its shape
    (samples, chunks)."""
    from archive_manager import ArchiveManager
    from archive_manager.interop.synthetic import make_rollout

    with ArchiveManager.open(root) as pool:
        with pool.writer("rollout", rollout_id=0) as writer:
            for start in range(0, samples, 64):
                for s in make_rollout(min(64, samples - start), seed=start, **shape):
                    s.index += start
                    writer.add(s)
        arc = pool.open_archive("rollout")
        return {"samples": len(arc), "chunks": len(arc.chunks()), **shape}


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
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--response-min", type=int, default=1400)
    parser.add_argument("--response-max", type=int, default=4200)
    parser.add_argument(
        "--modes", default=",".join(DEFAULT_MODES), help=f"comma-separated, of {', '.join(MODES)}"
    )
    parser.add_argument("--root", type=Path, help="work folder (default: a temp folder)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    modes = args.modes.split(",")
    unknown = set(modes) - set(MODES)
    if unknown:
        parser.error(f"unknown mode {', '.join(sorted(unknown))}")
    rollout = {
        "prompt_len": args.prompt_len,
        "response_min": args.response_min,
        "response_max": args.response_max,
    }
    with tempfile.TemporaryDirectory(dir=args.root) as work:
        root = Path(work) / "pool"
        shape = make_pool(root, args.samples, rollout)
        runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
        for _ in range(args.rounds):  # interleaved: load elsewhere hits every mode alike
            for mode in modes:
                runs[mode].append(scan(root, mode))
    totals = {(r["total"], r["items"]) for rs in runs.values() for r in rs}
    assert len(totals) == 1, f"the scans disagree: {totals}"
    figures = {
        **shape,
        "results": {
            mode: {
                "seconds": statistics.median(r["seconds"] for r in rs),
                "samples_per_s": shape["samples"] / statistics.median(r["seconds"] for r in rs),
                "added_mib": statistics.median(r["added_kib"] for r in rs) / 1024,
            }
            for mode, rs in runs.items()
        },
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(
        f"{shape['samples']} samples (responses {args.response_min}-{args.response_max} "
        f"tokens) in {shape['chunks']} chunks, median of {args.rounds}:"
    )
    for mode, fig in figures["results"].items():
        print(
            f"  {mode:<28} {fig['seconds']:7.3f} s  {fig['samples_per_s']:8.0f} samples/s"
            f"   peak +{fig['added_mib']:7.1f} MiB"
        )


if __name__ == "__main__":
    main()
