"""Saves handed to a background thread (`ArchiveManager.save_async`): a future returned at once,
the samples taken at the call (the caller may change them right after), bytes in flight
bounded by a budget, failures on the future and again at `close` when nobody looked, `close`
and interpreter exit waiting for saves in flight, order and ownership as `save`.

The worker is held back where a test needs it by a store whose writes wait for an event; no
test sleeps or times anything."""

from __future__ import annotations

import gc
import inspect
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import assert_same_samples, snapshot_pool, tiny_rollout

from archive_manager import ArchiveManager, Sample
from archive_manager.blobs import BlobStore
from archive_manager.blobs.base import PutItem
from archive_manager.errors import (
    ArchiveError,
    ArchiveExistsError,
    InvalidInputError,
    UnencodableError,
)
from archive_manager.interop.synthetic import make_rollout
from archive_manager.pool.archive import Archive
from archive_manager.testing.faults import FaultyBlobStore

CHUNK = 4
REPO = Path(__file__).resolve().parents[2]


class GatedStore(FaultyBlobStore):
    """The folder store whose writes wait until `gate` is set (the worker is held there)."""

    def __init__(self, root: Path) -> None:
        super().__init__(BlobStore(root))
        self.gate = threading.Event()
        self.gate.set()
        self.waiting = threading.Event()  # a write is waiting at the gate

    def put_new(self, items: Sequence[PutItem], *, workers: int | None = None) -> list[str]:
        if not self.gate.is_set():
            self.waiting.set()
            assert self.gate.wait(60), "the gate stayed shut"
        return super().put_new(items, workers=workers)


@pytest.fixture
def gated(tmp_path: Path) -> Iterator[tuple[ArchiveManager, GatedStore]]:
    root = tmp_path / "pool"
    root.mkdir()
    store = GatedStore(root)
    pool = ArchiveManager.open(root, chunk_size=CHUNK, store=store)
    yield pool, store
    store.gate.set()
    pool.catalog.close()


def assert_loads(pool: ArchiveManager, name: str, expected: list[Any]) -> None:
    assert_same_samples(pool.open_archive(name).load_samples(materialize=True), expected)


def rich_samples(n: int = 10) -> list[Sample]:
    """Samples with lists, dicts, a tensor, a numpy array and an extra attribute."""
    samples = tiny_rollout(n, seed=4)
    for i, s in enumerate(samples):
        s.metadata = {"step": i, "scores": [i, i + 1]}
        s.multimodal_inputs = {"pixels": torch.arange(6, dtype=torch.float32) + i}
        s.rollout_routed_experts = np.arange(8, dtype=np.int32) * i
    return samples


def mutate(samples: list[Any]) -> None:  # Any: the fields a sample() above sets are not None
    """What a training loop that reuses its buffers does to them after handing them off."""
    for s in samples:
        s.tokens[0] = -1
        s.tokens.append(7)
        s.loss_mask.clear()
        s.rollout_log_probs[:] = [0.0]
        s.metadata["step"] = -1
        s.metadata["scores"].append(99)
        s.multimodal_inputs["pixels"].fill_(-5.0)
        s.rollout_routed_experts[:] = -3
        s.reward = 123.0
        s.status = Sample.Status.ABORTED
    samples.append(samples[0])


def test_returns_a_future_that_resolves_to_the_archive(gated) -> None:
    pool, _ = gated
    samples = tiny_rollout(10)
    future = pool.save_async("a", samples, rollout_id=1, attrs={"k": 1})
    assert isinstance(future, Future)
    assert not future.cancel()  # handed over: it ends published or failed
    archive = future.result()
    assert isinstance(archive, Archive) and archive.name == "a" and archive.attrs == {"k": 1}
    assert_loads(pool, "a", samples)
    shared = pool.save_async("ref", None, rollout_id=2, reference="a").result()
    assert shared.reference == "a"
    assert_loads(pool, "ref", samples)
    pool.close()


