#!/usr/bin/env bash
# The wheels a lent accelerator needs besides its image (which holds jax, flax, optax,
# orbax-checkpoint, chex, absl-py, numpy, matplotlib, protobuf, pyarrow, etils, ...; see
# /work/.library/device/KINDS.md): deq_jax's other requirements and what they pull in
# that the image lacks, for CPython 3.12 on x86_64 Linux. Run here (PyPI reachable):
#
#   echo /.whl/ >> .git/info/exclude; bash launch/device/wheels.sh .whl
#
# then carry `.whl` (9.9 MiB on 2026-11-26) and begin the device command with
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#     --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit;
# `promise` has no wheel on PyPI (pure Python): it is built here.
set -euo pipefail
out=${1:-.whl}
mkdir -p "$out"
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform any)
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${platforms[@]}" -d "$out" \
  jaxopt ml_collections tensorboardX tensorflow-datasets array_record dm-tree \
  immutabledict simple_parsing docstring-parser tensorflow-metadata \
  googleapis-common-protos termcolor toml importlib_resources
python3 -m pip wheel --quiet --no-deps -w "$out" promise
ls "$out"
