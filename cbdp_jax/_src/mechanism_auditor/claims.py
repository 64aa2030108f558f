"""Privacy claims: their text, the parsed :class:`Claim`, and a capacity claim's architecture.

``pure:EPS``, ``approx:EPS:DELTA``, ``renyi:ALPHA:EPS``, ``capacity:CLASS:DIV[:ALPHA]:VALUE`` and
``dpsgd:...`` (:func:`parse_claim`); what an (epsilon, delta) claim allows at every eps is the
randomized response's curve (:meth:`Claim.claimed_delta`).
"""

from __future__ import annotations

import math
import re
from typing import Any, NamedTuple

from cbdp_jax._src.infra.validation import InvalidParameterError, check_choice
from cbdp_jax._src.mechanism_auditor.epsilon import rr_delta

CLAIM_KINDS = ("pure", "approx", "renyi", "capacity", "dpsgd")


class Claim(NamedTuple):
    """A privacy claim.

    Attributes:
      kind: ``'pure'``, ``'approx'``, ``'renyi'`` or ``'capacity'``.
      epsilon: eps of a pure / approximate / Renyi claim.
      delta: delta of an approximate claim (0 for pure).
      alpha: The Renyi order (renyi, or a capacity claim on the Renyi divergence).
      adversary: The class of a capacity claim (``linear``, ``poly``, ``mlp``).
      divergence: The divergence of a capacity claim (``kl`` or ``renyi``).
      value: The claimed value of a capacity claim.
      text: The claim as written.
      source: For a ``dpsgd:`` claim, the run's parameters and the accountant
        (:class:`~cbdp_jax._src.privacy.accounting.DpsgdClaim`); the claim itself is the approximate one
        they imply.
      architecture: For a capacity claim, the class's architecture as audited (``'mlp(32x2)'``,
        ``'poly(3)'``, ``'linear'``).
      architecture_default: Whether the claim named only the family, so that the architecture is
        the default one (:data:`DEFAULT_ARCHITECTURES`).

    """

    kind: str
    epsilon: float = math.nan
    delta: float = 0.0
    alpha: float | None = None
    adversary: str | None = None
    divergence: str | None = None
    value: float = math.nan
    text: str = ""
    source: Any = None
    architecture: str | None = None
    architecture_default: bool = False

    def claimed_delta(self, eps: float) -> float:
        """delta(eps) implied by an (epsilon, delta) claim: the (epsilon, delta) randomized response's.

        Every (epsilon, delta)-DP mechanism is dominated by the (epsilon, delta) randomized response
        (Kairouz, Oh, Viswanath 2015, Theorem 2.1), so its hockey-stick curve bounds theirs:
        delta + (1 - delta) (max(0, e^epsilon - e^eps) + max(0, 1 - e^(epsilon + eps))) /
        (1 + e^epsilon). The second term is 0 for eps >= -epsilon (every grid of an audit).

        A ``dpsgd:`` claim is the accountant's whole curve: the run claims (eps, delta(eps))-DP at
        every eps, so the smaller of the two is claimed.

        References:
          Kairouz, Oh, Viswanath 2015, "The composition theorem for differential privacy".

        """
        implied = rr_delta(self.epsilon, self.delta, eps)
        if hasattr(self.source, "delta_at"):
            return min(implied, self.source.delta_at(eps))
        return implied


def _num(text: str, name: str, claim: str) -> float:
    try:
        x = float(text)
    except ValueError:
        x = math.nan
    if not math.isfinite(x):
        raise InvalidParameterError(f"claim={claim!r} is invalid: {name}={text!r} must be a number")
    return x