def test_an_interrupted_call_raises_and_publishes_nothing(
    gated, monkeypatch: pytest.MonkeyPatch
) -> None:
    from archive_manager.codec import snapshot
    from archive_manager.pool import background

    pool, _ = gated
    before = snapshot_pool(pool)
    take = snapshot.take_samples
    batches = 0

    def interrupted(samples: Any) -> Any:
        nonlocal batches
        batches += 1
        if batches == 2:
            raise KeyboardInterrupt
        return take(samples)

    monkeypatch.setattr(background, "_BATCH", 4)
    monkeypatch.setattr(snapshot, "take_samples", interrupted)
    pool.save_async_budget = 1  # the worker is already storing the first samples
    with pytest.raises(KeyboardInterrupt):
        pool.save_async("a", tiny_rollout(12), rollout_id=1)
    pool.close()  # the caller saw it: not raised again
    with ArchiveManager.open(pool.root, chunk_size=CHUNK) as again:
        assert snapshot_pool(again) == before


def test_takes_the_arguments_of_save() -> None:
    # A parameter added to save (and so to what the worker passes on) must be added here.
    save, save_async = (
        inspect.signature(f) for f in (ArchiveManager.save, ArchiveManager.save_async)
    )
    assert list(save_async.parameters.values()) == list(save.parameters.values())


def test_the_samples_are_taken_at_the_call(gated) -> None:
    pool, store = gated
    store.gate.clear()  # the worker's first write waits: the save is still in flight
    blocker = pool.save_async("blocker", tiny_rollout(4, seed=9), rollout_id=0)
    samples = rich_samples()
    expected = rich_samples()
    future = pool.save_async("a", samples, rollout_id=1)
    mutate(samples)  # right after the call, while nothing of "a" is stored yet
    assert store.waiting.wait(60) and not future.done()
    store.gate.set()
    assert blocker.result() and future.result()
    assert_loads(pool, "a", expected)
    pool.close()


def test_the_caller_runs_no_collection_of_the_copies(gated) -> None:
    # The GC is paused while the samples are taken; the young collection the pause ran up
    # would start on the caller's thread as it resumed, walking every copy to free nothing:
    # the copies join the oldest generation instead, as a load's objects do.
    pool, _ = gated
    caller = threading.get_ident()  # the worker's own collections are the worker's
    started: list[int] = []

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and threading.get_ident() == caller:
            started.append(info["generation"])

    # copies of far more containers than a young collection waits for
    samples = rich_samples(300)
    gc.collect()
    gc.callbacks.append(note)
    try:
        future = pool.save_async("a", samples, rollout_id=1)
    finally:
        gc.callbacks.remove(note)
    assert future.result()
    pool.close()
    assert started == []


def test_two_saves_both_land_in_order_and_a_name_taken_fails_as_save(gated) -> None:
    pool, _ = gated
    first = pool.save_async("x", tiny_rollout(6, seed=1), rollout_id=1)
    second = pool.save_async("y", tiny_rollout(6, seed=2), rollout_id=2)
    taken = pool.save_async("x", tiny_rollout(6, seed=3), rollout_id=3)
    assert first.result().name == "x" and second.result().name == "y"
    with pytest.raises(ArchiveExistsError, match="'x' already exists"):
        taken.result()
    infos = {i.name: i for i in pool.find()}
    assert set(infos) == {"x", "y"} and infos["x"].created_at <= infos["y"].created_at
    assert_loads(pool, "x", tiny_rollout(6, seed=1))
    pool.close()  # the failure was looked at: close does not raise it again


def test_supersede_as_save_has_it(gated) -> None:
    pool, _ = gated
    pool.save("x", tiny_rollout(4, seed=1), rollout_id=1).release()
    with pytest.raises(ArchiveExistsError, match="supersede=True"):
        pool.save_async("x", tiny_rollout(4, seed=2), rollout_id=1).result()
    again = pool.save_async("x", tiny_rollout(4, seed=2), rollout_id=1, supersede=True)
    assert again.result().name == "x"
    assert_loads(pool, "x", tiny_rollout(4, seed=2))
    assert [i.state for i in pool.find(state="superseded")] == ["superseded"]
    pool.close()


