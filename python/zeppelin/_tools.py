"""The command-line tools installed with the package (pip's console
scripts zprun, zpplan, zptopo, zpconfig): each runs the program of that
name that the package carries in zeppelin/bin (setup.py builds them with
the library), or, in a source tree, the one in <tree>/build."""

import os
import sys
from typing import NoReturn


def _exec(name: str) -> NoReturn:
    here = os.path.dirname(os.path.abspath(__file__))
    tree_build = os.path.join(os.path.dirname(os.path.dirname(here)), "build")
    for path in (os.path.join(here, "bin", name), os.path.join(tree_build, name)):
        if os.path.isfile(path):
            if not os.access(path, os.X_OK):  # a wheel unpacked without file modes
                os.chmod(path, 0o755)
            os.execv(path, [path] + sys.argv[1:])
    sys.exit("zeppelin: no %s program in %s or %s (pip install builds it; in a source tree: cmake --build build "
             "--target %s)" % (name, os.path.join(here, "bin"), tree_build, name))


def zprun() -> NoReturn:
    _exec("zprun")


def zpplan() -> NoReturn:
    _exec("zpplan")


def zptopo() -> NoReturn:
    _exec("zptopo")


def zpconfig() -> NoReturn:
    _exec("zpconfig")
