"""Exact restricted and unrestricted divergences for known noise laws (quadrature + a concave solver).

For a class H linear in its parameters, h_theta(x) = theta . phi~(x) with phi~ = (1, phi), the restricted
f-divergence is the supremum of a concave function of theta (docs/theory/mechanisms.md, last paragraph):

    D_f^H(P, Q) = sup_theta  E_P[h_theta] - E_Q[f*(h_theta)].

Both expectations are computed here by deterministic float64 quadrature (:mod:`quadrature`: composite
Gauss-Legendre split at the density kinks and at the roots of h, geometric tails), and the supremum by a
damped Newton method with backtracking line search written in JAX (``lax.while_loop``, ``jax.hessian``),
vmapped over several starting points and over a batch of problems (e.g. a grid of Renyi orders), keeping
the best start. The solver works with the tighter, equivalent forms of docs/theory/objectives.md:

* KL (H contains constants): the Donsker-Varadhan form  sup_u E_P[u.phi] - log E_Q[exp(u.phi)], concave;
  the optimal constant is then b = 1 - log E_Q[exp(u.phi)].
* alpha-divergence / Renyi (H is a cone): fixing the scale by E_P[h] = 1 (any h with E_P[h] > 0 can be
  rescaled), the scale-free form becomes  D_R^H = -log min_u E_Q[|1 + u.(phi - E_P phi)|^A],
  A = alpha / (alpha - 1): a *convex* minimisation (|.|^A is convex, h is affine in u), unlike the
  scale-free form itself. The scale t* of the plain f-form is then closed form
  (``divergences.alpha_optimal_scale``).
* Pearson chi^2, squared Hellinger, Jensen-Shannon: the plain f-form (concave).

The reported ``value`` is the solver's tight form at the optimum, evaluated on normalised quadrature
weights with log1p / expm1 (so values down to ~1e-7 keep ~1e-13 relative accuracy); ``f_value`` is the
plain f-form E_P[h*] - E_Q[f*(h*)] with the project's :class:`~cbdp_jax.divergences.Divergence`
conjugate at the same h*. They agree at the optimum (tested).

Polynomial (and 1-D linear) classes are parametrised by polynomials orthonormal under (P + Q) / 2, rebuilt
between rounds under the Hessian's weight for the alpha family, solved degree by degree, and certified:
a Newton decrement below ``GAP_TOL``, monotonicity in the degree, and the quadrature checks. Degrees above
``DEGREE_LIMITS`` are refused, and (``strict``) so is a value that fails its certificate; the Gaussian KL
is exact by structure at every degree. See docs/theory/exact_solver.md. The Poisson-subsampled Gaussian
pair (both directions) is a family here too (docs/theory/subsampled_gaussian.md).

Domains (where E_Q[f*(h)] is finite). Only KL has an unbounded-above conjugate that grows faster than
every polynomial, so only KL needs care: E_Q[exp(h)] is finite iff
  - Laplace, linear h = a x + b: |a| < eps (per unit scale: |u| < 1 in standardised units);
  - polynomial of degree k: an odd leading coefficient of degree >= 3 must be 0 (so poly_k KL for odd
    k >= 3 equals poly_{k-1} KL: the solver fixes that coefficient to 0 and reports it as 0), and an even
    leading coefficient must be < 0 (Gaussian degree 2: < 1 / (2 s^2));
  - a user feature map: assumed finite (true for bounded features such as random Fourier features).
The domain is open and the objective tends to -inf at its boundary, so the Newton iterates are kept
inside by rejecting infeasible trial points in the line search (no barrier needed). For Renyi / alpha
every polynomial has finite moments under both noise laws, so no constraint arises. For total variation,
squared Hellinger and Jensen-Shannon f* is +inf above a finite level, so no non-constant polynomial h on R
is admissible and the restricted value is 0 (docs/theory/mechanisms.md: degenerate); for a user feature map the
level constraint is enforced on every quadrature node.

Supported shapes: 1-D pairs with any adversary; d-dimensional pairs (independent coordinates) with the
linear class: KL and chi^2 decompose into a sum over coordinates; Renyi does not decompose -- Gaussian
pairs reduce exactly to 1-D with sensitivity ||v||_2 (rotation invariance), Laplace pairs are solved by
nested 2-D quadrature when at most two coordinates have a non-zero shift (zero-shift coordinates can be
dropped: by reflection symmetry and convexity their optimal coefficient is 0); more raise.

References:
  Chaudhuri, Imola, Machanavajjhala, "Capacity Bounded Differential Privacy", NeurIPS 2019: eq. (1)-(4),
  Lemma 1, Lemma 2, Table 1, Figures 1-2. docs/theory/divergences.md, objectives.md, capacity_bounded_dp.md and mechanisms.md.

One concept per file:

- :mod:`.pairs`: the noise families and the pair constructors (:class:`~.pairs.NoisePair`,
  :func:`~.pairs.laplace_pair`, ..., :func:`~.pairs.output_laws`); :mod:`.laws`: a 1-D pair's two laws
  in standardised units.
- :mod:`.inputs`: the public inputs checked and parsed; :mod:`.limits`: the certified degree limits.
- :mod:`.grids`: the quadrature geometries (1-D, nested 2-D Laplace) and the features on their nodes.
- :mod:`.problems`: the solver's problems built from the inputs; :mod:`.basis`: the orthonormal
  polynomial bases of the polynomial classes.
- :mod:`.solver`: the batched damped Newton solver in JAX and the grid-refinement rounds;
  :mod:`.certificate`: the value at the optimum and its certificate.
- :mod:`.degrees`: polynomial classes solved degree by degree, certified monotone in the degree;
  :mod:`.structural`: values fixed without a solve.
- :mod:`.restricted` and :mod:`.unrestricted`: the public entry points; :mod:`.result`:
  :class:`~.result.ExactResult`; :mod:`.float64`: the x64 scope and float64 helpers.

The public names are re-exported here, and from here by :mod:`cbdp_jax.exact` (code inside ``_src``
imports what it needs from the file that defines it).

"""

from cbdp_jax._src.exact.certificate import GAP_TOL as GAP_TOL
from cbdp_jax._src.exact.inputs import ADVERSARIES as ADVERSARIES
from cbdp_jax._src.exact.limits import DEGREE_LIMITS as DEGREE_LIMITS
from cbdp_jax._src.exact.limits import degree_limit as degree_limit
from cbdp_jax._src.exact.pairs import DIRECTIONS as DIRECTIONS
from cbdp_jax._src.exact.pairs import FAMILIES as FAMILIES
from cbdp_jax._src.exact.pairs import NoisePair as NoisePair
from cbdp_jax._src.exact.pairs import gaussian_pair as gaussian_pair
from cbdp_jax._src.exact.pairs import laplace_pair as laplace_pair
from cbdp_jax._src.exact.pairs import noise_pair_from as noise_pair_from
from cbdp_jax._src.exact.pairs import output_laws as output_laws
from cbdp_jax._src.exact.pairs import point_mass_pair as point_mass_pair
from cbdp_jax._src.exact.pairs import subsampled_gaussian_pair as subsampled_gaussian_pair
from cbdp_jax._src.exact.restricted import restricted_divergence as restricted_divergence
from cbdp_jax._src.exact.restricted import (
    restricted_divergence_curve as restricted_divergence_curve,
)
from cbdp_jax._src.exact.restricted import (
    restricted_divergence_degrees as restricted_divergence_degrees,
)
from cbdp_jax._src.exact.result import ExactResult as ExactResult
from cbdp_jax._src.exact.unrestricted import unrestricted_divergence as unrestricted_divergence