def test_a_failure_nobody_looked_at_is_raised_by_close(gated) -> None:
    pool, _ = gated
    pool.save("x", tiny_rollout(4), rollout_id=1)
    before = snapshot_pool(pool)
    taken = pool.save_async("x", tiny_rollout(4, seed=2), rollout_id=2)
    with pytest.raises(ArchiveExistsError) as raised:
        pool.close()
    assert "save_async of 'x'" in "".join(raised.value.__notes__)
    assert taken.done() and taken.exception() is raised.value
    pool.close()  # reported once
    with ArchiveManager.open(pool.root, chunk_size=CHUNK) as again:
        assert snapshot_pool(again) == before


def test_the_with_block_raises_a_failure_nobody_looked_at(tmp_path: Path) -> None:
    samples = tiny_rollout(4)
    samples[2].metadata = {"bad": object()}
    with (
        pytest.raises(UnencodableError, match="metadata"),
        ArchiveManager.open(tmp_path / "pool", chunk_size=CHUNK) as pool,
    ):
        pool.save_async("bad", samples, rollout_id=1)
    # A block that raises keeps its own error; the save's is logged.
    with (
        pytest.raises(KeyError, match="the block's own"),
        ArchiveManager.open(tmp_path / "pool", chunk_size=CHUNK) as pool,
    ):
        pool.save_async("bad", samples, rollout_id=1)
        raise KeyError("the block's own")
    with ArchiveManager.open(tmp_path / "pool", chunk_size=CHUNK) as pool:
        assert pool.find(state=None) == []


@pytest.mark.parametrize(
    ("samples", "options", "error", "match"),
    [
        (None, {}, InvalidInputError, "samples is None"),
        ("abc", {}, InvalidInputError, "samples must be a sequence"),
        ([{"a": 1}], {"task_keys": ["t", "u"]}, InvalidInputError, "task_keys has 2 keys"),
        ([{"a": object()}], {}, UnencodableError, "a"),
        ([{"a": 1}], {"attrs": {"x": object()}}, InvalidInputError, "attrs"),
        ([{"a": 1}], {"rollout_id": "1"}, InvalidInputError, "rollout"),
    ],
)
def test_bad_input_fails_the_future_and_leaves_the_pool_as_it_was(
    gated, samples: Any, options: dict[str, Any], error: type[Exception], match: str
) -> None:
    pool, _ = gated
    pool.save("kept", tiny_rollout(4), rollout_id=0)
    before = snapshot_pool(pool)
    future = pool.save_async("new", samples, **{"rollout_id": 1, **options})
    with pytest.raises(error, match=match):
        future.result()
    pool.close()
    with ArchiveManager.open(pool.root, chunk_size=CHUNK) as again:
        assert snapshot_pool(again) == before


def test_an_unencodable_sample_after_stored_chunks_rolls_the_save_back(gated) -> None:
    pool, _ = gated
    before = snapshot_pool(pool)
    samples = tiny_rollout(12)
    samples[10].metadata = {"bad": object()}  # its chunk comes after two stored ones
    pool.save_async_budget = 1  # the worker starts on the save while it is being taken
    future = pool.save_async("a", samples, rollout_id=1)
    with pytest.raises(UnencodableError):
        future.result()
    pool.close()
    with ArchiveManager.open(pool.root, chunk_size=CHUNK) as again:
        assert snapshot_pool(again) == before


def test_bytes_in_flight_stay_within_the_budget(gated) -> None:
    pool, store = gated
    saves = pool._background_saves()
    samples = rich_samples(40)
    one = max(_prepared_size(pool, s, i) for i, s in enumerate(samples))
    budget = 6 * one
    pool.save_async_budget = budget
    highest = 0
    hand_over = saves._hand_over

    def watched(job: Any, prepared: Any) -> bool:
        nonlocal highest
        taken = hand_over(job, prepared)
        highest = max(highest, saves.in_flight)
        return taken

    saves._hand_over = watched  # type: ignore[method-assign]
    store.gate.clear()
    blocker = pool.save_async("blocker", tiny_rollout(4, seed=9), rollout_id=0)
    assert store.waiting.wait(60)
    returned = threading.Event()
    futures: list[Future[Archive]] = []

    def caller() -> None:
        futures.append(pool.save_async("big", samples, rollout_id=1))
        returned.set()

    thread = threading.Thread(target=caller)
    thread.start()
    # The worker is held on "blocker": "big" fills the budget, then its caller waits.
    with saves._cond:
        assert saves._cond.wait_for(lambda: saves._held + one > budget, timeout=60)
    assert not returned.is_set()
    store.gate.set()
    thread.join(60)
    assert returned.is_set() and blocker.result() and futures[0].result()
    assert highest <= budget
    assert saves.in_flight == 0
    assert_loads(pool, "big", rich_samples(40))
    pool.close()


