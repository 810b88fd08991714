"""Decoding: batched sampling (sampling), the static decode loop and its compiled steps and
kernels."""
