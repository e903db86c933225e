"""Standalone scripts that reproduce one call (`writer`, the msprobe-script command),
from a template (`template`); the engine they run (`runtime`) comes from the installed
package or from the judging library written once beside them (`shared`).

May import: `dump`, `run`, `judge`, `results`, `errors`, `standards`, `bench_functions`.
Never pytest, never `plugin`.
"""
