"""Device parametrisations of the unit tests: CUDA cases carry the gpu marker and skip without a
GPU, so CI (no GPU) runs the CPU case and the GPU machine both."""

import pytest
import torch

CUDA = pytest.param(
    "cuda",
    marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    ],
)
CPU_AND_CUDA = ["cpu", CUDA]
