"""What SGLang and vLLM share: the ceil arithmetic (``utils``), the device policy (``env``), real
model configurations (``models``, chapter 02), pool sizing (``sizing``, 08) and decode attention
through the mappings in both engines' spellings (``attention``, 09). The kernels both sides call
live in ``memlab.kernels``.
"""
