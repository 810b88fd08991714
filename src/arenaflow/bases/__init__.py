"""Base models the repository builds or imports itself: the tiny Llamas of the embedded
defaults, and SmolLM2-135M-Instruct from its wheel."""
