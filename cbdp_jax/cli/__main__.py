"""``python -m cbdp_jax.cli``: the ``cbdp`` executable."""

from cbdp_jax.cli import console_main

if __name__ == "__main__":
    console_main()
