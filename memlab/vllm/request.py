"""The slice of vLLM's Request (vllm/v1/request.py) that the KV cache books read.

As vLLM's, it accepts an empty prompt (vLLM refuses one upstream, in its input processor: "The
decoder prompt cannot be empty"); the checks memlab adds (token ids, multimodal ranges, the salt's
type) are the boundary's, not vLLM's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from memlab.common import _checks
from memlab.vllm.hashing import BlockHash, MultiModalFeature


class Request:
    """A request's token ids, its block hashes (grown as full blocks appear) and hash keys."""

    __slots__ = (
        "request_id",
        "prompt_token_ids",
        "all_token_ids",
        "num_computed_tokens",
        "lora_name",
        "lora_path",
        "mm_features",
        "cache_salt",
        "block_hashes",
        "_block_hasher",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        *,
        block_hasher: Callable[[Request], list[BlockHash]] | None = None,
        lora_name: str | None = None,
        lora_path: str | None = None,
        mm_features: Sequence[MultiModalFeature] = (),
        cache_salt: str | None = None,
    ):
        mm_features = [MultiModalFeature(*f) for f in mm_features]
        _validate_request(request_id, prompt_token_ids, mm_features, cache_salt)
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.all_token_ids = list(prompt_token_ids)
        self.num_computed_tokens = 0
        # vLLM's LoRARequest: the hash key holds the name and the path (vLLM requires a path;
        # memlab lets it be None when a lesson only needs the name).
        self.lora_name = lora_name
        self.lora_path = lora_path
        self.mm_features = mm_features
        self.cache_salt = cache_salt
        self.block_hashes: list[BlockHash] = []
        self._block_hasher = block_hasher
        self._update_block_hashes()

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    def append_output_token_ids(self, token_ids: int | Sequence[int]) -> None:
        """Grow the request (decode); blocks that became full get their hash now."""
        token_ids = _checks.int_list(
            "token_ids", [token_ids] if type(token_ids) is int else token_ids
        )
        self.all_token_ids.extend(token_ids)
        self._update_block_hashes()

    def _update_block_hashes(self) -> None:
        if self._block_hasher is not None:
            self.block_hashes.extend(self._block_hasher(self))

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, num_tokens={self.num_tokens}, "
            f"num_computed_tokens={self.num_computed_tokens}, block_hashes={len(self.block_hashes)})"
        )


# -- argument checks at the boundary (memlab's, not vLLM's) --------------------------------------


def _validate_request(request_id, prompt_token_ids, mm_features, cache_salt) -> None:
    if (
        prompt_token_ids is None
    ):  # vLLM's message; an empty prompt is a request, as in vLLM
        raise ValueError("Neither prompt_token_ids nor prompt_embeds were defined.")
    _checks.int_list(
        f"request {request_id!r}: prompt_token_ids (token ids)", prompt_token_ids
    )
    _checks.instance("cache_salt", cache_salt, (str, type(None)), "a str or None")
    ends = [0] + [
        f.offset + f.length for f in mm_features
    ]  # sorted, disjoint, inside the prompt
    if any(
        f.offset < end or f.length <= 0 for f, end in zip(mm_features, ends)
    ) or ends[-1] > len(prompt_token_ids):
        raise ValueError(
            f"mm items not sorted and disjoint, or outside the {len(prompt_token_ids)}-token "
            f"prompt: {mm_features}"
        )
