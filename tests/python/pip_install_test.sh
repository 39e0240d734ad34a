#!/bin/sh
# `pip install .` as a user would, offline (there is no PyPI here): into a
# venv that sees Debian's packages (setuptools, wheel, torch), the library
# taken from this build (ZEPPELIN_BUILD_DIR; a build of its own takes
# minutes, see setup.py). The installed package must import from outside the
# source tree, load the library it carries, ship py.typed, and run a call.
#   pip_install_test.sh PYTHON SOURCE_DIR BUILD_DIR
set -eu
py=$1 src=$2 build=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" -m venv --system-site-packages "$tmp/venv"
(cd "$tmp" && ZEPPELIN_BUILD_DIR="$build" "$tmp/venv/bin/pip" install -q --no-build-isolation --no-index --no-deps "$src")
cd / && env -u ZEPPELIN_LIBRARY PYTHONNOUSERSITE=1 "$tmp/venv/bin/python" - "$tmp/venv" <<'PY'
import array, os, sys
import zeppelin
here = os.path.dirname(zeppelin.__file__)
assert here.startswith(sys.argv[1]), "imported %s, not the venv's package" % here
assert zeppelin.library_path == os.path.join(here, "libzeppelin.so"), zeppelin.library_path
assert os.path.exists(os.path.join(here, "py.typed"))
c = zeppelin.Communicator.from_unique_id(zeppelin.get_unique_id(), 1, 0)
x = array.array("d", [1.5, 2.5])
c.all_reduce(x, op=zeppelin.MAX)
c.destroy()
assert list(x) == [1.5, 2.5], list(x)
print("pip install test: zeppelin %s from the venv, with its own library" % zeppelin.__version__)
PY
