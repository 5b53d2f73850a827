"""The slice of vLLM's Request (vllm/v1/request.py) that the KV cache books read.

As vLLM's, it accepts an empty prompt (vLLM refuses one upstream, in its input processor: "The
decoder prompt cannot be empty"); the checks memlab adds (token ids, multimodal ranges, the salt's
type) are the boundary's, not vLLM's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from memlab.common import _checks
from memlab.vllm.hashing import BlockHash, MultiModalFeature, _validate_mm_features


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
        _validate_request(
            request_id, prompt_token_ids, block_hasher, lora_name, lora_path
        )
        _checks.instance("cache_salt", cache_salt, (str, type(None)), "a str or None")
        mm_features = _validate_mm_features(mm_features, len(prompt_token_ids))
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
            new_hashes = self._block_hasher(self)
            _checks.instance(
                "block_hasher(request)", new_hashes, list, "a list of hashes"
            )
            self.block_hashes.extend(new_hashes)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, num_tokens={self.num_tokens}, "
            f"num_computed_tokens={self.num_computed_tokens}, "
            f"block_hashes={len(self.block_hashes)})"
        )


# -- argument checks at the boundary (memlab's, not vLLM's) --------------------------------------


def _validate_request(request_id, prompt_token_ids, block_hasher, *lora) -> None:
    _checks.instance("request_id", request_id, str)
    # vLLM's message; an empty prompt is a request, as in vLLM
    if prompt_token_ids is None:
        raise ValueError("Neither prompt_token_ids nor prompt_embeds were defined.")
    _checks.int_list(
        f"request {request_id!r}: prompt_token_ids (token ids)", prompt_token_ids
    )
    if block_hasher is not None:
        _checks.function("block_hasher", block_hasher)
    for name, value in zip(("lora_name", "lora_path"), lora):
        _checks.instance(name, value, (str, type(None)), "a str or None")
