"""``cbdp audit``: a mechanism's privacy claim checked on a searched or given pair, or the suite."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Annotated

import typer

from cbdp_jax._src.infra.display import NOTHING, NOTHING_MEANS, certified_text
from cbdp_jax._src.infra.progress import Progress
from cbdp_jax._src.infra.validation import InvalidParameterError, check_choice, check_output_folder
from cbdp_jax.cli._common import FORMATS, _echo_wrapped, progress_hook


def audit_cmd(
    mechanism: Annotated[
        str | None,
        typer.Argument(
            help="FILE.py:FUNCTION or MODULE:FUNCTION; the function takes (key or numpy "
            "Generator, dataset, n) and returns n outputs"
        ),
    ] = None,
    claim: Annotated[
        str | None,
        typer.Option(help="the claim to check; its forms are listed above"),
    ] = None,
    d: Annotated[str | None, typer.Option("--d", help="dataset D as JSON, e.g. [0,1,1]")] = None,
    d_prime: Annotated[str | None, typer.Option("--d-prime", help="neighbour D' as JSON")] = None,
    relation: Annotated[
        str | None,
        typer.Option(
            help="with --d: the neighbouring relation D and D' must satisfy, checked before any "
            "work: replace-one (default; one record differs), zero-out, add-remove (one record "
            "added), or any (no check)"
        ),
    ] = None,
    space: Annotated[
        str | None,
        typer.Option(
            help='dataset space to search as JSON: {"shape": [5], "low": 0, "high": 1, '
            '"integer": false, "relation": "replace-one" | "zero-out" | "linf", "radius": 1}'
        ),
    ] = None,
    pairs: Annotated[
        str | None,
        typer.Option(help="FILE.py:FUNCTION returning candidate pairs (D, D') to screen"),
    ] = None,
    samples: Annotated[
        int, typer.Option(help="fresh certification samples per side for the chosen pair")
    ] = 1_000_000,
    screen_samples: Annotated[
        int, typer.Option(help="samples per side per screened pair")
    ] = 20_000,
    random_pairs: Annotated[int, typer.Option(help="random candidates from --space")] = 12,
    local_steps: Annotated[int, typer.Option(help="local-search moves from the best")] = 12,
    gradient_steps: Annotated[
        int,
        typer.Option(help="then gradient ascent on the datasets (differentiable JAX mechanisms)"),
    ] = 0,
    classes: Annotated[
        str,
        typer.Option(
            help="critic classes, comma-separated: halfspace, linear, poly, mlp, histogram, "
            "bounded-mlp"
        ),
    ] = "linear,poly,mlp,histogram",
    confidence: Annotated[float, typer.Option(help="family-wise level")] = 0.95,
    suite: Annotated[
        bool,
        typer.Option("--suite", help="audit the built-in suite of flawed and correct mechanisms"),
    ] = False,
    seed: Annotated[int, typer.Option(help="PRNG seed")] = 0,
    output_format: Annotated[str, typer.Option("--format", help="table or json")] = "table",
    out: Annotated[Path | None, typer.Option(help="folder for audit.json and report.png")] = None,
) -> None:
    """Audit a mechanism's privacy claim: search a worst pair, certify it on fresh samples.

    A violation is reported only when a certified (family-wise) lower bound exceeds the claim;
    otherwise the strongest certified bound and what the audit could have detected. Pure and
    approximate claims also report the empirical epsilon (the largest eps the certified curve
    refutes) and GDP mu. A capacity claim on class H is checked only with bounds on H itself.

    Claims (--claim): pure:EPS (pure eps-DP), approx:EPS:DELTA ((eps, delta)-DP), renyi:ALPHA:EPS
    (Renyi DP of order ALPHA), capacity:CLASS:kl:VALUE or capacity:CLASS:renyi:ALPHA:VALUE (the
    restricted divergence of CLASS = linear, poly, mlp or bounded-mlp is at most VALUE).

    DP-SGD claims: dpsgd:noise=S,rate=Q,steps=T,delta=D, optionally followed by ,sampling=poisson (or
    shuffle, or fixed): the (eps, delta) the run's accountant reports (dp_accounting's PLD accountant,
    Poisson-subsampled Gaussian).

    Exit status: 0 when no violation is certified, 1 when a violation is certified, 2 for bad input.
    """
    from cbdp_jax import audit as au
    from cbdp_jax._src.infra.io import to_json

    check_choice("format", output_format, FORMATS)
    if out is not None:
        check_output_folder("out", out)
    config = au.AuditConfig(
        samples=samples, screen_samples=screen_samples, random_pairs=random_pairs,
        local_steps=local_steps, classes=_parse_classes(classes), confidence=confidence,
        gradient_steps=gradient_steps,
    )  # fmt: skip
    if suite:
        from cbdp_jax._src.infra.sizes import check_memory_for_audit

        check_memory_for_audit(samples, screen_samples, 1)  # before the table's header
        return _audit_suite(config, seed, output_format, out)
    result = _audit_one(mechanism, claim, (d, d_prime, space, pairs, relation), config, seed)
    _emit_audit(result, output_format, out)
    if output_format == "json":
        typer.echo(to_json(result.to_dict()))
    if result.violation:
        raise typer.Exit(1)  # a script can tell: 1 = violation certified (0 = none, 2 = bad input)


def _audit_one(mechanism, claim, where, config, seed):
    """Audits one user mechanism: checks the arguments, finds or takes the pair, certifies."""
    import jax

    from cbdp_jax import audit as au

    if mechanism is None:
        raise InvalidParameterError(
            "mechanism=None is invalid: give FILE.py:FUNCTION or MODULE:FUNCTION, or --suite"
        )
    if claim is None:
        raise InvalidParameterError("claim=None is invalid: must be given, e.g. --claim pure:1")
    parsed = au.parse_claim(claim)
    mech = au.load_mechanism(mechanism)
    pair, space_obj, candidates = _audit_pairs(*where)
    with Progress("cbdp audit", unit="samples") as bar:
        return au.audit(
            jax.random.key(seed), mech, parsed, pair=pair, space=space_obj, candidates=candidates,
            config=config, **progress_hook(au.audit, bar),
        )  # fmt: skip


def _parse_classes(text: str) -> tuple[str, ...]:
    names = tuple(c.strip() for c in text.split(",") if c.strip())
    allowed = ("linear", "halfspace", "poly", "mlp", "histogram", "bounded-mlp")
    for name in names or ("",):
        check_choice("classes", name, allowed)
    return names


def _audit_pairs(d, d_prime, space, pairs, relation=None):
    """The given pair (checked against ``relation``), or the space and candidates to search."""
    from cbdp_jax import audit as au
    from cbdp_jax._src.mechanism_auditor.loading import load_mechanism, parse_dataset
    from cbdp_jax._src.privacy.neighbours import check_pair

    if (d is None) != (d_prime is None):
        missing = "d_prime" if d_prime is None else "d"
        raise InvalidParameterError(f"{missing}=None is invalid: --d and --d-prime go together")
    if d is not None:
        pair = (parse_dataset("d", d), parse_dataset("d_prime", d_prime))
        check_pair(*pair, "replace-one" if relation is None else relation)
        return pair, None, None
    if relation is not None:
        raise InvalidParameterError(
            f"relation={relation!r} is invalid without --d and --d-prime: a searched space names "
            'its relation in --space ("relation": ...), and --pairs candidates are taken as given'
        )
    space_obj = None
    if space is not None:
        try:
            spec = json.loads(space)
            missing = [k for k in ("shape", "low", "high") if k not in spec]
            if missing:
                raise InvalidParameterError(
                    f"space={space!r} is invalid: must give {', '.join(missing)} (the datasets' "
                    "shape and the range [low, high] of their entries; no range is assumed)"
                )
            space_obj = au.DatasetSpace(**spec)
        except (json.JSONDecodeError, TypeError, AttributeError) as exc:
            raise InvalidParameterError(
                f"space={space!r} is invalid: must be a JSON object with keys shape, low, high, "
                f"integer, relation, radius ({exc})"
            ) from exc
    candidates = None
    if pairs is not None:
        gen = load_mechanism(pairs).fn
        try:
            candidates = [tuple(c) for c in gen()]
        except Exception as exc:  # noqa: BLE001 - report against the generator
            raise InvalidParameterError(
                f"pairs={pairs!r} is invalid: calling it failed or did not give pairs ({exc})"
            ) from exc
        if not candidates or any(len(c) != 2 for c in candidates):
            raise InvalidParameterError(
                f"pairs={pairs!r} is invalid: must return a non-empty iterable of (D, D') pairs"
            )
    if space_obj is None and candidates is None:
        raise InvalidParameterError(
            "d=None is invalid: give --d and --d-prime, or --space / --pairs to search"
        )
    return None, space_obj, candidates


def _emit_audit(result, output_format: str, out: Path | None, pair: str | None = None) -> None:
    """Writes ``--out`` and prints the audit; ``pair`` says what D and D' are (else their values)."""
    if out is not None:
        from cbdp_jax._src.mechanism_auditor.report import write_report

        write_report(result, Path(out))
    if output_format == "json":
        return
    _echo_wrapped(f"cbdp audit: {result.mechanism}, claim {result.claim}")
    _echo_wrapped(
        f"pair: {pair}"
        if pair
        else f"pair: D = {_rounded(result.pair[0])}, D' = {_rounded(result.pair[1])}"
    )
    typer.echo(f"{'class':<22} {'dir':<5} {result.grid_name:>8} {'claimed':>10} {'certified':>10}")
    for r in result.rows:
        typer.echo(
            f"{r.critic[:22]:<22} {r.direction:<5} {r.grid:>8.3g} {r.claimed:>10.4g} "
            f"{certified_text(r.lower_bound):>10}" + ("  VIOLATION" if r.violation else "")
        )
    notes = dict.fromkeys(r.note for r in result.rows if r.note)
    for note in notes:
        _echo_wrapped(f"note: {note}")
    if any(not r.lower_bound > 0 for r in result.rows):
        _echo_wrapped(f"certified {NOTHING}: {NOTHING_MEANS}")
    _echo_wrapped(result.verdict)


