"""Dishonest: a thread that forges the answers on the process's socket while the main thread is
busy, and reads the course from a thread (where a check running in the main one is not)."""

import json
import os
import struct
import sys
import threading
import time


def forge():
    socks = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                socks.append(int(fd))
        except OSError:
            pass
    frame = json.dumps(
        ["a", ["t", [["R", -999], ["R", -998]]], [[], [], [], []], []]
    ).encode()
    for _ in range(200):
        for fd in socks:
            try:
                os.write(fd, struct.pack("<QI", len(frame), 0) + frame)
            except OSError:
                pass
        for root in (os.path.dirname(sys.prefix), "/autograder"):
            try:
                open(root + "/source/memlab/capstone/engine.py").read()
            except OSError:
                pass
        time.sleep(0.01)


threading.Thread(target=forge, daemon=True).start()


class Request:
    def __init__(self, rid, input_len, max_new_tokens):
        self.rid, self.input_len, self.max_new_tokens = rid, input_len, max_new_tokens


class CapacityHooks:
    def __init__(self, available, token_capacity, page_size):
        self.available, self.token_capacity, self.page_size = (
            available,
            token_capacity,
            page_size,
        )

    def available_size(self):
        return self.available

    def max_new_tokens_for_memory(self, input_tokens, max_new_tokens):
        return max_new_tokens


def admit(*args, **kwargs):
    time.sleep(0.05)  # the window the thread writes in
    return [], []
