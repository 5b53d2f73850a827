"""Moved to ``memlab.vllm.trace_replay`` (chapter 06's replay uses vLLM's side only). This alias
stays until the chapters and saved notebooks that import it from here have moved."""

import warnings

from memlab.vllm.trace_replay import *  # noqa: F403

warnings.warn(
    "memlab.capstone.trace_replay moved to memlab.vllm.trace_replay",
    DeprecationWarning,
    stacklevel=2,
)