def _rounded(x) -> list:
    import numpy as np

    return np.round(np.asarray(x, np.float64), 3).tolist()


def _audit_suite(config, seed: int, output_format: str, out: Path | None) -> None:
    """Audits every suite case, one row each (80 columns), with a count and an ETA on a terminal."""
    import jax

    from cbdp_jax import audit as au
    from cbdp_jax._src.infra.io import to_json
    from cbdp_jax._src.mechanism_auditor.suite import SUITE, as_arrays

    records = []
    with Progress("cbdp audit --suite", total=len(SUITE), unit="cases") as bar:
        if output_format == "table":
            bar.say(_SUITE_HEADER)
        for i, case in enumerate(SUITE):
            result = au.audit(
                jax.random.fold_in(jax.random.key(seed), i), au.load_mechanism(case.fn, case.name),
                case.claim, space=case.space, candidates=[as_arrays(case.paper_pair)],
                config=config,
            )  # fmt: skip
            rec = result.to_dict() | {
                "flawed": case.flawed,
                "beyond_sampling": case.beyond_sampling,
            }
            records.append(rec)
            if out is not None:
                _emit_audit(result, "json", Path(out) / case.name)
            if output_format == "table":
                for line in _suite_lines(case, result):
                    bar.say(line)
            bar.advance()
    if output_format == "json":
        typer.echo(to_json({"suite": records}))
    else:
        _echo_wrapped(_SUITE_LEGEND)


