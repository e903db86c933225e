"""pytest hooks of pytest-msprobe (filled in by the core)."""
