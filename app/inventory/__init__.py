"""The pool: nodes and their GPUs, with topology and free capacity."""
