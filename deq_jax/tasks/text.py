"""Language modelling on text: character level (``"char_text"``) and word level (``"wikitext"``).

The interface the DEQ-Transformer language model and its training loop use::

    import deq_jax.tasks as tasks

    task = tasks.get("char_text", path=PATH, data_dir=DIR)  # a UTF-8 file, or a directory
                                                            # holding one corpus *.txt
    task = tasks.get("wikitext", path=DIR, data_dir=DIR)    # wiki.{train,valid,test}.tokens
    task.name, task.level, task.headline   # "char_text", "char", "bpc" / "wikitext", "word", "ppl"
    task.vocab, task.vocab_size            # a `Vocabulary` built from the train split
    task.train_split, task.eval_splits     # "train", ("valid", "test")
    task.prepare()                         # cache the token ids under data_dir if missing
    task.tokens(split)                     # int32 [N]: the split as one token stream
    task.num_tokens(split), task.steps_per_epoch(batch_size, seq_len)

    # Endless Transformer-XL batches, resumable at start_step, sharded by process:
    for batch in task.train_iterator(batch_size, seq_len, start_step=step):
        batch["inputs"], batch["targets"]  # int32 [b, L]; targets are inputs shifted by one
        batch["mask"], batch["reset"]      # bool [b, L]; np.bool_: clear the memory first
    # One pass scoring every target of the split once (padding has mask=False):
    for batch in task.eval_iterator("valid", batch_size, seq_len): ...
    task.summarize(nll_sum, count)         # {"bpc" | "ppl", "nll", "tokens"}

The character corpus is split into contiguous blocks, 90% train, 5% valid, 5% test;
the default is the Shakespeare corpus that ``python -m launch.prepare_data shakespeare``
writes to `DEFAULT_SHAKESPEARE_DIR`. WikiText comes as its three files. Batching is in
`deq_jax.tasks.text_batches`, reading and validating the raw text in
`deq_jax.tasks.text_corpus`, the vocabulary in `deq_jax.tasks.text_vocab`.

Storage: the encoded corpus is cached as numpy files in one directory,
``{data_dir}/text_ids/{level}-{corpus}-{fingerprint}/``: ``{split}.npy`` (``int32
[N]``, the split's token ids) and ``vocabulary.json``. The fingerprint is of the source
files' bytes, so a changed corpus is cached anew. A second `TextTask.prepare` only
hashes the raw files. The raw text is validated before anything is written, and the
directory appears whole or not at all (written beside it, then renamed): bad input
raises and leaves ``data_dir`` alone, and a run killed while caching leaves nothing a
later run would read.

A text task is not a `deq_jax.tasks.base.Task`: its batches are segments of a stream
(``train_iterator(batch_size, seq_len)``), not shuffled examples.

References:
  Dai, Yang, Yang, Carbonell, Le, Salakhutdinov, "Transformer-XL: Attentive Language
  Models Beyond a Fixed-Length Context", ACL 2019.
  Merity, Xiong, Bradbury, Socher, "Pointer Sentinel Mixture Models", 2016 (WikiText).
  Bai, Kolter, Koltun, "Deep Equilibrium Models", NeurIPS 2019 (the DEQ-Transformer).
"""

from __future__ import annotations

import math
import os
import shutil
import time
from collections.abc import Callable, Iterator

import numpy as np

from deq_jax.tasks import text_batches, text_corpus
from deq_jax.tasks.text_vocab import CHAR, WORD, Vocabulary

DEFAULT_SHAKESPEARE_DIR = os.path.expanduser("~/.cache/deq_jax/shakespeare")
DEFAULT_DATA_DIR = os.path.expanduser("~/.cache/deq_jax/data")
CACHE_FOLDER = "text_ids"  # under data_dir: one directory per corpus version
VOCAB_FILE = "vocabulary.json"
TRAIN, VALID, TEST = text_corpus.TRAIN, text_corpus.VALID, text_corpus.TEST


