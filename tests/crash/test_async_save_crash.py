"""Crash safety of background saves (`save_async`): a process killed (SIGKILL) while its saves
run on the worker thread, the caller having changed its samples right after handing them
over, keeps every save that published exactly as it was handed over, leaves nothing of the
one in flight visible, and the next process saves that name again at once.  (The crash
matrix, tools/crash_matrix.py, kills the ``async_save`` scenario at every failpoint.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import assert_same_samples

from archive_manager import ArchiveManager
from archive_manager._util import failpoints
from archive_manager.errors import ArchiveNotFoundError
from archive_manager.interop.synthetic import make_rollout

REPO = Path(__file__).resolve().parents[2]
TINY = {"prompt_len": 8, "response_min": 4, "response_max": 12, "r3_layers": 2}


def rollout(seed: int) -> list:
    return make_rollout(12, seed=seed, **TINY)  # type: ignore[arg-type]


SCRIPT = """
import sys
from archive_manager import ArchiveManager
from archive_manager.interop.synthetic import make_rollout

TINY = {tiny!r}
pool = ArchiveManager.open(sys.argv[1], chunk_size=4)
futures = []
for name, seed in (("a", 1), ("b", 2)):
    samples = make_rollout(12, seed=seed, **TINY)
    futures.append(pool.save_async(name, samples, rollout_id=seed))
    for sample in samples:  # the training loop reuses its samples at once
        sample.tokens.clear()
        sample.rollout_routed_experts.fill_(0)
        sample.reward = -1.0
for future in futures:
    future.result()
print("not killed")
"""


def test_a_process_killed_during_its_second_background_save(tmp_path: Path) -> None:
    root = tmp_path / "pool"
    # A save of 12 samples in chunks of 4 commits its blobs once before its manifest (a small
    # save packs its last chunks with it): the second commit is the second save's, killed
    # just after it.
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        failpoints.ENV: "save.blobs.after_commit=kill@2",
    }
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(tiny=TINY), str(root)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == -9, done.stderr
    assert "not killed" not in done.stdout
    with ArchiveManager.open(root, chunk_size=4) as pool:
        assert [a.name for a in pool.find()] == ["a"]
        # What was handed over, not what the caller changed afterwards.
        assert_same_samples(pool.open_archive("a").load_samples(materialize=True), rollout(1))
        with pytest.raises(ArchiveNotFoundError):
            pool.open_archive("b")  # the killed save left nothing visible
        # The killed save's process is gone: the name is free at once.
        pool.save_async("b", rollout(2), rollout_id=2).result()
        assert_same_samples(pool.open_archive("b").load_samples(materialize=True), rollout(2))
        report = pool.verify(read_data=True)
        assert report.ok, report
