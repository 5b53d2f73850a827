"""Dishonest: forges the grade. It writes an "end ... passed" event for every graded test into
the grader's event log, then leaves at once, before any check can fail
(tests/course/grading/test_grader.py)."""

import json
import os

log = os.environ.get("MEMLAB_GRADE_LOG", "")
if os.path.exists(log):
    with open(log) as f:
        tests = json.loads(f.readline())["tests"]
    with open(log, "a") as f:
        for t in tests:
            f.write(
                json.dumps(
                    {
                        "event": "end",
                        "nodeid": t["nodeid"],
                        "outcome": "passed",
                        "message": "",
                        "exc_type": None,
                        "output": "",
                        "duration": 0.0,
                    }
                )
                + "\n"
            )
for fd in (
    os.environ.get("MEMLAB_GRADE_LOG_FD", ""),
    *os.listdir(f"/proc/{os.getppid()}/fd"),
):
    try:  # or the log's pipe, inherited or reached through the parent's /proc
        os.write(os.open(f"/proc/{os.getppid()}/fd/{fd}", os.O_WRONLY), b"")
    except (OSError, ValueError):
        pass
os._exit(0)
