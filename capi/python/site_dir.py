"""Prints where this interpreter looks for packages under an installation prefix, relative to it.

Debian's python3 searches <prefix>/lib/python3.X/dist-packages for the prefix /usr/local
(and /usr/lib/python3/dist-packages for /usr); other builds use sysconfig's site-packages.
"""
import os
import sys
import sysconfig

version = f"python{sys.version_info.major}.{sys.version_info.minor}"
debian = f"lib/{version}/dist-packages"
if any(p.endswith("/" + debian) for p in sys.path):
    print(debian)
else:
    base = "/prefix"
    path = sysconfig.get_path("platlib", "posix_prefix", vars={"base": base, "platbase": base})
    print(os.path.relpath(path, base))
