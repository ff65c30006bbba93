"""Saving a step again under its name (docs/architecture/save-protocol.md, "Superseding a name").

A run resumed from an earlier checkpoint regenerates a step it had saved: once the earlier
archive of that name is released, ``pool.save(name, ..., supersede=True)`` saves it again.
The earlier archive stays on record as ``superseded`` (its id, rows and journal kept), and
statistics, queries, groups and listings count only the archive the name points at; an
archive still retained is refused, naming its owners.  Without the flag, a published name is
refused with a message that says how, and a released one whose payload gc reclaimed is
taken back.  Issue 35, item 1.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers import (
    Backend,
    assert_same_samples,
    open_on,
    snapshot_pool,
    tiny_rollout,
)
from sqlalchemy import select
from test_recovery import CatalogBackup, lose_catalog

from archive_manager import ArchiveManager
from archive_manager.catalog import archives_table, retention_table
from archive_manager.cli import cli
from archive_manager.errors import (
    ArchiveExistsError,
    ArchiveNotFoundError,
    ArchiveRetainedError,
    SaveInFlightError,
)

STEP = 105


def _attempt(seed: int, n: int, reward: float) -> list[Any]:
    samples = tiny_rollout(n, seed=seed, rollout_id=STEP)
    for s in samples:
        s.reward = reward
    return samples


#: The abandoned attempt of the step and the one trained on: told apart by size and reward.
ABANDONED = (1, 4, 0.25)
TRAINED = (2, 6, 0.75)


def _rows(pool: ArchiveManager, name: str) -> list[tuple[int, str, int | None, float | None]]:
    a = archives_table
    with pool.catalog.read() as conn:
        return [
            (row.id, row.state, row.superseded_by, row.superseded_at)
            for row in conn.execute(
                select(a.c.id, a.c.state, a.c.superseded_by, a.c.superseded_at)
                .where(a.c.name == name)
                .order_by(a.c.id)
            )
        ]


def _current(pool: ArchiveManager, name: str) -> tuple[str, int]:
    arc = pool.open_archive(name)
    return arc.state, len(arc)


def _counts_only_the_trained_attempt(pool: ArchiveManager, name: str) -> None:
    """Statistics, queries, groups and listings see one attempt: the one the name points at."""
    samples, reward = TRAINED[1], TRAINED[2]
    (row,) = pool.stats(STEP)
    assert (row.archives, row.samples, row.reward_mean) == (1, samples, pytest.approx(reward))
    for state in ("published", None):
        found = pool.query(rollout_ids=STEP, state=state)
        assert len(found) == samples and {r.reward for r in found} == {reward}
    assert sum(g.size for g in pool.groups(name)) == samples
    assert [i.name for i in pool.find(rollout_id=STEP)] == [name]
    assert [i.samples for i in pool.find(rollout_id=STEP, state="released")] == []
    assert pool.info().samples == samples
    arc = pool.open_archive(name)
    assert (arc.state, len(arc)) == ("published", samples)
    assert_same_samples(arc.load_samples(), _attempt(*TRAINED))


def test_a_released_step_is_saved_again_and_the_earlier_archive_kept_on_record(
    pool: ArchiveManager,
) -> None:
    first = pool.save("step", _attempt(*ABANDONED), rollout_id=STEP)
    first_id = first.info().id
    assert first.release()
    # Before the step is saved again the released attempt still counts, as released ones do.
    (row,) = pool.stats(STEP)
    assert (row.archives, row.released) == (1, 1)

    second = pool.save("step", _attempt(*TRAINED), rollout_id=STEP, supersede=True)
    second_id = second.info().id
    assert second_id != first_id
    ((old, old_state, by, at), (new, new_state, _, _)) = _rows(pool, "step")
    assert (old, old_state, by) == (first_id, "superseded", second_id) and at is not None
    assert (new, new_state) == (second_id, "published")
    _counts_only_the_trained_attempt(pool, "step")

    # On record, for audit: listed, in the name's history, its rows and summary kept.
    history = pool.history("step")
    assert [(i.id, i.state, i.superseded_by) for i in history] == [
        (first_id, "superseded", second_id),
        (second_id, "published", None),
    ]
    assert history[0].samples == ABANDONED[1] and history[0].released_at is not None
    assert [(i.id, i.state) for i in pool.find(state="superseded")] == [(first_id, "superseded")]
    assert [i.id for i in pool.find(state=None)] == [first_id, second_id]
    assert first.state == "superseded" and first.owners() == []
    assert len(first.keys()) == ABANDONED[1]
    report = pool.verify()
    assert report.ok, report.as_dict()

    # The step saved a third time: each attempt keeps its own record.
    second.release()
    third = pool.save("step", _attempt(*TRAINED), rollout_id=STEP, supersede=True)
    assert [i.state for i in pool.history("step")] == ["superseded", "superseded", "published"]
    assert pool.history("step")[1].superseded_by == third.info().id
    _counts_only_the_trained_attempt(pool, "step")


def test_saving_a_taken_name_again_is_refused_before_anything_is_written(
    pool: ArchiveManager,
) -> None:
    pool.save("step", _attempt(*ABANDONED), rollout_id=STEP)
    before = snapshot_pool(pool)

    # Published, no flag: the message says it is published and how to save the step again.
    with pytest.raises(ArchiveExistsError) as plain:
        pool.save("step", _attempt(*TRAINED), rollout_id=STEP)
    assert not isinstance(plain.value, ArchiveRetainedError)
    assert "already exists (published)" in str(plain.value)
    assert "supersede=True" in str(plain.value)
    # Published, with the flag: its own owner retains it.
    with pytest.raises(ArchiveRetainedError, match="retained by archive:step") as held:
        pool.save("step", _attempt(*TRAINED), rollout_id=STEP, supersede=True)
    assert held.value.owners == ["archive:step"] and held.value.name == "step"
    with pytest.raises(ArchiveRetainedError):
        pool.writer("step", rollout_id=STEP, supersede=True)
    assert snapshot_pool(pool) == before

    # Released while a checkpoint still retains it: refused, naming the checkpoint.
    pool.retain("checkpoint:step-100", "step")
    pool.open_archive("step").release()
    before = snapshot_pool(pool)
    for supersede in (True, False):
        with pytest.raises(ArchiveRetainedError, match="checkpoint:step-100") as info:
            pool.save("step", _attempt(*TRAINED), rollout_id=STEP, supersede=supersede)
        assert info.value.owners == ["checkpoint:step-100"]
    assert snapshot_pool(pool) == before

    # Released and unowned, its payload still stored: the flag is needed.
    pool.release_owner("checkpoint:step-100")
    before = snapshot_pool(pool)
    with pytest.raises(ArchiveExistsError, match="not yet reclaimed") as exists:
        pool.save("step", _attempt(*TRAINED), rollout_id=STEP)
    assert "supersede=True" in str(exists.value)
    assert snapshot_pool(pool) == before
    pool.save("step", _attempt(*TRAINED), rollout_id=STEP, supersede=True)
    _counts_only_the_trained_attempt(pool, "step")


def test_after_the_abandoned_attempt_is_collected_a_plain_save_takes_the_name_back(
    pool: ArchiveManager,
) -> None:
    """The issue's case: the abandoned attempt released and collected, the name stayed
    taken, and stats averaged both attempts."""
    pool.save("step", _attempt(*ABANDONED), rollout_id=STEP)
    pool.open_archive("step").release()
    pool.gc(grace=0)
    assert pool.payload_reclaimed(["step"]) == {"step"}
    pool.save("step", _attempt(*TRAINED), rollout_id=STEP)
    assert [i.state for i in pool.history("step")] == ["superseded", "published"]
    _counts_only_the_trained_attempt(pool, "step")
    # Collected and superseded, released and collected again: still reusable, either way.
    pool.open_archive("step").release()
    pool.gc(grace=0)
    pool.save("step", _attempt(*TRAINED), rollout_id=STEP, supersede=True)
    assert [i.state for i in pool.history("step")] == ["superseded"] * 2 + ["published"]
    _counts_only_the_trained_attempt(pool, "step")
    assert pool.verify(read_data=True).ok


def test_supersede_of_a_free_name_is_a_plain_save(pool: ArchiveManager) -> None:
    """A resumed run may pass supersede=True for every step: a step never saved is saved."""
    arc = pool.save("step", _attempt(*TRAINED), rollout_id=STEP, supersede=True)
    assert [i.state for i in pool.history("step")] == ["published"]
    assert arc.info().superseded_by is None
    with pytest.raises(ArchiveNotFoundError):
        pool.history("never-saved")
    with pytest.raises(ValueError, match="supersede must be True or False"):
        pool.save("other", _attempt(*TRAINED), rollout_id=STEP, supersede=1)  # type: ignore[arg-type]


def test_the_writer_supersedes_and_the_earlier_archive_is_current_until_it_publishes(
    pool: ArchiveManager,
) -> None:
    pool.save("step", _attempt(*ABANDONED), rollout_id=STEP)
    pool.open_archive("step").release()
    with pool.writer("step", rollout_id=STEP, supersede=True) as w:
        for s in _attempt(*TRAINED):
            w.add(s)
        w.wait_stored()
        # Storing: the name still points at the released attempt, which still counts.
        assert _current(pool, "step") == ("released", ABANDONED[1])
        (row,) = pool.stats(STEP)
        assert row.samples == ABANDONED[1]
    assert w.archive is not None and w.archive.state == "published"
    _counts_only_the_trained_attempt(pool, "step")


def test_of_two_superseding_saves_the_first_to_commit_wins(pool: ArchiveManager) -> None:
    """Both start while the name points at the released attempt; the second to commit finds
    it published by the first, and is refused and rolled back."""
    pool.save("step", _attempt(*ABANDONED), rollout_id=STEP)
    pool.open_archive("step").release()
    first = pool.writer("step", rollout_id=STEP, supersede=True)
    second = pool.writer("step", rollout_id=STEP, supersede=True)
    for s in _attempt(*TRAINED):
        first.add(s)
        second.add(s)
    first.commit()
    with pytest.raises(ArchiveRetainedError, match="it is published"):
        second.commit()
    assert [i.state for i in pool.history("step")] == ["superseded", "published"]
    assert pool.owners().saves == []
    _counts_only_the_trained_attempt(pool, "step")
    assert pool.verify().ok


def test_a_superseding_save_whose_earlier_archive_gained_an_owner_is_rolled_back(
    pool: ArchiveManager,
) -> None:
    """Checked again at publication: an owner the earlier archive gained meanwhile (a
    rebuild brought it back) refuses the save, which rolls back; the earlier archive stays
    the name's."""
    first = pool.save("step", _attempt(*ABANDONED), rollout_id=STEP)
    first.release()
    with (
        pytest.raises(ArchiveRetainedError, match="checkpoint:7"),
        pool.writer("step", rollout_id=STEP, supersede=True) as w,
    ):
        for s in _attempt(*TRAINED):
            w.add(s)
        w.wait_stored()
        with pool.catalog.write() as conn:
            conn.execute(
                retention_table.insert().values(
                    owner="checkpoint:7", archive_id=first.info().id, created_at=1.0
                )
            )
    assert [i.state for i in pool.history("step")] == ["released"]
    assert pool.open_archive("step").info().id == first.info().id
    assert pool.owners().saves == []


