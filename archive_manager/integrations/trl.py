"""Archive every generation batch of a TRL ``GRPOTrainer``, one archive per step.

    from archive_manager.integrations.trl import ArchiveCallback, ArchiveGRPOTrainer

    trainer = ArchiveGRPOTrainer(            # a GRPOTrainer that hands its batches on
        model=..., reward_funcs=[...], args=GRPOConfig(...), train_dataset=...,
        callbacks=[ArchiveCallback("/pools/run-7", task_key_column="id")],
    )
    trainer.train()

A ``TrainerCallback`` is given no batch (only the arguments, the state and the model), so the
batch comes from a hook: `ArchiveGRPOMixin` (already mixed into `ArchiveGRPOTrainer`; mix it
into your own ``GRPOTrainer`` subclass, before it) wraps the two methods of TRL 1.16's
``GRPOTrainer`` that see a whole generation batch, ``_calculate_rewards`` (the prompts and
completions the reward functions were given, the unpadded completion ids, every reward
function's rewards for the whole batch) and ``_generate_and_score_completions`` (the padded
ids, the masks and the advantages the loss uses), and hands the batch, unpadded, to each
`ArchiveCallback` of the trainer.  Those are private methods, hence the version check: TRL
1.16.x only (`SUPPORTED_TRL`), refused with `UnsupportedVersionError` otherwise.

What one archive holds (docs/recipes.md, "TRL"): one `Sample` per completion, in TRL's order,
with ``tokens`` = prompt ids + completion ids (no padding), ``response_length`` the completion's
length, ``loss_mask`` the completion's mask as the loss uses it, ``reward`` the weighted total,
``rewards`` each function's, ``advantage``; the archive's ``rollout_id`` is the trainer's
``global_step`` at generation, the number reward functions see as ``trainer_state.global_step``.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import (
    ArchiveExistsError,
    ArchiveNotFoundError,
    ArchiveRetainedError,
    InvalidInputError,
    MissingDependencyError,
    SaveInFlightError,
    UnsupportedVersionError,
)
from ..manager import ArchiveManager
from ..samples import Sample

try:
    import trl
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - the main suite has no TRL; tests skip
    raise MissingDependencyError(
        f"archive_manager.integrations.trl needs TRL 1.16 and transformers, which could not "
        f"be imported ({exc}): pip install 'trl>=1.16,<1.17'"
    ) from None

__all__ = [
    "SUPPORTED_TRL",
    "ArchiveCallback",
    "ArchiveGRPOMixin",
    "ArchiveGRPOTrainer",
    "check_trl_version",
    "prompt_key",
]

_log = logging.getLogger("archive_manager")

#: The TRL release series this module reads batches of (``major.minor``): 1.16.x, tested
#: with 1.16.0.  The hook reads private methods' arguments and results, which other series
#: may lay out differently.
SUPPORTED_TRL: tuple[tuple[int, int], ...] = ((1, 16),)

#: The key of an archive's ``attrs`` this module writes (the run, TRL's version, the reward
#: functions): a resumed run supersedes only archives whose ``attrs["trl"]["run"]`` is its own.
ATTRS_KEY = "trl"


def check_trl_version(version: str | None = None) -> str:
    """The installed TRL version (or ``version``) if this module supports it.

    Raises:
        UnsupportedVersionError: another release series, naming the supported ones.
    """
    from packaging.version import InvalidVersion, Version  # a dependency of TRL itself

    text = str(trl.__version__ if version is None else version)
    supported = ", ".join(f"{major}.{minor}.x" for major, minor in SUPPORTED_TRL)
    try:
        release = Version(text).release[:2]
    except InvalidVersion:
        release = ()
    if release not in SUPPORTED_TRL:
        raise UnsupportedVersionError(
            f"archive_manager.integrations.trl supports TRL {supported} (tested with 1.16.0), "
            f"not TRL {text}: its GRPOTrainer batches may be laid out differently; install "
            f"trl=={SUPPORTED_TRL[-1][0]}.{SUPPORTED_TRL[-1][1]}.0"
        )
    return text


def prompt_key(prompt: object) -> str:
    """The task key of a prompt: its text (chat messages as their canonical JSON text), so
    the same prompt has the same key in every step and every run.  The pool keys a text over
    255 bytes by ``sha256:`` and its digest and keeps the text beside it (docs/lens.md, "Task
    keys"), so ``pool.query(task_key=prompt_key(p))`` finds its samples either way.

    Raises:
        InvalidInputError: a prompt that is not JSON text (images in the messages): name a
            ``task_key_column`` instead.
    """
    if isinstance(prompt, str):
        return str.__str__(prompt)
    try:
        return json.dumps(prompt, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError):
        raise InvalidInputError(
            f"a {type(prompt).__name__} prompt holding values other than text has no prompt "
            "key: give ArchiveCallback a task_key_column"
        ) from None


def _column_key(value: object, column: str) -> str:
    """A task key column's value as the text the pool keys it by (a str, or an int's digits)."""
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return str(int(value))
    raise InvalidInputError(
        f"task_key_column {column!r} holds a {type(value).__name__} ({value!r:.40}): a task "
        "key is a str or an int"
    )


@dataclass
class GenerationBatch:
    """One generation batch of the whole run (every process's rows, in TRL's order), as the
    hook hands it to `ArchiveCallback`.

    ``rows`` hold ``prompt``, ``completion`` (text, or chat messages), ``prompt_ids``,
    ``completion_ids``, ``loss_mask`` (unpadded lists), ``advantage`` and ``task_key``;
    ``rewards[i][k]`` is reward function ``k``'s reward of row ``i`` (NaN where it returned
    None) and ``totals[i]`` the weighted sum TRL logs (NaN when every function returned None).
    """

    step: int
    rows: list[dict[str, Any]]
    rewards: list[list[float]]
    totals: list[float]
    reward_names: list[str]
    reward_weights: list[float]
    num_generations: int
    stop_ids: frozenset[int]
    output_dir: str


class ArchiveCallback(TrainerCallback):  # type: ignore[misc]  # transformers is untyped here
    """Saves each generation batch of a ``GRPOTrainer`` that mixes in `ArchiveGRPOMixin` as
    one archive, from the main process only.

    Args:
        pool: An open `ArchiveManager`, or the root of a pool, opened (created if missing) by
            the main process at its first save and closed at the end of training.
        name_format: The archive name of a step, formatted with ``step`` (the global step at
            generation).
        task_key_column: The dataset column whose value is a row's task key (a str or an int);
            without it, a prompt's key is `prompt_key` of the dataset's prompt.
        run: Who saved the archives, written to ``attrs["trl"]["run"]``: a run restarted or
            resumed with the same ``run`` supersedes the archives it saved before for the steps
            it generates again; by default the absolute path of ``args.output_dir``, where its
            checkpoints are.
        attrs: More attributes for every archive (JSON values).
    """

    def __init__(
        self,
        pool: ArchiveManager | str | os.PathLike[str],
        *,
        name_format: str = "step-{step:06d}",
        task_key_column: str | None = None,
        run: str | None = None,
        attrs: Mapping[str, Any] | None = None,
    ) -> None:
        check_trl_version()
        try:
            name_format.format(step=0)
        except (KeyError, IndexError, ValueError) as exc:
            raise InvalidInputError(
                f"name_format {name_format!r} must format with step only ({exc!r})"
            ) from None
        if attrs is not None and ATTRS_KEY in attrs:
            raise InvalidInputError(f"attrs[{ATTRS_KEY!r}] is written by ArchiveCallback")
        if not isinstance(pool, ArchiveManager | str | os.PathLike):
            raise InvalidInputError(
                f"pool must be an ArchiveManager or a pool root, not {type(pool).__name__}"
            )
        self._pool_arg = pool
        self._pool: ArchiveManager | None = pool if isinstance(pool, ArchiveManager) else None
        self._opened_here = False
        self.name_format = name_format
        self.task_key_column = task_key_column
        self.run = run
        self.attrs = dict(attrs or {})
        self._batches = 0
        self._saved: set[int] = set()
        #: The names this callback saved, in order (the main process's; empty elsewhere).
        self.saved_names: list[str] = []

    # -- the trainer's events ------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Refuse settings under which one step would generate several batches."""
        per_generation = int(args.steps_per_generation) * int(getattr(args, "num_iterations", 1))
        if per_generation < int(args.gradient_accumulation_steps):
            raise InvalidInputError(
                f"with gradient_accumulation_steps={args.gradient_accumulation_steps}, "
                f"steps_per_generation={args.steps_per_generation} and num_iterations="
                f"{getattr(args, 'num_iterations', 1)}, TRL generates several batches per "
                "optimizer step, and ArchiveCallback names one archive per step: make "
                "steps_per_generation * num_iterations at least gradient_accumulation_steps"
            )

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """A step ended without a batch: the trainer has no hook, say so at once."""
        if self._batches == 0:
            raise InvalidInputError(
                "ArchiveCallback was given no generation batch: its trainer must be an "
                "ArchiveGRPOTrainer, or a GRPOTrainer subclass that mixes in "
                "ArchiveGRPOMixin (before GRPOTrainer)"
            )

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Close the pool this callback opened."""
        if self._opened_here and self._pool is not None:
            self._pool.close()
            self._pool = None
            self._opened_here = False

    # -- a batch from the hook -----------------------------------------------------------

    def save_batch(self, batch: GenerationBatch, *, main_process: bool = True) -> str | None:
        """Save ``batch`` as the archive of its step (the hook calls this on every process;
        only the main one saves).  Returns the archive's name, None off the main process.

        Raises:
            ArchiveExistsError: the step's name holds an archive another run saved (its
                ``attrs["trl"]["run"]`` differs) or this process saved already; nothing is
                written.
            ArchiveRetainedError: the earlier attempt of the step is retained by another
                owner (a checkpoint): the message names it; nothing is written.
            SaveInFlightError: a live process is saving that step.
        """
        self._batches += 1
        if not main_process:
            return None
        name = self.name_format.format(step=batch.step)
        run = self.run if self.run is not None else os.path.abspath(batch.output_dir)
        if batch.step in self._saved:
            raise ArchiveExistsError(
                f"step {batch.step} generated a second batch in this run; archive {name!r} "
                "holds its first"
            )
        samples, task_keys = samples_of(batch)
        attrs = {
            **self.attrs,
            ATTRS_KEY: {
                "run": run,
                "version": str(trl.__version__),
                "reward_funcs": batch.reward_names,
                "reward_weights": batch.reward_weights,
                "num_generations": batch.num_generations,
            },
        }
        pool = self._open_pool()
        self._release_earlier_attempt(pool, name, run)
        while True:
            try:
                pool.save(
                    name,
                    samples,
                    rollout_id=batch.step,
                    task_keys=task_keys,
                    attrs=attrs,
                    supersede=True,
                )
                break
            except SaveInFlightError as exc:
                if exc.holder_status == "alive":
                    raise
                # The killed attempt ran where this process cannot tell whether it lives (a
                # container, another node): its name is free once its lease lapses.
                _log.warning("archive %r: waiting for a dead save's lease: %s", name, exc)
                time.sleep(max(exc.expires_at - time.time(), 0.0) + 1.0)
        self._saved.add(batch.step)
        self.saved_names.append(name)
        return name

    def _open_pool(self) -> ArchiveManager:
        if self._pool is None:
            root = self._pool_arg
            assert not isinstance(root, ArchiveManager)
            self._pool = ArchiveManager.open(Path(root))
            self._opened_here = True
        return self._pool

    def _release_earlier_attempt(self, pool: ArchiveManager, name: str, run: str) -> None:
        """A published archive of this name saved by this run is an attempt of the step no
        surviving model trained on (the run died, or resumed from an earlier checkpoint):
        release it, so that the save supersedes it.  Another run's is refused."""
        try:
            history = pool.history(name)
        except ArchiveNotFoundError:
            return
        if not any(info.state == "published" for info in history):
            return  # released, superseded or pending: the save with supersede=True decides
        attrs = pool.open_archive(name).attrs or {}
        mine = attrs.get(ATTRS_KEY)
        saved_by = mine.get("run") if isinstance(mine, dict) else None
        if saved_by != run:
            who = f"the TRL run {saved_by!r}" if saved_by is not None else "something else"
            raise ArchiveExistsError(
                f"archive {name!r} was saved by {who}, not by this run ({run!r}): "
                "ArchiveCallback supersedes only its own run's steps; give it another "
                "name_format or run, or release the archive first"
            )
        plan = pool.release([name], dry_run=True)
        owners = sorted({owner for item in plan.release for owner in item.other_owners})
        if owners:
            raise ArchiveRetainedError(
                f"archive {name!r} (an earlier attempt of this step) is retained by "
                f"{', '.join(owners)}: release them to save the step again",
                name=name,
                owners=owners,
            )
        pool.release([name])
        _log.info("archive %r: an earlier attempt of this run's step, superseded", name)


