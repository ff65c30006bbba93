"""The GRPO runs of test_trl.py: a tokenizer trained here, a tiny Llama from a config, a
dataset, a trainer that keeps what TRL computed; and, run as a script under
``torch.distributed.run``, one rank of a two-process run on gloo.  Imported only once the
test module has made sure TRL is installed."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import transformers
import trl
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from archive_manager.integrations.trl import ArchiveCallback, ArchiveGRPOTrainer

CORPUS = "the cat sat on a mat and dog ran to red ball while one two three four"
PROMPTS = ["the cat sat", "a dog ran to", "one two", "red ball", "the mat", "four three"]


def make_tokenizer() -> Any:
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
        seed=0,
        disable_tqdm=True,
        reward_weights=[1.0, 0.5],
        **{"save_strategy": "no", **config},
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


def rank_main(pool_root: str, out: str) -> None:
    """One rank of a two-process run: train 2 steps, write what this rank computed."""
    trainer = grpo(make_tokenizer(), Path(out), ArchiveCallback(pool_root), max_steps=2)
    trainer.train()
    rank = int(os.environ["RANK"])
    record = [
        {
            "step": b["step"],
            "tokens": [
                unpadded(b["prompt_ids"][i], b["prompt_mask"][i]) + b["completion_lists"][i]
                for i in range(len(b["prompts"]))
            ],
            "advantages": b["advantages"].tolist(),
            "processes": trainer.accelerator.num_processes,
        }
        for b in trainer.batches
    ]
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    rank_main(sys.argv[1], sys.argv[2])
