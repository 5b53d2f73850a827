"""Moved to ``memlab.vllm.trace_replay``: chapter 06's replay uses vLLM's side only."""

raise ImportError(
    "memlab.capstone.trace_replay moved to memlab.vllm.trace_replay: "
    "from memlab.vllm import trace_replay (the same names)"
)
