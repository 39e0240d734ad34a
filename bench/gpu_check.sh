#!/usr/bin/env bash
# gpu_check.sh: what a person with a GPU machine runs to check Zeppelin's
# device path against the real CUDA runtime and NCCL on it. It works offline
# and on one GPU, installs nothing, and writes one summary file.
#
#   bash bench/gpu_check.sh [--ranks N] [-P uniform|random|zipf] [--build DIR] [--out DIR] [--without-ucx]
#   bash bench/gpu_check.sh --double [--build DIR] [--out DIR] [--without-ucx]
#
# Steps (each timed; a failed step is recorded and the next one runs):
#   tools       what is installed, and what is missing (nothing is installed)
#   versions    device, driver, CUDA and NCCL versions ("unknown" when absent)
#   configure   cmake -DZP_WITH_CUDA=ON into DIR (default build-gpu); UCX is
#               used when present, and one node needs none (ZP_WITH_UCX=AUTO;
#               --without-ucx leaves it out even when present, as on a GPU
#               machine that has none: CI builds the double's programs so)
#   build       only the programs below
#   kernels     the device tests whose results come from the device kernels,
#               checked against the host path's functors (DeviceAttention:
#               the attention driver's merges, additions, 16-bit rounding;
#               Ulysses: the GQA summing kernel)
#   device_tests the other device tests (real.* in ctest)
#   alltoallv_zp, alltoallv_nccl, alltoallv_table
#               alltoallv_perf -G 1 against nccl_alltoallv_perf (NCCL's own
#               grouped ncclSend/ncclRecv) on the same traffic, every byte
#               checked, and one table of both
#   allreduce_zp, allreduce_nccl, allreduce_table
#               all_reduce_perf -G 1 against nccl_all_reduce_perf (NCCL's
#               own ncclAllReduce) on the same buffers, every element
#               checked, and one table of both
#   attention   attn_perf -G 1, the attention driver on device buffers
#   route_*     only with GPU_CHECK_LAUNCH (a launcher of one job across GPU
#               nodes): routed alltoallv, ZP_ROUTING=balanced, rail and off,
#               against NCCL with PXN on and off, e.g.
#                 GPU_CHECK_LAUNCH="srun -N 2 --ntasks-per-node 8" bash bench/gpu_check.sh
#               (the launcher must pass ZP_ROUTING and NCCL_PXN_DISABLE on;
#               DIR must be at the same path on every node)
#
# Ranks: --ranks N (default: the GPUs nvidia-smi lists, at least 2, so that
# alltoallv is more than a self-copy). With fewer GPUs than ranks, ranks
# share GPUs: each gets its own NCCL_HOSTID, without which NCCL refuses two
# ranks of one communicator on one GPU ("Duplicate GPU detected").
#
# --double: the same steps against the CUDA/NCCL test double (tests/fakecuda)
# instead of the real libraries, with one emulated GPU
# (FAKECUDA_DEVICE_COUNT=1), a subset of the device tests and tiny sweeps, so
# that CI runs this script (ctest gpu_check_double) and it cannot rot. With
# --build DIR it reuses that build as it is (no configure, no build). Its
# times are the double's, not a GPU's.
#
# The summary: OUT/summary.txt (OUT defaults to DIR/gpu_check), one log per
# step beside it. Exit status: 0 if no step failed, 1 if one did, 2 for bad
# arguments.
set -uo pipefail  # no -e: every step runs, and each one's status is recorded
cd "$(dirname "$0")/.." || exit 2
src=$PWD

usage() {
  cat <<'EOF'
usage: bash bench/gpu_check.sh [--ranks N] [-P uniform|random|zipf] [--build DIR] [--out DIR] [--without-ucx]
       bash bench/gpu_check.sh --double [--build DIR] [--out DIR] [--without-ucx]
(the header of bench/gpu_check.sh says what each step does)
EOF
}

mode=real
ucx=AUTO
build=
out=
ranks=
pattern=uniform
while [ $# -gt 0 ]; do
  case "$1" in
    --double) mode=double ;;
    --without-ucx) ucx=OFF ;;
    --build | --out | --ranks | -n | -P)
      [ $# -ge 2 ] || { echo "gpu_check: $1 needs a value" >&2; exit 2; }
      case "$1" in
        --build) build=$2 ;;
        --out) out=$2 ;;
        --ranks | -n) ranks=$2 ;;
        -P) pattern=$2 ;;
      esac
      shift ;;
    -h | --help) usage; exit 0 ;;
    [0-9]*) ranks=$1 ;;  # the old form: bash bench/gpu_check.sh NGPUS
    *) echo "gpu_check: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
