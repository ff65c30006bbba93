"""Import speed of a seed (straw) archive: ``python3 tools/bench_import_straw.py [N]``.

Writes an N-sample (default 1,024) seed archive with the seed's save protocol (tests/_seed.py,
real straw-queue), then times ``ArchiveManager.import_straw`` (read, rebuild, save, verify).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from archive_manager import ArchiveManager
from tests import _seed


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    with tempfile.TemporaryDirectory() as tmp:
        index = Path(tmp) / "rollout_0.straw.json"
        samples = [
            _seed.Sample(
                index=i,
                group_index=i // 8,
                tokens=list(range(512)),
                response_length=256,
                loss_mask=[1] * 256,
                rollout_log_probs=[-0.5] * 256,
                reward=float(i % 2),
                status=_seed.Sample.Status.COMPLETED,
            )
            for i in range(n)
        ]
        _seed.seed_save(index, samples, rollout_id=0)
        with ArchiveManager.open(Path(tmp) / "pool") as pool:
            start = time.perf_counter()
            arc = pool.import_straw(index)
            seconds = time.perf_counter() - start
        print(
            f"imported {len(arc)} samples in {seconds:.2f} s ({len(arc) / seconds:.0f} samples/s)"
        )


if __name__ == "__main__":
    main()
