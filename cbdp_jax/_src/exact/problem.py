"""One exact problem: a concave maximisation over a class's parameters, as the solver sees it.

:class:`_Problem` is built by :mod:`~cbdp_jax._src.exact.problems` from the public inputs, solved by
:mod:`~cbdp_jax._src.exact.solver` and certified by :mod:`~cbdp_jax._src.exact.certificate`; it sits
below all three, so none of them imports another through it (docs/theory/exact_solver.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from cbdp_jax._src.exact.float64 import _exp
from cbdp_jax._src.exact.grids import _Grid


@dataclasses.dataclass
class _Problem:
    """One concave maximisation, written as a convex minimisation F(u) for the solver.

    kind:
      'renyi_abs' / 'renyi_nonneg': F(u) = E_Q[|h|^A] (or h_+^A), h = 1 + u.(phi - E_P phi).
      'dv': F(u) = log E_Q[exp(u.phi)] - u.E_P[phi].
      'fform': F(theta) = -(E_P[theta.phi] - E_Q[f*(theta.phi)]), phi containing a constant column.
    """

    kind: str
    fname: str  # the divergence name ('renyi', 'alpha', 'kl', 'chi2', 'hellinger', 'js')
    alpha: float | None
    A: float
    convention: str
    geometry: Any
    lo: np.ndarray
    hi: np.ndarray
    starts: np.ndarray  # [S, m]
    to_theta: Callable[[np.ndarray], np.ndarray]  # standardised parameters -> original units
    # Polynomial classes: (u, grid) -> (u, grid) in a basis adapted to the objective at u.
    rebase: Callable[[np.ndarray, _Grid], tuple[np.ndarray, _Grid]] | None = None
    basis_ref: Any = None  # polynomial classes: the current basis (a _BasisRef)

    def mu_p(self, grid: _Grid) -> np.ndarray:
        return _exp(grid.lwp) @ grid.phi

    def solver_data(self, grid: _Grid) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        mu = self.mu_p(grid)
        if self.kind.startswith("renyi"):
            return grid.phi - mu[None, :], grid.lwq, mu
        return grid.phi, grid.lwq, mu