if [ -n "$ranks" ] && ! [[ "$ranks" =~ ^[1-9][0-9]*$ ]]; then
  echo "gpu_check: --ranks '$ranks' is not a positive number" >&2; exit 2
fi
case "$pattern" in uniform | random | zipf) ;; *)
  echo "gpu_check: -P '$pattern': one of uniform, random, zipf" >&2; exit 2 ;;
esac
reuse=0
if [ -n "$build" ]; then
  if [ "$mode" = double ] && [ ! -f "$build/CMakeCache.txt" ]; then
    echo "gpu_check: --build $build: no CMakeCache.txt there (--double reuses a configured build)" >&2; exit 2
  fi
  [ "$mode" = double ] && reuse=1
else
  build=$src/build-gpu
  [ "$mode" = double ] && build=$src/build-gpu-double
fi
build=$(cd "$src" && mkdir -p "$build" && cd "$build" && pwd)
out=${out:-$build/gpu_check}
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
summary=$out/summary.txt

# The programs each mode runs: the real ones, or the same sources linked
# with the double (tests/CMakeLists.txt).
if [ "$mode" = double ]; then
  tests_bin=tests/device_tests_double; zp_a2a=tests/alltoallv_perf_double
  nccl_a2a=tests/nccl_alltoallv_perf_double; attn=tests/attn_perf_double
  zp_ar=tests/all_reduce_perf_double; nccl_ar=tests/nccl_all_reduce_perf_double
  # One emulated GPU that every rank shares, as on a one-GPU machine.
  export FAKECUDA_DEVICE_COUNT=1
else
  tests_bin=tests/device_tests; zp_a2a=bench/alltoallv_perf
  nccl_a2a=bench/nccl_alltoallv_perf; attn=bench/attn_perf
  zp_ar=bench/all_reduce_perf; nccl_ar=bench/nccl_all_reduce_perf
fi
targets=(zprun)
for p in $tests_bin $zp_a2a $nccl_a2a $attn $zp_ar $nccl_ar; do targets+=("$(basename "$p")"); done

# ---- steps: each one timed, its output in OUT/NAME.log, its status kept ----
rows=()      # "name|status|seconds|note"
failed=0
note=
now() { date +%s.%N; }
# step NAME FUNCTION [ARGS...]: runs the function with its output in the
# step's log; its exit status is the step's (0 ok, anything else FAIL). The
# function may set $note, one line for the summary.
step() {
  local name=$1; shift
  local log=$out/$name.log t0 rc secs status
  note=
  steplog=$log
  echo "== $name" >&2
  t0=$(now)
  "$@" >"$log" 2>&1
  rc=$?
  secs=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
  if [ $rc -eq 0 ]; then status=ok; else status=FAIL; failed=$((failed + 1)); note="${note:+$note; }exit $rc, see $name.log"; fi
  rows+=("$name|$status|$secs|$note")
  echo "   $status ($secs s) $note" >&2
}
skip() {  # skip NAME WHY
  rows+=("$1|skipped|0.0|$2")
  echo "== $1: skipped: $2" >&2
}

