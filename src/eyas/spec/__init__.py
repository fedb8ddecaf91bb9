"""Speculative decoding's own pieces: the token tree (``tree``), drafting it (``drafter``), verifying it
(``verify``), and the tree's ops side by side as torch references (``tree_ops``) and Triton kernels
(``tree_kernels`` drafting, ``verify_kernels`` acceptance, masks and draws), which ``ops`` adds to the
transformer block's ops of ``eyas.models``.

``spec`` imports ``models``; the engine imports ``spec``; ``models`` never imports either
(tests/test_architecture.py).
"""
