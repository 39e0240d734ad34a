#!/usr/bin/env python3
"""Checks the layering of the source tree: data flows down, nothing below
includes anything above it (docs/design.md, "Layers").

Each folder may include Zeppelin headers only from the folders listed for it
(standard and system headers are not checked), and never the headers listed
as banned for it. Among them:
- no file under transport/ includes src/core/comm.h or src/route/ (a
  transport knows the communicator only through src/core/transport.h, and
  the routing layer only through src/core/routing.h);
- the carriers (transport/shm, transport/ucx, transport/nccl) include
  nothing of the relay (transport/relay/) or of routing (src/route/,
  src/core/routing.h): they offer lanes and know nothing of who uses them;
- no file under collectives/ includes anything under transport/ or
  src/route/: collectives hand Ops to the executor and reach routing only
  through Routing (src/core/routing.h);
- src/route includes, of transport/, only the relay's header (it installs
  the relay); bench/ and src/tools/ reach the library through the C API and
  the plain-data layers (planner, simulator, topology, router), never the
  communicator, the transports or the collectives;
- src/core includes neither src/route nor collectives, nor anything under
  transport/: the communicator reaches every transport, host or device,
  through the table declared in src/core/transport.h (hostTransports(),
  streamTransportKind()), which transport/transports.cc defines;
- no file under src/api includes anything under transport/: the C face
  reaches the device data plane (zpAddDeviceInitHook) through that table too.
Besides includes, no library source may dynamic_cast to a transport type:
the executor finds a transport by peer, never by asking what it is. And the
Python package crosses into C only through the public header: every zp*
name it uses is declared in include/zeppelin.h.

Run from ctest with the source directory as the argument; prints one line
per rule broken, naming the file, the line and the rule, and fails if any is.
"""
import os
import re
import sys

# What a carrier (a transport others are built on) must never include.
CARRIER_BANS = ["src/core/comm.h", "src/core/routing.h", "src/route/", "transport/relay/"]
# folder -> (prefixes it may include, headers it must never include). The
# most specific folder wins.
RULES = {
    "src/util": (["src/util/"], []),
    "transport": (["include/", "src/util/", "src/core/", "transport/"], ["src/core/comm.h", "src/route/"]),
    "transport/shm": (["include/", "src/util/", "src/core/", "transport/shm/"], CARRIER_BANS),
    "transport/ucx": (["include/", "src/util/", "src/core/", "transport/ucx/"], CARRIER_BANS),
    "transport/nccl": (["include/", "src/util/", "src/core/", "transport/nccl/"], CARRIER_BANS),
    "src/core": (["include/", "src/util/", "src/core/"], ["src/route/", "collectives/", "transport/"]),
    "src/route": (["include/", "src/util/", "src/core/", "transport/relay/relay.h", "src/route/"], []),
    # The planner is plain computation: it never sees a communicator.
    "src/plan": (["include/", "src/util/", "src/core/", "src/plan/"], ["src/core/comm.h"]),
    # The step simulator sits on the planner, outside the library.
    "src/sim": (["include/", "src/util/", "src/plan/", "src/sim/"], []),
    "collectives": (["include/", "src/util/", "src/core/", "collectives/"],
                    ["collectives/ext/", "transport/", "src/route/"]),
    # The extension layer is built on the public C API only (and on the
    # NVTX ranges' helper, which holds no state of the library).
    "collectives/ext": (["include/zeppelin.h", "collectives/ext/", "src/util/nvtx.h"], []),
    # The emulated cluster is a test fixture of its own: no Zeppelin internals.
    "src/launcher/cluster": (["src/util/", "src/launcher/cluster/"], []),
    # The C face sits above every layer of the library.
    # It reaches the transports only through the table (src/core/transport.h).
    "src/api": (["include/", "src/util/", "src/core/", "src/route/", "src/plan/", "collectives/", "src/api/"],
                ["collectives/ext/", "transport/"]),
    # The command-line tools: plain-data layers, the parameters and logging.
    "src/tools": (["include/", "src/util/", "src/core/config.h", "src/core/log.h", "src/core/params.h",
                   "src/core/topology.h", "src/plan/", "src/sim/", "src/tools/"], []),
    # The benchmarks: the C API, and the plain-data layers they measure.
    "bench": (["include/", "src/util/", "src/plan/", "src/sim/", "src/route/router.h", "bench/"], []),
    # zprun uses the C API and the bootstrap's unique-id helpers.
    "src/launcher": (["include/", "src/util/", "src/core/bootstrap.h", "src/launcher/"], []),
}
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
# A dynamic_cast to a transport type (Transport, ShmTransport, Relay, ...).
CAST_CHECKED = ["include", "src", "transport", "collectives", "bench", "examples"]
TRANSPORT_CAST = re.compile(r'dynamic_cast\s*<\s*(const\s+)?(\w+::)*\w*(Transport|Relay)\b')
SOURCE = (".h", ".cc", ".c", ".cu", ".cuh")