def _prepared_size(pool: ArchiveManager, sample: Any, position: int) -> int:
    from archive_manager.pool.writer import prepare_sample

    return prepare_sample(pool.context, sample, position).nbytes


def test_close_waits_for_saves_in_flight(gated) -> None:
    pool, store = gated
    store.gate.clear()
    future = pool.save_async("a", tiny_rollout(8), rollout_id=1)
    assert store.waiting.wait(60)
    closing = threading.Thread(target=pool.close)
    closing.start()
    with pool._background._cond:  # type: ignore[union-attr]
        assert pool._background._cond.wait_for(lambda: pool._background._closed, timeout=60)  # type: ignore[union-attr]
    assert not future.done()
    store.gate.set()
    closing.join(60)
    assert not closing.is_alive() and future.done() and future.result().name == "a"
    with pytest.raises(ArchiveError, match="closed"):
        pool.save_async("b", tiny_rollout(2), rollout_id=2)
    with ArchiveManager.open(pool.root, chunk_size=CHUNK) as again:
        assert_loads(again, "a", tiny_rollout(8))


def test_a_thread_based_training_loop_reusing_its_buffers(tmp_path: Path) -> None:
    """A trainer thread saves each step's rollout and goes on, refilling the same sample
    objects; every archive holds the step it was handed."""
    steps = 6
    with ArchiveManager.open(tmp_path / "pool", chunk_size=CHUNK) as pool:
        pool.save_async_budget = 64 << 10  # small: backpressure on most steps
        futures: list[Future[Archive]] = []

        def train() -> None:
            buffer = tiny_rollout(9, seed=0)
            for step in range(steps):
                fresh = tiny_rollout(9, seed=step)
                for sample, new in zip(buffer, fresh, strict=True):
                    tokens = sample.tokens
                    tokens[:] = new.tokens  # the same list object, refilled
                    sample.__dict__.update(new.__dict__, tokens=tokens)  # the same sample
                futures.append(pool.save_async(f"step-{step}", buffer, rollout_id=step))
                for sample in buffer:
                    sample.tokens.clear()
                    sample.reward = -1.0

        trainer = threading.Thread(target=train)
        trainer.start()
        trainer.join(120)
        assert not trainer.is_alive()
        for step, future in enumerate(futures):
            assert future.result().name == f"step-{step}"
            assert_loads(pool, f"step-{step}", tiny_rollout(9, seed=step))


SCRIPT = """
import sys, threading
from archive_manager import ArchiveManager
from archive_manager.interop.synthetic import make_rollout

def rollout(seed):
    return make_rollout(12, seed=seed, prompt_len=8, response_min=4, response_max=12)

pool = ArchiveManager.open(sys.argv[1], chunk_size=4)
{body}
print("main returns")
"""


def _run(
    tmp_path: Path, body: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    script = SCRIPT.format(body=textwrap.dedent(body))
    return subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "pool")],
        capture_output=True,
        text=True,
        timeout=240,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", **(env or {})},
    )


@pytest.mark.parametrize(
    "body",
    [
        # The main thread returns with the saves in flight and never closes the pool.
        "for i in range(3):\n    pool.save_async(f'a{i}', rollout(i), rollout_id=i)\n",
        # A training thread goes on handing saves off after main returned (unclosed).
        "started = threading.Event()\n"
        "def train():\n"
        "    for i in range(3):\n"
        "        pool.save_async(f'a{i}', rollout(i), rollout_id=i)\n"
        "        started.set()\n"
        "threading.Thread(target=train).start()\n"
        "started.wait()\n",
    ],
)
def test_the_interpreter_exits_after_the_saves_in_flight(tmp_path: Path, body: str) -> None:
    done = _run(tmp_path, body)
    assert done.returncode == 0, done.stderr
    assert "main returns" in done.stdout
    with ArchiveManager.open(tmp_path / "pool") as pool:
        assert sorted(a.name for a in pool.find()) == ["a0", "a1", "a2"]


