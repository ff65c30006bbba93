"""`archive_manager.integrations.trl` against the real TRL: a `GRPOTrainer` trains a tiny model
built from a config with a tokenizer trained here (nothing from a hub), and what the callback
saved is compared with what the trainer computed (its batches, caught by a subclass, and the
completions table TRL writes itself)."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _integrations import require

os.environ.setdefault("HF_HUB_OFFLINE", "1")
trl = require("trl")
transformers = require("transformers")

import pandas as pd  # noqa: E402
from _trl_setup import dataset, grpo, make_tokenizer, reward_len, tiny_model, unpadded  # noqa: E402

from archive_manager import ArchiveManager, Sample  # noqa: E402
from archive_manager.errors import ArchiveExistsError, InvalidInputError  # noqa: E402
from archive_manager.integrations.trl import ArchiveCallback, prompt_key  # noqa: E402

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return make_tokenizer()


def test_each_generation_batch_is_one_archive_of_what_the_trainer_computed(
    tokenizer: Any, tmp_path: Path
) -> None:
    pool = ArchiveManager.open(tmp_path / "pool")
    seen: list[int] = []
    trainer = grpo(
        tokenizer,
        tmp_path / "out",
        ArchiveCallback(pool, task_key_column="pid"),
        seen_steps=seen,
        log_completions=True,
        mask_truncated_completions=True,
    )
    trainer.train()

    infos = pool.find()
    assert [i.rollout_id for i in infos] == [0, 1, 2] == sorted(set(seen))
    assert [i.name for i in infos] == ["step-000000", "step-000001", "step-000002"]
    stop = {tokenizer.eos_token_id, tokenizer.pad_token_id}
    truncated = 0
    for info, batch in zip(infos, trainer.batches, strict=True):
        assert info.rollout_id == batch["step"]
        archive = pool.open_archive(info.name)
        samples = archive.load_samples()
        assert archive.attrs is not None
        assert archive.attrs["trl"]["reward_funcs"] == ["reward_len", "reward_cat"]
        assert archive.attrs["trl"]["run"] == str((tmp_path / "out").resolve())
        assert len(samples) == len(batch["prompts"]) == 8
        # TRL's own completions table of the step (written after it: step + 1).
        table = pd.read_parquet(
            tmp_path / "out" / "completions" / f"completions_{batch['step'] + 1:05d}.parquet"
        )
        for i, s in enumerate(samples):
            assert isinstance(s, Sample)
            n = len(batch["completion_lists"][i])
            prompt_ids = unpadded(batch["prompt_ids"][i], batch["prompt_mask"][i])
            assert s.tokens == prompt_ids + batch["completion_lists"][i]
            assert batch["completion_ids"][i][:n].tolist() == batch["completion_lists"][i]
            assert s.response_length == n
            assert batch["completion_ids"][i][n:].eq(tokenizer.pad_token_id).all()
            assert s.loss_mask == batch["completion_mask"][i][:n].tolist()
            assert batch["completion_mask"][i][n:].sum() == 0
            is_truncated = batch["completion_lists"][i][-1] not in stop
            truncated += is_truncated
            assert s.status == (
                Sample.Status.TRUNCATED if is_truncated else Sample.Status.COMPLETED
            )
            if is_truncated:  # mask_truncated_completions: TRL trains on none of its tokens
                assert s.loss_mask == [0] * n
            assert s.prompt == batch["prompts"][i] == table["prompt"][i]
            assert s.response == table["completion"][i]
            assert tokenizer.decode(s.tokens[len(prompt_ids) :], skip_special_tokens=True) == (
                s.response
            )
            assert (
                vars(s)["advantage"]  # the integration adds it, with `rewards`
                == pytest.approx(table["advantage"][i], abs=0)
                == float(batch["advantages"][i])
            )
            rewards = batch["rewards"][i].tolist()
            for k, name in enumerate(["reward_len", "reward_cat"]):
                expected = table[name][i]
                if math.isnan(expected):
                    assert vars(s)["rewards"][name] is None and math.isnan(rewards[k])
                else:
                    assert vars(s)["rewards"][name] == expected == rewards[k]
            total = sum(
                w * r for w, r in zip([1.0, 0.5], rewards, strict=True) if not math.isnan(r)
            )
            assert s.reward == pytest.approx(total, rel=1e-6)
            assert s.group_index == i // 2
        keys = [task for _, task in archive.keys()]
        assert keys == batch["pids"]
    assert truncated > 0  # the mask and status cases were met


def test_task_key_defaults_to_the_prompt_text(tokenizer: Any, tmp_path: Path) -> None:
    pool = ArchiveManager.open(tmp_path / "pool")
    trainer = grpo(tokenizer, tmp_path / "out", ArchiveCallback(pool), max_steps=1)
    trainer.train()
    (batch,) = trainer.batches
    archive = pool.open_archive("step-000000")
    assert [t for _, t in archive.keys()] == batch["prompts"]
    assert [prompt_key(p) for p in batch["prompts"]] == batch["prompts"]
    rows = pool.query(task_key=batch["prompts"][0])
    assert len(rows) == batch["prompts"].count(batch["prompts"][0])
    # chat messages: their canonical JSON text
    chat = [{"role": "user", "content": "the cat"}]
    assert prompt_key(chat) == '[{"content":"the cat","role":"user"}]'


def test_a_plain_grpo_trainer_fails_at_its_first_step(tokenizer: Any, tmp_path: Path) -> None:
    pool = ArchiveManager.open(tmp_path / "pool")
    args = trl.GRPOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=3,
        max_steps=1,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
    )
    trainer = trl.GRPOTrainer(
        model=tiny_model(tokenizer),
        reward_funcs=[reward_len],
        args=args,
        train_dataset=dataset(),
        processing_class=tokenizer,
        callbacks=[ArchiveCallback(pool)],
    )
    with pytest.raises(InvalidInputError, match="ArchiveGRPOMixin"):
        trainer.train()
    assert pool.find(state=None) == []


def test_a_resumed_run_supersedes_the_steps_it_generates_again(
    tokenizer: Any, tmp_path: Path
) -> None:
    pool = ArchiveManager.open(tmp_path / "pool")
    first = grpo(
        tokenizer, tmp_path / "out", ArchiveCallback(pool), save_strategy="steps", save_steps=2
    )
    first.train()  # steps 0, 1, 2 saved; checkpoint-2 written after step 1 (global step 2)
    assert [i.rollout_id for i in pool.find()] == [0, 1, 2]
    lost_step_2 = [s.tokens for s in pool.open_archive("step-000002").load_samples()]

    resumed = grpo(tokenizer, tmp_path / "out", ArchiveCallback(pool), max_steps=4)
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    assert [b["step"] for b in resumed.batches] == [2, 3]

    # one archive per step, each the attempt the surviving run trained on
    assert [(i.name, i.rollout_id) for i in pool.find()] == [(f"step-{n:06d}", n) for n in range(4)]
    history = pool.history("step-000002")
    assert [i.state for i in history] == ["superseded", "published"]
    current = pool.open_archive("step-000002").load_samples()
    prompt_ids = [
        unpadded(resumed.batches[0]["prompt_ids"][i], resumed.batches[0]["prompt_mask"][i])
        for i in range(8)
    ]
    assert [s.tokens for s in current] == [
        p + c for p, c in zip(prompt_ids, resumed.batches[0]["completion_lists"], strict=True)
    ]
    # the superseded attempt counts nowhere
    assert [r.samples for r in pool.stats(rollout_ids=2)] == [8]
    assert [len(pool.history(f"step-{n:06d}")) for n in (0, 1, 3)] == [1, 1, 1]
    assert history[0].samples == len(lost_step_2) == 8  # the lost attempt stays on record


def test_another_runs_step_is_refused_before_anything_is_written(
    tokenizer: Any, tmp_path: Path
) -> None:
    pool = ArchiveManager.open(tmp_path / "pool")
    grpo(tokenizer, tmp_path / "out", ArchiveCallback(pool), max_steps=1).train()
    before = [(i.name, i.state, i.id) for i in pool.find(state=None)]
    other = grpo(tokenizer, tmp_path / "other", ArchiveCallback(pool), max_steps=1)
    with pytest.raises(ArchiveExistsError, match="not by this run"):
        other.train()
    assert [(i.name, i.state, i.id) for i in pool.find(state=None)] == before


def test_two_processes_save_each_batch_once_from_the_main_process(tmp_path: Path) -> None:
    """A real two-rank run (gloo): every rank runs the hook, the main process saves the
    whole batch (both ranks' rows, in TRL's order) once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # one thread per rank: two ranks on two cores would otherwise oversubscribe them
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path]),
        "OMP_NUM_THREADS": "1",
    }
    env.pop("LOCAL_RANK", None)
    done = subprocess.run(
        [
            sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
            "--master_addr=127.0.0.1", f"--master_port={port}",
            str(HERE / "_trl_setup.py"), str(tmp_path / "pool"), str(tmp_path / "out"),
        ],
        env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / "out" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0][0]["processes"] == 2
    pool = ArchiveManager.open(tmp_path / "pool", create=False)
    infos = pool.find(state=None)  # pending or superseded leftovers would show here
    assert [(i.name, i.state) for i in infos] == [
        ("step-000000", "published"),
        ("step-000001", "published"),
    ]
    for step, info in enumerate(infos):
        samples = pool.open_archive(info.name).load_samples()
        local = [ranks[r][step] for r in (0, 1)]
        assert [b["step"] for b in local] == [step, step]
        assert [s.tokens for s in samples] == local[0]["tokens"] + local[1]["tokens"]
        assert [s.advantage for s in samples] == local[0]["advantages"] + local[1]["advantages"]
        assert len(pool.history(info.name)) == 1
