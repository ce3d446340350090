"""Which ``-m`` expressions let the suite skip importing the stack-tier folders."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.conftest import _stack_deselected


def run_with(markexpr: str) -> SimpleNamespace:
    return SimpleNamespace(option=SimpleNamespace(markexpr=markexpr))


@pytest.mark.parametrize("markexpr", ["not stack and not slow", "not stack", "not (stack or slow)"])
def test_the_fast_tier_does_not_import_the_stack_folders(markexpr):
    assert _stack_deselected(run_with(markexpr))


@pytest.mark.parametrize(
    "markexpr",
    [
        "",  # everything
        "not slow",  # pyproject's default
        "stack and not slow",
        "slow",  # the slow chaos tests are stack tests too
        "multihost",
        "stack or unit",
        "not unit",
        "bad (",  # pytest says what is wrong with it, not this hook
    ],
)
def test_any_other_run_collects_them(markexpr):
    assert not _stack_deselected(run_with(markexpr))
