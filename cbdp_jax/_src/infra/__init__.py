"""Shared infrastructure: validation, keys, progress, interrupts, sizes, files and the program store."""
