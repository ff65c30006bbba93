"""`archive_manager.integrations.trl` against the real TRL: a `GRPOTrainer` trains a tiny model
built from a config with a tokenizer trained here (nothing from a hub), and what the callback
saved is compared with what the trainer computed (its batches, caught by a subclass, and the
completions table TRL writes itself)."""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
from _integrations import require

os.environ.setdefault("HF_HUB_OFFLINE", "1")
trl = require("trl")
transformers = require("transformers")

import pandas as pd  # noqa: E402
import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers, trainers  # noqa: E402

from archive_manager import ArchiveManager, Sample  # noqa: E402
from archive_manager.errors import InvalidInputError  # noqa: E402
from archive_manager.integrations.trl import (  # noqa: E402
    ArchiveCallback,
    ArchiveGRPOTrainer,
    prompt_key,
)

CORPUS = "the cat sat on a mat and dog ran to red ball while one two three four"
PROMPTS = ["the cat sat", "a dog ran to", "one two", "red ball", "the mat", "four three"]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """A word-level tokenizer trained on a line of text, with pad and eos tokens."""
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        [CORPUS], trainers.WordLevelTrainer(special_tokens=["<pad>", "<eos>", "<unk>"])
    )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )


def tiny_model(tokenizer: Any) -> Any:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    return transformers.LlamaForCausalLM(config)


def dataset() -> Any:
    return Dataset.from_dict(
        {"prompt": PROMPTS * 4, "pid": [f"task-{i % len(PROMPTS)}" for i in range(24)]}
    )


class Spy(ArchiveGRPOTrainer):  # type: ignore[misc]
    """Keeps what TRL computed for each generation batch, as TRL computed it (padded)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.batches: list[dict[str, Any]] = []

    def _calculate_rewards(self, inputs: Any, prompts: Any, completions: Any, ids: Any) -> Any:
        rewards = super()._calculate_rewards(inputs, prompts, completions, ids)
        self.scored = {
            "prompts": list(prompts),
            "completion_lists": [list(map(int, c)) for c in ids],
            "pids": [x["pid"] for x in inputs],
            "rewards": rewards.clone(),
        }
        return rewards

    def _generate_and_score_completions(self, inputs: Any) -> Any:
        step = self.state.global_step
        output = super()._generate_and_score_completions(inputs)
        kept = {k: v.clone() for k, v in output.items() if isinstance(v, torch.Tensor)}
        self.batches.append({"step": step, **kept, **self.scored})
        return output


def reward_len(completions: list[str], **kwargs: Any) -> list[float]:
    return [float(len(c)) for c in completions]


def grpo(
    tokenizer: Any,
    out: Path,
    callback: ArchiveCallback,
    *,
    max_steps: int = 3,
    seen_steps: list[int] | None = None,
    **config: Any,
) -> Spy:
    def reward_cat(completions: list[str], trainer_state: Any, **kwargs: Any) -> list[float | None]:
        if seen_steps is not None:
            seen_steps.append(trainer_state.global_step)
        return [1.0 if "cat" in c else None for c in completions]

    args = trl.GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,  # a generation batch of 8 feeds two micro-batches
        num_generations=2,
        max_completion_length=5,
        max_steps=max_steps,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
        reward_weights=[1.0, 0.5],
        **config,
    )
    return Spy(
        model=tiny_model(tokenizer),
        reward_funcs=[reward_len, reward_cat],
        args=args,
        train_dataset=dataset(),
        processing_class=tokenizer,
        callbacks=[callback],
    )


def unpadded(ids: torch.Tensor, mask: torch.Tensor) -> list[int]:
    return ids[mask.bool()].tolist()


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
                s.advantage
                == pytest.approx(table["advantage"][i], abs=0)
                == float(batch["advantages"][i])
            )
            rewards = batch["rewards"][i].tolist()
            for k, name in enumerate(["reward_len", "reward_cat"]):
                expected = table[name][i]
                if math.isnan(expected):
                    assert s.rewards[name] is None and math.isnan(rewards[k])
                else:
                    assert s.rewards[name] == expected == rewards[k]
            total = sum(
                w * r for w, r in zip([1.0, 0.5], rewards, strict=True) if not math.isnan(r)
            )
            assert s.reward == pytest.approx(total, rel=1e-6)
            assert s.group_index == i // 2
        keys = [task for _, task in archive.keys()]
        assert keys == batch["pids"]
    assert truncated > 0  # the mask and status cases were met


def test_task_key_defaults_to_the_prompt_digest(tokenizer: Any, tmp_path: Path) -> None:
    pool = ArchiveManager.open(tmp_path / "pool")
    trainer = grpo(tokenizer, tmp_path / "out", ArchiveCallback(pool), max_steps=1)
    trainer.train()
    (batch,) = trainer.batches
    archive = pool.open_archive("step-000000")
    expected = [
        hashlib.sha256(json.dumps(p, ensure_ascii=False).encode()).hexdigest()
        for p in batch["prompts"]
    ]
    assert [t for _, t in archive.keys()] == expected == [prompt_key(p) for p in batch["prompts"]]


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
