"""Readouts, paired comparisons, noise floors and the analyses built on them."""
