"""The RL lens from the catalog (`archive_manager.lens.groups`): prompt groups with GRPO advantages,
a prompt's history across rollouts, and prompts ranked by how their reward changed."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from helpers import Backend, open_on

from archive_manager import ArchiveManager
from archive_manager.cli import cli
from archive_manager.errors import ArchiveNotFoundError, InvalidInputError
from archive_manager.lens.groups import ADVANTAGE_EPS


def rollout(rid: int, seed: int, prompts: int = 5, n: int = 4) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = []
    for t in range(prompts):
        for k in range(n):
            reward: Any = float(rng.choice([0, 0, 1, 0.5]))
            if t == 0:
                reward = 1.0  # a group that teaches nothing
            if t == 1 and k == 0:
                reward = None  # no numeric reward: left out of the figures
            out.append(
                {
                    "tokens": [1] * rng.randint(1, 9),
                    "response_length": rng.randint(1, 50),
                    "reward": reward,
                    "index": t * n + k,
                    "task_key": f"q{t}",
                    "status": rng.choice(["completed", "truncated"]),
                }
            )
    return out


def test_groups_match_a_grpo_reference(tmp_path: Path, backend: Backend) -> None:
    samples = rollout(1, seed=3)
    with open_on(backend, tmp_path / "pool") as pool:
        pool.save("r", samples, rollout_id=1)
        groups = pool.groups("r")
    assert [g.task_key for g in groups] == [f"q{t}" for t in range(5)]
    for g in groups:
        members = [s for s in samples if s["task_key"] == g.task_key]
        rewards = [s["reward"] for s in members if s["reward"] is not None]
        t = torch.tensor(rewards, dtype=torch.float64)
        assert g.size == len(members) and g.rewarded == len(rewards)
        assert g.reward_mean == pytest.approx(t.mean().item())
        assert g.reward_std == pytest.approx(t.std().item())  # torch.std: n - 1
        assert (g.reward_min, g.reward_max) == (min(rewards), max(rewards))
        assert g.zero_variance is (len(set(rewards)) == 1)
        expected = ((t - t.mean()) / (t.std() + ADVANTAGE_EPS)).tolist()
        got = [m.normalized_advantage for m in g.members if m.reward is not None]
        assert got == pytest.approx(expected)
        assert [m.sample_key for m in g.members] == [f"sample:{s['index']}" for s in members]
        assert sum(g.statuses.values()) == g.size
    assert groups[0].zero_variance


def test_prompt_history_and_changes(tmp_path: Path, backend: Backend) -> None:
    with open_on(backend, tmp_path / "pool") as pool:
        pool.save("r1", rollout(1, seed=1), rollout_id=1)
        pool.save("r2", rollout(2, seed=2), rollout_id=2)
        pool.save("r2b", rollout(2, seed=5, prompts=2), rollout_id=2)  # one rollout, two archives
        pool.save("e3", rollout(3, seed=3), rollout_id=3, evaluation=True)
        history = pool.prompt_history("q1")
        assert [(h.rollout_id, h.evaluation) for h in history] == [
            (1, False),
            (2, False),
            (3, True),
        ]
        assert history[1].archives == ("r2", "r2b") and history[1].size == 8
        rewards = [
            s["reward"]
            for s in rollout(2, seed=2) + rollout(2, seed=5, prompts=2)
            if s["task_key"] == "q1" and s["reward"] is not None
        ]
        assert history[1].reward_mean == pytest.approx(sum(rewards) / len(rewards))
        assert history[1].pass_rate == pytest.approx(sum(r > 0 for r in rewards) / len(rewards))
        assert [h.rollout_id for h in pool.prompt_history("q1", evaluation=False)] == [1, 2]
        assert [h.rollout_id for h in pool.prompt_history("q1", (2, None))] == [2, 3]
        assert pool.prompt_history("nobody") == []

        changes = pool.prompt_changes(1, 2)
        assert sorted(c.task_key for c in changes) == [f"q{t}" for t in range(5)]
        assert [abs(c.change) for c in changes] == sorted(
            (abs(c.change) for c in changes), reverse=True
        )
        worse = pool.prompt_changes(1, 2, direction="regressed")
        assert all(c.change < 0 for c in worse)
        better = pool.prompt_changes(1, 2, direction="improved", limit=1)
        assert len(better) <= 1 and all(c.change > 0 for c in better)
        # A released archive still counts, as in stats().
        pool.open_archive("r1").release()
        assert pool.prompt_history("q1")[0].rollout_id == 1


def test_bad_input(tmp_path: Path) -> None:
    with ArchiveManager.open(tmp_path / "pool") as pool:
        pool.save("r", rollout(1, seed=1), rollout_id=1)
        with pytest.raises(ArchiveNotFoundError):
            pool.groups("missing")
        with pytest.raises(InvalidInputError):
            pool.prompt_history(None)  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError):
            pool.prompt_history("q1", pass_threshold=math.nan)
        with pytest.raises(InvalidInputError):
            pool.prompt_changes(1, 2, direction="sideways")
        with pytest.raises(InvalidInputError):
            pool.prompt_changes(1, "2")
        with pytest.raises(InvalidInputError):
            pool.prompt_changes(1, 2, limit=-1)


def test_extreme_rewards_do_not_overflow(tmp_path: Path) -> None:
    with ArchiveManager.open(tmp_path / "pool") as pool:
        samples = [{"tokens": [1], "reward": 1.7e308, "task_key": "q"} for _ in range(3)]
        pool.save("r", samples, rollout_id=1)
        (g,) = pool.groups("r")
        assert g.reward_mean == pytest.approx(1.7e308) and g.zero_variance


def test_cli(tmp_path: Path) -> None:
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        pool.save("r1", rollout(1, seed=1), rollout_id=1)
        pool.save("r2", rollout(2, seed=2), rollout_id=2)
    runner = CliRunner()
    base = ["--root", str(root)]
    done = runner.invoke(cli, [*base, "groups", "r1", "--sort", "std", "--members"])
    assert done.exit_code == 0, done.output
    assert "zero reward variance" in done.output and "ADVANTAGE" in done.output
    done = runner.invoke(cli, [*base, "groups", "r1", "--json"])
    assert json.loads(done.output)[0]["zero_variance"] is True
    done = runner.invoke(cli, [*base, "prompts", "--task-key", "q2"])
    assert done.exit_code == 0 and "ROLLOUT" in done.output
    done = runner.invoke(cli, [*base, "prompts", "--from", "1", "--to", "2..", "--json"])
    assert done.exit_code == 0 and len(json.loads(done.output)) == 5
    done = runner.invoke(cli, [*base, "prompts", "--from", "1"])
    assert done.exit_code == 2 and "--to" in done.output
    done = runner.invoke(cli, [*base, "groups", "nope"])
    assert done.exit_code == 1 and "error:" in done.output and "Traceback" not in done.output


def test_viewer_group_and_prompt_pages(tmp_path: Path) -> None:
    pytest.importorskip("flask")
    from helpers import snapshot_pool

    from archive_manager.web.app import create_app

    hostile = "<script>alert(1)</script>"
    with ArchiveManager.open(tmp_path / "pool") as pool:
        samples = rollout(1, seed=1)
        for s in samples[:4]:
            s["task_key"] = hostile
            s["response"] = "<b>bold</b> answer"
        pool.save("r1", samples, rollout_id=1)
        pool.save("r2", rollout(2, seed=2), rollout_id=2)
        before = snapshot_pool(pool)
        client = create_app(pool).test_client()
        page = client.get("/archive/r1/group", query_string={"task_key": hostile})
        assert page.status_code == 200
        assert hostile not in page.text and "&lt;script&gt;" in page.text
        assert "&lt;b&gt;bold&lt;/b&gt; answer" in page.text
        data: Any = client.get(
            "/archive/r1/group", query_string={"task_key": "q2", "format": "json", "sort": "reward"}
        ).json
        assert data["group"] == pool.groups("r1")[2].as_dict()
        assert len(data["responses"]) == data["group"]["size"]
        history: Any = client.get("/prompt", query_string={"task_key": "q2", "format": "json"}).json

        assert [h["rollout_id"] for h in history["history"]] == [1, 2]
        page = client.get("/prompt", query_string={"task_key": "q2"})
        assert page.status_code == 200 and "<svg" in page.text and "/archive/r2/group" in page.text
        assert client.get("/archive/r1/group?task_key=missing").status_code == 404
        assert client.get("/archive/r1/group").status_code == 400
        assert client.get("/prompt").status_code == 400
        assert "/archive/r1/group?task_key=q2" in client.get("/archive/r1").text
        assert snapshot_pool(pool) == before


def test_stats_carry_group_figures(tmp_path: Path, backend: Backend) -> None:
    """stats(): share of zero-variance groups and mean within-group std, equal to what
    groups() computes archive by archive (catalog only)."""
    with open_on(backend, tmp_path / "pool") as pool:
        pool.save("r2a", rollout(2, seed=2), rollout_id=2)
        pool.save("r2b", rollout(2, seed=7, prompts=3), rollout_id=2)
        pool.save("r3", [{"tokens": [1], "reward": 1.0}], rollout_id=3)  # no task key
        rows = {r.rollout_id: r for r in pool.stats()}
        groups = [g for name in ("r2a", "r2b") for g in pool.groups(name) if g.rewarded >= 2]
        assert rows[2].groups == len(groups)
        assert rows[2].zero_variance_groups == sum(g.zero_variance for g in groups)
        stds = [g.reward_std for g in groups if g.reward_std is not None]
        assert rows[2].group_std_mean == pytest.approx(sum(stds) / len(stds))
        assert rows[2].zero_variance_share == pytest.approx(
            rows[2].zero_variance_groups / len(groups)
        )
        assert rows[3].groups == 0 and rows[3].zero_variance_share is None
        assert pool.stats()[0].as_dict()["zero_variance_share"] == rows[2].zero_variance_share
    done = CliRunner().invoke(cli, ["--root", str(tmp_path / "pool"), "stats"])
    if backend.name == "sqlite":
        assert done.exit_code == 0 and "FLAT" in done.output and "GROUP STD" in done.output


# Claim: bad input to `prompts` is a clear one-line error.  Fixed: --regressed --improved
# together took the last one silently, and --limit 0 printed "no prompt with rewards in
# both ranges" whatever the ranges held.
def test_prompts_refuses_contradictory_options(tmp_path: Path) -> None:
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        for rid in (1, 2):
            pool.save(
                f"r{rid}",
                [
                    {"response": "r", "reward": float(rid * (i % 2)), "task_key": f"k{i}"}
                    for i in range(4)
                ],
                rollout_id=rid,
            )
    runner = CliRunner()
    base = ["--root", str(root), "prompts", "--from", "1", "--to", "2"]
    done = runner.invoke(cli, [*base, "--regressed", "--improved"])
    assert done.exit_code == 2 and "not both" in done.output
    done = runner.invoke(cli, [*base, "--limit", "0"])
    assert done.exit_code == 2 and "--limit" in done.output
    improved = runner.invoke(cli, [*base, "--improved", "--json"])
    assert improved.exit_code == 0, improved.output
    assert [c["task_key"] for c in json.loads(improved.output)] == ["k1", "k3"]
    regressed = runner.invoke(cli, [*base, "--regressed", "--json"])
    assert regressed.exit_code == 0 and json.loads(regressed.output) == []
    done = runner.invoke(cli, [*base, "--limit", str(10**30), "--json"])
    assert done.exit_code == 0 and len(json.loads(done.output)) == 4
