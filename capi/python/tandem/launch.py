"""python3 -m tandem.launch [launch flags] -- command: `tandem launch` from Python.

Runs TANDEM_BIN, else the `tandem` executable installed with this package (tandem/bin
after pip install, <prefix>/bin after make install), else the one on PATH; every argument goes to `tandem launch` unchanged.
"""
import os
import shutil
import sys


def _tandem_executable():
    here = os.path.dirname(os.path.abspath(__file__))
    # Installed: <prefix>/<site>/tandem, the executable in <prefix>/bin; in the build tree: build/python/tandem.
    candidates = [os.environ.get("TANDEM_BIN"), os.path.join(here, "bin", "tandem")]  # pip install . bundles it
    parent = here
    for _ in range(6):
        parent = os.path.dirname(parent)
        candidates.append(os.path.join(parent, "bin", "tandem"))
    candidates.append(shutil.which("tandem"))
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    sys.exit("python3 -m tandem.launch: no `tandem` executable found next to the package or on PATH; "
             "set TANDEM_BIN to it")


def main():
    exe = _tandem_executable()
    os.execv(exe, [exe, "launch"] + sys.argv[1:])


if __name__ == "__main__":
    main()
