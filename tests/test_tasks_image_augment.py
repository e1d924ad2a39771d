"""Tests for the image augmentation: known crops and flips, per-row draws, speed-free."""

import numpy as np
import pytest

from deq_jax.tasks import image_augment


def _images(b=3, h=4, w=5, c=2):
    return np.arange(b * h * w * c, dtype=np.float32).reshape(b, h, w, c) + 1.0


def test_centre_offset_without_flip_is_the_identity():
    x = _images()
    out = image_augment.crop_and_flip(x, np.full(3, 2), np.full(3, 2), np.zeros(3, bool), 2)
    np.testing.assert_array_equal(out, x)


def test_flip_mirrors_columns():
    x = _images()
    flips = np.array([True, False, True])
    out = image_augment.crop_and_flip(x, np.ones(3, int), np.ones(3, int), flips, 1)
    np.testing.assert_array_equal(out[0], x[0, :, ::-1])
    np.testing.assert_array_equal(out[1], x[1])
    np.testing.assert_array_equal(out[2], x[2, :, ::-1])


def test_corner_offset_shifts_in_padding_per_channel():
    x = _images(b=1)
    pad = np.array([-7.0, -9.0], np.float32)
    out = image_augment.crop_and_flip(
        x, np.zeros(1, int), np.zeros(1, int), np.zeros(1, bool), 2, pad
    )
    assert out.shape == x.shape and out.dtype == x.dtype
    np.testing.assert_array_equal(out[0, 2:, 2:], x[0, :-2, :-2])  # moved down-right by 2
    np.testing.assert_array_equal(out[0, :2, :, 0], -7.0)
    np.testing.assert_array_equal(out[0, :, :2, 1], -9.0)
    # Crop then flip: the far corner offset, mirrored.
    out = image_augment.crop_and_flip(x, np.full(1, 4), np.full(1, 4), np.ones(1, bool), 2, pad)
    np.testing.assert_array_equal(out[0, :2, -3:], x[0, 2:, 2:][:, ::-1])
    np.testing.assert_array_equal(out[0, 2:, :, 1], -9.0)


def test_draws_are_per_row_and_cover_the_range():
    rows = np.arange(400)
    dy, dx, flips = image_augment.draw_offsets(5, 11, rows, 3, True)
    assert set(dy.tolist()) == set(range(7)) and set(dx.tolist()) == set(range(7))
    assert 150 < flips.sum() < 250
    some = image_augment.draw_offsets(5, 11, rows[37:41], 3, True)
    for full, part in zip((dy, dx, flips), some, strict=True):
        np.testing.assert_array_equal(full[37:41], part)
    other_step = image_augment.draw_offsets(5, 12, rows, 3, True)
    assert not np.array_equal(other_step[0], dy)
    assert not image_augment.draw_offsets(5, 11, rows, 3, False)[2].any()


def test_crop_flip_slices_the_global_batch():
    aug = image_augment.CropFlip(2, True)
    x = _images(b=8)
    whole = aug(x, seed=0, step=4, batch_size=8)
    parts = [
        aug(x[p * 2 : (p + 1) * 2], seed=0, step=4, batch_size=8, process_index=p, process_count=4)
        for p in range(4)
    ]
    np.testing.assert_array_equal(np.concatenate(parts), whole)
    assert aug.active and not image_augment.CropFlip().active
    with pytest.raises(ValueError, match="crop_padding must be an integer >= 0"):
        image_augment.CropFlip(-1)