def samples_of(batch: GenerationBatch) -> tuple[list[Sample], list[str]]:
    """The samples and task keys of one batch (the module docstring says what each holds)."""
    samples: list[Sample] = []
    task_keys: list[str] = []
    for i, row in enumerate(batch.rows):
        completion = row["completion"]
        completion_ids = [int(t) for t in row["completion_ids"]]
        truncated = bool(completion_ids) and completion_ids[-1] not in batch.stop_ids
        sample = Sample(
            index=i,
            group_index=i // batch.num_generations,
            prompt=row["prompt"],
            tokens=[int(t) for t in row["prompt_ids"]] + completion_ids,
            response=completion if isinstance(completion, str) else _text_of(completion),
            response_length=len(completion_ids),
            loss_mask=[int(m) for m in row["loss_mask"]],
            reward=None if math.isnan(batch.totals[i]) else batch.totals[i],
            status=Sample.Status.TRUNCATED if truncated else Sample.Status.COMPLETED,
        )
        # Beyond slime's fields (a Sample keeps attributes added at run time).
        sample.rewards = {  # type: ignore[attr-defined]
            name: None if math.isnan(value) else value
            for name, value in zip(batch.reward_names, batch.rewards[i], strict=True)
        }
        sample.advantage = row["advantage"]  # type: ignore[attr-defined]
        if not isinstance(completion, str):
            sample.completion = completion  # type: ignore[attr-defined]
        samples.append(sample)
        task_keys.append(row["task_key"])
    return samples, task_keys


