"""Tests for the language-modelling data: vocabulary, corpora, batching and the tasks."""

import itertools
import math
import os

import numpy as np
import pytest

import deq_jax.tasks as tasks
from deq_jax.tasks import text_batches, text_corpus
from deq_jax.tasks.text import write_cache
from deq_jax.tasks.text_vocab import (
    EOS,
    UNK,
    Vocabulary,
    char_vocabulary,
    pattern_mask,
    word_vocabulary,
)

CORPUS = "".join(
    f"Line {i}: to be, or not to be; that is question {i * 7 % 13}.\n" for i in range(60)
)
WIKI = {
    "train": " = Title = \n\n the cat sat on the mat \n a <unk> cat \n",
    "valid": " the dog sat \n",
    "test": " on the mat \n\n",
}


def _stream(n, seed=0):
    return np.random.default_rng(seed).integers(0, 50, size=n).astype(np.int32)


def _take(iterator, n):
    return list(itertools.islice(iterator, n))


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return str(path)


# Vocabulary.


def test_char_vocabulary_round_trip_json_and_fingerprint():
    vocab = char_vocabulary("hello world\n")
    assert vocab.tokens == tuple(sorted(set("hello world\n"))) and vocab.unk_id is None
    ids = vocab.encode("low row\nhe")
    assert ids.dtype == np.int32 and ids.shape == (10,)
    assert vocab.decode(ids) == "low row\nhe"
    again = Vocabulary.from_json(vocab.to_json())
    assert again == vocab and again.fingerprint == vocab.fingerprint
    assert len(vocab.fingerprint) == 16
    assert char_vocabulary("hello world!").fingerprint != vocab.fingerprint


def test_char_vocabulary_errors_name_the_character_and_the_id():
    vocab = char_vocabulary("abc")
    with pytest.raises(ValueError, match=r"'z' at position 3"):
        vocab.encode("abcz")
    with pytest.raises(ValueError, match="Token id 3 "):
        vocab.decode([0, 3])
    with pytest.raises(ValueError, match="Token id -1 "):
        vocab.decode(np.array([-1]))


def test_char_unk_added_only_for_unseen_evaluation_characters():
    assert char_vocabulary("abc", ["cab", "a"]).unk_id is None
    vocab = char_vocabulary("abc", ["abd"])
    assert vocab.tokens == ("a", "b", "c", UNK) and vocab.unk_id == 3
    np.testing.assert_array_equal(vocab.encode("adzb"), [0, 3, 3, 1])


def test_word_vocabulary_order_eos_and_unk():
    vocab = word_vocabulary(WIKI["train"])
    # 4 lines -> 4 <eos>; "=", "cat", "the" twice; the rest once; ties alphabetically.
    assert vocab.tokens[:4] == (EOS, "=", "cat", "the")
    assert vocab.tokens[4:] == tuple(sorted(["Title", "sat", "on", "mat", "a", UNK]))
    ids = vocab.encode(" a <unk> cat \n the mat")
    assert vocab.decode(ids) == "a <unk> cat\nthe mat\n"
    assert vocab.decode(vocab.encode("the dog")) == "the <unk>\n"  # unknown -> <unk>
    assert Vocabulary.from_json(vocab.to_json()) == vocab
    without_unk = word_vocabulary("the cat\n")
    with pytest.raises(ValueError, match=r"'dog' \(line 2, word 1\)"):
        without_unk.encode("the\ndog cat")


def test_pattern_mask_marks_the_characters_inside_matches():
    vocab = char_vocabulary("ab c   d\n")
    ids = vocab.encode("a   b c    d")
    mask = pattern_mask(vocab, ids, " {3,}")
    assert "".join("x" if m else "." for m in mask) == ".xxx...xxxx."
    assert not pattern_mask(vocab, ids, "z").any()
    with pytest.raises(ValueError, match="not a regular expression"):
        pattern_mask(vocab, ids, "(")
    words = word_vocabulary(WIKI["train"])
    with pytest.raises(ValueError, match="character-level"):
        pattern_mask(words, words.encode("the cat"), "cat")


def test_vocabulary_rejects_bad_token_lists():
    with pytest.raises(ValueError, match="level"):
        Vocabulary("byte", ("a",))
    with pytest.raises(ValueError, match="distinct"):
        Vocabulary("char", ("a", "a"))
    with pytest.raises(ValueError, match="single characters"):
        Vocabulary("char", ("ab",))


# Corpora.


