"""The bundled digits (issue 42): the UCI optical digits as scikit-learn ships them, without it."""

import hashlib

import numpy as np
import pytest

from cbdp_jax._src.training_auditor.digits import load_digits
from cbdp_jax._src.training_auditor.setups import load_data

# Per-class counts of the 1797 images (scikit-learn's DESCR: about 180 per class).
CLASS_COUNTS = [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
# SHA-256 of the arrays' bytes, as written from scikit-learn 1.7.2's load_digits (uint8).
IMAGES_SHA256 = "8f26b2bd9d135c256808f68f14fdabddde6d9c7f869ae419704b051f0f14b3b3"
LABELS_SHA256 = "8ba4f891220f5e4c9c819638d1602d74b83618f167043c6da52a2a247841ddf0"


def test_the_bundled_arrays_are_intact():
    images, labels = load_digits()
    assert images.shape == (1797, 64) and labels.shape == (1797,)
    assert images.dtype == labels.dtype == np.uint8
    assert images.min() == 0 and images.max() == 16 and set(labels.tolist()) == set(range(10))
    assert np.bincount(labels).tolist() == CLASS_COUNTS
    assert hashlib.sha256(images.tobytes()).hexdigest() == IMAGES_SHA256
    assert hashlib.sha256(labels.tobytes()).hexdigest() == LABELS_SHA256
    with pytest.raises(ValueError):  # read-only: no caller can change them for the next
        images[0, 0] = 1


def test_the_bundled_digits_equal_scikit_learns():
    sklearn_datasets = pytest.importorskip("sklearn.datasets")
    d = sklearn_datasets.load_digits()
    images, labels = load_digits()
    np.testing.assert_array_equal(images, d.data)  # every pixel, exactly
    np.testing.assert_array_equal(labels, d.target)
    # negative control: one pixel changed is caught
    changed = images.copy()
    changed[100, 10] += 1
    assert not np.array_equal(changed, d.data)


def test_load_data_digits_needs_no_scikit_learn(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "sklearn", None)  # import sklearn now raises ImportError
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    x, y = load_data("digits", n=300)
    images, labels = load_digits()
    assert x.dtype == np.float32 and y.dtype == np.int32
    np.testing.assert_array_equal(x, (images[:300] / 16.0).astype(np.float32))
    np.testing.assert_array_equal(y, labels[:300])
