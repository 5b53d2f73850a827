"""Dishonest: reads the solution from the course's folder and runs it
(tests/course/grading/test_grader.py)."""

from pathlib import Path

for folder in [Path(p) for p in __import__("sys").path] + [
    Path(__file__).resolve().parent
]:
    for up in [folder, *folder.parents]:
        solution = up / "solutions" / "ch08_sizing.py"
        if solution.is_file():
            exec(solution.read_text())
            break
    else:
        continue
    break
