"""The "zeppelin" torch.distributed backend (zeppelin.distributed) and
communicator(group), under torchrun on every rank. Every rank draws every
rank's input from seeds, so each result is checked against values computed
here, element by element; the values are small integers in float64, so sums
and products are exact in any order."""
import pytest
import torch
import torch.distributed as dist

import zeppelin
import zeppelin.distributed


@pytest.fixture(scope="module", autouse=True)
def world():
    dist.init_process_group("zeppelin")  # torchrun's MASTER_ADDR, RANK, WORLD_SIZE
    yield
    dist.destroy_process_group()


def values(r, n=37, lo=-3, hi=4, seed=0):
    g = torch.Generator().manual_seed(1000 * seed + r)
    return torch.randint(lo, hi, (n,), generator=g).to(torch.float64)


def test_the_default_group_is_zeppelin():
    assert dist.get_backend() == "zeppelin"
    assert isinstance(dist.distributed_c10d._get_default_group(), zeppelin.distributed.ProcessGroupZeppelin)


@pytest.mark.parametrize("op", ["SUM", "PRODUCT", "MIN", "MAX", "AVG"])
def test_all_reduce(op):
    rank, n = dist.get_rank(), dist.get_world_size()
    inputs = [values(r, lo=-2 if op == "PRODUCT" else -3, hi=3, seed=1) for r in range(n)]
    stacked = torch.stack(inputs)
    want = {"SUM": stacked.sum(0), "PRODUCT": stacked.prod(0), "MIN": stacked.min(0).values,
            "MAX": stacked.max(0).values, "AVG": stacked.sum(0) / n}[op]
    x = inputs[rank].clone()
    work = dist.all_reduce(x, op=getattr(dist.ReduceOp, op), async_op=True)
    assert work.wait()
    assert torch.equal(x, want), (x, want)
    assert torch.equal(work.get_future().value()[0], want)


def test_broadcast_and_reduce():
    rank, n = dist.get_rank(), dist.get_world_size()
    for root in range(n):
        x = values(rank, seed=2)
        dist.broadcast(x, src=root)
        assert torch.equal(x, values(root, seed=2))
        y = values(rank, seed=3)
        dist.reduce(y, dst=root, op=dist.ReduceOp.SUM)
        if rank == root:
            assert torch.equal(y, sum(values(r, seed=3) for r in range(n)))


def test_all_gather_and_reduce_scatter():
    rank, n = dist.get_rank(), dist.get_world_size()
    x = values(rank, n=5, seed=4)
    outs = [torch.full((5,), float("nan"), dtype=torch.float64) for _ in range(n)]
    dist.all_gather(outs, x)
    for r in range(n):
        assert torch.equal(outs[r], values(r, n=5, seed=4))
    flat = torch.full((5 * n,), float("nan"), dtype=torch.float64)
    dist.all_gather_into_tensor(flat, x)
    assert torch.equal(flat, torch.cat([values(r, n=5, seed=4) for r in range(n)]))

    blocks = [values(rank, n=3, seed=10 + b) for b in range(n)]
    out = torch.full((3,), float("nan"), dtype=torch.float64)
    dist.reduce_scatter(out, blocks, op=dist.ReduceOp.MAX)
    assert torch.equal(out, torch.stack([values(r, n=3, seed=10 + rank) for r in range(n)]).max(0).values)
    out2 = torch.full((3,), float("nan"), dtype=torch.float64)
    dist.reduce_scatter_tensor(out2, torch.cat(blocks))
    assert torch.equal(out2, sum(values(r, n=3, seed=10 + rank) for r in range(n)))


def test_all_to_all_single_and_all_to_all():
    rank, n = dist.get_rank(), dist.get_world_size()
    rows = lambda s, d: 1 + (3 * s + d) % 4  # noqa: E731 (rows rank s sends to rank d)
    width = 6
    send = [values(rank, n=rows(rank, d) * width, seed=20 + d).view(-1, width) for d in range(n)]
    out = torch.full((sum(rows(s, rank) for s in range(n)), width), float("nan"), dtype=torch.float64)
    dist.all_to_all_single(out, torch.cat(send), [rows(s, rank) for s in range(n)], [rows(rank, d) for d in range(n)])
    want = torch.cat([values(s, n=rows(s, rank) * width, seed=20 + rank).view(-1, width) for s in range(n)])
    assert torch.equal(out, want)
    equal = torch.full((2 * n, width), float("nan"), dtype=torch.float64)
    dist.all_to_all_single(equal, torch.cat([values(rank, n=2 * width, seed=30 + d).view(2, width) for d in range(n)]))
    assert torch.equal(equal, torch.cat([values(s, n=2 * width, seed=30 + rank).view(2, width) for s in range(n)]))
    outs = [torch.full((rows(s, rank), width), float("nan"), dtype=torch.float64) for s in range(n)]
    dist.all_to_all(outs, send)
    assert torch.equal(torch.cat(outs), want)


