"""The configuration reference, docs/configuration.md, generated from the schemas.

    python -m arenaflow.configref --out docs/configuration.md   # stdout without --out

walk lists every key the schemas reach; document writes the reference and runs the command.
"""
