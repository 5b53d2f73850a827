"""Dishonest: answers the grader with messages meant to crash it: a view of its own fenced input
that reaches the unreadable page, a storage of a terabyte, JSON nested too deep for a parser,
an int of ten thousand digits, a callback the grader never gave, a header that promises more
than it sends. A grader that trusts any of them dies, and a dead grader grades nothing."""

import gc
import json
import os
import struct
import sys
import time


def learner():
    return next(o for o in gc.get_objects() if type(o).__name__ == "Learner")


def payloads(me):
    fenced = [
        s
        for s, e in me.entries.items()
        if s > 0
        and len(e) == 2
        and type(e[1]) is list
        and e[1][0] != [[0, e[0].numel()]]
    ]
    sid = fenced[0] if fenced else 1
    empty = [[], [], [], []]
    yield ["a", ["T", sid, "int64", [4096], [1], 0], empty, []]
    yield ["a", ["R", -5], [[[-5, "B", ["cpu", 1 << 40, [], 0, []]]], [], [], []], []]
    yield ["a", json.loads("[" * 50 + "]" * 50), empty, []]
    yield "deep"
    yield ["a", int("9" * 4000), empty, []]
    yield ["c", ["t", [77, ["t", []], ["t", []]]], empty, []]
    yield "short"


def attack():
    me = learner()
    wire = sys.modules[type(me).__module__]
    # this run's
    counter = os.path.join(os.environ["TRITON_CACHE_DIR"], "crash-counter")
    try:
        n = int(open(counter).read())
    except (OSError, ValueError):
        n = 0
    open(counter, "w").write(str(n + 1))
    header = list(payloads(me))[n % 7]
    if header == "deep":
        data = b"[" * 200_000 + b"]" * 200_000
        me.sock.sendall(struct.pack("<QI", len(data), 0) + data)
    elif header == "short":
        me.sock.sendall(struct.pack("<QI", 1 << 30, 0) + b"[")
    else:
        wire.send_msg(me.sock, header, [])
    time.sleep(30)  # the grader must stop this process, not wait for it
    os._exit(0)


def compute_slot_mapping(*args, **kwargs):
    attack()


def slot_mapping_kernel(*args, **kwargs):
    attack()