def _text_of(messages: object) -> str:
    """The text of a conversational completion: its messages' text contents, joined."""
    if not isinstance(messages, Sequence) or isinstance(messages, str | bytes):
        return ""
    parts = []
    for message in messages:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, str):
            parts.append(content)
    return "".join(parts)


# -- the hook ----------------------------------------------------------------------------


class ArchiveGRPOMixin:
    """Hands each training generation batch of a ``GRPOTrainer`` to its `ArchiveCallback`s.

    Mix it in before ``GRPOTrainer`` (``class MyTrainer(ArchiveGRPOMixin, GRPOTrainer)``), or
    use `ArchiveGRPOTrainer`.  It overrides two private methods of TRL 1.16 and calls them
    unchanged: ``_calculate_rewards`` (it keeps the prompts, completions, completion ids and
    rewards) and ``_generate_and_score_completions`` (it reads the ids, masks and advantages
    of the batch it returns, before TRL shuffles and splits it).  Every process gathers the
    batch (collectives, so every process must run the hook); the main process saves it.
    Evaluation batches are not saved.
    """

    _archive_scored: tuple[Any, ...] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        check_trl_version()
        super().__init__(*args, **kwargs)

    def _calculate_rewards(
        self, inputs: Any, prompts: Any, completions: Any, completion_ids_list: Any
    ) -> Any:
        rewards_per_func = super()._calculate_rewards(  # type: ignore[misc]
            inputs, prompts, completions, completion_ids_list
        )
        self._archive_scored = (inputs, prompts, completions, completion_ids_list, rewards_per_func)
        return rewards_per_func

    def _generate_and_score_completions(self, inputs: Any) -> Any:
        self._archive_scored = None
        output = super()._generate_and_score_completions(inputs)  # type: ignore[misc]
        scored, self._archive_scored = self._archive_scored, None
        trainer: Any = self
        callbacks = [
            cb for cb in trainer.callback_handler.callbacks if isinstance(cb, ArchiveCallback)
        ]
        if len(callbacks) > 1:
            raise InvalidInputError(
                f"the trainer has {len(callbacks)} ArchiveCallbacks: give it one per pool run"
            )
        if callbacks and trainer.model.training:
            if scored is None:
                raise UnsupportedVersionError(
                    "this GRPOTrainer scored its batch without _calculate_rewards: "
                    "ArchiveGRPOMixin cannot read its rewards"
                )
            batch = _collect(trainer, scored, output, callbacks[0].task_key_column)
            callbacks[0].save_batch(batch, main_process=bool(trainer.accelerator.is_main_process))
        return output


