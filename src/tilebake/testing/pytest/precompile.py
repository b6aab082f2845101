"""TK_PRECOMPILE=1: a kernel-cache warm-up pass. Keeps only the tests whose parameters include a
token count (num_tokens, num_expanded_tokens or num_send_tokens); the generators then hand
those a single small count (tilebake.testing.generator.generate_num_tokens), so every kernel
specialisation is built once without running full-size cases."""

from __future__ import annotations

from tilebake.testing.generator import is_precompile

_TOKEN_KEYS = ("num_tokens", "num_expanded_tokens", "num_send_tokens")


def _has_token_count(item) -> bool:
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return False
    names = set(callspec.params)
    for value in callspec.params.values():
        if isinstance(value, dict):  # the `params` dict the test files parametrize with
            names.update(value)
    return any(key in names for key in _TOKEN_KEYS)


def pytest_collection_modifyitems(config, items):
    if not is_precompile():
        return
    kept = [item for item in items if _has_token_count(item)]
    dropped = [item for item in items if not _has_token_count(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
