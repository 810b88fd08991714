"""Speed patches of the training step, apart from the recipe: each computes what the plain
PEFT/DeepSpeed/transformers path computes, with fewer kernels or copies (tests hold them to it)."""
