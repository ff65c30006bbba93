"""Smoke runs of the benchmark tools at tiny sizes, so they cannot rot, and their helpers."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch

from archive_manager import Sample

REPO = Path(__file__).resolve().parent.parent
TOOLS = REPO / "tools"


def _tool(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_tool_{name}", TOOLS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=False,
    )


def test_bench_quick_run_measures_every_operation_of_every_tool(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = _run(
        TOOLS / "bench.py", "--quick", "--workloads", "realistic-256", "--no-memory",
        "--keys", "2", "--json", out, "--dir", tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    result = figures["results"]["realistic-256"]
    seconds = result["seconds"]
    am_ops = {op for op, by in seconds.items() if "archive_manager" in by}
    assert am_ops == {
        "save", "writer", "load_all", "load_arrays", "load_one", "load_one_open", "load_task",
        "sample_metadata", "find", "release_gc",
    }  # fmt: skip
    assert {"torch", "raw"} <= set(seconds["save"]) and {"torch", "raw"} <= set(seconds["load_all"])
    assert "lists_alone" in seconds["load_all"] and "numbers only" in done.stdout
    assert all(s > 0 for by in seconds.values() for s in by.values())
    if figures["straw_skipped"] is None:
        assert "straw" in seconds["save"] and "straw" in seconds["load_one"]
        assert "seed" in seconds["save"] and "faster than straw seed" in done.stdout
        assert result["bytes"]["straw"] > 0
    else:
        assert "straw column skipped" in done.stdout
    assert 0 < result["bytes"]["archive_manager_blobs"] < result["bytes"]["archive_manager"]
    assert result["bytes"]["torch"] > 0
    assert "== realistic-256" in done.stdout and "faster than torch" in done.stdout
    assert not list(tmp_path.glob("bench-*")), "the work folder was left behind"


def test_seed_save_writes_what_the_seed_wrote(tmp_path: Path) -> None:
    """The seed baseline does the seed's work: its tagged tree of every value, one record per
    64-sample chunk, a report holding every sample's metadata."""
    pytest.importorskip("straw")
    bench = _tool("bench")
    from straw import SharedFilesystemStore
    from straw.protocol import RecordSetRef

    from archive_manager.interop.synthetic import make_rollout

    samples: Any = make_rollout(70, seed=2)
    bench.seed_save(samples, tmp_path / "r.json")
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["format"] == "vime.straw-debug"
    assert len(report["sample_metadata"]["samples"]) == 70
    with SharedFilesystemStore(
        tmp_path / "straw-data", "debug-rollout", codecs=bench.SEED_CODECS
    ) as store:
        [index] = list(store.read(RecordSetRef.from_dict(report["manifest"])))
        chunks = json.loads(index.payload)["tree"]["chunks"]
        assert len(chunks) == 2
        first = list(store.read(RecordSetRef.from_dict(chunks[0])))[-1]
    tree = json.loads(first.payload)["tree"]
    assert tree[0] == "list" and len(tree[1]) == 64
    fields = dict((k, v) for k, v in tree[1][0][1][1])
    assert fields["tokens"] == ["list", samples[0].tokens]
    assert fields["status"] == ["status", samples[0].status.value]


def test_bench_r3_workloads_use_what_they_load(tmp_path: Path) -> None:
    """The R3 rows of issue 37: tensors and numpy arrays, each used after every tool's load;
    straw, which stores JSON and tensors, sits out the numpy one."""
    bench = _tool("bench")
    for name, kind in (("r3-40", torch.Tensor), ("r3-40-numpy", np.ndarray)):
        samples = bench.WORKLOADS[name].make(quick=True)
        assert all(isinstance(s.rollout_routed_experts, kind) for s in samples)
        assert bench.samples_nbytes(samples) > sum(s.rollout_routed_experts.nbytes for s in samples)
    assert not bench.WORKLOADS["r3-40-numpy"].straw
    used: list[int] = []

    class Spy(np.ndarray):
        def max(self, *args: Any, **kwargs: Any) -> Any:
            used.append(self.size)
            return super().max(*args, **kwargs)

    spied = np.arange(6).view(Spy)
    assert bench._used([{"a": spied, "b": [1, 2]}]) == [{"a": spied, "b": [1, 2]}]
    assert used == [6]


