"""Run a script as on a machine where pytest-msprobe is not installed, and prove it:
`python -S -c "import without_plugin; without_plugin.run()" SCRIPT ARGS...`.

Importing pytest_msprobe fails here as it does where the package is absent, whatever
sys.path holds (a non-editable install in site-packages included); after the script
ends no module of pytest_msprobe may be loaded, else the exit status is 99. A fault
module (planted_linear) may be imported first with `-c "import planted_linear; ..."`.
"""

import importlib.abc
import runpy
import sys

EXIT_IMPORTED = 99


class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "pytest_msprobe":
            raise ModuleNotFoundError(f"No module named {name!r} (pytest-msprobe is not installed here)", name=name)
        return None


def run() -> None:
    sys.meta_path.insert(0, _Absent())
    script, sys.argv = sys.argv[1], sys.argv[1:]
    try:
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exc.code
    leaked = sorted(name for name in sys.modules if name.split(".")[0] == "pytest_msprobe")
    if leaked:
        print(f"pytest_msprobe was imported: {', '.join(leaked)}", file=sys.stderr)
        sys.exit(EXIT_IMPORTED)
    sys.exit(code)