@pytest.mark.parametrize("end", ["del pool\n", "", "future = None\n"])
def test_an_exit_with_a_failure_nobody_looked_at_logs_it(tmp_path: Path, end: str) -> None:
    """The pool dropped, or never closed, with a failed save whose future nobody looked at:
    the process ends normally and the failure is logged."""
    done = _run(
        tmp_path,
        "pool.save('a0', rollout(0), rollout_id=0)\n"
        "future = pool.save_async('a0', rollout(1), rollout_id=1)\n" + end,
    )
    assert done.returncode == 0, done.stderr
    assert "ArchiveExistsError" in done.stderr and "save_async of 'a0'" in done.stderr


def test_a_save_handed_over_from_an_atexit_function_is_saved(tmp_path: Path) -> None:
    """`atexit` functions run once the exit hook's last wait is over, when a worker started
    would be stopped mid-save: the save was lost without a word (exit 0, nothing published).
    It is now saved on the caller's thread, its future returned done; a failure is its
    future's, logged when nobody looked at it."""
    done = _run(
        tmp_path,
        """\
        import atexit
        def last_words():
            future = pool.save_async('late', rollout(1), rollout_id=1)
            print('late', future.done(), future.result().name)
            pool.save_async('a0', rollout(2), rollout_id=2)  # taken: fails
        atexit.register(last_words)
        pool.save_async('a0', rollout(0), rollout_id=0)
        """,
    )
    assert done.returncode == 0, done.stderr
    assert "late True late" in done.stdout
    assert "ArchiveExistsError" in done.stderr and "save_async of 'a0'" in done.stderr
    with ArchiveManager.open(tmp_path / "pool") as pool:
        assert sorted(a.name for a in pool.find()) == ["a0", "late"]
        late = make_rollout(12, seed=1, prompt_len=8, response_min=4, response_max=12)
        assert_loads(pool, "late", late)


def test_a_save_async_in_the_atexit_function_that_opened_the_first_pool_is_saved(
    tmp_path: Path,
) -> None:
    """The process's first pool opened in an `atexit` function: the exit hook cannot be
    registered any more, and the save went to a worker the interpreter never waited for
    (nothing published, exit 0). It is saved on the caller's thread."""
    ArchiveManager.open(tmp_path / "pool").close()
    script = """
import atexit, sys
from archive_manager import ArchiveManager
from archive_manager.interop.synthetic import make_rollout

def last_words():
    late = ArchiveManager.open(sys.argv[1], chunk_size=4)
    rollout = make_rollout(12, seed=1, prompt_len=8, response_min=4, response_max=12)
    print('late', late.save_async('late', rollout, rollout_id=1).done())

atexit.register(last_words)
"""
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "pool")],
        capture_output=True,
        text=True,
        timeout=240,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert "late True" in done.stdout
    with ArchiveManager.open(tmp_path / "pool") as pool:
        assert [a.name for a in pool.find()] == ["late"]


def test_a_daemon_thread_handing_saves_over_does_not_hold_the_exit_up(tmp_path: Path) -> None:
    """A daemon thread handing saves over faster than they were saved held the exit up for
    ever (the hook waited for each save handed over meanwhile). The exit waits for the saves
    handed over before it began; the daemon's later saves are its own, as a `save` of a
    daemon thread is."""
    done = _run(
        tmp_path,
        """\
        import time
        handed = []
        def produce():
            r = rollout(1)
            for i in range(100_000):
                handed.append(pool.save_async(f'd{i}', r, rollout_id=i))
        threading.Thread(target=produce, daemon=True).start()
        time.sleep(0.3)
        """,
    )
    assert done.returncode == 0, done.stderr
    with ArchiveManager.open(tmp_path / "pool") as pool:
        names = {a.name for a in pool.find()}
    assert names and all(f"d{i}" in names for i in range(len(names) - 1))  # none skipped


