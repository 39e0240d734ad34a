"""The build step of `pip install .` (pyproject.toml holds the metadata):
libzeppelin and the tools zprun, zpplan, zptopo and zpconfig are built with
CMake into build-pip/ and copied into the package (zeppelin/libzeppelin.so,
where the package looks for it second, after ZEPPELIN_LIBRARY; see
python/zeppelin/_lib.py; and zeppelin/bin/, which the console scripts of
pyproject.toml run). So the installed package works in any environment, a
plain venv included, without this tree. The build's progress goes to the
terminal (/dev/tty), since pip shows a build's output only with -v.

ZEPPELIN_BUILD_DIR=DIR takes the library and tools from a build already made
(the README's build/, for example) instead of building them (a tool missing
there is built there).

The wheel is tagged py3-none-<platform> (py3-none-linux_x86_64 here): the
Python code runs on any Python 3, but libzeppelin.so is a machine's ELF
file, so a py3-none-any wheel would install where the library cannot load.
"""
import os
import re
import shutil
import subprocess
import sys

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py
from setuptools.command.install import install

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


TOOLS = ["zprun", "zpplan", "zptopo", "zpconfig"]  # the console scripts of pyproject.toml run these


def _tty():
    """The user's terminal, or None. pip shows a build's output only with -v
    or when it fails; a line on the terminal shows the build's progress."""
    try:
        return open("/dev/tty", "w")
    except OSError:
        return None


def _run(cmd, what, tty):
    """cmd, its output passed on (pip -v shows it), its [ NN%] progress on the terminal."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in p.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        m = re.match(r"\[\s*(\d+)%\]", line)
        if tty and m:
            tty.write("\rzeppelin: %s %3s%%" % (what, m.group(1)))
            tty.flush()
    if p.wait():
        raise SystemExit("setup.py: %s failed (exit %d): %s" % (what, p.returncode, " ".join(cmd)))


def built():
    """The directory with libzeppelin.so and the tools: ZEPPELIN_BUILD_DIR's
    (tools missing there are built there), or build-pip/, built here."""
    tty = _tty()
    build = os.environ.get("ZEPPELIN_BUILD_DIR")
    fresh = not build
    say = "zeppelin: %s\n"
    if not fresh:
        msg = say % ("using the build in %s (ZEPPELIN_BUILD_DIR)" % build)
        targets = [t for t in TOOLS if not os.path.exists(os.path.join(build, t))]
    else:
        build = os.path.join(ROOT, "build-pip")
        msg = say % ("building libzeppelin and %s with CMake in %s; this takes minutes (pip install -v shows the "
                     "compiler's lines; ZEPPELIN_BUILD_DIR=DIR takes an existing build instead)"
                     % (", ".join(TOOLS), build))
        targets = ["zeppelin"] + TOOLS
    sys.stderr.write(msg)
    if tty:
        tty.write("\n" + msg)  # (after pip's spinner, which ends no line)
        tty.flush()
    if fresh:
        _run(["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DZP_BUILD_TESTS=OFF",
              "-DZP_BUILD_BENCH=OFF", "-DZP_BUILD_EXAMPLES=OFF"], "configuring", None)
    if targets:
        _run(["cmake", "--build", build, "--target"] + targets + ["-j", str(os.cpu_count() or 1)],
             "building " + " ".join(targets), tty)
        if tty:
            tty.write("\n")
    for name in ["libzeppelin.so"] + TOOLS:
        if not os.path.exists(os.path.join(build, name)):
            raise SystemExit("setup.py: no %s in %s" % (name, build))
    return build


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        build = built()
        pkg = os.path.join(self.build_lib, "zeppelin")
        # the file, not the symlinks to it
        shutil.copyfile(os.path.realpath(os.path.join(build, "libzeppelin.so")), os.path.join(pkg, "libzeppelin.so"))
        os.makedirs(os.path.join(pkg, "bin"), exist_ok=True)
        for name in TOOLS:
            shutil.copy(os.path.join(build, name), os.path.join(pkg, "bin", name))  # with its mode


class WithLibrary(Distribution):
    # The package carries a machine's library, like an extension module: so
    # install puts it in platlib, and bdist_wheel makes a non-pure wheel
    # (Root-Is-Purelib: false) with the package at its root. Setting only
    # bdist_wheel's root_is_pure left the files under .data/purelib/.
    def has_ext_modules(self):
        return True


class Install(install):
    # Debian's setuptools wheel (the one pip installs offline from
    # /usr/share/python-wheels) is patched for Debian's Python: its
    # install_lib and install_egg_info ask the install command for
    # install_layout and prefix_option, which only Debian's Python gives it.
    # Under another Python (pyenv's) the build stopped with AttributeError:
    # install_layout. None: the default layout and prefix.
    def initialize_options(self):
        super().initialize_options()
        for name in ("install_layout", "prefix_option"):
            if not hasattr(self, name):
                setattr(self, name, None)


cmdclass = {"build_py": BuildWithLibrary, "install": Install}
if bdist_wheel is not None:
    class PlatformWheel(bdist_wheel):
        def get_tag(self):
            # The platform as bdist_wheel computes it (--plat-name included),
            # but no Python version or ABI: the library is loaded with
            # ctypes, not imported, so any Python 3 on the platform can use it.
            return "py3", "none", super().get_tag()[2]

    cmdclass["bdist_wheel"] = PlatformWheel

setup(version=version(), distclass=WithLibrary, cmdclass=cmdclass)
