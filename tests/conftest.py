import os
import sys
from pathlib import Path

import pytest
import torch

# Without a GPU, Triton kernels (eyas.models.kernels) run in Triton's interpreter. Triton reads this
# when a kernel is defined, so it is set before anything imports triton.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).parent))

from helpers import tiny_target, train_draft  # noqa: E402

# Tiny models gain nothing from threads, and extra threads thrash a 2-core machine.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def target():
    """Tiny random Llama target in float64 (ties in argmax are then practically impossible)."""
    return tiny_target()


@pytest.fixture(scope="session")
def draft(target):
    """A draft briefly trained on the tiny target: accepts some tokens, rejects others."""
    return train_draft(target)