def write_cache(directory: str, corpus: text_corpus.Corpus) -> None:
    """Writes ``corpus`` (a vocabulary and ``{split: int32 [N]}``) to ``directory``,
    whole or not at all: into a folder beside it, renamed at the end.

    Another process that cached the same corpus first wins: its folder holds the same
    bytes (the name fingerprints the source), and ours is removed.
    """
    vocab, streams = corpus
    partial = f"{directory}.{os.getpid()}.tmp"
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(partial)
    try:
        for split, ids in streams.items():
            np.save(os.path.join(partial, f"{split}.npy"), np.asarray(ids, np.int32))
        with open(os.path.join(partial, VOCAB_FILE), "w") as f:
            f.write(vocab.to_json())
        try:
            os.rename(partial, directory)
        except OSError:
            if not os.path.isdir(directory):
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)


class TextTask:
    """A language-modelling task on one corpus (see the module docstring).

    Args:
      name: the registry name.
      level: ``"char"`` or ``"word"``.
      files: the source files, in the order they are fingerprinted.
      load: reads, validates and encodes them (`text_corpus.char_corpus` ...).
      corpus: a short name for the corpus, part of the cache directory's name.
      data_dir: where the token ids are cached (default `DEFAULT_DATA_DIR`).
    """

    train_split = TRAIN
    eval_splits = (VALID, TEST)
    validation_split = VALID
    splits = text_corpus.SPLITS

    def __init__(
        self,
        name: str,
        level: str,
        files: tuple[str, ...],
        load: Callable[[], text_corpus.Corpus],
        corpus: str,
        *,
        data_dir: str | None = None,
    ):
        self.name, self.level, self.files = name, level, files
        self.corpus, self._load = corpus, load
        self.data_dir = data_dir or DEFAULT_DATA_DIR
        self._cache: str | None = None
        self._vocab: Vocabulary | None = None
        self._tokens: dict[str, np.ndarray] = {}

    @property
    def headline(self) -> str:
        """The metric a language model reports: ``"bpc"`` (char) or ``"ppl"`` (word)."""
        return "bpc" if self.level == CHAR else "ppl"

    def prepare(self) -> None:
        """Caches the token ids under `data_dir` unless they are there (then it only
        hashes the source files); reads the vocabulary.

        Raises:
          DataFormatError: for a source that is not UTF-8, empty or too short (nothing
            is written then).
        """
        if self._cache is not None:
            return
        name = f"{self.level}-{self.corpus}-{text_corpus.fingerprint(self.files)}"
        cache = os.path.join(self.data_dir, CACHE_FOLDER, name)
        if not os.path.isdir(cache):
            began = time.perf_counter()
            corpus = self._load()  # validated before anything is written
            print(
                f"Caching the {self.name} token ids in {cache} (once: later runs reuse them)...",
                flush=True,
            )
            write_cache(cache, corpus)
            print(
                f"Cached the {self.name} token ids in {time.perf_counter() - began:.0f} s.",
                flush=True,
            )
        with open(os.path.join(cache, VOCAB_FILE)) as f:
            self._vocab = Vocabulary.from_json(f.read())
        self._cache = cache

    @property
    def vocab(self) -> Vocabulary:
        """The `Vocabulary` of the train split (prepares the data on first use)."""
        self.prepare()
        return self._vocab

    @property
    def vocab_size(self) -> int:
        """``vocab.size``."""
        return self.vocab.size

    def tokens(self, split: str) -> np.ndarray:
        """The whole split as one stream of token ids, ``int32 [N]``, read-only; read once,
        cached."""
        text_corpus.check_split(split)
        if split not in self._tokens:
            self.prepare()
            stream = np.load(os.path.join(self._cache, f"{split}.npy"))
            stream.flags.writeable = False  # shared by every caller
            self._tokens[split] = stream
        return self._tokens[split]

    def num_tokens(self, split: str) -> int:
        """Tokens in ``split`` (``N``; a split has ``N - 1`` targets)."""
        return len(self.tokens(split))

    def steps_per_epoch(self, batch_size: int, seq_len: int) -> int:
        """Training steps per epoch (see `text_batches.train_batches`)."""
        return text_batches.steps_per_epoch(self.num_tokens(TRAIN), batch_size, seq_len)

    def train_iterator(
        self,
        batch_size: int,
        seq_len: int,
        *,
        start_step: int = 0,
        process_index: int = 0,
        process_count: int = 1,
    ) -> Iterator[text_batches.Batch]:
        """Endless Transformer-XL training batches; see `text_batches.train_batches`."""
        return text_batches.train_batches(
            self.tokens(TRAIN),
            batch_size,
            seq_len,
            start_step=start_step,
            process_index=process_index,
            process_count=process_count,
        )

    def eval_iterator(
        self,
        split: str,
        batch_size: int,
        seq_len: int,
        *,
        process_index: int = 0,
        process_count: int = 1,
    ) -> Iterator[text_batches.Batch]:
        """One pass scoring every target of ``split`` once; see `text_batches.eval_batches`."""
        return text_batches.eval_batches(
            self.tokens(split),
            batch_size,
            seq_len,
            process_index=process_index,
            process_count=process_count,
        )

    @property
    def selection_metric(self) -> tuple[str, str]:
        """The metric that picks a run's best checkpoint, minimised: ``bpc`` at the
        character level, ``ppl`` at the word level (`summarize`)."""
        return ("bpc" if self.level == CHAR else "ppl", "min")

    def summarize(self, nll_sum: float, count: float) -> dict[str, float]:
        """Per-token metrics of a summed negative log-likelihood (natural log).

        Returns:
          Character level ``{"bpc": nll / count / ln 2, "nll", "tokens"}``; word level
          ``{"ppl": exp(nll / count), "nll", "tokens"}``, where ``nll`` is the mean.
        """
        count = float(count)
        if not count > 0:
            raise ValueError(f"summarize needs a positive token count, got {count}.")
        nll = float(nll_sum) / count
        if self.level == CHAR:
            return {"bpc": nll / math.log(2.0), "nll": nll, "tokens": count}
        ppl = math.exp(nll) if nll < 709.0 else math.inf  # exp overflows a float past 709.78
        return {"ppl": ppl, "nll": nll, "tokens": count}


