"""`Vocabulary`: the frozen token list of a language-modelling corpus.

Two levels, built from the *training* split only:

* ``"char"``: the sorted distinct characters (Unicode code points) of the training
  text. A character of the validation or test text that the training text lacks maps
  to one extra entry, ``"<unk>"``, appended at the end of the list -- only when such a
  character exists (see `char_vocabulary`), so a corpus whose evaluation characters all
  occur in training has no ``<unk>`` and every id is a real character.
* ``"word"``: whitespace-separated tokens, each line ending in ``"<eos>"`` (as in the
  WikiText benchmarks), ordered by descending training frequency, ties alphabetically.
  WikiText's own ``"<unk>"`` is an ordinary word of the text; when present, words
  outside the vocabulary map to it.

``encode(text) -> int32 [N]`` and ``decode(ids) -> str``; without ``<unk>`` an unknown
character or word is a ValueError naming it and its position. ``decode(encode(text))``
gives ``text`` back, except that unknown characters or words come back as ``<unk>``
(and, at the word level, whitespace is normalised: one space between words, a line
break after every ``<eos>``). ``to_json`` /
`Vocabulary.from_json` store it, and ``fingerprint`` (a short sha256 of the token list)
lets a checkpoint check that it was trained on the same vocabulary.

References:
  Merity, Xiong, Bradbury, Socher, "Pointer Sentinel Mixture Models", 2016 (WikiText,
  ``<eos>`` per line, ``<unk>`` as a word).
"""

from __future__ import annotations

import array
import collections
import dataclasses
import functools
import hashlib
import json
import re
from collections.abc import Iterable

import numpy as np

CHAR, WORD = "char", "word"
LEVELS = (CHAR, WORD)
UNK, EOS = "<unk>", "<eos>"


def lines(text: str) -> list[str]:
    """The lines of ``text`` as a file iterates them: split on ``"\\n"``, no final empty one."""
    out = text.split("\n")
    if out[-1] == "":
        out.pop()
    return out


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    """A frozen token list; a token's id is its position.

    Attributes:
      level: ``"char"`` (one token per character, ``<unk>`` excepted) or ``"word"``.
      tokens: the tokens, id order; distinct.
    """

    level: str
    tokens: tuple[str, ...]

    def __post_init__(self):
        object.__setattr__(self, "tokens", tuple(self.tokens))
        if self.level not in LEVELS:
            raise ValueError(
                f"Unknown vocabulary level {self.level!r}; valid: {', '.join(LEVELS)}."
            )
        if not self.tokens:
            raise ValueError("A vocabulary needs at least one token.")
        if len(set(self.tokens)) != len(self.tokens):
            raise ValueError("Vocabulary tokens must be distinct.")
        if self.level == CHAR:
            bad = [t for t in self.tokens if len(t) != 1 and t != UNK]
            if bad:
                raise ValueError(
                    f"Character vocabulary entries must be single characters: {bad[:3]}."
                )

    @property
    def size(self) -> int:
        """Number of tokens."""
        return len(self.tokens)

    @property
    def unk_id(self) -> int | None:
        """The id of ``"<unk>"``, or None when the vocabulary has none."""
        return self._ids.get(UNK)

    @functools.cached_property
    def _ids(self) -> dict[str, int]:
        return {t: i for i, t in enumerate(self.tokens)}

    @functools.cached_property
    def _char_table(self) -> tuple[np.ndarray, np.ndarray]:
        """Sorted code points of the single-character tokens and their ids."""
        chars = [(ord(t), i) for i, t in enumerate(self.tokens) if len(t) == 1]
        chars.sort()
        points = np.array([c for c, _ in chars], np.int64)
        return points, np.array([i for _, i in chars], np.int32)

    @property
    def fingerprint(self) -> str:
        """The first 16 hex digits of the sha256 of the level and token list."""
        blob = json.dumps([self.level, list(self.tokens)], ensure_ascii=False)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]

    def encode(self, text: str) -> np.ndarray:
        """Token ids of ``text``: ``int32 [N]``.

        Character level: one id per character. Word level: each line's whitespace
        tokens followed by ``<eos>``.

        Raises:
          ValueError: for a character or word outside the vocabulary when it has no
            ``<unk>``, naming the first one and its position (character index, or
            line and word for the word level).
        """
        if self.level == CHAR:
            return self._encode_chars(text)
        ids, get, unk = array.array("i"), self._ids.get, self.unk_id
        for line_no, line in enumerate(lines(text)):
            words = [*line.split(), EOS]
            line_ids = [get(word, unk) for word in words]
            if None in line_ids:
                word_no = line_ids.index(None)
                raise ValueError(
                    f"Word {words[word_no]!r} (line {line_no + 1}, word {word_no + 1}) is not "
                    f"in the vocabulary of {self.size} words, which has no {UNK}."
                )
            ids.extend(line_ids)
        return np.frombuffer(ids, np.int32).copy() if ids else np.zeros(0, np.int32)

    def _encode_chars(self, text: str) -> np.ndarray:
        points = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), np.uint32)
        points = points.astype(np.int64)  # [N]
        known, ids = self._char_table
        where = np.minimum(np.searchsorted(known, points), len(known) - 1)
        found = known[where] == points
        out = ids[where]
        if not found.all():
            if self.unk_id is None:
                first = int(np.argmin(found))
                raise ValueError(
                    f"Character {text[first]!r} at position {first} is not in the vocabulary "
                    f"of {self.size} characters, which has no {UNK}."
                )
            out = np.where(found, out, np.int32(self.unk_id))
        return out.astype(np.int32)

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        """The text of token ids: characters joined, or words joined by spaces with
        ``<eos>`` as a line break.

        Raises:
          ValueError: for an id outside ``[0, size)``, naming it.
        """
        ids = np.asarray(ids, np.int64).reshape(-1)
        bad = (ids < 0) | (ids >= self.size)
        if bad.any():
            raise ValueError(f"Token id {int(ids[np.argmax(bad)])} is outside [0, {self.size}).")
        words = [self.tokens[i] for i in ids]
        if self.level == CHAR:
            return "".join(words)
        out, line = [], []
        for word in words:
            if word == EOS:
                out.append(" ".join(line) + "\n")
                line = []
            else:
                line.append(word)
        return "".join(out) + " ".join(line)

    def to_json(self) -> str:
        """A JSON string that `from_json` reads back."""
        return json.dumps({"level": self.level, "tokens": list(self.tokens)}, ensure_ascii=False)

    @classmethod
    def from_json(cls, s: str) -> Vocabulary:
        """The vocabulary `to_json` wrote."""
        blob = json.loads(s)
        return cls(level=blob["level"], tokens=tuple(blob["tokens"]))


