"""Standalone scripts that reproduce one call (`writer`, the msprobe-script command),
from a template (`template`) and a runtime (`runtime`) that the script embeds, with the
stages it needs, as a private package.

May import: `dump`, `run`, `judge`, `results`, `errors`, `standards`, `bench_functions`.
Never pytest, never `plugin`.
"""

from pytest_msprobe._moved import old_attributes

__getattr__ = old_attributes(__name__)  # pytest_msprobe.scripts was the module scripts.writer
