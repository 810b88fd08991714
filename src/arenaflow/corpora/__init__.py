"""Training corpora: rejection-sampled rows, decontamination, coverage selection, manifests."""
