"""memlab.kernels: the course's Triton kernels, one file each.

The files live in the repository's top-level ``kernels/`` folder; ``memlab/kernels`` is a
symbolic link to it, so the package is ``memlab.kernels`` for Python, for an editable or a
regular install and for an IDE alike (``from memlab.kernels import alloc_extend``).

Importing the package fixes the kernel mode first: without a GPU, Triton's interpreter must be on
(TRITON_INTERPRET=1) before a kernel is defined, because ``triton.jit`` reads it then.
"""

from memlab.common.env import ensure_kernel_mode

ensure_kernel_mode()
