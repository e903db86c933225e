"""Standalone scripts that reproduce one call (`writer`, the msprobe-script command),
from a template (`template`) and a runtime (`runtime`) that the script embeds, with the
stages it needs, as a private package.

May import: `dump`, `run`, `judge`, `results`, `errors`, `standards`, `bench_functions`.
Never pytest, never `plugin`.
"""