def test_char_split_is_90_5_5_and_contiguous():
    text = "".join(chr(65 + i % 26) for i in range(200))
    blocks = text_corpus.split_chars(text)
    assert [len(blocks[s]) for s in text_corpus.SPLITS] == [180, 10, 10]
    assert blocks["train"] + blocks["valid"] + blocks["test"] == text
    assert text_corpus.split_bounds(1001) == (900, 950)


def test_char_corpus_maps_characters_unseen_in_training_to_unk(tmp_path):
    vocab, streams = text_corpus.char_corpus(_write(tmp_path / "c.txt", CORPUS + "Z"))
    assert vocab.tokens[-1] == UNK and "Z" not in vocab.tokens
    assert streams["test"][-1] == vocab.unk_id
    assert [len(streams[s]) for s in text_corpus.SPLITS] == [
        len(b) for b in text_corpus.split_chars(CORPUS + "Z").values()
    ]


# Batching.


@pytest.mark.parametrize("n, batch_size, seq_len", [(101, 4, 5), (1000, 3, 7)])
def test_train_batches_transformer_xl_layout(n, batch_size, seq_len):
    tokens = _stream(n)
    steps = text_batches.steps_per_epoch(n, batch_size, seq_len)
    row_len = (n - 1) // batch_size
    assert steps == row_len // seq_len > 1
    batches = _take(text_batches.train_batches(tokens, batch_size, seq_len), 2 * steps + 1)
    rows = tokens[: batch_size * row_len + 1]
    for s, batch in enumerate(batches):
        assert batch["inputs"].shape == batch["targets"].shape == (batch_size, seq_len)
        assert batch["inputs"].dtype == np.int32 and batch["mask"].dtype == bool
        assert batch["mask"].all() and batch["reset"].dtype == np.bool_
        assert bool(batch["reset"]) == (s % steps == 0)
        k = s % steps
        for i in range(batch_size):
            start = i * row_len + k * seq_len
            np.testing.assert_array_equal(batch["inputs"][i], rows[start : start + seq_len])
            np.testing.assert_array_equal(
                batch["targets"][i], rows[start + 1 : start + seq_len + 1]
            )
    for a, b in zip(batches[:-1], batches[1:], strict=True):
        if not b["reset"]:  # each row continues the same row of the previous batch
            np.testing.assert_array_equal(b["inputs"][:, 0], a["targets"][:, -1])
        np.testing.assert_array_equal(a["targets"][:, :-1], a["inputs"][:, 1:])
    for key in ("inputs", "targets"):  # epochs repeat the same order
        np.testing.assert_array_equal(batches[steps][key], batches[0][key])


def test_train_batches_resume_and_process_sharding():
    tokens = _stream(500, seed=1)
    full = _take(text_batches.train_batches(tokens, 4, 6), 50)
    for start in (0, 7, 20, 41):
        resumed = _take(text_batches.train_batches(tokens, 4, 6, start_step=start), 50 - start)
        for a, b in zip(full[start:], resumed, strict=True):
            for key in a:
                np.testing.assert_array_equal(a[key], b[key])
    shards = [
        _take(text_batches.train_batches(tokens, 4, 6, process_index=p, process_count=2), 30)
        for p in range(2)
    ]
    for s in range(30):
        assert shards[0][s]["inputs"].shape == (2, 6)
        for key in ("inputs", "targets", "mask"):
            joined = np.concatenate([shards[0][s][key], shards[1][s][key]])
            np.testing.assert_array_equal(joined, full[s][key])
        assert shards[0][s]["reset"] == shards[1][s]["reset"] == full[s]["reset"]


@pytest.mark.parametrize(
    "n, batch_size, seq_len", [(101, 4, 7), (50, 3, 100), (2, 2, 1), (97, 8, 4)]
)
def test_eval_batches_score_every_target_once(n, batch_size, seq_len):
    tokens = _stream(n, seed=2)
    batches = list(text_batches.eval_batches(tokens, batch_size, seq_len))
    assert len(batches) == text_batches.num_eval_batches(n, batch_size, seq_len)
    assert [bool(b["reset"]) for b in batches] == [True] + [False] * (len(batches) - 1)
    mask = np.concatenate([b["mask"] for b in batches], axis=1)  # [B, columns]
    targets = np.concatenate([b["targets"] for b in batches], axis=1)
    inputs = np.concatenate([b["inputs"] for b in batches], axis=1)
    assert mask.sum() == n - 1
    np.testing.assert_array_equal(targets[mask], tokens[1:])  # row-major reassembly
    np.testing.assert_array_equal(inputs[mask], tokens[:-1])
    if batch_size % 2:
        return
    shards = [
        list(
            text_batches.eval_batches(tokens, batch_size, seq_len, process_index=p, process_count=2)
        )
        for p in range(2)
    ]
    assert len(shards[0]) == len(shards[1]) == len(batches)
    for s, batch in enumerate(batches):
        for key in ("inputs", "targets", "mask"):
            joined = np.concatenate([shards[0][s][key], shards[1][s][key]])
            np.testing.assert_array_equal(joined, batch[key])


