"""The 8x8 handwritten digits, bundled: 1797 images of 64 pixels (0..16) and their labels (0..9).

The training audits' default data set (``cbdp audit-training --data digits``) needs no extra package
and no download: the arrays ship with this package in ``data/digits.npz`` (uint8, 45 kB compressed),
the same values as ``sklearn.datasets.load_digits()`` (checked in ``tests/test_digits.py`` where
scikit-learn is installed).

Origin and licence: the test set of the UCI Machine Learning Repository's "Optical Recognition of
Handwritten Digits" (E. Alpaydin, C. Kaynak, 1998; https://doi.org/10.24432/C50P49), as shipped by
scikit-learn; licensed under Creative Commons Attribution 4.0 International (CC BY 4.0). See
``data/README.md``.

References:
  Alpaydin, Kaynak, "Optical Recognition of Handwritten Digits", UCI Machine Learning Repository,
  1998. Kaynak, "Methods of combining multiple classifiers and their applications to handwritten
  digit recognition", MSc thesis, Bogazici University, 1995.

"""

from __future__ import annotations

import functools
from importlib import resources

import numpy as np

SHAPE = (1797, 64)
CLASSES = 10


@functools.cache
def _arrays() -> tuple[np.ndarray, np.ndarray]:
    with resources.files("cbdp_jax._src").joinpath("data/digits.npz").open("rb") as fh:
        with np.load(fh, allow_pickle=False) as z:
            images, labels = z["images"], z["labels"]
    images.setflags(write=False)
    labels.setflags(write=False)
    return images, labels


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """``(images [1797, 64] uint8 in 0..16, labels [1797] uint8 in 0..9)``, read-only.

    The values of ``sklearn.datasets.load_digits()``'s ``data`` and ``target`` (there float64 and
    int64). Scale the pixels by 1 / 16 for [0, 1].
    """
    return _arrays()


__all__ = ["CLASSES", "SHAPE", "load_digits"]
