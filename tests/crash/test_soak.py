"""The soak harness (``tools/soak.py``): short runs on both catalog backends must end with no
unexpected error, no lost or corrupted sample and a clean ``verify(read_data=True)``; and its
checker must notice damage when there is some."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from helpers import Backend, local_store, open_on

REPO = Path(__file__).resolve().parents[2]
SOAK = REPO / "tools" / "soak.py"


def _load_soak() -> ModuleType:
    spec = importlib.util.spec_from_file_location("soak_tool", SOAK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


soak = _load_soak()


def _run_soak(root: Path, url: str | None, *, processes: int, seconds: float) -> dict[str, Any]:
    args = [sys.executable, str(SOAK), "--root", str(root), "--processes", str(processes)]
    args += ["--seconds", str(seconds), "--seed", "7", "--json"]
    if url is not None:
        args += ["--catalog-url", url]
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=seconds + 240)
    assert done.stdout, done.stderr
    summary = json.loads(done.stdout)
    # The exit status agrees with the summary it printed.
    assert (done.returncode == 0) == soak.passed(summary), done.stderr
    return summary


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_short_soak_loses_nothing(tmp_path: Path, backend: Backend) -> None:
    root = tmp_path / "pool"
    summary = _run_soak(root, backend.url(root), processes=3, seconds=10)
    traces = "\n".join(summary["tracebacks"])
    assert summary["unexpected_errors"] == {}, traces
    assert summary["corrupted_during_run"] == 0
    final = summary["final"]
    assert (final["lost_samples"], final["corrupted_samples"]) == (0, 0)
    assert final["verify"]["ok"], final["verify"]["problems"]
    assert final["unrecorded"] == []
    # The run did exercise the pool: every kind of operation ran (or failed as expected),
    # and owned archives were checked at the end.
    seen = set(summary["ops"]) | {k.split(":")[0] for k in summary["expected_errors"]}
    assert seen == set(soak.MIX)
    assert final["owned"] > 0 and final["owned_samples"] > 0


def _pool_with_records(tmp_path: Path, backend: Backend) -> tuple[Any, Any, str]:
    records = soak.Records(tmp_path / "records")
    records.folder.mkdir()
    root = tmp_path / "pool"
    pool = open_on(backend, root, **soak.POOL_OPTIONS)
    samples = soak.content(3, True)
    pool.save("a", samples, rollout_id=3)
    records.write(soak.make_record("a", samples, kind="save", seed=3, tensors=True))
    return pool, records, str(root)


def test_final_check_counts_a_damaged_blob_as_lost(tmp_path: Path, backend: Backend) -> None:
    pool, records, root = _pool_with_records(tmp_path, backend)
    with pool:
        chunk = pool.open_archive("a").chunks()[0]["digest"]
        path = local_store(pool).path(chunk)
        path.chmod(0o644)
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
    final = soak.final_check(root, backend.url(root), records)
    assert not final["verify"]["ok"]
    assert final["lost_samples"] == len(records.get("a")["digests"])
    assert final["unexpected"] == {"final load: IntegrityError": 1}


def test_final_check_counts_samples_that_differ_from_the_record(
    tmp_path: Path, backend: Backend
) -> None:
    pool, records, root = _pool_with_records(tmp_path, backend)
    pool.close()
    record = records.get("a")
    record["digests"][1] = "0" * 32  # as if sample 1 had come back changed
    records.write(record)
    final = soak.final_check(root, backend.url(root), records)
    assert final["verify"]["ok"]
    assert (final["lost_samples"], final["corrupted_samples"]) == (0, 1)
    assert not soak.passed({"unexpected_errors": {}, "corrupted_during_run": 0, "final": final})


def test_sample_digest_tells_samples_apart() -> None:
    a, b = soak.content(5, True)[:2]
    assert soak.sample_digest(a) == soak.sample_digest(soak.content(5, True)[0])
    assert soak.sample_digest(a) != soak.sample_digest(b)
    changed = soak.content(5, True)[0]
    changed.rollout_routed_experts[0, 0, 0] += 1  # one value of one tensor
    assert soak.sample_digest(changed) != soak.sample_digest(a)