def rule_for(path):
    best = None
    for folder in RULES:
        if path == folder or path.startswith(folder + "/"):
            if best is None or len(folder) > len(best):
                best = folder
    return best


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    checked = 0
    failed = set()
    for folder in sorted(RULES):
        top = os.path.join(root, folder)
        for dirpath, _, files in os.walk(top):
            for name in sorted(files):
                if not name.endswith(SOURCE):
                    continue
                path = os.path.relpath(os.path.join(dirpath, name), root)
                owner = rule_for(path)
                if owner != folder:
                    continue  # a more specific folder's rule covers it
                allowed, banned = RULES[owner]
                checked += 1
                with open(os.path.join(root, path), encoding="utf-8") as f:
                    for lineno, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        inc = m.group(1)
                        if "/" not in inc:
                            # A header next to the file (same folder), else
                            # on the include path (include/zeppelin.h).
                            near = os.path.join(os.path.dirname(path), inc)
                            inc = os.path.relpath(near, ".") if os.path.exists(os.path.join(root, near)) \
                                else "include/" + inc
                        ok = any(inc == a or inc.startswith(a) for a in allowed) and not any(
                            inc == b or inc.startswith(b) for b in banned)
                        if not ok:
                            failed.add(path)
                            print(f"{path}:{lineno}: includes {inc}, but {owner}/ may include only "
                                  f"{', '.join(allowed)}" + (f" and never {', '.join(banned)}" if banned else ""))
    # The casts: in every source of the tree but the tests.
    for top in CAST_CHECKED:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith(SOURCE):
                    continue
                path = os.path.relpath(os.path.join(dirpath, name), root)
                with open(os.path.join(root, path), encoding="utf-8") as f:
                    for lineno, line in enumerate(f, 1):
                        if TRANSPORT_CAST.search(line):
                            failed.add(path)
                            print(f"{path}:{lineno}: casts to a transport type; the executor finds a transport "
                                  f"by peer (Comm::transportFor), never by its type")
    # Python's C boundary: the zp* names the package uses, in the public header.
    header = open(os.path.join(root, "include", "zeppelin.h"), encoding="utf-8").read()
    declared = set(re.findall(r"\bzp[A-Z]\w*", header))
    pydir = os.path.join(root, "python", "zeppelin")
    for name in sorted(os.listdir(pydir)) if os.path.isdir(pydir) else []:
        if not name.endswith(".py"):
            continue
        path = os.path.relpath(os.path.join(pydir, name), root)
        checked += 1
        with open(os.path.join(root, path), encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                for sym in re.findall(r"\bzp[A-Z]\w*", line):
                    if sym not in declared:
                        failed.add(path)
                        print(f"{path}:{lineno}: uses {sym}, which include/zeppelin.h does not declare: the "
                              f"package reaches the library only through the public C API")
    print(f"include rules: {checked} files checked")
    print(f"{checked - len(failed)} passed, {len(failed)} failed")
    return 1 if failed or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
