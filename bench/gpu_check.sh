#!/usr/bin/env bash
# gpu_check.sh: what a person with a GPU machine runs to check Zeppelin's
# device path against NCCL on it. Nothing here has run on a GPU yet (the
# project's machines have none); please send back what it prints.
#
#   bash bench/gpu_check.sh [NGPUS] [-P uniform|random|zipf]
#
# 1. builds with the real CUDA runtime and NCCL (ZP_WITH_CUDA=ON) in build-gpu/
# 2. runs the device tests against them (on a GPU they run instead of skipping)
# 3. sweeps alltoallv_perf -G 1 (Zeppelin) and nccl_alltoallv_perf (NCCL's own
#    grouped ncclSend/ncclRecv on the same traffic) on NGPUS ranks of this node
#    (default: every GPU nvidia-smi lists), every byte checked (-c 1)
# 4. prints one table: busbw of both and their ratio per size.
# 5. only with GPU_CHECK_LAUNCH set (a launcher of one job across several GPU
#    nodes): routed alltoallv across nodes, Zeppelin with ZP_ROUTING=balanced,
#    rail and off against NCCL alone with PXN on (NCCL_PXN_DISABLE=0) and off
#    (=1), the same traffic, every byte checked; one more table. For example
#      GPU_CHECK_LAUNCH="srun -N 2 --ntasks-per-node 8" bash bench/gpu_check.sh
#      GPU_CHECK_LAUNCH="mpirun -np 16 --host a:8,b:8 -x MASTER_ADDR=a -x ZP_ROUTING -x NCCL_PXN_DISABLE" ...
#    The launcher must pass ZP_ROUTING and NCCL_PXN_DISABLE on to the ranks
#    (srun does; mpirun needs the -x above), and build-gpu/ must be at the
#    same path on every node.
set -euo pipefail
cd "$(dirname "$0")/.."
ngpus="${1:-}"
[ -n "$ngpus" ] && shift
if [ -z "$ngpus" ]; then
  ngpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  [ "$ngpus" -ge 1 ] 2>/dev/null || { echo "gpu_check: no GPU found by nvidia-smi; pass NGPUS" >&2; exit 2; }
fi
pattern=uniform
if [ "${1:-}" = "-P" ]; then pattern="$2"; fi

bash .ci/setup --deps-only
cmake -S . -B build-gpu -DZP_WITH_CUDA=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-gpu -j"$(nproc)"

echo "== device tests on the real CUDA runtime and NCCL"
ctest --test-dir build-gpu --output-on-failure -R '^real\.' || echo "gpu_check: device tests FAILED"

sweep=(-b 1M -e 256M -f 2 -c 1 -P "$pattern")
log=build-gpu/gpu_check
mkdir -p "$log"
echo "== Zeppelin: zprun -n $ngpus alltoallv_perf -G 1 ${sweep[*]}"
build-gpu/zprun -n "$ngpus" build-gpu/bench/alltoallv_perf -G 1 "${sweep[@]}" | tee "$log/zeppelin.txt"
echo "== NCCL: zprun -n $ngpus nccl_alltoallv_perf ${sweep[*]}"
build-gpu/zprun -n "$ngpus" build-gpu/bench/nccl_alltoallv_perf "${sweep[@]}" | tee "$log/nccl.txt"

python3 - "$log/zeppelin.txt" "$log/nccl.txt" <<'PY'
import os, sys
sys.path.insert(0, os.path.join(os.getcwd(), "bench"))
from compare import parse_table
zp, nccl = (parse_table(open(f).read()) for f in sys.argv[1:3])
print("\n%12s %12s %12s %8s %8s" % ("size (B)", "zp busbw", "nccl busbw", "zp/nccl", "#wrong"))
for size in sorted(zp):
    a, b = zp[size]["busbw"], nccl.get(size, {}).get("busbw")
    wrong = (zp[size]["wrong"] or 0) + (nccl.get(size, {}).get("wrong") or 0)
    print("%12d %12.2f %12s %8s %8d" % (size, a, "%.2f" % b if b else "n/a", "%.2f" % (a / b) if b else "n/a", wrong))
PY

[ -n "${GPU_CHECK_LAUNCH:-}" ] || exit 0
echo "== across nodes: $GPU_CHECK_LAUNCH (routing on devices against NCCL alone)"
route_sweep=(-b 4M -e 1G -f 4 -c 1 -P "$pattern")
runs=()
for routing in balanced rail off; do
  echo "== Zeppelin ZP_ROUTING=$routing: alltoallv_perf -G 1 ${route_sweep[*]}"
  ZP_ROUTING=$routing $GPU_CHECK_LAUNCH build-gpu/bench/alltoallv_perf -G 1 "${route_sweep[@]}" | tee "$log/route-zp-$routing.txt"
  runs+=("zp $routing=$log/route-zp-$routing.txt")
done
for pxn in 0 1; do
  echo "== NCCL NCCL_PXN_DISABLE=$pxn: nccl_alltoallv_perf ${route_sweep[*]}"
  NCCL_PXN_DISABLE=$pxn $GPU_CHECK_LAUNCH build-gpu/bench/nccl_alltoallv_perf "${route_sweep[@]}" | tee "$log/route-nccl-pxn$pxn.txt"
done
runs+=("nccl pxn on=$log/route-nccl-pxn0.txt" "nccl pxn off=$log/route-nccl-pxn1.txt")

python3 - "${runs[@]}" <<'PY'
import os, sys
sys.path.insert(0, os.path.join(os.getcwd(), "bench"))
from compare import parse_table
names, tables = [], []
for arg in sys.argv[1:]:
    name, path = arg.split("=", 1)
    names.append(name)
    tables.append(parse_table(open(path).read()))
base = tables[0]  # zp balanced
print("\nbusbw (GB/s) across nodes; the last columns: zp balanced over each NCCL run")
print("%12s" % "size (B)" + "".join("%14s" % n for n in names) + "%12s%12s%8s" % ("/pxn on", "/pxn off", "#wrong"))
for size in sorted(base):
    row = [t.get(size, {}).get("busbw") for t in tables]
    wrong = sum((t.get(size, {}).get("wrong") or 0) for t in tables)
    ratio = lambda b: "%.2f" % (row[0] / b) if row[0] and b else "n/a"
    print("%12d" % size + "".join("%14s" % ("%.2f" % v if v else "n/a") for v in row) +
          "%12s%12s%8d" % (ratio(row[-2]), ratio(row[-1]), wrong))
PY
