"""Language modelling on text: character level (``"char_text"``) and word level (``"wikitext"``).

The interface the DEQ-Transformer language model and its training loop use::

    import deq_jax.tasks as tasks

    task = tasks.get("char_text", path=PATH, data_dir=DIR)  # a UTF-8 file, or a directory
                                                            # holding one corpus *.txt
    task = tasks.get("wikitext", path=DIR, data_dir=DIR)    # wiki.{train,valid,test}.tokens
    task.name, task.level, task.headline   # "char_text", "char", "bpc" / "wikitext", "word", "ppl"
    task.vocab, task.vocab_size            # a `Vocabulary` built from the train split
    task.train_split, task.eval_splits     # "train", ("valid", "test")
    task.prepare()                         # build the tfds data under data_dir if missing
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

Storage: a tfds ``GeneratorBasedBuilder`` (``text_corpus``) in ``array_record`` files,
read with ``as_data_source()`` (no TensorFlow). Its config name is the level, the
corpus name and a fingerprint of the source files' bytes, so a changed corpus builds a
new version; each split is a sequence of records ``{"ids": int32 [4096], "length":
int32}`` (the last chunk zero-padded) and the vocabulary JSON is in the dataset's
metadata. A second `TextTask.prepare` only hashes the raw files. The raw text is
validated before anything is written: bad input raises and leaves ``data_dir`` alone.

A text task is not a `deq_jax.tasks.base.Task`: its batches are segments of a stream
(``train_iterator(batch_size, seq_len)``), not shuffled examples.

References:
  Dai, Yang, Yang, Carbonell, Le, Salakhutdinov, "Transformer-XL: Attentive Language
  Models Beyond a Fixed-Length Context", ACL 2019.
  Merity, Xiong, Bradbury, Socher, "Pointer Sentinel Mixture Models", 2016 (WikiText).
  Bai, Kolter, Koltun, "Deep Equilibrium Models", NeurIPS 2019 (the DEQ-Transformer).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Iterator

import numpy as np
import tensorflow_datasets as tfds

from deq_jax.tasks import _tfds, text_batches, text_corpus
from deq_jax.tasks.text_vocab import CHAR, WORD, Vocabulary

DEFAULT_SHAKESPEARE_DIR = os.path.expanduser("~/.cache/deq_jax/shakespeare")
CHUNK = 4096  # token ids per stored record
TRAIN, VALID, TEST = text_corpus.TRAIN, text_corpus.VALID, text_corpus.TEST
_VOCAB_KEY = "vocabulary"


@dataclasses.dataclass(eq=False)
class TextCorpusConfig(tfds.core.BuilderConfig):
    """A tfds builder config naming one corpus; ``load`` returns its validated
    `text_corpus.Corpus` when the data must be built."""

    load: Callable[[], text_corpus.Corpus] | None = None


class TextCorpus(tfds.core.GeneratorBasedBuilder):
    """tfds builder of token streams in fixed-size chunks; build it with `builder`."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release."}

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description="A text corpus as token ids, each split one stream in chunks.",
            features=tfds.features.FeaturesDict(
                {
                    "ids": tfds.features.Tensor(shape=(CHUNK,), dtype=np.int32),
                    "length": tfds.features.Scalar(dtype=np.int32),
                }
            ),
            metadata=tfds.core.MetadataDict(),
            disable_shuffling=True,
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # The corpus is a local file, read by ``load``.
        vocab, streams = self.builder_config.load()
        self.info.metadata[_VOCAB_KEY] = vocab.to_json()
        return {split: self._generate_examples(ids) for split, ids in streams.items()}

    def _generate_examples(self, ids: np.ndarray):
        for i, start in enumerate(range(0, len(ids), CHUNK)):
            chunk = ids[start : start + CHUNK]
            padded = np.zeros(CHUNK, np.int32)
            padded[: len(chunk)] = chunk
            yield i, {"ids": padded, "length": np.int32(len(chunk))}


def builder(name: str, *, data_dir: str | None = None, load=None) -> TextCorpus:
    """The tfds builder of the corpus config ``name`` under ``data_dir``.

    The data live in ``{data_dir}/text_corpus/{name}/1.0.0``; ``load`` (a callable
    returning the validated corpus) is needed only to build them.
    """
    with _tfds.quiet():
        return TextCorpus(
            config=TextCorpusConfig(name=name, load=load),
            data_dir=data_dir,
            file_format="array_record",
        )


def read_stream(source) -> np.ndarray:
    """Reassembles a split's chunk records (a tfds data source) into ``int32 [N]``."""
    if not len(source):
        return np.zeros(0, np.int32)
    records = source.__getitems__(list(range(len(source))))
    return np.concatenate([r["ids"][: int(r["length"])] for r in records]).astype(np.int32)


class TextTask:
    """A language-modelling task on one corpus (see the module docstring).

    Args:
      name: the registry name.
      level: ``"char"`` or ``"word"``.
      files: the source files, in the order they are fingerprinted.
      load: reads, validates and encodes them (`text_corpus.char_corpus` ...).
      corpus: a short name for the corpus, part of the tfds config name.
      data_dir: where tfds stores the data (default ``~/tensorflow_datasets``).
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
        self.corpus, self.data_dir, self._load = corpus, data_dir, load
        self._builder: TextCorpus | None = None
        self._vocab: Vocabulary | None = None
        self._tokens: dict[str, np.ndarray] = {}

    @property
    def headline(self) -> str:
        """The metric a language model reports: ``"bpc"`` (char) or ``"ppl"`` (word)."""
        return "bpc" if self.level == CHAR else "ppl"

    def prepare(self) -> None:
        """Builds the tfds data under `data_dir` unless they exist (then it only hashes
        the source files); reads the vocabulary.

        Raises:
          DataFormatError: for a source that is not UTF-8, empty or too short (nothing
            is written then).
        """
        if self._builder is not None:
            return
        name = f"{self.level}-{self.corpus}-{text_corpus.fingerprint(self.files)}"
        with _tfds.quiet():
            b = builder(name, data_dir=self.data_dir)
            if not b.is_prepared():
                corpus = self._load()  # validated before anything is written
                b = builder(name, data_dir=self.data_dir, load=lambda: corpus)
                _tfds.prepare(b)
        self._vocab = Vocabulary.from_json(b.info.metadata[_VOCAB_KEY])
        self._builder = b

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
            with _tfds.quiet():
                source = self._builder.as_data_source(split=split)
            stream = read_stream(source)
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
      data_dir: where tfds stores the data (default ``~/tensorflow_datasets``).

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
      data_dir: where tfds stores the data (default ``~/tensorflow_datasets``).

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
