"""memlab's autograder, one package:

- ``catalog``: every graded exercise (id, chapter, file, points); ``find`` takes a file or an id;
- ``loader``: the one seam between graded tests and learner code (``load("ch04_alloc_extend")``);
- ``sandbox``: the learner's code in a process of its own (a user of its own on Gradescope);
- ``wire``: the codec both sides share, and the program the learner's process runs;
- ``checks``, ``fuzz``: the teaching checks and the random cases graded tests use;
- ``plugin``: the pytest plugin that times and logs each graded test in the child process;
- ``runner``: runs the child, survives hangs and crashes, scores the results (``grade()``);
- ``report``: the score table, Gradescope's results.json, the catalog listing;
- ``cli``: the command line, ``python -m memlab.grade`` (memlab/grade.py is its entry point);
- ``gradescope``: the whole course as a Gradescope autograder;
- ``similarity``: copies of memlab's code or of a solution, flagged for the instructor;
- ``stubs``: the course's stubs as committed, whatever a learner did to exercises/;
- ``hints``: two or three hints per exercise, one at a time (``./course hint``).
"""
