"""The build step of `pip install .` (pyproject.toml holds the metadata):
libzeppelin is built with CMake into build-pip/ and copied into the package
as zeppelin/libzeppelin.so, where the package looks for it second (after
ZEPPELIN_LIBRARY; see python/zeppelin/_lib.py). So the installed package
works in any environment, a plain venv included, without this tree.

ZEPPELIN_BUILD_DIR=DIR takes DIR/libzeppelin.so from a build already made
(the README's build/, for example) instead of building one.
"""
import os
import re
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
os.makedirs(os.path.join(ROOT, "build-pip"), exist_ok=True)  # setup.cfg's egg_base must exist


def version():
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        return re.search(r"project\(zeppelin VERSION ([0-9.]+)", f.read()).group(1)


def library():
    build = os.environ.get("ZEPPELIN_BUILD_DIR")
    if not build:
        build = os.path.join(ROOT, "build-pip")
        subprocess.check_call(["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DZP_BUILD_TESTS=OFF",
                               "-DZP_BUILD_BENCH=OFF", "-DZP_BUILD_EXAMPLES=OFF"])
        subprocess.check_call(["cmake", "--build", build, "--target", "zeppelin", "-j", str(os.cpu_count() or 1)])
    path = os.path.join(build, "libzeppelin.so")
    if not os.path.exists(path):
        raise SystemExit("setup.py: no libzeppelin.so in %s" % build)
    return os.path.realpath(path)  # the file, not the symlinks to it


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        shutil.copyfile(library(), os.path.join(self.build_lib, "zeppelin", "libzeppelin.so"))


setup(version=version(), cmdclass={"build_py": BuildWithLibrary})