def test_batching_bad_arguments_say_what_to_change():
    tokens = _stream(100)
    with pytest.raises(ValueError, match="divisible by process_count 2"):
        text_batches.train_batches(tokens, 3, 4, process_count=2)
    with pytest.raises(ValueError, match="divisible by process_count 2"):
        text_batches.eval_batches(tokens, 3, 4, process_count=2)
    for seq_len in (0, -1):
        with pytest.raises(ValueError, match="seq_len must be a positive integer"):
            text_batches.train_batches(tokens, 2, seq_len)
        with pytest.raises(ValueError, match="seq_len must be a positive integer"):
            text_batches.eval_batches(tokens, 2, seq_len)
    with pytest.raises(ValueError, match="lower batch_size or seq_len"):
        text_batches.train_batches(tokens, 10, 10)  # 99 targets: rows of 9 < 10
    with pytest.raises(ValueError, match="start_step"):
        text_batches.train_batches(tokens, 2, 4, start_step=-1)


# The tasks, end to end through their cache of token ids.


@pytest.fixture(scope="module")
def char_task(tmp_path_factory):
    root = tmp_path_factory.mktemp("char")
    corpus_dir = root / "corpus"
    corpus_dir.mkdir()
    _write(corpus_dir / "plays.txt", CORPUS)
    _write(corpus_dir / "SOURCE.txt", "provenance, not corpus text\n")
    task = tasks.get("char_text", path=str(corpus_dir), data_dir=str(root / "data"))
    task.prepare()
    return task