class ArchiveGRPOTrainer(ArchiveGRPOMixin, trl.GRPOTrainer):  # type: ignore[misc]
    """``trl.GRPOTrainer`` with `ArchiveGRPOMixin`: give it an `ArchiveCallback`."""


def _collect(
    trainer: Any, scored: tuple[Any, ...], output: Mapping[str, Any], column: str | None
) -> GenerationBatch:
    """The whole generation batch, unpadded, on every process (gathered in TRL's order: the
    order in which it gathered the rewards)."""
    import torch  # TRL's own dependency, imported by now

    inputs, prompts, completions, completion_ids_list, rewards_per_func = scored
    prompt_ids = output["prompt_ids"].detach().cpu()
    prompt_mask = output["prompt_mask"].detach().cpu().bool()
    loss_mask = output["completion_mask"].detach().cpu()
    if output.get("tool_mask") is not None:  # multi-turn: tool output is not trained on
        loss_mask = loss_mask * output["tool_mask"].detach().cpu()
    advantages = output["advantages"].detach().cpu().tolist()
    rows = []
    for i, prompt in enumerate(prompts):
        completion_ids = [int(t) for t in completion_ids_list[i]]
        source = inputs[i]
        if column is not None:
            if column not in source:
                raise InvalidInputError(
                    f"task_key_column {column!r} is not a column of the training data "
                    f"(its rows have {sorted(source)})"
                )
            key = _column_key(source[column], column)
        else:
            key = prompt_key(source.get("prompt", prompt))
        rows.append(
            {
                "prompt": prompt,
                "completion": completions[i],
                "prompt_ids": prompt_ids[i][prompt_mask[i]].tolist(),
                "completion_ids": completion_ids,
                "loss_mask": loss_mask[i, : len(completion_ids)].tolist(),
                "advantage": float(advantages[i]),
                "task_key": key,
            }
        )
    rows = _gather_rows(trainer.accelerator, rows)
    weights = trainer.reward_weights.to(rewards_per_func.device)
    # The total as TRL computes the reward it logs: float32, NaN-skipping, NaN when unscored.
    totals = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
    totals[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
    tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
    stop_ids = {int(t) for t in trainer.eos_token_ids if t is not None}
    if tokenizer.pad_token_id is not None:
        stop_ids.add(int(tokenizer.pad_token_id))
    if len(rows) != len(rewards_per_func):
        raise UnsupportedVersionError(
            f"the gathered batch has {len(rows)} rows and {len(rewards_per_func)} rewards"
        )
    return GenerationBatch(
        step=int(trainer.state.global_step),
        rows=rows,
        rewards=rewards_per_func.detach().cpu().tolist(),
        totals=totals.detach().cpu().tolist(),
        reward_names=[str(n) for n in trainer.reward_func_names],
        reward_weights=[float(w) for w in trainer.reward_weights.tolist()],
        num_generations=int(trainer.num_generations),
        stop_ids=frozenset(stop_ids),
        output_dir=str(trainer.args.output_dir),
    )


def _gather_rows(accelerator: Any, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every process's rows, process 0's first.  As JSON bytes in a tensor, never pickled:
    ``gather_object`` would unpickle what other processes send."""
    if int(accelerator.num_processes) == 1:
        return rows
    import torch

    data = json.dumps(rows, ensure_ascii=False).encode("utf-8", "surrogatepass")
    local = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(accelerator.device)
    sizes = accelerator.gather(torch.tensor([local.numel()], device=accelerator.device))
    whole = accelerator.gather(accelerator.pad_across_processes(local, dim=0)).cpu()
    width = whole.numel() // len(sizes)
    gathered: list[dict[str, Any]] = []
    for rank, size in enumerate(sizes.cpu().tolist()):
        piece = whole[rank * width : rank * width + size].numpy().tobytes()
        gathered.extend(json.loads(piece.decode("utf-8", "surrogatepass")))
    return gathered
