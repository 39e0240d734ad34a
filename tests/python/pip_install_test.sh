#!/bin/sh
# `pip install .` as a user would, offline (there is no PyPI here): into a
# venv that sees no system package, with pip's build isolation, the build's
# setuptools and wheel installed from the wheels Debian ships in
# /usr/share/python-wheels. Then the wheel built from the tree (`pip wheel`):
# tagged for the platform (it carries libzeppelin.so), installed into another
# such venv. Both builds take the library of this build (ZEPPELIN_BUILD_DIR;
# a build of its own takes minutes, see setup.py). Each installed package
# must import from outside the source tree, load the library it carries (the
# build's: ZEPPELIN_BUILD_DIR reached setup.py through the isolated build),
# ship py.typed, and run a call; the console scripts zprun, zpplan, zptopo
# and zpconfig must run the tools the package carries (zprun starting 2 ranks
# that import it, ZP_DEBUG=VERSION printing one version line per process);
# the first pip install, under script(1), must say on the terminal which
# build it used; and import zeppelin.distributed must say how to get torch.
#   pip_install_test.sh PYTHON SOURCE_DIR BUILD_DIR
set -eu
py=$1 src=$2 build=$3
wheels=/usr/share/python-wheels
for w in setuptools wheel; do
  ls "$wheels/$w"-*.whl >/dev/null 2>&1 ||
    { echo "no $w-*.whl in $wheels: apt-get install python3-$w-whl (.ci/setup installs it)" >&2; exit 1; }
done
# Only what is tested: not pip's settings of the caller (an extra
# --find-links, no build isolation) nor its cache of wheels.
unset $(env | sed -n 's/^\(PIP_[A-Za-z0-9_]*\)=.*/\1/p')
export PIP_CONFIG_FILE=/dev/null PIP_NO_CACHE_DIR=1 ZEPPELIN_BUILD_DIR="$build"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
venv() {  # venv DIR: a venv that sees no system package (numpy is one)
  "$py" -m venv "$1"
  "$1/bin/python" -c "import importlib.util as u, sys; sys.exit(u.find_spec('numpy') is not None)" ||
    { echo "the venv $1 sees system packages" >&2; exit 1; }
}
check() {  # check VENV: its zeppelin is its own, the build's library, and works
  (cd / && env -u ZEPPELIN_LIBRARY PYTHONNOUSERSITE=1 "$1/bin/python" - "$1" "$build" <<'PY'
import array, filecmp, os, sys
import zeppelin
here = os.path.dirname(zeppelin.__file__)
assert here.startswith(sys.argv[1]), "imported %s, not the venv's package" % here
assert zeppelin.library_path == os.path.join(here, "libzeppelin.so"), zeppelin.library_path
assert filecmp.cmp(zeppelin.library_path, os.path.join(sys.argv[2], "libzeppelin.so"), shallow=False), \
    "the package's library is not %s/libzeppelin.so (did ZEPPELIN_BUILD_DIR reach setup.py?)" % sys.argv[2]
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
tools() {  # tools VENV: the console scripts run the programs the package carries
  (cd / && env -u ZEPPELIN_LIBRARY PYTHONNOUSERSITE=1 "$1/bin/zpconfig" --list | grep -q ZP_TIMEOUT) ||
    { echo "$1/bin/zpconfig --list does not list ZP_TIMEOUT" >&2; exit 1; }
  for t in zpplan zptopo; do
    (cd / && "$1/bin/$t" --help >/dev/null) || { echo "$1/bin/$t --help failed" >&2; exit 1; }
  done
  # -p: each rank's lines whole and prefixed with its rank (zprun's own
  # version line, from the rendezvous it hosts, has no prefix).
  out=$(cd / && env -u ZEPPELIN_LIBRARY PYTHONNOUSERSITE=1 ZP_DEBUG=VERSION "$1/bin/zprun" -p -n 2 "$1/bin/python" -c \
    "import zeppelin; c = zeppelin.init(); c.barrier(); print('rank', c.rank, 'of', c.size); c.destroy()" 2>&1) ||
    { echo "$1/bin/zprun -n 2 failed: $out" >&2; exit 1; }
  for r in 0 1; do echo "$out" | grep -q "^\[$r\] rank $r of 2" || { echo "no rank $r in: $out" >&2; exit 1; }; done
  [ "$(echo "$out" | grep -c '^\[[01]\] .*ZP INFO Zeppelin version')" = 2 ] ||
    { echo "ZP_DEBUG=VERSION: not one version line per process: $out" >&2; exit 1; }
}
venv "$tmp/plain"
# Under script(1), which gives pip a terminal: the build says on it what it does.
(cd "$tmp" && script -qec "'$tmp/plain/bin/pip' install -q --no-index --find-links '$wheels' '$src'" "$tmp/tty.log" \
  >/dev/null)
grep -q "zeppelin: using the build in $build (ZEPPELIN_BUILD_DIR)" "$tmp/tty.log" ||
  { echo "pip install printed no build line on the terminal:" >&2; cat "$tmp/tty.log" >&2; exit 1; }
check "$tmp/plain"
tools "$tmp/plain"
(cd "$tmp" && "$tmp/plain/bin/pip" wheel -q --no-index --find-links "$wheels" --no-deps -w "$tmp/dist" "$src")
whl=$(ls "$tmp"/dist/zeppelin-*.whl)
plat=$("$py" -c "import sysconfig; print(sysconfig.get_platform().replace('-', '_').replace('.', '_'))")
case $whl in
  *-py3-none-"$plat".whl) ;;
  *) echo "the wheel is not tagged py3-none-$plat: $whl" >&2; exit 1 ;;
esac
"$py" - "$whl" <<'PY'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/WHEEL"))).decode()
assert "Root-Is-Purelib: false" in meta, "the wheel is marked pure:\n" + meta
assert "zeppelin/libzeppelin.so" in z.namelist(), "the library is not at the wheel's root"
PY
venv "$tmp/other"
"$tmp/other/bin/pip" install -q --no-index "$whl"
check "$tmp/other"
tools "$tmp/other"
# A venv without torch: the package works, and its torch parts say how to get torch.
msg=$(cd / && PYTHONNOUSERSITE=1 "$tmp/other/bin/python" -c "import zeppelin.distributed" 2>&1) &&
  { echo "import zeppelin.distributed worked in a venv without torch?" >&2; exit 1; }
echo "$msg" | grep -q "venv --system-site-packages" ||
  { echo "no advice on getting torch: $msg" >&2; exit 1; }
