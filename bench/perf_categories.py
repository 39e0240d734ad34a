#!/usr/bin/env python3
"""Where a job's core time goes, from a system-wide perf profile.

Reads `perf script` output of a `perf record -a -g` profile (frame-pointer
call chains are enough: the categories come from kernel frames and the
sampled function) and prints each category's share of the samples of the
job's processes (route_perf, mpi_route_perf, tcp_rails, and ksoftirqd, which
does network work for them): cross-memory copies, the kernel's TCP send and
receive paths, softirq network processing, user-space copies, page faults,
sched_yield, polling, library code. Cut the profile to the timed calls with
the window route_perf prints in its cpu line:

  perf record -a -g -F 499 -k CLOCK_MONOTONIC -o zipf.data -- build/zprun --nodes 2 \\
      --ranks-per-node 4 --nics-per-node 4 --nic-rate 1gbit build/bench/route_perf -p zipf \\
      -m balanced -b 32M -e 32M -w 1 -c 0 -n 5
  perf script -i zipf.data --time FROM,TO | python3 bench/perf_categories.py
"""
import sys, re, collections
cat = collections.Counter(); comms = collections.Counter(); tot = 0
def classify(fr):
    chain = ' '.join(fr); top = fr[0] if fr else ''
    h = lambda *xs: any(x in chain for x in xs)
    if h('process_vm_rw'): return 'CMA (process_vm_readv: copy + page pinning)'
    if h('tcp_sendmsg', 'sock_sendmsg', '__sys_sendmsg', '__sys_sendto'): return 'TCP send syscalls (copy + stack + veth/tbf)'
    if h('tcp_recvmsg', 'sock_recvmsg', '__sys_recvfrom', '__sys_recvmsg'): return 'TCP recv syscalls (copy + stack)'
    if h('net_rx_action', 'handle_softirqs', '__do_softirq', 'do_softirq', 'veth_', 'tbf_', 'br_', 'ip_rcv', 'tcp_v4_rcv', 'napi'): return 'softirq / net stack (veth, bridge, tbf, TCP rx)'
    if re.search(r'mem(move|cpy|set)', top) and 'libc' in top: return 'user memcpy/memset (own block, UCX eager copies)'
    if h('clear_page', 'exc_page_fault', 'do_anonymous_page', 'handle_mm_fault'): return 'page faults'
    if h('sched_yield', 'do_sched_yield'): return 'sched_yield'
    if h('__schedule', 'schedule', 'finish_task_switch', 'futex'): return 'scheduling / futex'
    if h('epoll', 'do_sys_poll', '__poll', 'ppoll', 'sys_poll', 'ep_poll'): return 'poll / epoll'
    if 'kernel' in top: return 'kernel other'
    if 'libzeppelin' in top: return 'zeppelin user code'
    if 'libuc' in top: return 'UCX user code'
    return 'other user code'
for block in sys.stdin.read().split('\n\n'):
    lines = [l.strip() for l in block.strip().split('\n') if l.strip()]
    if len(lines) < 2: continue
    comm = lines[0].split()[0]
    if comm.startswith('ksoftirqd'): key = 'ksoftirqd'
    elif comm in ('route_perf', 'mpi_route_perf', 'tcp_rails'): key = comm
    else: key = 'others'
    comms[key] += 1; tot += 1
    if key in ('route_perf', 'mpi_route_perf', 'tcp_rails', 'ksoftirqd'):
        fr = [re.sub(r'^[0-9a-f]+ ', '', l) for l in lines[1:]]
        cat[classify(fr)] += 1
print('samples %d; by process: %s' % (tot, ', '.join('%s %.1f%%' % (k, 100 * v / tot) for k, v in comms.most_common())))
mine = sum(cat.values())
for k, v in cat.most_common(): print('%5.1f%% of all, %5.1f%% of the job  %s' % (100 * v / tot, 100 * v / mine, k))