def char_vocabulary(train: str, others: Iterable[str] = ()) -> Vocabulary:
    """The character vocabulary of a training text.

    Args:
      train: the training text; its distinct characters, sorted, are the vocabulary.
      others: the evaluation texts; if one holds a character that ``train`` lacks,
        ``"<unk>"`` is appended (a character level model scores it as ``<unk>``).

    Returns:
      A ``"char"`` `Vocabulary`.
    """
    chars = set(train)
    tokens = sorted(chars)
    if any(set(text) - chars for text in others):
        tokens.append(UNK)
    return Vocabulary(CHAR, tuple(tokens))


def word_vocabulary(train: str) -> Vocabulary:
    """The word vocabulary of a training text: its whitespace tokens plus ``<eos>``
    (one per line), by descending frequency, ties in alphabetical order."""
    counts = collections.Counter()
    for line in lines(train):
        counts.update(line.split())
        counts[EOS] += 1
    tokens = sorted(counts, key=lambda word: (-counts[word], word))
    return Vocabulary(WORD, tuple(tokens))


def pattern_mask(vocab: Vocabulary, ids: np.ndarray, pattern: str) -> np.ndarray:
    """``bool [N]``: which tokens of a character-level stream fall inside a match of the
    regular expression ``pattern`` (e.g. ``" {10,}"``, runs of ten or more spaces).

    Raises:
      ValueError: for a word-level vocabulary, or a pattern that does not compile.
    """
    if vocab.level != CHAR:
        raise ValueError(f"A text pattern needs a character-level vocabulary, not {vocab.level!r}.")
    try:
        compiled = re.compile(pattern)
    except re.error as e:
        raise ValueError(f"The pattern {pattern!r} is not a regular expression: {e}.") from e
    text = vocab.decode(ids)
    inside = np.zeros(len(text), bool)
    for match in compiled.finditer(text):
        inside[match.start() : match.end()] = True
    return inside
