"""Bug-zoo rows for chapter 11's exercise, written apart so they can be folded into zoo.py's ZOO
(same ``Variant`` rows, same patch rules). Until then, check them with

    python tests/bug_zoo/zoo_ch11.py     # each variant must fail the graded test it names
"""

import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

_spec = importlib.util.spec_from_file_location("_memlab_bug_zoo_base", Path(__file__).with_name("zoo.py"))
_zoo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_zoo)
Variant, build = _zoo.Variant, _zoo.build

ZOO_CH11 = (
    Variant("ch11_radix_match__split_parent_not_relinked", "ch11.radix_match", "test_split_by_hand",
            "the split forgets to point the parent's entry at the new node: the prefix hangs in the air",
            (("    child.parent.children[tree.child_key(child.key)] = new_node\n", ""),)),
    Variant("ch11_radix_match__split_drops_locks", "ch11.radix_match", "test_split_keeps_locks",
            "the new node of a split starts unlocked, so eviction can take a prefix a request uses",
            (("    new_node.lock_ref = child.lock_ref\n", ""),)),
    Variant("ch11_radix_match__child_by_token", "ch11.radix_match", "test_match_whole_pages",
            "children looked up by their first token even with pages (they are keyed by their first page)",
            (("        child = node.children.get(tree.child_key(key, matched))\n",
              "        child = node.children.get(key[matched])\n"),)),
    Variant("ch11_radix_match__no_touch", "ch11.radix_match", "test_match_refreshes_access_time",
            "a match does not refresh the access time: LRU evicts the prefix everyone uses",
            (("        child.last_access_time = now\n", ""),)),
    Variant("ch11_radix_match__mru", "ch11.radix_match", "test_evict_lru_order",
            "eviction takes the most recently used leaf first",
            (("    heap = [(n.last_access_time, id(n), n) for n in tree.evictable_leaves()]",
              "    heap = [(-n.last_access_time, id(n), n) for n in tree.evictable_leaves()]"),
             ("heapq.heappush(heap, (parent.last_access_time, id(parent), parent))",
              "heapq.heappush(heap, (-parent.last_access_time, id(parent), parent))"))),
    Variant("ch11_radix_match__no_climb", "ch11.radix_match", "test_evict_skips_locked_and_climbs",
            "a parent left without children is not considered in the same call: evict frees too little",
            (("        if parent is not tree.root and not parent.children and parent.lock_ref == 0:\n"
              "            heapq.heappush(heap, (parent.last_access_time, id(parent), parent))\n", ""),)),
)


def main() -> int:
    """Build each variant into a temporary solutions folder and run the test it must fail."""
    root = Path(__file__).resolve().parents[2]
    bad = 0
    for v in ZOO_CH11:
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / f"{v.solution}.py").write_text(build(v))
            r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
                                f"tests/exercises/test_{v.solution}.py::{v.catches}"], cwd=root,
                               env={**__import__("os").environ, "MEMLAB_EXERCISES": d}, capture_output=True, text=True)
        caught = r.returncode != 0 and "failed" in r.stdout
        bad += not caught
        print(f"{'caught' if caught else 'MISSED'}  {v.name} by {v.catches}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