def test_a_pending_superseding_save_holds_the_name(
    pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    from helpers import die_before_publish

    pool.save("step", _attempt(*ABANDONED), rollout_id=STEP)
    pool.open_archive("step").release()
    # Killed after its ownership commit, in this very process (alive): the name is held.
    from archive_manager.pool.writer import ArchiveWriter

    real = ArchiveWriter.__init__

    def superseding(self: ArchiveWriter, *args: Any, **kw: Any) -> None:
        real(self, *args, **{**kw, "supersede": True})

    monkeypatch.setattr(ArchiveWriter, "__init__", superseding)
    die_before_publish(pool, "step", _attempt(*TRAINED), monkeypatch)
    monkeypatch.undo()
    assert [i.state for i in pool.history("step")] == ["released", "pending"]
    assert pool.open_archive("step").state == "released"
    (row,) = pool.stats(STEP)
    assert row.samples == ABANDONED[1]
    with pytest.raises(SaveInFlightError):
        pool.save("step", _attempt(*TRAINED), rollout_id=STEP, supersede=True)
    listed = sorted((i.state, i.samples) for i in pool.find(state=None))
    assert listed == [("pending", TRAINED[1]), ("released", ABANDONED[1])]


def test_listings_page_over_the_records_of_a_name(pool: ArchiveManager) -> None:
    """A page never ends part-way through the archives of one name (its superseded records
    beside the one it points at): the next page, started after its last name, holds them."""
    for i in range(3):
        pool.save(f"a{i}", _attempt(*ABANDONED), rollout_id=STEP)
    for _ in range(2):
        pool.open_archive("a1").release()
        pool.save("a1", _attempt(*TRAINED), rollout_id=STEP, supersede=True)
    every = [(i.name, i.id) for i in pool.find(state=None)]
    assert [n for n, _ in every] == ["a0", "a1", "a1", "a1", "a2"]
    for size in (1, 2, 3, 4):
        seen: list[tuple[str, int | None]] = []
        after = None
        while True:
            page = pool.find(state=None, limit=size, after=after)
            if not page:
                break
            seen += [(i.name, i.id) for i in page]
            after = page[-1].name
        assert seen == every, size


def test_a_resumed_run_saves_its_steps_again_as_the_usage_recipe_does(
    pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/usage.md, "Resuming a run": run A saved steps 0-5 and died saving step 6; run B,
    a new run in the same pool, saves steps 0-2; A resumes from the checkpoint of step 4 and
    saves steps 4-7 again. The recipe released every step from ``start`` on, so B (start 0)
    released and superseded A's steps; it releases only its own run's."""
    from helpers import die_before_publish
    from sqlalchemy import update

    from archive_manager._util.holders import this_process
    from archive_manager.catalog import leases_table

    def rollout(step: int, attempt: int) -> list[Any]:
        samples = tiny_rollout(3, seed=10 * attempt + step, rollout_id=step)
        for s in samples:
            s.reward = float(attempt)
        return samples

    def save_rollout(run: str, step: int, samples: list[Any]) -> None:
        # The recipe's loop, less its wait for a lease this process cannot judge.
        name = f"{run}.rollout-{step:06d}"
        pool.save(name, samples, rollout_id=step, attrs={"run": run}, supersede=True)

    def resume(run: str, start: int) -> None:  # the recipe's release, as written
        pool.release(
            [
                i.name
                for i in pool.find(rollout_id=(start, None))
                if i.name.startswith(f"{run}.")
                and (pool.open_archive(i.name).attrs or {}).get("run") == run
            ]
        )

    for step in range(6):
        save_rollout("A", step, rollout(step, attempt=1))
    die_before_publish(pool, "A.rollout-000006", rollout(6, attempt=1), monkeypatch)
    with pool.catalog.write() as conn:  # the lost run's process is gone
        dead = {**this_process(), "pid": 2**22 + 12345}
        conn.execute(update(leases_table).values(holder=dead))

    resume("B", 0)
    for step in range(3):
        save_rollout("B", step, rollout(step, attempt=3))
    assert pool.find(state="superseded") == [] and pool.find(state="released") == []

    start = 4
    resume("A", start)
    for step in range(start, 8):
        save_rollout("A", step, rollout(step, attempt=2))

    rows = pool.stats()
    assert [(r.rollout_id, r.archives) for r in rows] == [(i, 2 if i < 3 else 1) for i in range(8)]
    for step in range(8):
        name = f"A.rollout-{step:06d}"
        states = [i.state for i in pool.history(name)]
        assert states == (["superseded", "published"] if step in (4, 5) else ["published"])
        expected = rollout(step, attempt=2 if step >= start else 1)
        assert_same_samples(pool.open_archive(name).load_samples(), expected)
    for step in range(3):
        assert [i.state for i in pool.history(f"B.rollout-{step:06d}")] == ["published"]
    assert pool.owners().saves == [] and pool.verify().ok


def _cli(pool: ArchiveManager, *args: str) -> Any:
    result = CliRunner().invoke(
        cli, ["--root", str(pool.root), "--catalog-url", pool.catalog_url, *args]
    )
    assert result.exit_code == 0, result.output
    return result


def test_the_cli_lists_and_shows_the_superseded_archives(pool: ArchiveManager) -> None:
    first = pool.save("step", _attempt(*ABANDONED), rollout_id=STEP)
    first.release()
    second = pool.save("step", _attempt(*TRAINED), rollout_id=STEP, supersede=True)
    listed = json.loads(_cli(pool, "ls", "--state", "all", "--json").stdout)
    assert [(r["id"], r["state"]) for r in listed] == [
        (first.info().id, "superseded"),
        (second.info().id, "published"),
    ]
    assert [r["state"] for r in json.loads(_cli(pool, "ls", "--json").stdout)] == ["published"]
    table = _cli(pool, "ls", "--state", "superseded").stdout
    assert "superseded" in table and "published" not in table
    shown = json.loads(_cli(pool, "show", "step", "--json").stdout)
    assert shown["id"] == second.info().id and shown["samples"] == TRAINED[1]
    assert [(r["id"], r["superseded_by"]) for r in shown["superseded"]] == [
        (first.info().id, second.info().id)
    ]
    text = _cli(pool, "show", "step").stdout
    (line,) = [r for r in text.splitlines() if r.startswith("supersedes")]
    assert f"#{first.info().id} ({ABANDONED[1]} samples" in line
    stats = json.loads(_cli(pool, "stats", "--json").stdout)
    assert [(r["rollout_id"], r["samples"]) for r in stats] == [(STEP, TRAINED[1])]


# --------------------------------------------------------------------------- durability


@pytest.mark.parametrize("checkpointed", [False, True])
def test_a_rebuild_from_the_pool_files_knows_which_archive_is_current(
    tmp_path: Path, backend: Backend, checkpointed: bool
) -> None:
    """The catalog lost: the manifests and the retention journal give the name back to the
    archive that superseded, and the earlier one comes back as its superseded record; with
    a checkpoint of the journal in between too."""
    from archive_manager.pool.journal import checkpoint

    root = tmp_path / "pool"
    with open_on(backend, root) as pool:
        pool.save("step", _attempt(*ABANDONED), rollout_id=STEP)
        pool.open_archive("step").release()
        pool.save("step", _attempt(*TRAINED), rollout_id=STEP, supersede=True)
        if checkpointed:
            checkpoint(pool.catalog, pool.journal, pool.clock)
    url = lose_catalog(backend, root)
    with ArchiveManager.open(root, url, recover=True) as pool:
        report = pool.rebuild_catalog()
        assert not report.skipped, report.skipped
        assert _current(pool, "step") == ("published", TRAINED[1])
        history = pool.history("step")
        assert [(i.state, i.samples) for i in history] == [
            ("superseded", ABANDONED[1]),
            ("published", TRAINED[1]),
        ]
        assert history[0].superseded_by == history[1].id
        _counts_only_the_trained_attempt(pool, "step")
        assert pool.verify().ok


def test_a_catalog_restored_from_before_the_step_was_saved_again_is_brought_forward(
    tmp_path: Path, backend: Backend
) -> None:
    root = tmp_path / "pool"
    backup = CatalogBackup(backend, root, backend.url(root), tmp_path / "catalog.backup")
    with open_on(backend, root) as pool:
        pool.save("step", _attempt(*ABANDONED), rollout_id=STEP)
        pool.open_archive("step").release()
        backup.take()
        pool.save("step", _attempt(*TRAINED), rollout_id=STEP, supersede=True)
    backup.restore()
    with open_on(backend, root) as pool:
        report = pool.rebuild_catalog()
        assert not report.skipped and not report.renamed, report.as_dict()
        assert _current(pool, "step") == ("published", TRAINED[1])
        assert [i.state for i in pool.history("step")] == ["superseded", "published"]
        _counts_only_the_trained_attempt(pool, "step")
        assert pool.verify().ok


def test_a_catalog_restored_while_the_step_was_being_saved_again_is_brought_forward(
    tmp_path: Path, backend: Backend
) -> None:
    """The backup caught the superseding save pending: the journal says it published."""
    root = tmp_path / "pool"
    backup = CatalogBackup(backend, root, backend.url(root), tmp_path / "catalog.backup")
    with open_on(backend, root) as pool:
        pool.save("step", _attempt(*ABANDONED), rollout_id=STEP)
        pool.open_archive("step").release()
        with pool.writer("step", rollout_id=STEP, supersede=True) as w:
            for s in _attempt(*TRAINED):
                w.add(s)
            real = w._publish

            def publish(archive_id: int, manifest_digest: str) -> None:
                backup.take()
                real(archive_id, manifest_digest)

            w._publish = publish  # type: ignore[method-assign]
    backup.restore()
    with open_on(backend, root) as pool:
        report = pool.rebuild_catalog()
        assert report.brought_forward, report.as_dict()
        assert _current(pool, "step") == ("published", TRAINED[1])
        assert [i.state for i in pool.history("step")] == ["superseded", "published"]
        _counts_only_the_trained_attempt(pool, "step")
        assert pool.verify().ok
