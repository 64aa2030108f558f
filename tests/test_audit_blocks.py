"""An audit's row-wise functions evaluated by blocks of rows give the whole-matrix numbers exactly.

A training audit at 10^7 runs computes its feature groups, its learned critic's input and logit and
the standardisation of that input a block of rows at a time (cbdp_jax/_src/mechanism_auditor/blocks.py),
so that it never holds float64 copies of the whole release. The claim is exact equality (bytes), so
every comparison here is ``array_equal`` with the same dtype: no tolerance, no Monte Carlo error.
Block sizes are chosen smaller than n and not dividing it, so blocks really split and the last one
is ragged (the remainder joins the last full block: blocks.spans).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from cbdp_jax._src.mechanism_auditor import blocks
from cbdp_jax._src.mechanism_auditor import hockey_stick as hs
from cbdp_jax._src.training_auditor.critics import release_groups
from cbdp_jax._src.training_auditor.release import ReleaseLayout


def _layout(kind: str = "updates", steps: int = 16) -> ReleaseLayout:
    roles = ("canary", "twin", "twin", "moved", "moved")
    return ReleaseLayout(kind, tuple(range(len(roles))), roles, steps if kind == "updates" else 1)


def _release(n: int, layout: ReleaseLayout, seed: int = 0) -> np.ndarray:
    """Float32 rows ``[score, release]`` as a run records them, with exact zeros and repeats."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 1 + layout.steps * layout.width)).astype(np.float32)
    x[rng.random(x.shape) < 0.1] = 0.0  # the 'exact' group counts exact zeros
    x[::7, 1:] = x[::7, 1:2]  # rows whose coordinates repeat (differences exactly 0)
    return x


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("n, rows", [(1000, 64), (1025, 128), (300, 8)])
@pytest.mark.parametrize("kind", ["updates", "final"])
def test_every_feature_group_by_blocks_equals_the_whole_matrix(n, rows, kind):
    layout = _layout(kind)
    x = _release(n, layout)
    groups = release_groups(layout, "llr")
    assert {g.name for g in groups} >= {"score", "learned"}
    for g in groups:
        whole = np.asarray(g.features(x))
        assert _same(blocks.in_blocks(g.features, x, rows=rows), whole), g.name


def test_the_learned_logit_and_its_standardisation_by_blocks_equal_the_whole_matrix(monkeypatch):
    layout = _layout()
    learned = next(g for g in release_groups(layout, "llr") if g.learned)
    xp, xq = _release(2003, layout, 1), _release(2003, layout, 2)
    fp, fq = learned.features(xp), learned.features(xq)
    # the standardisation: numpy's mean and std of the two samples' features stacked
    both = np.concatenate([fp, fq])
    mean, std = blocks.mean_std(xp, xq, features=learned.features, rows=256)
    assert _same(mean, both.mean(0)) and _same(std, both.std(0))
    # the logit fitted on the features computed whole (as before) and by blocks (as now)
    key = jax.random.key(3)
    g_whole, _ = hs.fit_logit(key, fp, fq, "mlp", width=8, depth=1, steps=5, batch=256)
    monkeypatch.setattr(blocks, "ROWS", 200)  # 2003 rows: 9 blocks of 200 and one of 203
    g_rows, _ = hs.fit_logit(
        key, xp, xq, "mlp", width=8, depth=1, steps=5, batch=256, features=learned.features
    )
    by_rows = g_rows(xp)
    monkeypatch.setattr(blocks, "ROWS", 1 << 20)
    assert _same(by_rows, g_whole(fp)) and _same(g_rows(xq), g_whole(fq))


def test_mean_std_equals_numpy_in_float32_and_float64():
    rng = np.random.default_rng(4)
    for dtype in (np.float32, np.float64):
        a = (rng.normal(size=(1001, 7)) * 10.0 ** rng.integers(-3, 4, size=7)).astype(dtype)
        b = rng.normal(size=(513, 7)).astype(dtype) + 3.0
        both = np.concatenate([a, b])
        mean, std = blocks.mean_std(a, b, rows=64)
        assert _same(mean, both.mean(0)) and _same(std, both.std(0)), dtype


def test_a_function_that_is_not_row_wise_is_caught():
    # negative controls: the equality above could fail. A feature that looks at other rows (here
    # the block's first row, as a block-boundary bug would) differs by blocks from the whole ...
    x = _release(1000, _layout())
    first_row = lambda b: b - b[:1]
    assert not _same(blocks.in_blocks(first_row, x, rows=64), first_row(x))
    # ... and one that returns another number of rows is refused by name
    with pytest.raises(ValueError, match="not row-wise"):
        blocks.in_blocks(lambda b: b[:-1], x, rows=64)
    with pytest.raises(ValueError, match="multiple of 8"):
        next(blocks.spans(100, rows=100))
    sizes = [s.stop - s.start for s in blocks.spans(2003, rows=200)]
    assert sizes == [200] * 9 + [203] and [len(range(5)[s]) for s in blocks.spans(5, 8)] == [5]


def _issue_mechanism():
    """What the size check reads of the mechanism of ``cbdp audit-training --data synthetic
    --examples 63 --sampler poisson --rate 0.125 --steps 16 --noise 0.5``: 16 steps of 5
    coordinates (the canary, two twins, two moved), 81 values a run (nothing is built or traced)."""
    from types import SimpleNamespace

    groups = release_groups(_layout(), "llr")
    return SimpleNamespace(problem=None, sample_noun="runs", feature_groups=groups,
                           output_dim=lambda dataset: 81)  # fmt: skip


def test_the_size_check_allows_ten_million_runs_on_this_machine_and_refuses_more(monkeypatch):
    from cbdp_jax import training_audit as ta
    from cbdp_jax._src.infra import sizes
    from cbdp_jax._src.infra.validation import InvalidParameterError
    from cbdp_jax._src.mechanism_auditor.audit import _check_memory, _learned_inputs

    mech = _issue_mechanism()
    dim = mech.output_dim([1.0])
    assert dim == 81 and _learned_inputs(mech.feature_groups, dim) == 65
    # the model (infra/sizes.py): at 10^7 runs per side the larger phase is certifying
    drawing, certifying = 12 * 81 * 10**7, (8 * 81 + 234 + sizes.TRAINING_BYTES_PER_RUN) * 10**7
    assert sizes.training_audit_bytes(10**7, 81, 65) == max(drawing, certifying)
    assert sizes.training_audit_bytes(10**7, 81, 65) < 14 * 2**30
    # the issue's machine: 22.7 GiB available; 10^7 runs per side pass, 2 x 10^7 are refused
    monkeypatch.setattr(sizes, "available_bytes", lambda **_: int(22.7 * 2**30))
    _check_memory(mech, ([1.0], [0.0]), None, ta.training_audit_config(4.0, samples=10**7))
    with pytest.raises(
        InvalidParameterError,
        match=r"samples=20000000 is invalid: 20000000 runs per side \(81 values each\) need about "
        r".* GiB of memory and 22.7 GiB is available .*--critics score",
    ):
        _check_memory(mech, ([1.0], [0.0]), None, ta.training_audit_config(4.0, samples=2 * 10**7))
    # the way out it names: the score alone (one float64 value a run, no learned critic) fits
    assert _learned_inputs((mech.feature_groups[0],), dim) == 0
    sizes.check_memory_for_audit(2 * 10**7, 100, 1, "runs")
