"""pip install .: the tandem package built by the project's CMake.

The extensions (_tandem, and _c10d where LibTorch is found) and libtandem.so.0 land in
the package directory (the extensions find the library by their $ORIGIN run path),
with the `tandem` executable as tandem/bin/tandem for `python3 -m tandem.launch`.
TANDEM_BUILD_DIR names an existing build to package instead of building in build/pip.
"""
import glob
import os
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True  # a platform wheel: the package carries compiled extensions


class BuildWithCMake(build_py):
    def run(self):
        build = os.environ.get("TANDEM_BUILD_DIR") or os.path.join(HERE, "build", "pip")
        if not os.environ.get("TANDEM_BUILD_DIR"):
            subprocess.check_call(["cmake", "-S", HERE, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                                   f"-DPython_EXECUTABLE={sys.executable}"])
            targets = ["tandem_python", "tandem", "tandem_shared"]
            if "tandem_c10d" in subprocess.run(["ninja", "-C", build, "-t", "targets", "all"], capture_output=True,
                                               text=True).stdout:
                targets.append("tandem_c10d")
            subprocess.check_call(["ninja", "-C", build] + targets)
        package = os.path.join(build, "python", "tandem")
        if not glob.glob(os.path.join(package, "_tandem*.so")):
            sys.exit(f"setup.py: {package} has no _tandem extension: is pybind11-dev installed?")
        out = os.path.join(self.build_lib, "tandem")
        os.makedirs(os.path.join(out, "bin"), exist_ok=True)
        for f in glob.glob(os.path.join(package, "*.py")) + glob.glob(os.path.join(package, "*.so")):
            shutil.copy2(f, out)
        # The soname the extensions load, as one file.
        shutil.copy2(os.path.join(build, "lib", "libtandem.so.0"), out, follow_symlinks=True)
        shutil.copy2(os.path.join(build, "bin", "tandem"), os.path.join(out, "bin", "tandem"))


# setuptools' own scratch away from CMake's build/lib.
SCRATCH = os.path.join("build", "pip-package")
os.makedirs(SCRATCH, exist_ok=True)
setup(packages=["tandem"], package_dir={"tandem": "capi/python/tandem"}, cmdclass={"build_py": BuildWithCMake},
      distclass=BinaryDistribution, zip_safe=False,
      options={"build": {"build_base": SCRATCH}, "egg_info": {"egg_base": SCRATCH}})
