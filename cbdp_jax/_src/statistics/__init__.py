"""The statistics of held-out evaluation: every confidence bound the library reports comes from here.

One concept per file:

- :mod:`.moments`: count, mean, centred sum of squares, min and max of a sample, as a pytree that merges
  exactly across chunks, members and devices (Chan's parallel update).
- :mod:`.tails`: a streaming sketch of the largest deviations and Hill's estimate of the tail index,
  the check that an asymptotic (CLT) bound's finite-variance assumption is not visibly violated.
- :mod:`.betting`: finite-sample lower confidence bounds and sequences for the mean of a bounded
  variable by betting (Waudby-Smith and Ramdas 2023): anytime-valid, usable with early stopping.
- :mod:`.berry_esseen`: a fixed-n finite-sample lower bound from the Berry-Esseen inequality with
  explicit constant and finite-sample bounds on the second and third moments; nearly as tight as the
  CLT at large n.
- :mod:`.binomial`: exact (Clopper-Pearson) bounds on a probability from a count, for indicator
  critics and tail sets (the training audit).
- :mod:`.selection`: exact order statistics and the median inside compiled programs, by bisection on
  the values' bit patterns instead of a sort (the sweep's tail-sketch centres).
- :mod:`.held_out`: everything a held-out evaluation of one fixed critic records (moments, pair
  moments, tail sketches of both f-form terms), and the bound it certifies.
- :mod:`.bounds`: the :class:`~.bounds.Bound` record every result carries, the CLT bound, family-wise
  (Bonferroni) levels, the Renyi transform and the largest value n samples can certify.

The theory, in the project's own words, is in ``docs/theory/bounds.md``.
"""
