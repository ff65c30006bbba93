"""archive_manager.integrations.verl against the real verl 0.9.1 (CPU, no Ray cluster): a GRPO
batch built by verl's own code (DataProto.from_single_dict, repeat, get_response_mask,
compute_position_id_with_mask, compute_advantage) saved and rebuilt exactly, loaded by uid,
saved again on resume, and saved by the RayPPOTrainer mixin called as verl's fit loop calls
it.  Skipped without verl, failed instead with ARCHIVE_MANAGER_REQUIRE_INTEGRATIONS=1
(.ci/integrations)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

if os.environ.get("ARCHIVE_MANAGER_REQUIRE_INTEGRATIONS"):
    import verl
else:
    verl = pytest.importorskip("verl")

import torch
from verl import DataProto
from verl.trainer.ppo.core_algos import AdvantageEstimator
from verl.trainer.ppo.ray_trainer import RayPPOTrainer, compute_advantage
from verl.utils.model import compute_position_id_with_mask
from verl.utils.torch_functional import get_response_mask

from archive_manager import ArchiveManager
from archive_manager.errors import (
    ArchiveRetainedError,
    InvalidInputError,
    UnencodableError,
    UnsupportedFormatError,
    UnsupportedVersionError,
)
from archive_manager.integrations import verl as av

PAD, EOS = 0, 2
PROMPTS, N, PROMPT_WIDTH, RESPONSE_WIDTH = 4, 3, 6, 8


def objects(items: list[Any]) -> np.ndarray:
    """A 1-d object array of ``items`` (lists stay items, as verl's collate makes them)."""
    out = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        out[i] = item
    return out


def grpo_batch(seed: int = 0) -> DataProto:
    """A step's batch as verl's fit loop holds it when it calls _log_rollout_data: prompts
    left-padded, uids given before `repeat(n, interleave=True)`, responses right-padded after
    EOS, masks and positions from verl's functions, GRPO advantages from compute_advantage,
    reward infos merged as np.array(list) (a '<U' column), meta_info as the loop sets it."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, PROMPT_WIDTH + 1, (PROMPTS,), generator=g)
    keep = torch.arange(PROMPT_WIDTH)[None, :] >= PROMPT_WIDTH - lengths[:, None]
    prompts = torch.randint(3, 50, (PROMPTS, PROMPT_WIDTH), generator=g).masked_fill(~keep, PAD)
    gen = DataProto.from_single_dict(
        {
            "prompts": prompts,
            "uid": np.array([str(uuid.UUID(int=seed * 100 + i)) for i in range(PROMPTS)], object),
            "data_source": np.array(["openai/gsm8k"] * PROMPTS, dtype=object),
            "reward_model": np.array(
                [{"ground_truth": str(i * 7), "style": "rule"} for i in range(PROMPTS)], object
            ),
            "raw_prompt": objects(
                [[{"role": "user", "content": f"what is {i} * 7?"}] for i in range(PROMPTS)]
            ),
            "index": np.arange(PROMPTS, dtype=np.int64),
            "extra_info": np.array(
                [{"split": "train", "index": i, "tools_kwargs": {}} for i in range(PROMPTS)],
                dtype=object,
            ),
        },
        meta_info={"temperature": 1.0, "multi_turn": False},
    )
    batch = gen.repeat(repeat_times=N, interleave=True)
    rows = len(batch)
    responses = torch.randint(3, 50, (rows, RESPONSE_WIDTH), generator=g)
    ends = torch.randint(1, RESPONSE_WIDTH + 1, (rows,), generator=g)
    for i, end in enumerate(ends.tolist()):
        if end < RESPONSE_WIDTH:
            responses[i, end - 1] = EOS
            responses[i, end:] = PAD
    response_mask = get_response_mask(response_id=responses, eos_token=EOS, dtype=torch.int64)
    attention_mask = torch.cat([batch.batch["prompts"].ne(PAD).long(), response_mask], dim=1)
    batch.batch["responses"] = responses
    batch.batch["input_ids"] = torch.cat([batch.batch["prompts"], responses], dim=1)
    batch.batch["attention_mask"] = attention_mask
    batch.batch["position_ids"] = compute_position_id_with_mask(attention_mask)
    batch.batch["response_mask"] = response_mask
    # log-probs hold values past the mask, as the model computes them for pad tokens
    batch.batch["old_log_probs"] = -torch.rand(rows, RESPONSE_WIDTH, generator=g)
    correct = torch.randint(0, 2, (rows,), generator=g).float()
    scores = torch.zeros(rows, RESPONSE_WIDTH)
    scores[torch.arange(rows), response_mask.sum(-1) - 1] = correct
    batch.batch["token_level_scores"] = scores
    infos = {"acc": correct.bool().tolist(), "pred": [str(int(c)) for c in correct.tolist()]}
    batch.non_tensor_batch.update({k: np.array(v) for k, v in infos.items()})
    batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
    batch = compute_advantage(batch, adv_estimator=AdvantageEstimator.GRPO, num_repeat=N)
    batch.meta_info["global_token_num"] = torch.sum(attention_mask, dim=-1).tolist()
    return batch


def assert_same(rebuilt: DataProto, batch: DataProto) -> None:
    assert rebuilt.batch is not None and batch.batch is not None
    assert list(rebuilt.batch.keys()) == list(batch.batch.keys())
    assert rebuilt.batch.batch_size == batch.batch.batch_size
    for key in batch.batch.keys():
        a, b = rebuilt.batch[key], batch.batch[key]
        assert a.dtype == b.dtype and a.shape == b.shape, key
        assert torch.equal(a, b), key
    assert list(rebuilt.non_tensor_batch) == list(batch.non_tensor_batch)
    for key, b in batch.non_tensor_batch.items():
        a = rebuilt.non_tensor_batch[key]
        assert a.dtype == b.dtype and a.shape == b.shape, key
        for x, y in zip(a.tolist(), b.tolist(), strict=True):
            assert type(x) is type(y) and x == y, key


@pytest.fixture
def pool(tmp_path: Path) -> Any:
    with ArchiveManager.open(tmp_path / "pool") as p:
        yield p


def test_a_grpo_batch_round_trips_exactly(pool: Any) -> None:
    batch = grpo_batch()
    batch.meta_info["shape"] = (1, 2)  # a tuple: JSON would give a list back
    with pytest.warns(UserWarning, match="'shape'"):
        archive = av.save_batch(pool, batch, step=7)
    assert (archive.name, archive.rollout_id) == ("step-000007", 7)
    rebuilt = av.load_batch(pool, "step-000007")
    assert_same(rebuilt, batch)
    del batch.meta_info["shape"]
    assert rebuilt.meta_info == batch.meta_info
    assert archive.attrs is not None
    assert archive.attrs["verl"]["meta_info_dropped"] == ["shape"]
    assert rebuilt.non_tensor_batch["pred"].dtype.kind == "U"

    # What a sample holds: unpadded token ids where the pad positions hold one value, the
    # log-probs (varying past the mask) and positions whole; uid as the task key.
    samples = pool.open_archive("step-000007").load_samples(materialize=True)
    mask = batch.batch["attention_mask"]
    for i, sample in enumerate(samples):
        length = int(mask[i, PROMPT_WIDTH:].sum())
        assert (
            sample["batch"]["responses"].tolist() == batch.batch["responses"][i][:length].tolist()
        )
        if RESPONSE_WIDTH - length > 1:  # random values past the mask: kept whole
            assert sample["batch"]["old_log_probs"].shape == (RESPONSE_WIDTH,)
            assert "old_log_probs" not in sample["padding"]
        assert sample["non_tensor_batch"]["uid"] == batch.non_tensor_batch["uid"][i]
    assert any("responses" in s["padding"] for s in samples)
    keys = [t for _, t in pool.open_archive("step-000007").keys()]
    assert keys == batch.non_tensor_batch["uid"].tolist()

    # The catalog's reward is verl's score (token_level_scores summed), its length the
    # response part of attention_mask; no status is invented.
    rows = pool.query(rollout_ids=7)
    scores = batch.batch["token_level_scores"].sum(-1).tolist()
    assert [r.reward for r in rows] == scores
    assert [r.response_length for r in rows] == mask[:, PROMPT_WIDTH:].sum(-1).tolist()
    assert {r.status for r in rows} == {None}


def test_padding_that_varies_is_stored_whole_and_nan_fills_exactly(pool: Any) -> None:
    batch = grpo_batch(seed=1)
    values = batch.batch["old_log_probs"].clone()
    values[batch.batch["response_mask"] == 0] = float("nan")
    values[0, -1] = -0.0  # one row's pad positions differ in sign bit only
    values[0, :-1][batch.batch["response_mask"][0, :-1] == 0] = 0.0
    batch.batch["old_log_probs"] = values
    batch.batch["mask_bf16"] = batch.batch["response_mask"].to(torch.bfloat16)
    av.save_batch(pool, batch, step=1)
    rebuilt = av.load_batch(pool, "step-000001")
    for key in ("old_log_probs", "mask_bf16"):
        a, b = rebuilt.batch[key], batch.batch[key]
        assert a.dtype == b.dtype
        assert torch.equal(
            a.view(torch.int16 if a.dtype == torch.bfloat16 else torch.int32),
            b.view(torch.int16 if b.dtype == torch.bfloat16 else torch.int32),
        )


def test_load_one_prompt_group_by_uid(pool: Any) -> None:
    batch = grpo_batch(seed=2)
    av.save_batch(pool, batch, step=2)
    uid = batch.non_tensor_batch["uid"][N]  # the second prompt's group
    group = av.load_batch(pool, "step-000002", uid=uid)
    assert len(group) == N
    assert_same(group, batch.select_idxs([N, N + 1, N + 2]))
    with pytest.raises(KeyError):
        av.load_batch(pool, "step-000002", uid="no-such-uid")


def test_a_resumed_run_saves_its_step_again(pool: Any) -> None:
    first, again = grpo_batch(seed=3), grpo_batch(seed=4)
    av.save_batch(pool, first, step=5)
    av.save_batch(pool, again, step=5)  # the run restarted from an earlier checkpoint
    assert [i.state for i in pool.history("step-000005")] == ["superseded", "published"]
    assert_same(av.load_batch(pool, "step-000005"), again)
    # Retained by a checkpoint: the earlier step stays, nothing is released or written.
    pool.retain("checkpoint:step-5", "step-000005")
    with pytest.raises(ArchiveRetainedError, match="checkpoint:step-5"):
        av.save_batch(pool, first, step=5)
    assert [i.state for i in pool.history("step-000005")] == ["superseded", "published"]
    with pytest.raises(Exception, match="already exists"):
        av.save_batch(pool, first, step=6, name="step-000005", resume=False)


def test_refusals_write_nothing(pool: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    batch = grpo_batch(seed=5)
    with pytest.raises(InvalidInputError, match="expected a verl DataProto"):
        av.save_batch(pool, batch.batch, step=1)
    bad = grpo_batch(seed=5)
    bad.non_tensor_batch["obj"] = np.array([object()] * len(bad), dtype=object)
    with pytest.raises(UnencodableError):
        av.save_batch(pool, bad, step=1)
    av.save_batch(pool, batch, step=2)
    bad.non_tensor_batch["obj"][:] = [{1, 2}] * len(bad)  # a set: not storable
    with pytest.raises(UnencodableError):
        av.save_batch(pool, bad, step=2)  # refused before the step's archive is released
    assert [(i.name, i.state) for i in pool.find(state=None)] == [("step-000002", "published")]
    monkeypatch.setattr(verl, "__version__", "0.8.5")
    with pytest.raises(UnsupportedVersionError, match=r"verl 0\.8\.5"):
        av.save_batch(pool, batch, step=3)
    with pytest.raises(UnsupportedVersionError, match=r"verl 0\.8\.5"):
        av.load_batch(pool, "step-000002")
    monkeypatch.undo()
    pool.save("plain", [{"x": 1}], rollout_id=1)
    with pytest.raises(UnsupportedFormatError):
        av.load_batch(pool, "plain")
    layout = pool.open_archive("step-000002").attrs["verl"]
    samples = pool.open_archive("step-000002").load_samples(materialize=True)
    for spec in ("[('a', '<i4')]", "|V8", "i4,f8", "<M8[ns]"):
        broken = dict(layout, non_tensor_batch=[{"name": "uid", "dtype": spec, "shape": []}])
        with pytest.raises(UnsupportedFormatError):
            av.from_samples(samples, broken)
    assert [(i.name, i.state) for i in pool.find(state=None)] == [
        ("plain", "published"),
        ("step-000002", "published"),
    ]


class ArchivingTrainer(av.ArchiveRolloutMixin, RayPPOTrainer):
    pass


def test_the_mixin_saves_each_step_as_the_fit_loop_calls_it(tmp_path: Path) -> None:
    # The fit loop's call, as ray_trainer.py makes it once per step when
    # trainer.rollout_data_dir is set; the trainer is not constructed (no workers, no Ray).
    trainer = ArchivingTrainer.__new__(ArchivingTrainer)
    root = tmp_path / "rollouts"
    batches = {}
    for step in (1, 2):
        trainer.global_steps = step
        batches[step] = grpo_batch(seed=10 + step)
        timing_raw: dict[str, float] = {}
        trainer._log_rollout_data(batches[step], {"acc": []}, timing_raw, str(root))
        assert timing_raw["archive_rollout"] > 0
    assert trainer.archive_pool is not None
    pool = trainer.archive_pool
    assert [(i.name, i.rollout_id) for i in pool.find()] == [("step-000001", 1), ("step-000002", 2)]
    for step, batch in batches.items():
        assert_same(av.load_batch(pool, f"step-{step:06d}"), batch)
    assert not list(root.glob("*.jsonl"))  # verl's JSONL dump was not written into the pool
    pool.close()

    trainer.archive_keep_jsonl = True
    trainer.archive_pool = None
    with pytest.raises(InvalidInputError, match="archive_pool"):
        trainer._log_rollout_data(batches[1], {}, {}, str(root))


def test_importing_the_package_imports_no_framework() -> None:
    code = (
        "import sys, archive_manager, archive_manager.integrations.verl\n"
        "print(sorted(m for m in ('verl', 'ray', 'transformers', 'tensordict', 'torch')"
        " if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
