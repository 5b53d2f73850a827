"""Dishonest: reads the course through a directory descriptor (os.open(..., dir_fd=...)), a path
no check of the path string sees, and runs what it finds: a solution, or memlab's own sizing."""

import os
import sys

roots = [
    os.path.dirname(sys.prefix),
    "/autograder",
    os.path.dirname(os.path.dirname(sys.prefix)),
]
for line in open(f"/proc/{os.getppid()}/cmdline", "rb").read().split(b"\0"):
    if line.endswith(b"wire.py"):  # the grader's own program names the course's folder
        roots.append(
            os.path.dirname(
                os.path.dirname(os.path.dirname(os.path.dirname(line.decode())))
            )
        )
found = None
for root in roots:
    for rel in (
        "solutions/ch08_sizing.py",
        "source/memlab/sglang/sizing.py",
        "memlab/sglang/sizing.py",
    ):
        try:
            top = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
            fd = os.open(rel, os.O_RDONLY, dir_fd=top)
            found = os.read(fd, 1 << 20).decode()
            break
        except OSError:
            continue
    if found:
        break
if found:
    exec(compile(found, "<found>", "exec"))
