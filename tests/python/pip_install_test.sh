#!/bin/sh
# `pip install .` as a user would, offline (there is no PyPI here): into a
# venv that sees Debian's packages (setuptools, wheel, torch), the library
# taken from this build (ZEPPELIN_BUILD_DIR; a build of its own takes
# minutes, see setup.py). Then a wheel built from the tree (`pip wheel`),
# installed into a venv that sees no system package at all (a plain venv has
# pip and setuptools but not wheel, which `pip install .` needs to build).
# Each installed package must import from outside the source tree, load the
# library it carries, ship py.typed, and run a call.
#   pip_install_test.sh PYTHON SOURCE_DIR BUILD_DIR
set -eu
py=$1 src=$2 build=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
check() {  # check VENV: its zeppelin is its own and works
  (cd / && env -u ZEPPELIN_LIBRARY PYTHONNOUSERSITE=1 "$1/bin/python" - "$1" <<'PY'
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
print("pip install test: zeppelin %s from %s, with its own library" % (zeppelin.__version__, sys.argv[1]))
PY
  )
}
"$py" -m venv --system-site-packages "$tmp/venv"
(cd "$tmp" && ZEPPELIN_BUILD_DIR="$build" "$tmp/venv/bin/pip" install -q --no-build-isolation --no-index --no-deps "$src")
check "$tmp/venv"
(cd "$tmp" && ZEPPELIN_BUILD_DIR="$build" "$tmp/venv/bin/pip" wheel -q --no-build-isolation --no-index --no-deps \
  -w "$tmp/dist" "$src")
"$py" -m venv "$tmp/plain"
"$tmp/plain/bin/python" -c "import importlib.util as u, sys; sys.exit(u.find_spec('numpy') is not None)" ||
  { echo "the plain venv sees system packages"; exit 1; }
"$tmp/plain/bin/pip" install -q --no-index "$tmp"/dist/zeppelin-*.whl
check "$tmp/plain"
