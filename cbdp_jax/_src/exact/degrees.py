"""Polynomial classes solved degree by degree, each warm started and certified monotone in the degree."""

from __future__ import annotations

from typing import Any

import numpy as np

from cbdp_jax._src.exact.basis import _poly_basis, _reference_rule
from cbdp_jax._src.exact.inputs import _Adversary
from cbdp_jax._src.exact.laws import _Law1D
from cbdp_jax._src.exact.problems import _kind, _problem_1d
from cbdp_jax._src.exact.solver import _solve_problems

_MONOTONE_TOL = 1e-9  # value(k) >= value(k - 1) - tol * (1 + |value(k - 1)|) certifies monotonicity


def _degree_chain(kind: str, degree: int) -> list[int]:
    """The degrees solved, in order, for a polynomial class of ``degree``; the last is the answer.

    KL (``'dv'``) climbs 1, 2, 4, ..., k_eff by continuation (k_eff = k, or k - 1 for odd k >= 3,
    whose leading coefficient must be 0): each optimum, with a small negative top coefficient added,
    starts the next degree inside the domain of E_Q[exp h]. The other forms have no domain to stay in
    and solve k - 1 then k. Either way the last two entries give the monotonicity certificate.
    """
    if kind == "dv":
        k_eff = degree - 1 if degree >= 3 and degree % 2 == 1 else degree
        return [1, *range(2, k_eff + 1, 2)]
    return [degree - 1, degree] if degree >= 2 else [1]


def _degrees_chain(kind: str, max_degree: int) -> list[int]:
    """Every degree 1..max_degree, except that KL skips odd k >= 3 (poly_k = poly_(k-1) there)."""
    if kind == "dv":
        return [k for k in range(1, max_degree + 1) if k <= 2 or k % 2 == 0]
    return list(range(1, max_degree + 1))


def _transfer(law: _Law1D, sol: dict[str, Any], kind: str, degree: int, size: int) -> np.ndarray:
    """A lower degree's optimum as starting points of ``degree`` in the basis (P + Q) / 2 builds.

    The lower-degree h lies in the larger class, so its coefficients in the new orthonormal basis are
    its inner products with the new polynomials under (P + Q) / 2 (exact up to rounding). Returns
    ``[3, size]`` starts; for KL the new top coefficient must be negative, so three sizes of it are
    tried (the line search discards a start outside the numerical domain).
    """
    z, w = _reference_rule(law, degree)
    ref = sol["problem"].basis_ref
    old = ref.poly(z, ref.degree)
    u = sol["u"]
    if kind.startswith("renyi"):
        h = (old[:, 1:] - w @ old[:, 1:]) @ u  # h - 1, up to a constant
    elif kind == "dv":
        h = old[:, 1:] @ u
    else:
        h = old @ u
    new = _poly_basis(law, degree)(z, degree)
    coef = new.T @ (w * h)
    out = np.zeros((3, size))
    start = coef if kind == "fform" else coef[1:]
    out[:, : start.size] = start[:size]
    if kind == "dv" and ref.degree < degree:
        out[:, -1] = (-1e-3, -1e-6, -1e-9)
    return out


def _solve_1d(
    law: _Law1D,
    scale: float,
    name: str,
    adv: _Adversary,
    alphas: list[float | None],
    convention: str,
    n_starts: int,
    tol: float,
) -> list[dict[str, Any]]:
    """1-D problems (one per order); polynomial classes carry the degree certificate.

    A linear or polynomial class of degree k is solved along :func:`_degree_chain` (k - 1 then k; for
    KL 1, 2, 4, ..., k) by :func:`_solve_chain`, and the last entry is returned.
    """
    if adv.kind == "feature_map":
        probs = [_problem_1d(law, scale, name, adv, a, convention, n_starts) for a in alphas]
        sols = _solve_problems(probs, tol)
        for s in sols:
            s.update(monotone_checked=False, previous_value=None)
        return sols
    chain = _degree_chain(_kind(name, convention), adv.degree)
    chain[-1] = adv.degree  # KL with an odd k: the last step is poly_k itself (top coefficient 0)
    return _solve_chain(law, scale, name, chain, alphas, convention, n_starts, tol)[-1]


def _solve_chain(
    law: _Law1D,
    scale: float,
    name: str,
    chain: list[int],
    alphas: list[float | None],
    convention: str,
    n_starts: int,
    tol: float,
) -> list[list[dict[str, Any]]]:
    """Polynomial classes of the increasing degrees ``chain``, each warm started from the previous.

    Every entry is certified monotone against the one before it: value(k) >= value(previous) -
    tolerance (the classes nest, so a smaller value would prove the solve wrong); the first entry is
    compared with the constants (value 0) if it is degree 1, else with nothing it knows.
    """
    kind = _kind(name, convention)
    out: list[list[dict[str, Any]]] = []
    prev: list[dict[str, Any]] | None = None
    for e in chain:
        k = e - 1 if kind == "dv" and e >= 3 and e % 2 else e
        probs = []
        for i, a in enumerate(alphas):
            warm = None
            if prev is not None:
                warm = _transfer(law, prev[i], kind, k, k + (kind == "fform"))
            starts = max(n_starts, 4) if warm is not None else n_starts
            step = _Adversary("linear" if e == 1 else "poly", e, None)
            probs.append(_problem_1d(law, scale, name, step, a, convention, starts, None, warm))
        sols = _solve_problems(probs, tol)
        for i, s in enumerate(sols):
            if prev is not None:
                _certify_monotone(s, prev[i]["value"])
            elif e == 1:
                _certify_monotone(s, 0.0)
            else:
                s.update(monotone_checked=False, previous_value=None)
        out.append(sols)
        prev = sols
    return out


def _certify_monotone(sol: dict[str, Any], before: float) -> None:
    """Marks ``sol`` with the monotonicity certificate against the next smaller class's value."""
    slack = _MONOTONE_TOL * (1.0 + abs(before))
    sol["previous_value"] = before
    sol["monotone_checked"] = bool(sol["value"] >= before - slack)
    if not sol["monotone_checked"]:
        sol["converged"] = False
        sol["reason"] = (
            f"not certified: the value {sol['value']:.10g} lies below the previous degree's "
            f"{before:.10g} although the classes nest (the solve at this degree failed)"
        )
