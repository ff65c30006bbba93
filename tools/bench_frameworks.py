"""slime-shaped samples as slime hands them (its own ``Sample`` class, nested ``Status``,
``SpecInfo``, ``PrefixCacheInfo``) against the same samples as dicts and against slime's
``torch.save`` dump: ``python3 tools/bench_frameworks.py [--samples N] [--repeat R]``.

The samples come from tests/frameworks (the field-for-field stand-in of
``slime.utils.types.Sample`` and its seeded rollouts), with realistic lengths: prompts of
``--prompt`` tokens and responses of ``--response`` tokens, log-probs and loss masks, routed
experts ``[T-1, 4, 2]`` int32; PIL images are left out (they are no ``torch.save`` value for
``weights_only`` loads).  Each figure is the median of ``--repeat`` runs, in one process, with
the machine's load printed: compare the columns as ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "frameworks"))
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from rollouts import make_slime_rollout  # noqa: E402

from archive_manager import ArchiveManager  # noqa: E402


def _median(run: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _rollout(n: int, prompt: int, response: int) -> list[Any]:
    rows = make_slime_rollout(n, seed=1)
    for i, s in enumerate(rows):
        s.multimodal_inputs = None
        s.tokens = [(i * 7 + k) % 151_000 for k in range(prompt + response)]
        s.response_length = response
        s.loss_mask = [1] * response
        s.rollout_log_probs = [-(k % 97) / 31.0 for k in range(response)]
        s.rollout_routed_experts = torch.randint(
            0, 64, (prompt + response - 1, 4, 2), dtype=torch.int32
        )
    return rows


def _as_dict(sample: Any) -> dict[str, Any]:
    """What slime's ``Sample.to_dict()`` gives: status as its value, helpers as dicts."""
    out = dict(vars(sample))
    out["status"] = sample.status.value
    out["spec_info"] = dict(vars(sample.spec_info))
    out["prefix_cache_info"] = dict(vars(sample.prefix_cache_info))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--response", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rows = _rollout(args.samples, args.prompt, args.response)
    dicts = [_as_dict(s) for s in rows]
    print(
        f"load average {os.getloadavg()[0]:.2f}; {args.samples} samples of "
        f"{args.prompt}+{args.response} tokens; median of {args.repeat}"
    )
    with tempfile.TemporaryDirectory() as tmp, ArchiveManager.open(Path(tmp) / "pool") as pool:
        count = [0]

        def save(samples: list[Any]) -> Any:
            count[0] += 1
            return pool.save(f"r{count[0]}", samples, rollout_id=count[0])

        save_cls = _median(lambda: save(rows), args.repeat)
        save_dict = _median(lambda: save(dicts), args.repeat)
        cls_name, dict_name = save(rows).name, save(dicts).name
        load_cls = _median(lambda: pool.open_archive(cls_name).load_samples(), args.repeat)
        load_dict = _median(lambda: pool.open_archive(dict_name).load_samples(), args.repeat)
        dump = Path(tmp) / "rollout.pt"

        def torch_save() -> None:
            with open(dump, "wb") as f:
                torch.save({"rollout_id": 1, "samples": dicts}, f)
                f.flush()
                os.fsync(f.fileno())

        save_pt = _median(torch_save, args.repeat)
        load_pt = _median(lambda: torch.load(dump, weights_only=True), args.repeat)
    print("| | slime Sample | dicts | torch.save/load (dicts) | Sample/dicts | torch/Sample |")
    print("| --- | --- | --- | --- | --- | --- |")
    print(
        f"| save | {save_cls:.3f} s | {save_dict:.3f} s | {save_pt:.3f} s | "
        f"{save_cls / save_dict:.2f} | {save_pt / save_cls:.1f}x |"
    )
    print(
        f"| load | {load_cls:.3f} s | {load_dict:.3f} s | {load_pt:.3f} s | "
        f"{load_cls / load_dict:.2f} | {load_pt / load_cls:.1f}x |"
    )


if __name__ == "__main__":
    main()
