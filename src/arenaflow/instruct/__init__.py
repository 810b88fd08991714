"""Instruction following: the constraint checker, IF prompt pools, the probe split, multi-turn
readouts, per-family deltas and the tool-leak audit."""
