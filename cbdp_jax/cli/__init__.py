"""The ``cbdp`` command line: exact values, estimates, the demo, paper reproductions, reruns.

Every bad input exits with status 2 and one line ``error: <parameter>=<value> is invalid: <range>`` on
stderr, without a traceback. Each command's code is in its own module of this package (``exact``,
``calibrate``, ``estimate``, ``audit``, ``audit_training``, ``rerun``, ``demo``, ``sweep``,
``reproduce``); what several share is in ``_common``. This module holds the app and the entry points.
"""

from __future__ import annotations

import inspect
import os
import sys

# `cbdp rerun` promises bit-identical numbers on the same device: ask XLA for deterministic GPU kernels
# before JAX initialises its backend (importing the package does not initialise it).
from cbdp_jax._src.determinism import request_deterministic_gpu_ops

request_deterministic_gpu_ops()

import typer  # noqa: E402

from cbdp_jax._src.validation import InvalidParameterError  # noqa: E402
from cbdp_jax.cli.audit import audit_cmd  # noqa: E402
from cbdp_jax.cli.audit_training import audit_training_cmd  # noqa: E402
from cbdp_jax.cli.calibrate import calibrate_cmd  # noqa: E402
from cbdp_jax.cli.demo import demo_cmd  # noqa: E402
from cbdp_jax.cli.estimate import estimate_cmd  # noqa: E402
from cbdp_jax.cli.exact import exact_cmd  # noqa: E402
from cbdp_jax.cli.reproduce import _experiment_lines, reproduce_cmd  # noqa: E402
from cbdp_jax.cli.rerun import rerun_cmd  # noqa: E402
from cbdp_jax.cli.sweep import sweep_cmd  # noqa: E402

__all__ = ["QUICK_EXIT_COMMANDS", "app", "console_main", "main"]

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Capacity bounded differential privacy: exact, analytic and learned restricted divergences.",
)

# In this order in `cbdp --help`.
COMMANDS = {
    "exact": exact_cmd,
    "calibrate": calibrate_cmd,
    "estimate": estimate_cmd,
    "audit": audit_cmd,
    "audit-training": audit_training_cmd,
    "rerun": rerun_cmd,
    "demo": demo_cmd,
    "sweep": sweep_cmd,
    "reproduce": reproduce_cmd,
}


def _reflowed(doc: str) -> str:
    """A docstring as help text: each paragraph on one line, so the terminal wraps it.

    Typer's rich help keeps single newlines, which broke lines mid-sentence at any width but the
    source's.
    """
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(" ".join(line.strip() for line in p.splitlines()) for p in paragraphs)


def _help(callback) -> str:
    """A command's help: its docstring reflowed; ``reproduce``'s also lists the experiments."""
    text = _reflowed(callback.__doc__)
    if callback is reproduce_cmd:
        # rich help keeps the blank lines between paragraphs: one experiment per paragraph
        text += "\n\nExperiments:\n\n" + "\n\n".join(_experiment_lines())
    return text


for _name, _callback in COMMANDS.items():
    app.command(_name, help=_help(_callback))(_callback)


def main() -> None:
    """Console entry point: runs the app, turning bad input into a one-line error and exit 2."""
    try:
        code = app(standalone_mode=False)
    except InvalidParameterError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("aborted", err=True)
        sys.exit(130)
    except typer.TyperException as exc:  # usage errors: unknown option, bad type
        typer.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code or 2)
    sys.exit(code if isinstance(code, int) else 0)


# Commands after which the ``cbdp`` executable skips interpreter teardown (see console_main): they
# start no other process and no jax.distributed job, and write every file before they return.
QUICK_EXIT_COMMANDS = frozenset({"estimate", "exact", "rerun"})


def console_main() -> None:
    """The ``cbdp`` executable: :func:`main`, then, for ``QUICK_EXIT_COMMANDS``, an immediate exit.

    A process that has run JAX spends about 0.2 s tearing the interpreter down after its work is done
    (XLA's runtime, thread pools, module clean-up): a fifth of a warm ``cbdp estimate``. By then every
    output is written and closed (result files atomically; JAX's compilation cache and the program
    store write as they compile), so those commands flush stdout and stderr and leave with
    ``os._exit`` and main's status. Any other command, an uncaught exception, and in-process callers
    of :func:`main` exit normally.
    """
    if len(sys.argv) < 2 or sys.argv[1] not in QUICK_EXIT_COMMANDS:
        main()
        return
    try:
        main()
        code: object = 0
    except SystemExit as exc:
        code = exc.code
    if not isinstance(code, int):
        if code is not None:
            print(code, file=sys.stderr)
        code = 0 if code is None else 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