def parse_claim(text: str) -> Claim:
    """A claim from its text: one of the forms below.

    ``pure:EPS``, ``approx:EPS:DELTA``, ``renyi:ALPHA:EPS``, ``capacity:CLASS:DIV[:ALPHA]:VALUE`` or
    ``dpsgd:noise=S,rate=Q,steps=T,delta=D[,sampling=...][,relation=...][,accountant=...]``. A
    ``dpsgd:`` claim is the approximate claim (epsilon, delta) the run's accountant gives
    (:mod:`cbdp_jax._src.privacy.accounting`, dp_accounting's PLD accountant by default, under the
    add-remove relation unless it names another). A capacity claim's CLASS names the architecture
    audited, ``mlp(64x3)`` (width x depth), ``poly(3)`` (degree) or ``linear``; a family alone
    (``mlp``) is its default architecture (:data:`DEFAULT_ARCHITECTURES`), which the result states.

    Raises:
      InvalidParameterError: Naming ``claim``, the forms allowed and the part that is out of range.

    """
    forms = (
        "pure:EPS, approx:EPS:DELTA, renyi:ALPHA:EPS, capacity:CLASS:kl:VALUE (CLASS e.g. "
        "mlp(64x3)) or dpsgd:noise=S,rate=Q,steps=T,delta=D"
    )
    parts = str(text).split(":")
    kind = parts[0]
    if kind not in CLAIM_KINDS:
        raise InvalidParameterError(f"claim={text!r} is invalid: must be {forms}")
    if kind == "dpsgd":
        from cbdp_jax._src.privacy.accounting import parse_dpsgd

        run = parse_dpsgd(str(text))
        return Claim("approx", run.epsilon, run.delta, text=str(text), source=run)
    sizes = {"pure": (2,), "approx": (3,), "renyi": (3,), "capacity": (4, 5)}
    if len(parts) not in sizes[kind]:
        raise InvalidParameterError(f"claim={text!r} is invalid: must be {forms}")
    if kind == "pure":
        eps = _num(parts[1], "EPS", text)
        if eps < 0:
            raise InvalidParameterError(f"claim={text!r} is invalid: EPS must be >= 0")
        return Claim("pure", eps, 0.0, text=text)
    if kind == "approx":
        eps, delta = _num(parts[1], "EPS", text), _num(parts[2], "DELTA", text)
        if eps < 0 or not 0 <= delta < 1:
            raise InvalidParameterError(
                f"claim={text!r} is invalid: EPS must be >= 0 and DELTA in [0, 1)"
            )
        return Claim("approx", eps, delta, text=text)
    if kind == "renyi":
        alpha, eps = _num(parts[1], "ALPHA", text), _num(parts[2], "EPS", text)
        if alpha <= 1 or eps < 0:
            raise InvalidParameterError(
                f"claim={text!r} is invalid: ALPHA must be > 1 and EPS >= 0"
            )
        return Claim("renyi", eps, alpha=alpha, text=text)
    family, arch, defaulted = parse_architecture(parts[1], text)
    divergence = parts[2]
    check_choice("claim divergence", divergence, ("kl", "renyi"))
    alpha = _num(parts[3], "ALPHA", text) if len(parts) == 5 else None
    if (divergence == "renyi") != (alpha is not None) or (alpha is not None and alpha <= 1):
        raise InvalidParameterError(
            f"claim={text!r} is invalid: renyi needs capacity:CLASS:renyi:ALPHA:VALUE, ALPHA > 1"
        )
    return Claim(
        "capacity", alpha=alpha, adversary=family, divergence=divergence,
        value=_num(parts[-1], "VALUE", text), text=text, architecture=arch,
        architecture_default=defaulted,
    )  # fmt: skip


# A capacity claim's class: the family and its architecture (the default when only the family is named)
DEFAULT_ARCHITECTURES = {
    "linear": "linear",
    "poly": "poly(3)",
    "mlp": "mlp(32x2)",
    "bounded-mlp": "bounded-mlp(32x2)",
}
_ARCH = re.compile(r"^(linear|poly|mlp|bounded-mlp)(?:\((?:(\d+)x(\d+)|(\d+))\))?$")


def parse_architecture(name: str, claim: str = "") -> tuple[str, str, bool]:
    """``'mlp(64x3)'`` -> ``('mlp', 'mlp(64x3)', False)``; ``'mlp'`` -> ``('mlp', 'mlp(32x2)', True)``.

    ``mlp(WxD)`` and ``bounded-mlp(WxD)`` are width W and depth D; ``poly(K)`` is degree K.

    Raises:
      InvalidParameterError: For an unknown family or an architecture that does not fit it.

    """
    m = _ARCH.match(str(name).strip())
    families = tuple(DEFAULT_ARCHITECTURES)
    if m is None:
        family = str(name).split("(")[0]
        check_choice("claim class", family, families)
        raise InvalidParameterError(
            f"claim={claim!r} is invalid: class {name!r} must be linear, poly or poly(K), mlp or "
            "mlp(WIDTHxDEPTH), bounded-mlp or bounded-mlp(WIDTHxDEPTH), e.g. mlp(64x3)"
        )
    family, width, depth, degree = m.groups()
    if width is None and degree is None:
        return family, DEFAULT_ARCHITECTURES[family], family != "linear"
    fits = (family in ("mlp", "bounded-mlp") and width is not None) or (
        family == "poly" and degree is not None
    )
    sizes = [int(v) for v in (width, depth, degree) if v is not None]
    if not fits or min(sizes) < 1:
        raise InvalidParameterError(
            f"claim={claim!r} is invalid: class {name!r}: mlp and bounded-mlp take (WIDTHxDEPTH), "
            "poly takes (DEGREE), linear takes none; every size >= 1"
        )
    return family, f"{family}({width}x{depth})" if degree is None else f"poly({degree})", False


def architecture_kwargs(architecture: str) -> dict:
    """The estimator's keyword arguments for a parsed architecture (``'mlp(64x3)'``, ``'poly(3)'``)."""
    family, _, _ = parse_architecture(architecture)
    m = _ARCH.match(architecture)
    _, width, depth, degree = m.groups()
    if family == "linear":
        return {"adversary": "linear"}
    if family == "poly":
        return {"adversary": "poly", "degree": int(degree or 3)}
    out = {"adversary": "mlp", "width": int(width or 32), "depth": int(depth or 2)}
    return out | ({"bound": 2.0} if family == "bounded-mlp" else {})
