"""Private implementation modules of cbdp_jax. Import from the public modules instead."""