def char_text(*, path: str = DEFAULT_SHAKESPEARE_DIR, data_dir: str | None = None) -> TextTask:
    """The character-level task on one text file; the registry's constructor.

    Args:
      path: a UTF-8 text file, or a directory holding one corpus ``*.txt`` (besides
        ``SOURCE.txt``), as ``launch.prepare_data`` writes it. The default is the
        Shakespeare corpus of ``python -m launch.prepare_data shakespeare``.
      data_dir: where the token ids are cached (default `DEFAULT_DATA_DIR`).

    Raises:
      DataNotFoundError: for a missing path; the message gives the command that
        prepares the default corpus.
    """
    file = text_corpus.char_corpus_file(path)
    stem = text_corpus.safe_name(os.path.splitext(os.path.basename(file))[0])
    return TextTask(
        "char_text",
        CHAR,
        (file,),
        lambda: text_corpus.char_corpus(file),
        stem,
        data_dir=data_dir,
    )


def wikitext(*, path: str, data_dir: str | None = None) -> TextTask:
    """The word-level WikiText task; the registry's constructor.

    Args:
      path: a directory holding ``wiki.train.tokens``, ``wiki.valid.tokens`` and
        ``wiki.test.tokens`` (WikiText-2 or WikiText-103).
      data_dir: where the token ids are cached (default `DEFAULT_DATA_DIR`).

    Raises:
      DataNotFoundError: naming a missing file and how to get WikiText.
    """
    files = text_corpus.wikitext_files(path)
    corpus = text_corpus.safe_name(os.path.basename(os.path.normpath(os.path.expanduser(path))))
    return TextTask(
        "wikitext",
        WORD,
        tuple(files[split] for split in text_corpus.SPLITS),
        lambda: text_corpus.word_corpus(files),
        corpus,
        data_dir=data_dir,
    )
