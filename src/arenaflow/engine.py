"""A job's engine settings: how it decodes and trains (the decode loop, its kernels, warm-ups).

Config key `engine:` (workflow/schemas/config.schema.yaml: every key, its default and meaning),
overridden per suite, per corpus and per arm. arenaflow.config resolves each job's settings
once; its rule passes them as `--engine-json` (a param: a change reruns the job), the job runs
inside job(), and the decode and training code read get(). Readouts and trainings write
settings() into their metadata, so two runs of one config never differ by the shell they ran in.
"""

from __future__ import annotations

import contextlib
import json

from arenaflow.schema import schema_defaults

_settings: dict | None = None


def use(settings: dict | str | None) -> dict:
    """Set this process's settings (a dict, or its JSON), the schema's defaults under them."""
    global _settings
    given = json.loads(settings) if isinstance(settings, str) else dict(settings or {})
    defaults = schema_defaults("engine")
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise ValueError(f"engine settings: unknown key(s) {unknown}; known: {sorted(defaults)}")
    _settings = {**defaults, **given}
    return dict(_settings)


def settings() -> dict:
    """This process's settings (the schema's defaults where use() was not called)."""
    return dict(_settings if _settings is not None else schema_defaults("engine"))


def get(key: str):
    return settings()[key]


@contextlib.contextmanager
def job(settings: dict | str | None):
    """Within the block, exactly these settings (the schema's defaults under them); the previous
    ones after it, so that a job run in-process (tests) leaves nothing behind."""
    global _settings
    saved = _settings
    use(settings)
    try:
        yield
    finally:
        _settings = saved


@contextlib.contextmanager
def using(**settings):
    """Within the block, these settings over the ones use() set before (tests, benchmarks)."""
    global _settings
    saved = _settings
    use({**(saved or {}), **settings})
    try:
        yield
    finally:
        _settings = saved
