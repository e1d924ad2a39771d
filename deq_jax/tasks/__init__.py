"""Tasks: data, splits and metrics, named by configs and known to no training loop.

Every task is built by name and offers one interface, which later tasks copy::

    import deq_jax.tasks as tasks

    task = tasks.get("prefix_sum", data_dir=f"{workdir}/data", train_size=10_000)
    task.name, task.num_classes          # "prefix_sum", 2
    task.input_shape                     # one example's input, no batch dim: (32, 1)
    task.train_split, task.eval_splits   # "train", ("test_16", ..., "test_512")
    task.splits                          # ("train",) + eval_splits
    task.prepare()                       # build the data under data_dir if missing
    task.num_examples(split), task.steps_per_epoch(batch_size)

    # Endless, shuffled per epoch from (seed, epoch), drop_remainder, resumable:
    for batch in task.train_iterator(batch_size, seed=0, start_step=step,
                                     process_index=0, process_count=1):
        batch["inputs"], batch["targets"], batch["mask"], batch["index"]

    # One ordered pass; the last batch is padded with mask=False:
    for batch in task.eval_iterator("test_64", batch_size):
        m = task.metrics(logits, batch["targets"], batch["mask"])
    # m = {"bit_accuracy", "string_accuracy", "count"}; combine batches with
    # tasks.data.weighted_mean(list_of_m).

A task that changes its training batches each step (fresh input noise, extra graph
edges) says so with ``task.augments_training`` and does it in
``task.augment_train_batch(batch, seed=, step=, batch_size=, ...)``, which
``train_iterator`` applies; the change is a pure function of the seed, the global step
and the row of the global batch, so it survives a resume and any process count.

``batch_size`` is global: with ``process_count > 1`` each process gets
``batch_size // process_count`` rows of every global batch (see `deq_jax.tasks.data`).
Prefix-sum batches are ``{"inputs": float32 [b, L, 1], "targets": int32 [b, L],
"mask": bool [b], "index": int32 [b]}``; ``L`` differs between splits.

Image classification (``"digits"``, ``"fashion_mnist"``, ``"mnist"``, ``"cifar10"``)
batches are ``{"inputs": float32 [b, H, W, C], "targets": int32 [b], "mask", "index"}``
with ``task.metrics = {"accuracy", "count"}``. The three real data sets are read from
the files users download (MNIST-format idx files, CIFAR-10's python batches; or a
prepared tfds cifar10), converted once to tfds ``array_record`` under ``data_dir``, cut
into ``"train"``, ``"valid"`` and ``"test"``, and their training batches cropped and
flipped per step (`deq_jax.tasks.image_files`).

Language modelling (``"char_text"``, ``"wikitext"``) streams tokens instead of
examples; its interface is in `deq_jax.tasks.text`.

Data a user supplies (idx files, CIFAR-10 batches, a prepared tfds data set, a text
corpus, easy-to-hard-data's files) that is missing or malformed raises a `DataError`
(`DataNotFoundError`, a FileNotFoundError; `DataFormatError`, a ValueError) naming the
path, what is wrong and how to get the data (`deq_jax.tasks.errors`).

Importing this package is light (numpy and jax): the tasks generated in memory
(``"prefix_sum"``, ``"synthetic_1d"``, ``"mazes"``, ``"edge_copy"``,
``"matrix_inversion"`` and CLRS's ``"clrs"``) are imported with it, and so are the text
tasks (``"char_text"``, ``"wikitext"``: a corpus file, its token ids cached as numpy
files), while the image tasks import their module on the first `get` of one of them.
tensorflow-datasets (the ``[train]`` extra's dependency, with array_record) loads only
where a task reads or writes tfds records, in its ``prepare()`` and ``source()``
(`deq_jax.tasks._tfds.load`): building an image task, reading its ``input_shape``,
``num_classes``, ``metrics`` or augmentation, and timing its model on synthetic data
(`benchmarks.step_time`) need no tfds. Their classes live in their modules
(`deq_jax.tasks.prefix_sum.PrefixSumConfig`, `deq_jax.tasks.text.TextTask`, ...).

References:
  Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
  Computation", NeurIPS 2022.
  Schwarzschild et al., "Can You Learn an Algorithm? Generalizing from Easy to Hard
  Problems with Recurrent Networks", NeurIPS 2021.
"""

import importlib

from deq_jax._registry import Registry
from deq_jax.tasks import data
from deq_jax.tasks.edge_copy import edge_copy
from deq_jax.tasks.errors import DataError, DataFormatError, DataNotFoundError
from deq_jax.tasks.matrix_inversion import matrix_inversion
from deq_jax.tasks.mazes import mazes
from deq_jax.tasks.prefix_sum import prefix_sum
from deq_jax.tasks.synthetic_1d import synthetic_1d
from deq_jax.tasks.text import char_text, wikitext
from deq_jax.tasks.text_vocab import Vocabulary

_REGISTRY = Registry("task")
register = _REGISTRY.register
register(synthetic_1d.__name__, synthetic_1d)
register(mazes.__name__, mazes)
register(edge_copy.__name__, edge_copy)
register(matrix_inversion.__name__, matrix_inversion)
register(prefix_sum.__name__, prefix_sum)
register(char_text.__name__, char_text)
register(wikitext.__name__, wikitext)

# The image tasks, each named with the module that defines it: that module (scipy's
# filters, the files' readers) is imported by the first `get` of the task, and tfds only
# when the task reads or writes records (`deq_jax.tasks._tfds.load`), so importing this
# package, and the models that use its base class, needs no data-pipeline package.
_IMAGE_TASKS = {
    "digits": "images",
    "cifar10": "image_files",
    "fashion_mnist": "image_files",
    "mnist": "image_files",
    "blurry_digits": "blurry_digits",
}


def names() -> list[str]:
    """The task names `get` accepts, sorted (registered and image tasks alike)."""
    return sorted({*_REGISTRY.names(), *_IMAGE_TASKS})


def get(name: str, **kwargs):
    """Builds the task ``name`` with ``kwargs`` (see the module docstring).

    An image task is built without tensorflow-datasets; where it is not installed, the
    task's ``prepare()`` and ``source()`` raise a ModuleNotFoundError naming the
    ``[train]`` extra.

    Raises:
      ValueError: for an unknown name (the message lists the valid ones) or a keyword
        the task does not take (the message lists those it takes).
    """
    if name not in _REGISTRY and name in _IMAGE_TASKS:
        module = importlib.import_module(f"{__name__}.{_IMAGE_TASKS[name]}")
        register(name, getattr(module, name))
    if name not in _REGISTRY:
        raise ValueError(f"Unknown task {name!r}. Valid tasks: {', '.join(names())}.")
    return _REGISTRY.get(name, **kwargs)


__all__ = [
    "DataError",
    "DataFormatError",
    "DataNotFoundError",
    "Vocabulary",
    "data",
    "get",
    "names",
    "register",
]
