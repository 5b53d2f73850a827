"""Hybrid models' ledgers: sliding-window KV (``swa``) and per-request linear-attention state
(``mamba``). Import the submodules directly: ``swa`` needs ``memlab.allocator``."""
