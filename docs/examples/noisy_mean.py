"""An example mechanism for `cbdp audit` (README, "Auditing a mechanism"): plain numpy, with a bug.

The mean of 10 values in [0, 2] released with Laplace noise. Changing one value moves the mean by up
to 2/10, so eps-DP needs noise of scale 0.2/eps; the code uses the sensitivity of values in [0, 1]
(0.1), so its noise is half what it should be: the mechanism is 2-DP and the claim pure:1 is false
(E_e = 1 - exp(-1/2) = 0.39 on the worst pair).
"""

import numpy as np


def noisy_mean(rng: np.random.Generator, dataset, n: int) -> np.ndarray:
    """Releases the mean of ``dataset`` plus Laplace noise n times (rng: a numpy Generator)."""
    values = np.asarray(dataset, dtype=float)
    sensitivity = 1.0 / len(values)  # BUG: assumes values in [0, 1]; they lie in [0, 2]
    return values.mean() + rng.laplace(0.0, sensitivity / 1.0, size=n)


def noisy_mean_fixed(rng: np.random.Generator, dataset, n: int) -> np.ndarray:
    """The same with the right sensitivity, 2 / len(dataset)."""
    values = np.asarray(dataset, dtype=float)
    return values.mean() + rng.laplace(0.0, 2.0 / len(values), size=n)
