"""Token ids as text pieces, with a tokenizer the user has on disk (docs/architecture/rl-lens.md,
"Tokens as text").

A pool stores token ids, not the tokenizer that made them.  `load_tokenizer` reads a local
``tokenizer.json``, or a Hugging Face tokenizer folder holding one, with the `tokenizers`
library (imported here, on first use: an optional extra).  Nothing is ever downloaded:
`tokenizers.Tokenizer.from_file` reads the file and nothing else.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import InvalidInputError, MissingDependencyError, extra_hint

__all__ = ["MAX_TOKENIZER_BYTES", "TokenDecoder", "load_tokenizer"]

#: Largest tokenizer.json read (real ones are 2-35 MB); a bigger file is no tokenizer.
MAX_TOKENIZER_BYTES = 256 << 20


class TokenDecoder:
    """Decodes token ids one by one into the text pieces they stand for."""

    def __init__(self, tokenizer: Any, path: Path) -> None:
        self._tokenizer = tokenizer
        self.path = path
        self.vocab_size: int = tokenizer.get_vocab_size(with_added_tokens=True)

    def pieces(self, ids: Sequence[int]) -> list[str | None]:
        """The text of each id alone (None for an id the vocabulary lacks).

        NOTE: each id is decoded alone, so a character that a byte-level tokenizer splits
        over several tokens shows as U+FFFD in each of them; the response text above the
        tokens is the whole truth, the pieces say where the token boundaries are.
        """
        # NOTE: an id is known when the tokenizer names it, not when it is below the number of
        # tokens: a vocabulary with holes (ids past that count) showed its tokens as unknown
        # (tests/lens/test_tokenizer.py).  `tokenizers` ids are u32.
        knows = [0 <= i < 1 << 32 and self._tokenizer.id_to_token(i) is not None for i in ids]
        known = [[i] for i, k in zip(ids, knows, strict=True) if k]
        decoded = iter(
            self._tokenizer.decode_batch(known, skip_special_tokens=False) if known else []
        )
        return [next(decoded) if k else None for k in knows]


def load_tokenizer(path: str | os.PathLike[str]) -> TokenDecoder:
    """The tokenizer in ``path``: a ``tokenizer.json`` file, or a folder that holds one (a
    Hugging Face tokenizer folder).

    Raises:
        InvalidInputError: the path is missing, holds no tokenizer.json, or the file is not
            a tokenizer the `tokenizers` library reads.
        MissingDependencyError: `tokenizers` is not installed.
    """
    given = Path(path)
    file = given / "tokenizer.json" if given.is_dir() else given
    if not given.exists():
        raise InvalidInputError(f"tokenizer path {str(given)!r} does not exist")
    if not file.is_file():
        raise InvalidInputError(
            f"tokenizer folder {str(given)!r} holds no tokenizer.json (only tokenizers saved "
            "in the fast format, tokenizer.json, can be read)"
        )
    if file.stat().st_size > MAX_TOKENIZER_BYTES:
        raise InvalidInputError(f"{str(file)!r} is too large to be a tokenizer.json")
    try:
        from tokenizers import Tokenizer
    except ModuleNotFoundError as exc:
        raise MissingDependencyError(
            "showing tokens as text needs the tokenizers library; " + extra_hint("lens")
        ) from exc
    try:
        tokenizer = Tokenizer.from_file(str(file))
    except Exception as exc:  # the library raises a bare Exception for every parse error
        detail = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise InvalidInputError(
            f"{str(file)!r} is not a tokenizer the tokenizers library can read: {detail}"
        ) from None
    return TokenDecoder(tokenizer, file)
