"""Token ids shown as text (`archive_manager.lens.tokenizer`, ``--tokenizer`` of ``serve`` and
``sample``): bad tokenizer paths are clear errors, and every id the tokenizer names decodes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from archive_manager import ArchiveManager
from archive_manager.cli import cli
from archive_manager.errors import InvalidInputError


# Claim: a tokenizer path that is missing, a folder without tokenizer.json, a garbage file
# or a huge file is a clear error: InvalidInputError, and one line from serve and sample.
def test_bad_tokenizer_paths(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    from archive_manager.lens.tokenizer import MAX_TOKENIZER_BYTES, load_tokenizer

    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "tokenizer_config.json").write_text("{}")
    nested = tmp_path / "nested"
    (nested / "tokenizer.json").mkdir(parents=True)  # a folder named tokenizer.json
    garbage = tmp_path / "garbage.json"
    garbage.write_bytes(b"\x00\xff" * 100)
    huge = tmp_path / "huge.json"
    with huge.open("wb") as f:
        f.truncate(MAX_TOKENIZER_BYTES + 1)  # sparse: no disk used
    cases = [
        (tmp_path / "missing", "does not exist"),
        (folder, "no tokenizer.json"),
        (nested, "no tokenizer.json"),
        (garbage, "not a tokenizer"),
        (huge, "too large"),
    ]
    for path, message in cases:
        with pytest.raises(InvalidInputError, match=message):
            load_tokenizer(path)
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        pool.save("a", [{"response": "r", "tokens": [1, 2]}], rollout_id=1)
    runner = CliRunner()
    for path, message in cases:
        for args in (
            ["serve", "--tokenizer", str(path), "--port", "1"],
            ["sample", "a", "--position", "0", "--tokenizer", str(path)],
        ):
            done = runner.invoke(cli, ["--root", str(root), *args])
            assert done.exit_code != 0 and message in done.output, (args, done.output)
            assert "Traceback" not in done.output
            assert len(done.output.strip().splitlines()) == 1, done.output


# Claim: with --tokenizer, the response tokens show as their text pieces.  Fixed: an id was
# taken as known only below the number of tokens, so a vocabulary with holes (ids past that
# count, which the tokenizer names) showed those tokens as unknown.
def test_token_ids_past_the_vocabulary_count_are_decoded(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    from archive_manager.lens.tokenizer import load_tokenizer

    spec: dict[str, Any] = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "hello": 7}, "unk_token": "[UNK]"},
    }
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec))
    decoder = load_tokenizer(path)
    assert decoder.pieces([7, 0, 3, -1, 2**40, 7]) == ["hello", "[UNK]", None, None, None, "hello"]
