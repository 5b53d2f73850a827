"""memlab.kernels: the Triton kernels, kept in the repository's top-level kernels/ folder.

Importing this module fixes the kernel mode first (TRITON_INTERPRET=1 without a GPU), so every
``from memlab.kernels import alloc_extend`` sees the right mode. Its ``__path__`` points at
kernels/, which makes it a package whose submodules are the files there.
"""

import os

from memlab.env import ensure_kernel_mode

ensure_kernel_mode()
__path__ = [os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "kernels")]