@pytest.mark.parametrize("workload", ["r3-40", "r3-40-numpy"])
def test_bench_tensors_alone_reads_every_tensor_of_the_r3_rollout(
    tmp_path: Path, workload: str
) -> None:
    """The R3 rows' floor maps, checks and uses each tensor blob the samples refer to (torch
    tensors, or numpy arrays above the inline limit): all their bytes, and a damaged blob
    fails it as it fails a load."""
    bench = _tool("bench")
    from helpers import local_store

    from archive_manager import ArchiveManager
    from archive_manager.errors import IntegrityError

    samples = bench.WORKLOADS[workload].make(quick=True)
    arrays = workload.endswith("-numpy")
    with ArchiveManager.open(tmp_path / "pool") as pool:
        pool.save("rollout-0", samples, rollout_id=0)
        digests = bench.tensor_digests(pool)
        assert len(digests) == len(samples)
        nbytes = sum(s.rollout_routed_experts.nbytes for s in samples)
        assert bench.tensors_alone(pool, digests, arrays=arrays) == nbytes
        path = local_store(pool).path(digests[-1])
        path.chmod(0o644)
        with open(path, "r+b") as f:
            f.seek(-1, os.SEEK_END)
            last = f.read(1)
            f.seek(-1, os.SEEK_END)
            f.write(bytes([last[0] ^ 1]))
        with pytest.raises(IntegrityError):
            bench.tensors_alone(pool, digests, arrays=arrays)


def test_bench_numbers_alone_makes_every_number_of_the_rollout() -> None:
    """The list row's floor makes each number of the samples' numeric lists, as a load does,
    and equal to them."""
    bench = _tool("bench")
    samples = bench.WORKLOADS["realistic-256"].make(quick=True)
    arrays = bench.number_arrays(samples)
    lists = [v for s in samples for v in vars(s).values() if type(v) is list and v]
    numeric = [v for v in lists if type(v[0]) in (int, float)]
    assert [a.tolist() for a in arrays] == numeric
    assert bench.numbers_alone(arrays) == sum(map(len, numeric)) > 0


