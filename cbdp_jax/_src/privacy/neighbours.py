"""Whether a given pair of datasets ``(D, D')`` is neighbouring, and under which relation.

A privacy claim is a statement about neighbouring datasets, and which pairs are neighbours is part of
the claim (Dwork and Roth 2014, section 2.3). An audit of a pair the user gives checks it first: a pair
that is not neighbouring under the relation assumed would make a "violation" meaningless (any claim
fails for datasets far enough apart). The relations, on datasets whose first axis lists the records:

- ``replace-one``: the same number of records, exactly one record different;
- ``zero-out``: the same number of records, one record of ``D'`` all zeros where ``D``'s is not
  (a special case of replace-one; the relation DP-SGD's zero-out accounting uses);
- ``add-remove``: one dataset is the other with one record added (anywhere);
- ``any``: no check (the user vouches for the pair under a relation of their own).

References:
  Dwork, Roth, "The algorithmic foundations of differential privacy", 2014, Definition 2.4 and the
  discussion of neighbouring databases in section 2.3.

"""

from __future__ import annotations

import numpy as np

from cbdp_jax._src.infra.validation import InvalidParameterError, check_choice

RELATIONS = ("replace-one", "zero-out", "add-remove", "any")


def _records(d: np.ndarray) -> np.ndarray:
    """The dataset as ``[records, features]`` (a scalar is one record)."""
    d = np.asarray(d, np.float64)
    return d.reshape(1, -1) if d.ndim == 0 else d.reshape(d.shape[0], -1)


def _one_removed(big: np.ndarray, small: np.ndarray) -> bool:
    """Whether ``small`` is ``big`` with one record removed (the others in order)."""
    if big.shape[0] != small.shape[0] + 1 or big.shape[1:] != small.shape[1:]:
        return False
    # the first record where they differ is the removed one; the rest must then line up shifted
    same = np.all(big[:-1] == small, axis=1)
    i = int(np.argmin(same)) if not same.all() else small.shape[0]
    return bool(np.array_equal(np.delete(big, i, axis=0), small))


def relations_of(d, d_prime) -> tuple[str, ...]:
    """The relations of :data:`RELATIONS` (``any`` aside) under which ``(d, d_prime)`` are neighbours."""
    a, b = _records(d), _records(d_prime)
    found = []
    if np.asarray(d).shape == np.asarray(d_prime).shape:
        differ = np.flatnonzero(np.any(a != b, axis=1))
        if differ.size == 1:
            found.append("replace-one")
            i = differ[0]
            if not np.any(b[i]) or not np.any(a[i]):
                found.append("zero-out")
    elif _one_removed(a, b) or _one_removed(b, a):
        found.append("add-remove")
    return tuple(found)


def _difference(d, d_prime) -> str:
    a, b = _records(d), _records(d_prime)
    if np.asarray(d).shape == np.asarray(d_prime).shape:
        n = int(np.sum(np.any(a != b, axis=1)))
        return "they are equal" if n == 0 else f"{n} of their {a.shape[0]} records differ"
    if a.shape[1:] != b.shape[1:]:
        shapes = f"{np.asarray(d).shape} vs {np.asarray(d_prime).shape}"
        return f"their records have different shapes ({shapes})"
    text = f"D has {a.shape[0]} records and D' {b.shape[0]}"
    if abs(a.shape[0] - b.shape[0]) == 1 and not relations_of(d, d_prime):
        text += ", and the longer is not the shorter with one record added"
    return text


def check_pair(d, d_prime, relation: str) -> tuple[str, ...]:
    """Checks that ``(d, d_prime)`` are neighbours under ``relation``; returns every relation they fit.

    Raises:
      InvalidParameterError: Naming ``d_prime``, the relation, how the pair fails it, and the relations
        it does fit (or that it fits none).

    """
    check_choice("relation", relation, RELATIONS)
    fits = relations_of(d, d_prime)
    if relation == "any" or relation in fits:
        return fits
    others = (
        f"it is neighbouring under {', '.join(fits)} (--relation {fits[0]})"
        if fits
        else "it is neighbouring under none of replace-one, zero-out, add-remove (--relation any "
        "audits it anyway, for a relation of your own)"
    )
    shown = repr(np.asarray(d_prime).tolist())
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    raise InvalidParameterError(
        f"d_prime={shown} is invalid: D and D' are not {relation} "
        f"neighbours ({_difference(d, d_prime)}); {others}"
    )


__all__ = ["RELATIONS", "check_pair", "relations_of"]
