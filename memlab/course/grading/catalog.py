"""Every graded exercise, in one place: id, chapter, file, points, title.

``file`` is the stub's name under exercises/ (its twin under solutions/ has the same
name) and the graded tests live in tests/exercises/test_<file>.py. ``points`` are the
CPU points (tests run on a laptop, kernels in the Triton interpreter); ``gpu_points``
are extra points from tests that need a CUDA device. tests/course/grading/test_grader.py
checks that the tests' markers add up to these.
"""

from __future__ import annotations

from typing import NamedTuple


class Exercise(NamedTuple):
    id: str
    chapter: int
    file: str
    points: int
    title: str
    gpu_points: int = 0

    @property
    def test_file(self) -> str:
        return f"tests/exercises/test_{self.file}.py"


EXERCISES: tuple[Exercise, ...] = (
    Exercise(
        "ch01.alloc_rows",
        1,
        "ch01_alloc_rows",
        9,
        "request-table rows: tail allocation, generation counter",
    ),
    Exercise(
        "ch02.bytes_per_token",
        2,
        "ch02_bytes_per_token",
        7,
        "bytes per token for MHA and MLA",
    ),
    Exercise(
        "ch03.token_allocator",
        3,
        "ch03_token_allocator",
        10,
        "token allocator: FIFO free list, staged frees",
    ),
    Exercise(
        "ch04.alloc_extend",
        4,
        "ch04_alloc_extend",
        11,
        "paged alloc_extend in torch: the three parts",
    ),
    Exercise(
        "ch04.alloc_extend_kernel",
        4,
        "ch04_alloc_extend_kernel",
        8,
        "alloc_extend Triton kernel: the whole-page part",
        gpu_points=2,
    ),
    Exercise(
        "ch05.alloc_decode",
        5,
        "ch05_alloc_decode",
        8,
        "alloc_decode: when a decode step opens a page",
    ),
    Exercise(
        "ch05.paged_free",
        5,
        "ch05_paged_free",
        9,
        "paged free: page dedup, free_segment, free groups",
    ),
    Exercise(
        "ch06.free_queue",
        6,
        "ch06_free_queue",
        9,
        "vLLM free queue: the order of a request's freed blocks",
    ),
    Exercise(
        "ch06.block_hash",
        6,
        "ch06_block_hash",
        9,
        "chained block hashes with extra keys",
    ),
    Exercise(
        "ch06.slot_mapping",
        6,
        "ch06_slot_mapping",
        7,
        "slot_mapping Triton kernel",
        gpu_points=2,
    ),
    Exercise(
        "ch07.swa_release",
        7,
        "ch07_swa_release",
        10,
        "sliding window: out-of-window release, SWA free",
    ),
    Exercise(
        "ch07.mamba_tracking",
        7,
        "ch07_mamba_tracking",
        10,
        "Mamba state slots and ping-pong tracking",
    ),
    Exercise(
        "ch08.sizing",
        8,
        "ch08_sizing",
        11,
        "sizing: max_new_tokens_for_memory, KV per decode step",
    ),
    Exercise(
        "ch09.paged_gather",
        9,
        "ch09_paged_gather",
        7,
        "paged decode attention: gather KV through req_to_token",
        gpu_points=2,
    ),
    Exercise(
        "ch10.admission",
        10,
        "ch10_admission",
        10,
        "scheduler admission: free pages and the next decode step",
    ),
    Exercise(
        "ch11.radix_match",
        11,
        "ch11_radix_match",
        12,
        "radix tree: match_prefix with its split, LRU evict",
    ),
    Exercise(
        "ch12.virtual_pages",
        12,
        "ch12_virtual_pages",
        10,
        "unified pool: translate virtual ids, capacity in bytes, eager compaction",
    ),
)

BY_ID = {e.id: e for e in EXERCISES}
BY_FILE = {e.file: e for e in EXERCISES}


def find(name: str) -> Exercise:
    """The exercise named by its file (``ch04_alloc_extend``, with or without ``.py`` or a folder)
    or by its id (``ch04.alloc_extend``); a ValueError that lists the names otherwise."""
    key = name.strip().replace("\\", "/").rsplit("/", 1)[-1].removesuffix(".py")
    e = BY_FILE.get(key) or BY_ID.get(key) or BY_FILE.get(key.replace(".", "_", 1))
    if e is None:
        raise ValueError(
            f"unknown exercise {name!r}; the exercises are {', '.join(BY_FILE)}"
        )
    return e


def for_chapter(chapter: int | None) -> list[Exercise]:
    return [e for e in EXERCISES if chapter is None or e.chapter == chapter]