# tools: what is here. Nothing is installed; what is missing is named.
missing=()
tools() {
  local need_build=1
  [ $reuse -eq 1 ] && need_build=0
  local cuda_home=${CUDA_HOME:-/usr/local/cuda}
  check() {  # check WHAT NEEDED(1|0) TEST...
    local what=$1 needed=$2; shift 2
    if "$@" >/dev/null 2>&1; then echo "present: $what"; else
      echo "missing: $what"; missing+=("$what")
      [ "$needed" = 1 ] && return 1
    fi
    return 0
  }
  local bad=0
  check python3 1 command -v python3 || bad=1
  check timeout 1 command -v timeout || bad=1
  check cmake $need_build command -v cmake || bad=1
  check "C++ compiler" $need_build command -v c++ || bad=1
  check "nvcc ($cuda_home/bin)" $need_build test -x "$cuda_home/bin/nvcc" || bad=1
  check "cuda_runtime_api.h" $need_build test -f "$cuda_home/include/cuda_runtime_api.h" || bad=1
  check "nccl.h" $need_build nccl_header || bad=1
  check "pkg-config" $need_build command -v pkg-config || bad=1
  check "hwloc >= 2 (libhwloc-dev)" $need_build pkg-config --atleast-version=2.0 hwloc || bad=1
  check "GoogleTest (libgtest-dev)" $need_build test -f /usr/include/gtest/gtest.h || bad=1
  check "nlohmann json (nlohmann-json3-dev)" $need_build test -f /usr/include/nlohmann/json.hpp || bad=1
  check "CLI11 (libcli11-dev)" $need_build test -f /usr/include/CLI/CLI.hpp || bad=1
  # UCX is optional: one node needs none (ZP_WITH_UCX=AUTO builds without it).
  if pkg-config --exists ucx 2>/dev/null; then echo "present: UCX"; else
    echo "missing: UCX (optional: the build leaves it out; one node needs none)"; missing+=("UCX (optional)")
  fi
  if [ "$mode" = real ]; then
    check nvidia-smi 0 command -v nvidia-smi
  fi
  note="missing: ${missing[*]:-nothing}"
  return $bad
}
nccl_header() {  # where the build found nccl.h, else the usual places
  local d f
  d=$(sed -n 's/^NCCL_INCLUDE_DIR:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null)
  for f in "$d/nccl.h" "${NCCL_ROOT:-/nonexistent}/include/nccl.h" "${CUDA_HOME:-/usr/local/cuda}/include/nccl.h" \
           /usr/include/nccl.h; do
    [ -f "$f" ] && { echo "$f"; return 0; }
  done
  return 1
}

# versions: each "unknown" unless something here says it.
device=unknown driver=unknown cuda=unknown nccl=unknown gpus=0 cc=
versions() {
  local cuda_home=${CUDA_HOME:-/usr/local/cuda} q h lib
  if [ "$mode" = double ]; then
    device="the CUDA/NCCL test double (tests/fakecuda), 1 emulated GPU"
    driver="none (test double)"
    gpus=1
  elif command -v nvidia-smi >/dev/null && q=$(nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader 2>&1); then
    echo "nvidia-smi: $q"
    gpus=$(printf '%s\n' "$q" | grep -c .)
    device="$gpus x $(printf '%s\n' "$q" | head -1 | cut -d, -f1 | sed 's/^ *//')"
    driver=$(printf '%s\n' "$q" | head -1 | cut -d, -f2 | sed 's/^ *//')
    cc=$(printf '%s\n' "$q" | head -1 | cut -d, -f3 | tr -d ' .')
  else
    echo "nvidia-smi: ${q:-not installed}"
  fi
  # CUDA: the toolkit the build compiles with, and (real mode) the runtime's
  # and the driver's own answers through libcudart, which need no GPU.
  local toolkit=unknown runtime=unknown drv=unknown
  h="$cuda_home/include/cuda_runtime_api.h"
  [ -f "$h" ] && toolkit=$(awk '/#define CUDART_VERSION/ { v = $3; printf "%d.%d", v / 1000, (v % 1000) / 10 }' "$h")
  if [ "$mode" = real ]; then
    lib=$(ls "$cuda_home"/lib64/libcudart.so* 2>/dev/null | head -1)
    if [ -n "$lib" ]; then
      IFS='|' read -r runtime drv < <(python3 - "$lib" <<'PY'
import ctypes, sys
def ver(f):
    v = ctypes.c_int(0)
    if f(ctypes.byref(v)) != 0: return "unknown"
    return "%d.%d" % (v.value // 1000, v.value % 1000 // 10) if v.value else "none (no driver)"
lib = ctypes.CDLL(sys.argv[1])
print(ver(lib.cudaRuntimeGetVersion) + "|" + ver(lib.cudaDriverGetVersion))
PY
      ) || true
    fi
    cuda="runtime ${runtime:-unknown}, driver API ${drv:-unknown}, toolkit headers $toolkit"
  else
    cuda="the double (no runtime); compiled against CUDA $toolkit headers"
  fi
  # NCCL: ncclGetVersion from the library the programs load, and nccl.h's.
  local hdr header=unknown running=unknown
  hdr=$(nccl_header) && header=$(awk '/#define NCCL_(MAJOR|MINOR|PATCH) / { v[$2] = $3 }
    END { if (v["NCCL_MAJOR"] != "") printf "%s.%s.%s", v["NCCL_MAJOR"], v["NCCL_MINOR"], v["NCCL_PATCH"] }' "$hdr")
  if [ "$mode" = double ]; then lib=$build/tests/fakecuda/libfakecuda.so; else
    lib=$(sed -n 's/^NCCL_LIBRARY:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null)
    [ -f "$lib" ] || lib=$(ls "${NCCL_ROOT:-$cuda_home}"/lib*/libnccl.so* 2>/dev/null | head -1)
  fi
  if [ -n "$lib" ] && [ -f "$lib" ]; then
    running=$(python3 - "$lib" <<'PY'
import ctypes, sys
v = ctypes.c_int(0)
if ctypes.CDLL(sys.argv[1]).ncclGetVersion(ctypes.byref(v)) != 0: print("unknown")
else: print("%d.%d.%d" % (v.value // 10000, v.value % 10000 // 100, v.value % 100))
PY
    ) || running=unknown
  fi
  nccl="ncclGetVersion ${running:-unknown} (${lib:-no library found}), nccl.h $header"
  [ "$mode" = double ] && nccl="the double's ncclGetVersion ${running:-unknown}, nccl.h $header"
  printf 'device: %s\ndriver: %s\nCUDA: %s\nNCCL: %s\n' "$device" "$driver" "$cuda" "$nccl"
}

configure() {
  local args=(-S "$src" -B "$build" -DZP_WITH_CUDA=ON -DZP_WITH_UCX=$ucx -DCMAKE_BUILD_TYPE=RelWithDebInfo)
  # A compiler cache, where installed, serves the files a build in another
  # directory compiled the same (CI: .ci/run builds ./build first).
  command -v ccache >/dev/null && args+=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
                                         -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  # Only this machine's GPU architecture: the default (80;90) compiles twice.
  [ -n "$cc" ] && args+=(-DCMAKE_CUDA_ARCHITECTURES="$cc")
  echo "cmake ${args[*]}"
  cmake "${args[@]}" || return
  if grep -q "Zeppelin: UCX on" "$steplog"; then note="with UCX"; else note="without UCX: one node only"; fi
}

build_targets() {
  echo "cmake --build $build -j$(nproc) --target ${targets[*]}"
  cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"
}

# The device tests, by gtest filter, straight from the binary (ctest would
# write its own logs into the build directory, which a ctest run of this
# script is using). Notes the counts; fails on a failed test or none run.
gtest() {  # gtest FILTER SECONDS
  local bin=$build/$tests_bin
  [ -x "$bin" ] || { note="no $tests_bin in $build"; return 1; }
  echo "$bin --gtest_filter='$1'"
  timeout -k 10 "$2" "$bin" --gtest_filter="$1" --gtest_brief=1 --gtest_color=no
  local rc=$?
  local log=$steplog passed skipped failedn
  passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -1)
  skipped=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$log" | tail -1)
  failedn=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -1)
  note="${passed:-0} passed, ${skipped:-0} skipped, ${failedn:-0} failed"
  [ $rc -eq 124 ] && note="$note; timed out after $2 s"
  if [ $rc -eq 0 ] && [ "${passed:-0}" -eq 0 ]; then
    # Every test skipped: say why (the first skip's reason, e.g. no GPU).
    note="$note; nothing ran: $(grep -m1 -o 'needs a CUDA device: .*' "$log" || echo 'no test matched')"
    return 1
  fi
  return $rc
}

# One benchmark on this node's ranks under zprun; with fewer GPUs than
# ranks, each rank gets its own NCCL_HOSTID so that NCCL lets them share.
bench() {  # bench PROGRAM SECONDS ARGS...
  local prog=$build/$1 secs=$2; shift 2
  [ -x "$prog" ] || { note="no $prog"; return 1; }
  local hostid=()
  [ "$gpus" -lt "$ranks" ] && hostid=(sh -c 'NCCL_HOSTID=gpu-check-rank-$ZP_RANK exec "$0" "$@"')
  echo "zprun -n $ranks --timeout $secs ${hostid[*]} $prog $*"
  "$build/zprun" -n "$ranks" --timeout "$secs" "${hostid[@]}" "$prog" "$@"
}

table() {  # table NAME: NAME_zp's and NAME_nccl's tables side by side; fails on a wrong element or a missing row
  python3 - "$out/$1_zp.log" "$out/$1_nccl.log" <<'PY'
import os, sys
sys.path.insert(0, os.path.join(os.getcwd(), "bench"))
from compare import parse_table
zp, nccl = (parse_table(open(f).read()) for f in sys.argv[1:3])
if not zp or not nccl:
    print("no table from %s" % os.path.basename(sys.argv[1 if not zp else 2])[:-4])
    sys.exit(1)
bad = 0
print("%12s %12s %12s %8s %8s" % ("size (B)", "zp busbw", "nccl busbw", "zp/nccl", "#wrong"))
for size in sorted(set(zp) | set(nccl)):
    a, b = zp.get(size, {}).get("busbw"), nccl.get(size, {}).get("busbw")
    wrong = (zp.get(size, {}).get("wrong") or 0) + (nccl.get(size, {}).get("wrong") or 0)
    bad += wrong + (a is None) + (b is None)
    print("%12d %12s %12s %8s %8d" % (size, "%.2f" % a if a is not None else "n/a",
          "%.2f" % b if b is not None else "n/a", "%.2f" % (a / b) if a and b else "n/a", wrong))
sys.exit(1 if bad else 0)
PY
}

# ---- the run ----
start=$(now)
step tools tools
step versions versions
if [ $reuse -eq 1 ]; then
  skip configure "reusing $build as it is (--double --build)"
  skip build "reusing $build as it is (--double --build)"
else
  step configure configure
  step build build_targets
fi
# Ranks: every GPU, at least 2 (one rank's alltoallv is a self-copy).
if [ -z "$ranks" ]; then ranks=$gpus; [ "$ranks" -lt 2 ] && ranks=2; fi

# The kernels' tests and the others, each within a bound; --double runs a
# subset that fits CI's minute (the whole double.* suite runs in ctest).
kernel_filter='*DeviceAttention*:*Ulysses*'
if [ "$mode" = double ]; then
  kernels_run='Ranks/DeviceAttention.ForwardAndBackwardMatchTheHostDriver/2:Ranks/DeviceRanks.UlyssesMatchesTheHostPath/2'
  others_run='Ranks/DeviceRanks.AlltoallvRandomCountsEveryByte/2:Ranks/DeviceRanks.CollectivesMatchTheHostPath/2'
  others_run+=':DeviceErrors.HostAndDeviceBuffersMustMatchTheStream:Device.NcclCommunicatorIsHandedOut'
  sweep=(-b 64K -e 1M -f 4 -n 2 -w 1 -c 1 -P "$pattern"); attn_args=(-G 1 -b 256K -n 1 -w 0)
  ar_sweep=(-b 64K -e 1M -f 4 -n 2 -w 1 -c 1)
  tsecs=60; bsecs=60
else
  kernels_run=$kernel_filter
  others_run="-$kernel_filter"
  sweep=(-b 1M -e 64M -f 4 -n 10 -w 3 -c 1 -P "$pattern"); attn_args=(-G 1 -b 8M -n 3 -w 1)
  ar_sweep=(-b 1M -e 256M -f 4 -n 10 -w 3 -c 1)
  tsecs=240; bsecs=120
fi
step kernels gtest "$kernels_run" "$tsecs"
step device_tests gtest "$others_run" "$tsecs"
step alltoallv_zp bench "$zp_a2a" "$bsecs" -G 1 "${sweep[@]}"
step alltoallv_nccl bench "$nccl_a2a" "$bsecs" "${sweep[@]}"
step alltoallv_table table alltoallv
step allreduce_zp bench "$zp_ar" "$bsecs" -G 1 "${ar_sweep[@]}"
step allreduce_nccl bench "$nccl_ar" "$bsecs" "${ar_sweep[@]}"
step allreduce_table table allreduce
attention() {
  bench "$attn" "$bsecs" "${attn_args[@]}"
  local rc=$?
  note="Zeppelin's driver only: NCCL has no attention call to compare with${note:+; $note}"
  return $rc
}
step attention attention

# Across nodes, only when given a launcher (a cluster of GPU nodes).
if [ "$mode" = real ] && [ -n "${GPU_CHECK_LAUNCH:-}" ]; then
  route_sweep=(-b 4M -e 256M -f 4 -n 5 -w 2 -c 1 -P "$pattern")
  launch() {  # launch VAR=VALUE PROGRAM ARGS...: one job across the nodes
    echo "$1 $GPU_CHECK_LAUNCH $2 ${*:3}"
    env "$1" $GPU_CHECK_LAUNCH "$build/$2" "${@:3}"
  }
  for routing in balanced rail off; do
    step route_zp_$routing launch ZP_ROUTING=$routing "$zp_a2a" -G 1 "${route_sweep[@]}"
  done
  for pxn in 0 1; do
    step route_nccl_pxn$pxn launch NCCL_PXN_DISABLE=$pxn "$nccl_a2a" "${route_sweep[@]}"
  done
  route_table() {
    python3 - "$out"/route_zp_{balanced,rail,off}.log "$out"/route_nccl_pxn{0,1}.log <<'PY'
import os, sys
sys.path.insert(0, os.path.join(os.getcwd(), "bench"))
from compare import parse_table
names = ["zp balanced", "zp rail", "zp off", "nccl pxn on", "nccl pxn off"]
tables = [parse_table(open(p).read()) for p in sys.argv[1:]]
print("busbw (GB/s) across nodes; the last columns: zp balanced over each NCCL run")
print("%12s" % "size (B)" + "".join("%14s" % n for n in names) + "%12s%12s%8s" % ("/pxn on", "/pxn off", "#wrong"))
bad = 0
for size in sorted(tables[0]):
    row = [t.get(size, {}).get("busbw") for t in tables]
    wrong = sum((t.get(size, {}).get("wrong") or 0) for t in tables)
    bad += wrong
    ratio = lambda b: "%.2f" % (row[0] / b) if row[0] and b else "n/a"
    print("%12d" % size + "".join("%14s" % ("%.2f" % v if v else "n/a") for v in row) +
          "%12s%12s%8d" % (ratio(row[-2]), ratio(row[-1]), wrong))
sys.exit(1 if bad or not tables[0] else 0)
PY
  }
  step route_table route_table
else
  skip route "across nodes needs GPU_CHECK_LAUNCH (a launcher of one job across GPU nodes)"
fi
total=$(awk -v a="$start" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')

# ---- the summary: one file ----
{
  echo "Zeppelin GPU check ($mode mode), $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$src" diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
  echo "command: bash bench/gpu_check.sh $([ "$mode" = double ] && echo "--double ")--build $build --ranks $ranks -P $pattern"
  [ "$mode" = double ] && echo "against the CUDA/NCCL test double: its times are not a GPU's and mean nothing"
  echo "device: $device"
  echo "driver: $driver"
  echo "CUDA: $cuda"
  echo "NCCL: $nccl"
  if [ "$gpus" -eq 0 ]; then echo "ranks: $ranks; no GPU found"
  else echo "ranks: $ranks on $gpus GPU(s)$([ "$gpus" -lt "$ranks" ] && echo ", sharing them, each with its own NCCL_HOSTID")"; fi
  echo "missing: ${missing[*]:-nothing}"
  echo
  printf '%-16s %-8s %8s  %s\n' step status seconds note
  for r in "${rows[@]}"; do
    IFS='|' read -r n s t w <<<"$r"
    printf '%-16s %-8s %8s  %s\n' "$n" "$s" "$t" "$w"
  done
  echo
  if [ -s "$out/alltoallv_table.log" ]; then
    echo "alltoallv, $ranks ranks, device buffers (alltoallv_perf -G 1 / nccl_alltoallv_perf ${sweep[*]}):"
    cat "$out/alltoallv_table.log"
    echo
  fi
  if [ -s "$out/allreduce_table.log" ]; then
    echo "all-reduce, $ranks ranks, device buffers (all_reduce_perf -G 1 / nccl_all_reduce_perf ${ar_sweep[*]}):"
    cat "$out/allreduce_table.log"
    echo
  fi
  [ -s "$out/route_table.log" ] && { cat "$out/route_table.log"; echo; }
  echo "total: $total s; logs: $out"
  if [ $failed -eq 0 ]; then echo "result: PASS"; else echo "result: FAIL (failed steps: $failed)"; fi
} >"$summary"
cat "$summary"
echo "gpu_check: summary in $summary"
[ $failed -eq 0 ]
