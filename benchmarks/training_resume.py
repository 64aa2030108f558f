"""The tight audit of the README, before and after, and killed at half and resumed.

``cbdp audit-training --data synthetic --examples 63 --sampler poisson --rate 0.125 --steps 16
--noise 0.5 --runs RUNS`` four times, one process each under ``/usr/bin/time`` (wall, user + sys
CPU, peak resident memory): in the BASE tree; in this tree with ``--checkpoint``; in this tree with
``--checkpoint`` again, killed with SIGKILL once RUNS of the 2 x RUNS runs are in its blocks; and
that one resumed (``--resume``). Records whether the resumed JSON equals the uninterrupted one but
for the times, both verdicts and the empirical eps of BASE and of this tree.

    python benchmarks/training_resume.py 100000 . /tmp/base0 \
        benchmarks/measured/training-speed/resume_1e5.json
    python benchmarks/training_resume.py 1000000 . none OUT --critics score

BASE ``none`` skips the base tree's run; arguments after OUT go to every audit-training call (at
10^6 runs ``--critics score`` keeps the release's recorded coordinates, 4 (T (k + 1) + 3) bytes a
run, out of memory).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CMD = [
    "audit-training", "--data", "synthetic", "--examples", "63", "--sampler", "poisson",
    "--rate", "0.125", "--steps", "16", "--noise", "0.5", "--format", "json",
]  # fmt: skip


EXTRA: list[str] = []


def launch(tree: str, runs: str, extra: list[str]) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(Path(tree).resolve()))
    cmd = ["/usr/bin/time", "-f", "TIME %e %U %S %M", sys.executable, "-m", "cbdp_jax.cli", *CMD]
    return subprocess.Popen(
        [*cmd, "--runs", runs, *EXTRA, *extra], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, cwd=tempfile.gettempdir(),
    )  # fmt: skip


def finish(proc: subprocess.Popen) -> tuple[dict, dict]:
    out, err = proc.communicate()
    wall, user, system, rss = (
        float(x) for x in re.search(r"TIME (\S+) (\S+) (\S+) (\d+)", err).groups()
    )
    timing = {"rc": proc.returncode, "wall_s": wall, "cpu_s": user + system,
              "peak_rss_mb": rss / 1024, "load": os.getloadavg()[0]}  # fmt: skip
    return json.loads(out), timing


def without_times(record):
    if isinstance(record, dict):
        return {k: without_times(v) for k, v in record.items() if k != "seconds"}
    if isinstance(record, list):
        return [without_times(v) for v in record]
    return record


def runs_in(folder: Path) -> int:
    return sum(int(f.name.split(".")[2]) - int(f.name.split(".")[1]) for f in folder.glob("*.npz"))


def main() -> None:
    runs, here, base, out = sys.argv[1:5]
    EXTRA[:] = sys.argv[5:]
    rec: dict = {"runs_per_side": int(runs), "extra_options": EXTRA}
    base_json = None
    if base != "none":
        base_json, rec["base_uninterrupted"] = finish(launch(base, runs, []))
    work = Path(tempfile.mkdtemp())
    alone, rec["new_uninterrupted"] = finish(launch(here, runs, ["--checkpoint", str(work / "a")]))
    proc, t0 = launch(here, runs, ["--checkpoint", str(work / "k")]), time.perf_counter()
    while (not (work / "k").exists() or runs_in(work / "k") < int(runs)) and proc.poll() is None:
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    rec["killed_after_s"], rec["runs_done_at_kill"] = time.perf_counter() - t0, runs_in(work / "k")
    resumed, rec["resumed"] = finish(
        launch(here, runs, ["--checkpoint", str(work / "k"), "--resume"])
    )
    rec["identical_json_except_seconds"] = without_times(alone) == without_times(resumed)
    rec["saved_cpu_s"] = rec["new_uninterrupted"]["cpu_s"] - rec["resumed"]["cpu_s"]
    rec["saved_wall_s"] = rec["new_uninterrupted"]["wall_s"] - rec["resumed"]["wall_s"]
    rec["verdicts"] = {"alone": alone["violation"], "resumed": resumed["violation"]}
    rec["new_empirical"] = alone["empirical"]
    if base_json is not None:
        rec["verdicts"]["base"] = base_json["violation"]
        rec["base_empirical"] = base_json["empirical"]
    print(json.dumps(rec, indent=1))
    Path(out).write_text(json.dumps(rec, indent=1))


if __name__ == "__main__":
    main()
