"""The result file every tester's worker process writes for benchmarks/vs_dp_auditorium.py.

Standard library only: it is imported in our environment and in DP-Auditorium's (TensorFlow 2.15,
numpy < 2), so both tools report the same fields, measured the same way, and the benchmark's
summary (``_pair_row``) reads one schema.
"""

from __future__ import annotations

import json
import resource
from typing import Any


def write(
    path: str,
    *,
    tool: str,
    import_s: float,
    import_cpu_s: float,
    cold: dict[str, Any],
    warm: list[dict[str, Any]],
    settings: dict[str, Any],
    versions: dict[str, str],
    **extra: Any,
) -> None:
    """Writes the worker's result JSON: its timings and calls, and this process's CPU time and peak RSS."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out = {
        "tool": tool,
        "import_s": import_s,
        "import_cpu_s": import_cpu_s,
        "cold": cold,
        "warm": warm,
        "process_cpu_s": usage.ru_utime + usage.ru_stime,
        "max_rss_mb": usage.ru_maxrss / 1024,
        "settings": settings,
        "versions": versions,
        **extra,
    }
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