_SUITE_HEADER = (
    f"{'case':<27} {'flawed':<6} {'verdict':<9} {'certified':>9} {'claimed':>9} {'expected':>8} "
    f"{'s':>4}"
)
_SUITE_LEGEND = (
    "flawed: the literature shows the mechanism's claim false (else it is the correct twin). "
    "certified: the strongest certified lower bound (family-wise), beside the claimed value at the "
    "same point. expected: the verdict is what the case is there to show."
)


def _suite_lines(case, result) -> list[str]:
    """A suite case's row (at most 80 columns) and, where the outcome needs one, the reason."""
    best = result.strongest()
    verdict = "VIOLATION" if result.violation else "none"
    beyond = case.flawed and case.beyond_sampling and not result.violation
    expected = result.violation == case.flawed or beyond
    row = (
        f"{case.name[:27]:<27} {'yes' if case.flawed else 'no':<6} {verdict:<9} "
        f"{certified_text(best.lower_bound):>9} {best.claimed:>9.4g} {'yes' if expected else 'NO':>8} "
        f"{result.seconds:>4.0f}"
    )
    if beyond:
        why = "expected: the flaw is beyond what sampling can certify. " + case.description
    elif not expected and case.flawed:
        why = "a false claim the audit did not refute: " + case.description
    elif not expected:
        why = "a violation certified for a correct mechanism: " + case.description
    else:
        return [row]
    return [row, *textwrap.wrap(why, 78, initial_indent="  ", subsequent_indent="  ")]