def test_bench_rejects_an_unknown_workload(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = _tool("bench")
    monkeypatch.setattr(sys, "argv", ["bench.py", "--workloads", "realistic-256,nope"])
    with pytest.raises(SystemExit) as exit_info:
        bench.main()
    assert exit_info.value.code == 2 and "unknown workload(s) nope" in capsys.readouterr().err


def test_bench_memory_child_reports_the_peak_of_one_save(tmp_path: Path) -> None:
    pool = tmp_path / "pool"
    done = _run(
        TOOLS / "bench.py", "--child", "am-save", "--workloads", "realistic-1024", "--quick",
        "--child-path", pool,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["op"] == "am-save" and report["maxrss"] > report["rss_before"] > 0
    if report["peak_since_reset"] is not None:
        assert report["peak_since_reset"] >= report["rss_before"]
    assert (pool / "catalog.db").is_file() and any((pool / "blobs").rglob("*"))


def test_bench_scaling_quick_run(tmp_path: Path) -> None:
    out = tmp_path / "scaling.json"
    done = _run(TOOLS / "bench_scaling.py", "--quick", "--json", out, "--dir", tmp_path)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())["sqlite"]
    rows = result["rows"]
    assert [r["archives"] for r in rows] == [6, 10]
    for r in rows:
        # The API calls, the viewer's pages and the CLI verbs asked for, all timed.
        assert {"stats (first call)", "find (deep page)", "query status", "verify"} <= set(
            r["seconds"]
        )
        assert {"pool page (first request)", "cli stats", "cli ls --limit 50"} <= set(r["seconds"])
        assert all(s > 0 for s in r["seconds"].values())
        assert 0 < r["catalog_bytes_per_sample"] < 10_000
    # The plans of the filtered queries: the archive index, samples by primary key.
    plans = "\n".join(line for lines in result["plans"].values() for line in lines)
    assert "ix_archives_state_rollout_id_name" in plans and "TEMP B-TREE" not in plans
    assert "per archive" in done.stdout


def test_bench_scaling_keeps_a_postgresql_pool(tmp_path: Path, pg_server: Any) -> None:
    """``--pg-data DIR`` keeps the cluster and its pool: a second run measures the pool the
    first filled, without filling it again."""
    # NOTE: not under tmp_path: /tmp/pytest-of-root is 0700, and the postgres user must
    # reach the cluster's folder (as tests/pgserver.py).
    kept = Path(tempfile.mkdtemp(prefix="am-bench-kept-"))
    kept.chmod(0o755)
    try:
        rows = []
        for run in (1, 2):
            out = tmp_path / f"run{run}.json"
            args = ("--quick", "--cli", "", "--no-plans", "--pg-data", kept / "pg", "--json", out)
            done = _run(TOOLS / "bench_scaling.py", *args)
            assert done.returncode == 0, done.stderr
            rows.append(json.loads(out.read_text())["postgresql"]["rows"])
        assert [r["archives"] for r in rows[0]] == [6, 10]
        assert [r["archives"] for r in rows[1]] == [10]  # 6 is below what the pool holds
        # A refill would have failed: the templates' names are taken.
        assert rows[1][0]["entries"] == 10 * 64
        assert (kept / "pg" / "data" / "PG_VERSION").exists() and (kept / "pg" / "pool").is_dir()
    finally:
        shutil.rmtree(kept, ignore_errors=True)


def test_samples_nbytes_counts_raw_array_sizes() -> None:
    bench = _tool("bench")
    s: Any = Sample(tokens=[1, 2, 3], response="héllo", loss_mask=[1, 1], reward=1.0)
    s.extra = torch.zeros(4, 2, dtype=torch.int32)
    base = bench.samples_nbytes([Sample()])
    # 3 tokens (8 bytes each) instead of none, "héllo" is 6 UTF-8 bytes, a 2-item mask instead
    # of None (a scalar: 8 bytes), the reward a scalar either way, 32 tensor bytes
    assert bench.samples_nbytes([s]) - base == 3 * 8 + 6 + (2 * 8 - 8) + 32


def _result(save: dict, load: float, one: float, am_bytes: int, pt_bytes: int) -> dict:
    return {
        "seconds": {
            "save": save,
            "load_all": {"archive_manager": load, "torch": 1.0},
            "load_arrays": {"archive_manager": load / 2, "torch": 1.0},
            "load_one": {"archive_manager": one, "torch": 1.0},
        },
        "bytes": {"archive_manager": am_bytes, "torch": pt_bytes},
    }


@pytest.mark.parametrize("good", [True, False])
def test_targets_hold_or_miss_by_the_figures(good: bool) -> None:
    bench = _tool("bench")
    k = 1 if good else 3
    results = {
        "realistic-1024": _result(
            {"archive_manager": 0.1 * k, "torch": 0.85, "straw": 0.35, "seed": 4.5},
            load=0.15 * k,
            one=0.004 * k,
            am_bytes=50 * k,
            pt_bytes=100,
        ),
        "r3": {"seconds": {"save": {"archive_manager": 1.0 * k, "raw": 0.65}}},
        # issue 37's R3 rows: the loads and the Parquet exports against pyarrow by hand
        "r3-40": {
            "seconds": {
                "load_all": {
                    "archive_manager": 0.4 * k,
                    "torch": 1.0,
                    "tensors_alone": 0.2,
                    "parts_alone": 0.25,
                }
            }
        },
        "r3-40-numpy": {
            "seconds": {
                "load_all": {"archive_manager": 0.4 * k, "torch": 1.0, "inflate_alone": 0.4},
                "export": {"archive_manager": 0.5 * k, "pyarrow": 1.0, "write_alone": 0.8},
            }
        },
    }
    # the list load's floor beside its row
    results["realistic-1024"]["seconds"]["load_all"]["lists_alone"] = 0.125
    # and the S3 save against the local save of the same run
    results["realistic-1024"]["seconds"]["save_s3"] = {"archive_manager": 1.1 * k, "local": 1.0}
    memory = {"samples_nbytes": 100, "peak_above_baseline": {"am-save": 140 * k}}
    checks = bench.targets(results, memory)
    assert len(checks) == 16
    assert [ok for _, ok, _ in checks] == [good] * 16
    texts = " ".join(text for text, _, _ in checks)
    assert "Parquet export >= 1.5x pyarrow" in texts and "S3 save <= 1.25x" in texts
    # the floors beside the ratios: the export's own write alone, the chunks' inflating alone
    figures = " ".join(figure for _, _, figure in checks)
    assert "(floor 1.25x: the write alone)" in figures
    assert "(floor 2.50x: inflating its chunks only)" in figures
    assert "(floor 4.00x: its tensors, chunks and numbers only)" in figures
    assert "(floor 8.00x: inflating and tolist only)" in figures


def test_bench_stream_quick_run_compares_the_scans(tmp_path: Path) -> None:
    done = _run(
        TOOLS / "bench_stream.py", "--samples", "8", "--rounds", "1", "--root", tmp_path, "--json"
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert (figures["samples"], figures["chunks"]) == (8, 1)
    assert set(figures["results"]) == {"load_samples", "iter_samples", "iter_samples_arrays"}
    assert all(r["seconds"] > 0 for r in figures["results"].values())
    modes = "load_arrays,load_arrays_narrow,iter_samples_arrays_narrow"
    done = _run(
        TOOLS / "bench_stream.py", "--samples", "70", "--rounds", "1", "--root", tmp_path,
        "--response-min", "10", "--response-max", "20", "--modes", modes, "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert (figures["samples"], figures["chunks"], figures["response_max"]) == (70, 2, 20)
    assert set(figures["results"]) == set(modes.split(","))  # and the scans agreed


def test_bench_async_save_quick_run(tmp_path: Path) -> None:
    done = _run(
        TOOLS / "bench_async_save.py", "--samples", "8", "--rounds", "1", "--root", tmp_path,
        "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert set(figures["median_seconds"]) == {
        "save", "blocked", "async_total", "beside_total", "take", "prepare", "numbers", "fill",
    }  # fmt: skip
    assert all(len(v) == 1 and v[0] > 0 for v in figures["seconds"].values())
    assert set(figures["median_cpu_seconds"]) == set(figures["median_seconds"]) - {
        "async_total", "beside_total",
    }  # fmt: skip
    assert figures["loop_slowdown"] > 0


def test_bench_small_save_quick_run(tmp_path: Path) -> None:
    done = _run(
        TOOLS / "bench_small_save.py", "--rounds", "1", "--root", tmp_path, "--phases", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert set(figures["median_ms"]) == {"save1", "save8", "torch1", "torch8"}
    assert figures["phases_ms_per_save"]["8"]["txn save.publish"]["count"] == 1
    assert list(tmp_path.iterdir()) == []  # its temp pool removed


def test_bench_search_quick_run(tmp_path: Path) -> None:
    done = _run(
        TOOLS / "bench_search.py", "--root", tmp_path / "pool", "--archives", "2",
        "--samples", "16", "--index-archives", "1",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "literal, no match (reads all)" in done.stdout and "32 samples" in done.stdout
    assert "unicode61 fill" in done.stdout and "trigram" in done.stdout
    assert "chunk format version 2" in done.stdout and "CPU)" in done.stdout
    assert "target:" in done.stdout
    # side by side with a baseline tree (this one: the same matches)
    done = _run(
        TOOLS / "bench_search.py", "--root", tmp_path / "pool", "--archives", "2",
        "--samples", "16", "--index-archives", "0", "--cases", "literal, rare",
        "--baseline", REPO, "--rollouts", "1",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "baseline" in done.stdout and "same matches" in done.stdout and "x" in done.stdout


def test_bench_native_quick_run_compares_both_paths() -> None:
    from archive_manager import codec

    if codec._native_numbers is None:  # tests/codec/test_codec_native.py fails CI on that
        pytest.skip("the C extension is not built or is switched off")
    done = _run(TOOLS / "bench_native.py", "--samples", "8", "--repeat", "1", "--bound")
    assert done.returncode == 0, done.stderr
    rows = done.stdout.splitlines()[1:]
    assert [r.split()[0] for r in rows[::2]] == ["realistic", "leaves"]
    assert all(r.endswith("(same digests)") for r in rows[::2])
    assert all("expansion bound" in r for r in rows[1::2])


def test_bench_arrow_columns_quick_run_checks_every_read(tmp_path: Path) -> None:
    done = _run(
        TOOLS / "bench_arrow_columns.py", "--sizes", "16", "--repeat", "1", "--root", tmp_path,
        "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)["rollout-16"]
    assert figures["samples"] == 16
    assert {"whole", "reward", "status", "keys", "tokens"} <= set(figures["seconds"])
    assert figures["x_faster"]["whole"] == 1.0
