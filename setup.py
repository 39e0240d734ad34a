"""The build step of `pip install .` (pyproject.toml holds the metadata):
libzeppelin is built with CMake into build-pip/ and copied into the package
as zeppelin/libzeppelin.so, where the package looks for it second (after
ZEPPELIN_LIBRARY; see python/zeppelin/_lib.py). So the installed package
works in any environment, a plain venv included, without this tree.

ZEPPELIN_BUILD_DIR=DIR takes DIR/libzeppelin.so from a build already made
(the README's build/, for example) instead of building one.

The wheel is tagged py3-none-<platform> (py3-none-linux_x86_64 here): the
Python code runs on any Python 3, but libzeppelin.so is a machine's ELF
file, so a py3-none-any wheel would install where the library cannot load.
"""
import os
import re
import shutil
import subprocess

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

# bdist_wheel is setuptools' own since setuptools 70.1 (wheel's is now an
# alias of it), the wheel package's before; setuptools 66 (Debian 12) has
# none. Neither may be importable: pip runs this file to ask for the build's
# requirements (wheel among them) before it installs them, and a build
# without a wheel (`setup.py build`) needs none.
try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:
        bdist_wheel = None

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


class WithLibrary(Distribution):
    # The package carries a machine's library, like an extension module: so
    # install puts it in platlib, and bdist_wheel makes a non-pure wheel
    # (Root-Is-Purelib: false) with the package at its root. Setting only
    # bdist_wheel's root_is_pure left the files under .data/purelib/.
    def has_ext_modules(self):
        return True


cmdclass = {"build_py": BuildWithLibrary}
if bdist_wheel is not None:
    class PlatformWheel(bdist_wheel):
        def get_tag(self):
            # The platform as bdist_wheel computes it (--plat-name included),
            # but no Python version or ABI: the library is loaded with
            # ctypes, not imported, so any Python 3 on the platform can use it.
            return "py3", "none", super().get_tag()[2]

    cmdclass["bdist_wheel"] = PlatformWheel

setup(version=version(), distclass=WithLibrary, cmdclass=cmdclass)
