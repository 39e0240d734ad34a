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
flags=$(PKG_CONFIG_PATH="$libdir" pkg-config --cflags --libs zeppelin)
# pkg-config's prefix is the configured one; point it at the scratch prefix.
flags=${flags//$(PKG_CONFIG_PATH="$libdir" pkg-config --variable=prefix zeppelin)/$tmp/prefix}
cc -std=c99 -Wall -Werror "$src/consumer/main.c" $flags -o "$tmp/pc_consumer"
LD_LIBRARY_PATH="$tmp/prefix/lib" "$tmp/pc_consumer"
test -x "$tmp/prefix/bin/zprun"
echo "install test: find_package, static, pkg-config and zprun all fine"
