"""The autograder's parts: the exercise catalog, the one seam to learner code, teaching checks,
and the pytest plugin that times and records each graded test. The command is ``memlab.grade``.
"""