def test_send_recv_and_barrier():
    rank, n = dist.get_rank(), dist.get_world_size()
    if n < 2:
        pytest.skip("one rank")
    got = torch.full((9,), float("nan"), dtype=torch.float64)
    if rank % 2 == 0:
        dist.send(values(rank, n=9, seed=40), dst=(rank + 1) % n)
        dist.recv(got, src=(rank - 1) % n)
    else:
        dist.recv(got, src=(rank - 1) % n)
        dist.send(values(rank, n=9, seed=40), dst=(rank + 1) % n)
    assert torch.equal(got, values((rank - 1) % n, n=9, seed=40))
    dist.barrier()


def test_unsupported_calls_say_so():
    x = values(dist.get_rank(), seed=50)
    for name in ("BAND", "BOR", "BXOR"):
        with pytest.raises(Exception, match="SUM, PRODUCT, MIN, MAX and AVG, not ReduceOp.%s$" % name):
            dist.all_reduce(x.to(torch.int64), op=getattr(dist.ReduceOp, name))
    with pytest.raises(Exception, match="monitored_barrier"):
        dist.monitored_barrier()
    dist.barrier()  # still usable: nothing reached the library


def test_gather_and_scatter_every_root():
    rank, n = dist.get_rank(), dist.get_world_size()
    for root in range(n):
        x = values(rank, n=6, seed=80 + root).view(2, 3)
        outs = [torch.full((2, 3), float("nan"), dtype=torch.float64) for _ in range(n)] if rank == root else None
        dist.gather(x, outs, dst=root)
        if rank == root:
            for r in range(n):
                assert torch.equal(outs[r], values(r, n=6, seed=80 + root).view(2, 3)), (root, r)
        got = torch.full((5,), float("nan"), dtype=torch.float64)
        blocks = [values(root, n=5, seed=90 + r) for r in range(n)] if rank == root else None
        dist.scatter(got, blocks, src=root)
        assert torch.equal(got, values(root, n=5, seed=90 + rank)), root


def test_gather_list_of_the_wrong_length_is_refused():
    rank, n = dist.get_rank(), dist.get_world_size()
    x = values(rank, seed=81)
    if rank == 0:
        with pytest.raises(Exception, match="gather_list has 1 tensors"):
            dist.gather(x, [x.clone()], dst=0) if n > 1 else dist.gather(x, [x, x], dst=0)
    dist.barrier()


def test_send_recv_with_tags_match_per_tag_in_order():
    """Rank 0 sends to rank 1 three messages on tag 7 and two on tag 3,
    interleaved; rank 1 posts its receives tag 3 first. Each tag's messages
    arrive in order; tags 0 and 5 are posted too. Then a blocking send and
    recv with a tag."""
    rank, n = dist.get_rank(), dist.get_world_size()
    if n < 2:
        pytest.skip("one rank")
    sends = [(7, 0), (3, 1), (7, 2), (0, 3), (3, 4), (7, 5), (5, 6)]  # (tag, which message)
    size = lambda i: 3 + i  # noqa: E731 (every message its own size, so a mismatch cannot pass silently)
    if rank == 0:
        works = [dist.isend(values(0, n=size(i), seed=100 + i), 1, tag=t) for t, i in sends]
        for w in works:
            w.wait()
        dist.send(values(0, n=4, seed=120), 1, tag=9)
    elif rank == 1:
        order = sorted(sends, key=lambda ti: (ti[0] != 3, ti[0] != 0, ti[0], ti[1]))  # tag 3 first
        got = {i: torch.full((size(i),), float("nan"), dtype=torch.float64) for _, i in sends}
        works = [dist.irecv(got[i], 0, tag=t) for t, i in order]
        for w in reversed(works):
            w.wait()
        for t, i in sends:
            assert torch.equal(got[i], values(0, n=size(i), seed=100 + i)), (t, i)
        last = torch.full((4,), float("nan"), dtype=torch.float64)
        dist.recv(last, 0, tag=9)
        assert torch.equal(last, values(0, n=4, seed=120))
    dist.barrier()