def test_close_at_exit_raises_a_failed_save_that_nobody_looked_at(tmp_path: Path) -> None:
    """A failed save run by its caller at exit is `close`'s to raise, as a worker's is (it
    was only logged, chained to an internal `PastExit`)."""
    done = _run(
        tmp_path,
        """\
        import atexit
        pool.save('a0', rollout(0), rollout_id=0)
        held = []
        def last_words():
            held.append(pool.save_async('a0', rollout(1), rollout_id=1))  # taken: fails
            try:
                pool.close()
                print('close returned')
            except Exception as exc:
                print('close raised', type(exc).__name__)
        atexit.register(last_words)
        """,
    )
    assert "close raised ArchiveExistsError" in done.stdout, done.stdout + done.stderr
    assert "PastExit" not in done.stderr


def test_a_forked_child_exits_without_waiting_for_the_parents_saves(tmp_path: Path) -> None:
    """A child forked while a save is in flight (a DataLoader worker, a subprocess helper) does
    not own it: it exits at once; the parent's save publishes."""
    done = _run(
        tmp_path,
        "import os\n"
        "future = pool.save_async('a0', rollout(0), rollout_id=0)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    sys.exit(0)\n"
        "assert os.waitpid(pid, 0)[1] == 0\n"
        "assert future.result().name == 'a0'\n",
        {"ARCHIVE_MANAGER_FAILPOINTS": "save.publish.before_commit=sleep:3"},
    )
    assert done.returncode == 0, done.stderr
    with ArchiveManager.open(tmp_path / "pool") as pool:
        assert [a.name for a in pool.find()] == ["a0"]


INTERRUPTED = """
import signal, sys
from archive_manager import ArchiveManager, Sample

# A shell's background job (`pytest ... &`) starts with SIGINT ignored, and so would this child,
# whose Ctrl-C would then never come.
signal.signal(signal.SIGINT, signal.default_int_handler)

pool = ArchiveManager.open(sys.argv[1], chunk_size=4)
assert "numpy" not in sys.modules  # the first save_async imports it
samples = [Sample(index=i, tokens=list(range(20)), reward=1.0) for i in range(6)]
try:
    pool.save_async("a", samples, rollout_id=1)
except KeyboardInterrupt:
    print("interrupted")
pool.close()  # hung on a save registered and never sealed
print("closed")
"""


@pytest.mark.parametrize("point", ["save_async.import", "save_async.register"])
def test_ctrl_c_in_the_first_call_leaves_no_save_and_no_hung_pool(
    tmp_path: Path, point: str
) -> None:
    """SIGINT while the first `save_async` imports numpy and the writer, or right after it
    registered its save: the call raises KeyboardInterrupt, `close` and the interpreter's
    exit return, the pool is as it was, and the name saves at once."""
    with ArchiveManager.open(tmp_path / "pool", chunk_size=CHUNK) as pool:
        before = snapshot_pool(pool)
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPTED, str(tmp_path / "pool")],
        capture_output=True,
        text=True,
        timeout=120,  # a hang fails here
        env={
            "PYTHONPATH": str(REPO),
            "PATH": "/usr/bin:/bin",
            "ARCHIVE_MANAGER_FAILPOINTS": f"{point}=sigint",
        },
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["interrupted", "closed"]
    with ArchiveManager.open(tmp_path / "pool", chunk_size=CHUNK) as pool:
        assert snapshot_pool(pool) == before
        assert pool.save_async("a", tiny_rollout(4), rollout_id=1).result().name == "a"


def test_one_worker_runs_a_loops_saves_and_ends_with_the_pool(tmp_path: Path) -> None:
    """The worker waits, idle, for the next save (a thread started per save was part of the
    time the caller was blocked), and ends when the pool closes."""
    pool = ArchiveManager.open(tmp_path / "pool", chunk_size=CHUNK)
    pool.save_async("a", tiny_rollout(4), rollout_id=1).result()
    saves = pool._background
    assert saves is not None
    worker = saves._worker
    assert worker is not None and worker.is_alive()
    pool.save_async("b", tiny_rollout(4, seed=1), rollout_id=2).result()
    assert saves._worker is worker
    pool.close()
    assert not worker.is_alive()
    with ArchiveManager.open(tmp_path / "pool") as again:
        assert sorted(a.name for a in again.find()) == ["a", "b"]


