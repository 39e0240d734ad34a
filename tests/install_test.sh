#!/usr/bin/env bash
# Installs the build into a scratch prefix, then builds and runs a program
# against it through find_package(zeppelin) and through pkg-config.
set -euo pipefail
build=$1
src=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
cmake -S "$src/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/consumer" >"$tmp/build.log" 2>&1 || { tail -40 "$tmp/build.log"; exit 1; }
LD_LIBRARY_PATH="$tmp/prefix/lib" "$tmp/consumer/consumer"
"$tmp/consumer/consumer_static"
libdir=$(ls -d "$tmp"/prefix/lib*/pkgconfig | head -1)
# As installed: the .pc file finds the prefix from its own place.
flags=$(PKG_CONFIG_PATH="$libdir" pkg-config --cflags --libs zeppelin)
cc -std=c99 -Wall -Werror "$src/consumer/main.c" $flags -o "$tmp/pc_consumer"
LD_LIBRARY_PATH="$tmp/prefix/lib" "$tmp/pc_consumer"
for tool in zprun zptopo zpconfig zpplan; do test -x "$tmp/prefix/bin/$tool"; done
# The Python package loads the installed library, not the build tree's.
lib=$(ls "$tmp"/prefix/lib*/libzeppelin.so.0 | head -1)
(cd / && env -u ZEPPELIN_LIBRARY PYTHONPATH="$tmp/prefix/lib/python3/dist-packages" python3 -c "
import sys, zeppelin
assert zeppelin.library_path == sys.argv[1], (zeppelin.library_path, sys.argv[1])
assert zeppelin.__version__.count('.') == 2
c = zeppelin.Communicator.from_unique_id(zeppelin.get_unique_id(), 1, 0)
c.destroy()
" "$lib")
# The package says it is typed (PEP 561), so type checkers read its hints.
test -f "$tmp/prefix/lib/python3/dist-packages/zeppelin/py.typed"
echo "install test: find_package, static, pkg-config, the tools and the Python package all fine"