def test_a_tag_matched_to_another_tags_message_is_an_error():
    """Blocking sends on tags 1 then 2, blocking receives on tag 2 then 1:
    each runs alone, so the library pairs them in call order; the header
    says the tags differ, and the receive fails instead of keeping the
    wrong message."""
    rank, n = dist.get_rank(), dist.get_world_size()
    if n < 2:
        pytest.skip("one rank")
    gloo = dist.new_group(backend="gloo")
    if rank == 0:
        w1 = dist.isend(values(0, n=4, seed=130), 1, tag=1)
        w1.wait()
    elif rank == 1:
        got = torch.full((4,), float("nan"), dtype=torch.float64)
        with pytest.raises(Exception, match="tag 2 matched a message sent with tag 1"):
            dist.recv(got, 0, tag=2)
    dist.barrier(group=gloo)
    dist.destroy_process_group(gloo)


def test_ddp_trains_as_one_process_would():
    """One step of DistributedDataParallel over the backend: every rank's
    parameters equal those of one process training on the whole batch."""
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).double()
    reference = [p.detach().clone() for p in model.parameters()]
    g = torch.Generator().manual_seed(8)
    xs, ys = torch.randn(4 * n, 8, generator=g).double(), torch.randn(4 * n, 4, generator=g).double()

    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    loss = torch.nn.functional.mse_loss(ddp(xs[4 * rank:4 * rank + 4]), ys[4 * rank:4 * rank + 4])
    loss.backward()  # DDP averages the gradients over the ranks
    opt.step()

    torch.manual_seed(7)
    alone = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).double()
    for p, q in zip(alone.parameters(), reference):
        assert torch.equal(p, q)
    opt1 = torch.optim.SGD(alone.parameters(), lr=0.1)
    sum(torch.nn.functional.mse_loss(alone(xs[4 * r:4 * r + 4]), ys[4 * r:4 * r + 4]) for r in range(n)).div(n).backward()
    opt1.step()
    for p, q in zip(model.parameters(), alone.parameters()):
        assert torch.allclose(p, q, rtol=0, atol=1e-12), (p - q).abs().max()


def test_ddp_three_steps_lose_as_with_gloo():
    """Three steps of DistributedDataParallel on the zeppelin backend and on a
    gloo group, from the same model and data: the same losses on every rank
    and the same parameters at the end (float64; the gradient averages may
    sum in another order, so within 1e-12)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")

    def train(group):
        torch.manual_seed(11)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).double()
        ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(12 + rank)
        losses = []
        for _ in range(3):
            x, y = torch.randn(5, 8, generator=g).double(), torch.randn(5, 4, generator=g).double()
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, [p.detach().clone() for p in model.parameters()]

    ours, ours_params = train(None)  # the default group: zeppelin
    theirs, their_params = train(gloo)
    assert len(set(ours)) == 3  # three steps on three batches
    for a, b in zip(ours, theirs):
        assert abs(a - b) <= 1e-12, (ours, theirs)
    for p, q in zip(ours_params, their_params):
        assert torch.allclose(p, q, rtol=0, atol=1e-12), (p - q).abs().max()
    dist.destroy_process_group(gloo)


def test_all_to_all_single_matches_gloo_on_random_splits():
    """Random row splits, zeros among them, through the zeppelin backend and
    through gloo: the same output (NaN-poisoned first)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    width = 3
    for trial in range(5):
        g = torch.Generator().manual_seed(60 + trial)
        rows = torch.randint(0, 4, (n, n), generator=g)  # rows[s][d]: what rank s sends to rank d
        rows[trial % n, (trial + 1) % n] = 0
        send = values(rank, n=int(rows[rank].sum()) * width, seed=70 + trial).view(-1, width)
        outs = []
        for group in (None, gloo):
            out = torch.full((int(rows[:, rank].sum()), width), float("nan"), dtype=torch.float64)
            dist.all_to_all_single(out, send, rows[:, rank].tolist(), rows[rank].tolist(), group=group)
            outs.append(out)
        assert torch.equal(outs[0], outs[1]), trial
    dist.destroy_process_group(gloo)


def test_communicator_from_a_gloo_group_and_a_subgroup():
    rank, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    with zeppelin.distributed.communicator(gloo) as comm:
        assert (comm.rank, comm.size) == (rank, n)
        x = values(rank, seed=60)
        comm.all_reduce(x)
        assert torch.equal(x, sum(values(r, seed=60) for r in range(n)))
    if n < 3:
        return
    members = [1, 2]  # a subgroup without rank 0: its first rank is global rank 1
    sub = dist.new_group(members, backend="gloo")
    if rank in members:
        with zeppelin.distributed.communicator(sub) as comm:
            assert (comm.rank, comm.size) == (members.index(rank), 2)
            x = values(rank, seed=61)
            comm.all_reduce(x)
            assert torch.equal(x, values(1, seed=61) + values(2, seed=61))
    dist.barrier()