@pytest.mark.parametrize(
    "end",
    [
        "",  # the pool never closed
        "del pool\n",  # the pool dropped
        # a child forked while the worker idles saves on its own and exits
        "import os\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    pool.save_async('child', rollout(5), rollout_id=5).result()\n"
        "    sys.exit(0)\n"
        "assert os.waitpid(pid, 0)[1] == 0\n",
    ],
)
def test_an_idle_worker_never_holds_the_exit_up(tmp_path: Path, end: str) -> None:
    """A worker waiting for the next save ends at once when the interpreter exits (or its
    pool is dropped), in a forked child too, rather than after its idle wait."""
    start = time.monotonic()
    done = _run(tmp_path, "pool.save_async('a0', rollout(0), rollout_id=0).result()\n" + end)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - start < 60  # the idle wait is 300 s
    with ArchiveManager.open(tmp_path / "pool") as pool:
        names = sorted(a.name for a in pool.find())
    assert names == (["a0", "child"] if "fork" in end else ["a0"])


@pytest.mark.parametrize(
    "body",
    [
        # a done callback of one pool's save hands a save to a second pool: the first
        # pool's worker is a caller the exit hook joins
        "done = threading.Event()\n"
        "def mirror(future):\n"
        "    other.save_async('b0', rollout(1), rollout_id=1).add_done_callback(\n"
        "        lambda f: done.set())\n"
        "pool.save_async('a0', rollout(0), rollout_id=0).add_done_callback(mirror)\n"
        "done.wait()\n",
        # a daemon thread hands its first save to a second pool once the exit began
        "pool.save_async('a0', rollout(0), rollout_id=0)\n"
        "def late():\n"
        "    while not threading._SHUTTING_DOWN:\n"
        "        time.sleep(0.001)\n"
        "    other.save_async('b0', rollout(1), rollout_id=1)\n"
        "threading.Thread(target=late, daemon=True).start()\n",
    ],
)
def test_no_worker_idles_once_the_exit_began(tmp_path: Path, body: str) -> None:
    """Every pool's idle worker ends once the exit hook begins, those it has not seen yet
    and those that are callers it joins included."""
    start = time.monotonic()
    done = _run(
        tmp_path,
        "import time\nother = ArchiveManager.open(sys.argv[1] + '-b', chunk_size=4)\n" + body,
    )
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - start < 60  # the idle wait is 300 s
    with ArchiveManager.open(tmp_path / "pool") as pool:
        assert [a.name for a in pool.find()] == ["a0"]


def test_an_idle_worker_keeps_no_dropped_pool_alive(tmp_path: Path) -> None:
    """The last save the worker ran (a reference save holds its pool) is not kept by the
    idle worker: the pool dropped is collected, and its worker ends."""
    pool = ArchiveManager.open(tmp_path / "pool", chunk_size=CHUNK)
    base = pool.save("base", tiny_rollout(4), rollout_id=1)
    pool.save_async("ref", None, rollout_id=2, reference=base).result()
    saves = pool._background
    assert saves is not None
    worker = saves._worker
    assert worker is not None
    dropped = weakref.ref(pool)
    del pool, base
    gc.collect()
    assert dropped() is None
    worker.join(30)
    assert not worker.is_alive()


def test_an_executor_thread_that_saved_holds_no_exit_up(tmp_path: Path) -> None:
    """A `ThreadPoolExecutor` worker that handed a save over, its executor never shut down:
    the exit waits for the save, not for the executor's thread (which ends only after the
    exit hook: joining it there hung the exit for good)."""
    start = time.monotonic()
    done = _run(
        tmp_path,
        "from concurrent.futures import ThreadPoolExecutor\n"
        "ex = ThreadPoolExecutor(1)\n"
        "ex.submit(lambda: pool.save_async('a0', rollout(0), rollout_id=0)).result()\n",
    )
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - start < 60
    with ArchiveManager.open(tmp_path / "pool") as pool:
        assert [a.name for a in pool.find()] == ["a0"]
