"""Orthonormal polynomials under a discrete reference measure (private; numpy, float64).

The exact layer parametrises the class poly_k = span{1, z, ..., z^k} by the polynomials psi_0 = 1,
psi_1, ..., psi_k that are orthonormal under a reference probability measure rho (a quadrature rule for
(P + Q) / 2 in standardised units), instead of by monomials. The class is the same -- each psi_j has exact
degree j, so span{psi_0..psi_j} = poly_j for every j, whatever the rounding in the coefficients -- but the
Gram matrix of the parameters is the identity under rho instead of a Hankel matrix of moments (whose
condition number grows like (2k)! under Laplace noise). See docs/theory/exact_solver.md, section 2.

The polynomials come from the Stieltjes procedure: the three-term recurrence

    b_{j+1} psi_{j+1}(t) = (t - a_j) psi_j(t) - c_j psi_{j-1}(t),   psi_{-1} = 0, psi_0 = 1,

in t = (z - shift) / width, with a_j = <t psi_j, psi_j>, c_j = <t psi_j, psi_{j-1}> (= b_j in exact
arithmetic) and b_{j+1} the norm of the right-hand side, inner products under rho. Both a_j and c_j are
computed twice (the second pass removes what rounding left of the components along psi_j and psi_{j-1}),
which keeps the recurrence orthonormal to ~1e-13 on smooth reference measures; components along older
polynomials cannot enter a three-term recurrence and are left alone. Evaluation anywhere is the same
recurrence, so exact degree is never lost. :func:`gram_error` measures orthonormality on another grid.

References:
  W. Gautschi, "Orthogonal Polynomials: Computation and Approximation", Oxford 2004, section 2.2
  (discretised Stieltjes procedure).

"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class OrthoPoly:
    """psi_0..psi_k, orthonormal under a reference probability measure, by a three-term recurrence.

    Attributes:
      a: ``[k]`` recurrence coefficients a_0..a_{k-1}.
      b: ``[k + 1]`` normalisers, ``b[0] = 1``, ``b[j] > 0`` for j >= 1.
      c: ``[k]`` coefficients of psi_{j-1}, ``c[0] = 0``.
      shift: The recurrence is run in the variable ``(z - shift) / width`` (centring and scaling keep the
        coefficients O(1) for any noise geometry).
      width: See ``shift``.

    """

    a: np.ndarray
    b: np.ndarray
    c: np.ndarray
    shift: float
    width: float

    @property
    def degree(self) -> int:
        """The largest degree k."""
        return int(self.a.size)

    def __call__(self, z: np.ndarray, degree: int | None = None) -> np.ndarray:
        """The values psi_0(z)..psi_degree(z), shape ``[n, degree + 1]``."""
        k = self.degree if degree is None else int(degree)
        t = (np.asarray(z, dtype=np.float64) - self.shift) / self.width
        out = np.empty((t.size, k + 1))
        out[:, 0] = 1.0
        prev = np.zeros(t.size)
        cur = out[:, 0]
        for j in range(k):
            nxt = ((t - self.a[j]) * cur - self.c[j] * prev) / self.b[j + 1]
            out[:, j + 1] = nxt
            prev, cur = cur, nxt
        return out

    def leading_coefficients(self) -> np.ndarray:
        """``[k + 1]``: the coefficient of z^j in psi_j (positive)."""
        lc = np.ones(self.degree + 1)
        for j in range(1, self.degree + 1):
            lc[j] = lc[j - 1] / (self.b[j] * self.width)
        return lc

    def monomial_matrix(self) -> np.ndarray:
        """``M [k + 1, k + 1]`` with psi_j(z) = sum_i M[i, j] z^i (upper triangular).

        Converting to monomials is as ill-conditioned as the monomial basis itself; it is used only to
        report coefficients, never to compute a value.
        """
        k = self.degree
        # Coefficients in t = (z - shift) / width first, then expand t^i in z.
        ct = np.zeros((k + 1, k + 1))
        ct[0, 0] = 1.0
        for j in range(k):
            nxt = np.zeros(k + 1)
            nxt[1:] += ct[:-1, j]
            nxt -= self.a[j] * ct[:, j]
            if j > 0:
                nxt -= self.c[j] * ct[:, j - 1]
            ct[:, j + 1] = nxt / self.b[j + 1]
        # t^i = sum_l C(i, l) z^l (-shift)^(i - l) / width^i
        conv = np.zeros((k + 1, k + 1))
        for i in range(k + 1):
            for ell in range(i + 1):
                conv[ell, i] = _binom(i, ell) * (-self.shift) ** (i - ell) / self.width**i
        return conv @ ct


def _binom(n: int, k: int) -> float:
    from math import comb

    return float(comb(n, k))


def stieltjes(
    z: np.ndarray, w: np.ndarray, degree: int, *, shift: float = 0.0, width: float = 1.0
) -> OrthoPoly:
    """Orthonormal polynomials up to ``degree`` under the discrete measure sum_i w_i delta_{z_i}.

    Args:
      z: ``[n]`` nodes.
      w: ``[n]`` non-negative weights (normalised here to total mass 1).
      degree: The largest degree k (needs at least k + 1 nodes of positive weight).
      shift: Centre of the recurrence variable.
      width: Scale of the recurrence variable.

    Returns:
      The recurrence.

    """
    w = np.asarray(w, dtype=np.float64)
    keep = w > 0
    t = (np.asarray(z, dtype=np.float64)[keep] - shift) / width
    w = w[keep] / np.sum(w[keep])
    a = np.zeros(degree)
    b = np.ones(degree + 1)
    c = np.zeros(degree)
    prev = np.zeros(t.size)
    cur = np.ones(t.size)
    for j in range(degree):
        r = t * cur
        for _ in range(2):
            da = float(np.sum(w * r * cur))
            dc = float(np.sum(w * r * prev)) if j > 0 else 0.0
            a[j] += da
            c[j] += dc
            r = r - da * cur - dc * prev
        b[j + 1] = float(np.sqrt(np.sum(w * r * r)))
        if not b[j + 1] > 0.0:
            raise ValueError(f"the reference measure supports no polynomial of degree {j + 1}")
        prev, cur = cur, r / b[j + 1]
    return OrthoPoly(a, b, c, float(shift), float(width))


def gram_error(poly: OrthoPoly, z: np.ndarray, w: np.ndarray, degree: int | None = None) -> float:
    """The largest entry of |G - I|, G the Gram matrix of psi_0..psi_degree under sum_i w_i delta_z_i."""
    w = np.asarray(w, dtype=np.float64)
    w = w / np.sum(w)
    vals = poly(z, degree)
    gram = (vals * w[:, None]).T @ vals
    return float(np.max(np.abs(gram - np.eye(gram.shape[0]))))
