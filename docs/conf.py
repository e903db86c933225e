"""Sphinx configuration of the pytest-msprobe docs (built with -W by tests/repository/test_docs.py).

Pages are MyST Markdown; the reference's tables are written from the code by the local
extension `_ext/msprobe_docs.py` before each build (into `_generated/`, which the pages
include), and the Python API comes from the docstrings through autodoc."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "_ext"))

project = "pytest-msprobe"
author = "pytest-msprobe developers"
copyright = "2026, pytest-msprobe developers"  # Sphinx's name for it, shadowing a builtin

# napoleon: the public API's docstrings hold NumPy-style Parameters/Returns/Raises
# sections, rendered as field lists
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "msprobe_docs"]
napoleon_google_docstring = False
source_suffix = {".md": "markdown"}
# _generated: parts the pages include, not pages of their own
exclude_patterns = ["_build", "_generated", "Thumbs.db", ".DS_Store"]
myst_enable_extensions = ["colon_fence", "deflist"]
# Headings get anchors to link to (page.md#a-heading), as GitHub gives them.
myst_heading_anchors = 3
# "--msprobe-x" stays two hyphens (docutils would set an en dash)
smartquotes = False
html_theme = "furo"
html_title = "pytest-msprobe"
html_static_path = ["_static"]
html_css_files = ["msprobe.css"]

autodoc_default_options = {"members": True, "member-order": "bysource"}
autodoc_typehints = "description"
# The public API's modules import torch at first use; nothing else is mocked.
nitpicky = False
