#!/usr/bin/env python3
"""Replay benchmark: `RolloutIterableDataset` against a Dataset over slime's ``.pt`` dumps.

Workload (docs/architecture/workload.md "Workload", seeded): ``--rollouts`` (8) realistic rollouts
of ``--samples`` (256) samples each (groups of 8 sharing a 512-token prompt, responses
1400-4200 tokens), saved into one pool and dumped as slime's ``.pt`` files
(``Archive.export_pt``, ``{"rollout_id", "samples": [dict]}``).

Measured in one run, each side in its own fresh process, one epoch through
``DataLoader(num_workers=2, batch_size=16, collate_fn=pad_collate)`` yielding ``tokens``,
``loss_mask``, ``rollout_log_probs`` and ``reward``:
  * archive_manager: ``RolloutIterableDataset(root, fields=[...], batch_size=16)``: whole
    batches dealt to the workers round-robin, each worker reading a chunk once and inflating
    only its records (``--shuffle-buffer K``: chunk order shuffled, then samples through a
    buffer of K);
  * .pt dumps: an IterableDataset dealing the files to the workers; each file is
    ``torch.load`` ed (``weights_only=True``) and its samples' lists made tensors.
Samples per second over the epoch (worker start-up included), and the peak RSS of the
largest worker (``RUSAGE_CHILDREN`` once the workers exited). ``--no-pt`` measures our side
only; ``--narrow`` gives our side ``dtypes=`` (int32 token ids, int8 loss masks; log-probs
float32 as by default) instead of int64 ids and masks.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

FIELDS = ["tokens", "loss_mask", "rollout_log_probs", "reward"]


def _pt_dataset(files: list[Path]) -> Any:
    import torch
    from torch.utils.data import IterableDataset, get_worker_info

    class PtDumps(IterableDataset):  # type: ignore[type-arg]
        """slime's dumps, one torch.load per file, files dealt to the workers."""

        def __iter__(self) -> Iterator[dict[str, Any]]:
            info = get_worker_info()
            worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
            for path in files[worker::workers]:
                dump = torch.load(path, weights_only=True)
                for s in dump["samples"]:
                    yield {
                        "tokens": torch.tensor(s["tokens"], dtype=torch.int64),
                        "loss_mask": torch.tensor(s["loss_mask"], dtype=torch.int64),
                        "rollout_log_probs": torch.tensor(
                            s["rollout_log_probs"], dtype=torch.float32
                        ),
                        "reward": s["reward"],
                    }

    return PtDumps()


NARROW = {"tokens": "int32", "loss_mask": "int8", "rollout_log_probs": "float32"}


def _child(side: str, work: Path, workers: int, batch: int, buffer: int, narrow: bool) -> None:
    from torch.utils.data import DataLoader

    from archive_manager.data import RolloutIterableDataset, pad_collate

    if side == "archive_manager":
        dataset: Any = RolloutIterableDataset(
            work / "pool",
            fields=FIELDS,
            batch_size=batch,
            shuffle=buffer > 0,
            shuffle_buffer=buffer,
            dtypes=NARROW if narrow else None,
        )
    else:
        dataset = _pt_dataset(sorted((work / "dumps").glob("*.pt")))
    t0 = time.perf_counter()
    samples = tokens = 0
    loader = DataLoader(dataset, batch_size=batch, num_workers=workers, collate_fn=pad_collate)
    for b in loader:
        samples += b["tokens"].shape[0]
        tokens += int(b["attention_mask"].sum())
    seconds = time.perf_counter() - t0
    del loader  # the workers exit: their peak RSS is in RUSAGE_CHILDREN
    worker_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(
        json.dumps(
            {
                "seconds": seconds,
                "samples": samples,
                "tokens": tokens,
                "worker_peak_mib": worker_peak,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=256, help="samples per rollout")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument(
        "--shuffle-buffer", type=int, default=0, help="samples in the shuffle buffer (0: none)"
    )
    parser.add_argument("--no-pt", action="store_true", help="skip the .pt dumps' side")
    parser.add_argument("--narrow", action="store_true", help="narrow dtypes on our side")
    parser.add_argument("--dir", type=Path, default=None, help="work folder (default: a temp one)")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here too")
    parser.add_argument("--child", choices=["archive_manager", "pt"], help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.work, args.workers, args.batch, args.shuffle_buffer, args.narrow)
        return
    from archive_manager import ArchiveManager
    from archive_manager.interop.synthetic import make_rollout

    work = Path(tempfile.mkdtemp(prefix="bench-replay-", dir=args.dir))
    try:
        (work / "dumps").mkdir()
        with ArchiveManager.open(work / "pool") as pool:
            for i in range(args.rollouts):
                arc = pool.save(
                    f"rollout-{i}", make_rollout(args.samples, seed=i, rollout_id=i), rollout_id=i
                )
                if not args.no_pt:
                    arc.export_pt(work / "dumps" / f"rollout_{i}.pt")
        results = {}
        for side in ("archive_manager",) if args.no_pt else ("archive_manager", "pt"):
            done = subprocess.run(
                [sys.executable, __file__, "--child", side, "--work", str(work),
                 "--workers", str(args.workers), "--batch", str(args.batch),
                 "--shuffle-buffer", str(args.shuffle_buffer)]
                + (["--narrow"] if args.narrow else []),
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if done.returncode != 0:
                sys.exit(f"{side} failed:\n{done.stderr}")
            results[side] = json.loads(done.stdout.strip().splitlines()[-1])
        ours = results["archive_manager"]
        pt = results.get("pt", ours)
        total = args.rollouts * args.samples
        assert ours["samples"] == pt["samples"] == total and ours["tokens"] == pt["tokens"]
        rate = {k: r["samples"] / r["seconds"] for k, r in results.items()}
        print(
            f"== replay of {args.rollouts} x {args.samples} realistic samples, "
            f"DataLoader(num_workers={args.workers}, batch_size={args.batch}), "
            f"shuffle buffer {args.shuffle_buffer}" + (", narrow dtypes" if args.narrow else "")
        )
        for label, key in (("archive_manager", "archive_manager"), (".pt dumps", "pt")):
            if key not in results:
                continue
            r = results[key]
            print(
                f"{label:16s} {rate[key]:8.0f} samples/s ({r['seconds']:.2f} s)   "
                f"largest worker peak {r['worker_peak_mib']:7.1f} MiB"
            )
        if "pt" in rate:
            print(f"speed-up {rate['archive_manager'] / rate['pt']:.1f}x")
        if args.json:
            args.json.write_text(json.dumps({"results": results, "samples_per_s": rate}, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