def test_char_task_interface_and_streams(char_task):
    task = char_task
    assert (task.name, task.level, task.headline) == ("char_text", "char", "bpc")
    assert task.train_split == "train" and task.eval_splits == ("valid", "test")
    assert task.splits == ("train", "valid", "test")
    assert task.vocab.tokens == tuple(sorted(set(CORPUS[: 9 * len(CORPUS) // 10])))
    assert task.vocab_size == task.vocab.size
    sizes = [task.num_tokens(s) for s in task.splits]
    a, b = text_corpus.split_bounds(len(CORPUS))
    assert sizes == [a, b - a, len(CORPUS) - b]
    assert "".join(task.vocab.decode(task.tokens(s)) for s in task.splits) == CORPUS
    assert task.tokens("train").dtype == np.int32
    assert task.tokens("valid") is task.tokens("valid")  # cached
    assert not task.tokens("valid").flags.writeable
    assert task.steps_per_epoch(4, 16) == ((a - 1) // 4) // 16
    batch = next(task.train_iterator(4, 16, start_step=3))
    expected = _take(text_batches.train_batches(task.tokens("train"), 4, 16), 4)[3]
    np.testing.assert_array_equal(batch["inputs"], expected["inputs"])
    valid = list(task.eval_iterator("valid", 2, 8))
    assert sum(int(b["mask"].sum()) for b in valid) == task.num_tokens("valid") - 1
    with pytest.raises(ValueError, match="Unknown split 'dev'"):
        task.tokens("dev")
    with pytest.raises(ValueError, match="lower batch_size or seq_len"):
        next(task.train_iterator(64, 1000))


def test_char_task_second_prepare_only_hashes_and_a_new_corpus_builds_anew(
    char_task, monkeypatch, tmp_path
):
    def fail(*args):
        raise AssertionError("the raw text was read again")

    data_dir = char_task.data_dir
    monkeypatch.setattr(text_corpus, "char_corpus", fail)
    again = tasks.get("char_text", path=os.path.dirname(char_task.files[0]), data_dir=data_dir)
    np.testing.assert_array_equal(again.tokens("test"), char_task.tokens("test"))
    assert again.vocab == char_task.vocab
    monkeypatch.undo()
    new = "Z!\n" + CORPUS
    changed = tasks.get("char_text", path=_write(tmp_path / "plays.txt", new), data_dir=data_dir)
    assert "".join(changed.vocab.decode(changed.tokens(s)) for s in changed.splits) == new
    assert len(os.listdir(os.path.join(data_dir, "text_ids"))) == 2


def test_the_cache_appears_whole_and_the_first_writer_wins(char_task, tmp_path):
    vocab, streams = char_task.vocab, {s: char_task.tokens(s) for s in char_task.splits}
    cache = tmp_path / "text_ids" / "char-plays-0"
    (tmp_path / "text_ids" / "char-plays-0.123.tmp").mkdir(parents=True)  # a killed writer's
    write_cache(str(cache), (vocab, streams))
    assert sorted(os.listdir(cache)) == ["test.npy", "train.npy", "valid.npy", "vocabulary.json"]
    np.testing.assert_array_equal(np.load(cache / "valid.npy"), streams["valid"])
    other = {s: np.zeros(3, np.int32) for s in streams}
    write_cache(str(cache), (vocab, other))  # another process was first: it stays
    np.testing.assert_array_equal(np.load(cache / "valid.npy"), streams["valid"])
    assert sorted(os.listdir(tmp_path / "text_ids")) == ["char-plays-0", "char-plays-0.123.tmp"]


def test_summarize():
    task = tasks.get("char_text", path=__file__)
    assert task.summarize(10.0, 5) == {"bpc": 2.0 / math.log(2.0), "nll": 2.0, "tokens": 5.0}
    with pytest.raises(ValueError, match="positive token count"):
        task.summarize(1.0, 0)


def test_wikitext_task(tmp_path):
    wiki = tmp_path / "wikitext-2"
    wiki.mkdir()
    for split, text in WIKI.items():
        _write(wiki / f"wiki.{split}.tokens", text)
    task = tasks.get("wikitext", path=str(wiki), data_dir=str(tmp_path / "data"))
    assert (task.name, task.level, task.headline) == ("wikitext", "word", "ppl")
    vocab = task.vocab
    assert vocab == word_vocabulary(WIKI["train"])  # from the train file only
    assert "dog" not in vocab.tokens
    assert task.num_tokens("train") == 4 + 12  # 4 lines, 12 words
    assert (
        vocab.decode(task.tokens("train")) == "= Title =\n\nthe cat sat on the mat\na <unk> cat\n"
    )
    assert vocab.decode(task.tokens("valid")) == "the <unk> sat\n"
    assert [vocab.tokens[i] for i in task.tokens("test")] == ["on", "the", "mat", EOS, EOS]
    summary = task.summarize(3.0 * math.log(2.0), 3)
    assert summary["ppl"] == pytest.approx(2.0) and summary["tokens"] == 3.0


# Bad input: clear errors, nothing written.


def test_missing_char_corpus_gives_the_prepare_command(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(
        FileNotFoundError, match=r"python -m launch\.prepare_data shakespeare --out"
    ):
        tasks.get("char_text", path=str(missing), data_dir=str(tmp_path / "data"))
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(FileNotFoundError, match="prepare_data shakespeare"):
        tasks.get("char_text", path=str(tmp_path / "empty_dir"))
    two = tmp_path / "two"
    two.mkdir()
    _write(two / "a.txt", CORPUS)
    _write(two / "b.txt", CORPUS)
    with pytest.raises(ValueError, match="several"):
        tasks.get("char_text", path=str(two))
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize(
    "content, message",
    [
        (b"abc\xffdef" * 10, r"bad\.txt is not UTF-8 text: invalid byte 0xff at byte offset 3"),
        (b"", r"bad\.txt is empty"),
        (b"short text", r"valid split of .*bad\.txt would hold 0"),
    ],
)
def test_bad_char_corpus_raises_and_writes_nothing(tmp_path, content, message):
    path = tmp_path / "bad.txt"
    path.write_bytes(content)
    task = tasks.get("char_text", path=str(path), data_dir=str(tmp_path / "data"))
    with pytest.raises(ValueError, match=message):
        task.prepare()
    assert not (tmp_path / "data").exists()


def test_bad_wikitext_raises_and_writes_nothing(tmp_path):
    wiki = tmp_path / "wiki"
    wiki.mkdir()
    _write(wiki / "wiki.train.tokens", WIKI["train"])
    _write(wiki / "wiki.test.tokens", WIKI["test"])
    with pytest.raises(FileNotFoundError, match=r"wiki\.valid\.tokens"):
        tasks.get("wikitext", path=str(wiki))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        tasks.get("wikitext", path=str(tmp_path / "nowhere"))
    _write(wiki / "wiki.valid.tokens", "\n")  # one line: just <eos>
    task = tasks.get("wikitext", path=str(wiki), data_dir=str(tmp_path / "data"))
    with pytest.raises(ValueError, match=r"wiki\.valid\.tokens would hold 1 token"):
        task.prepare()
    (wiki / "wiki.valid.tokens").write_bytes(b"caf\xe9 \n")
    with pytest.raises(ValueError, match=r"wiki\.valid\.tokens is not UTF-8 text.*offset 3"):
        task.prepare()
    assert not (tmp_path / "data").exists()
