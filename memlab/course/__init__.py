"""The course's machinery, apart from the layers a learner studies: the chapters' cells
(``notebook``), the pictures and widgets (``viz``), the autograder (``grading``; learners type
``python -m memlab.grade``), the environment report (``doctor``), the course's home (``home``) and
chapter 10's real model (``chat``).
Nothing in memlab.sglang, memlab.vllm, memlab.common or memlab.capstone imports it.
"""
