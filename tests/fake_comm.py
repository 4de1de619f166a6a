"""A stand-in for mpi4py's communicator, for tests and a handout's program: N ranks as N threads of one
process, each with a communicator that answers the calls data_parallel.py makes, with MPI's meaning. A
collective is every rank's contribution laid on a table, a barrier, each rank's result read, a barrier.
A nonblocking call is done when it returns. Sums run in rank order, so every rank gets the same bits.
(As tests/fake_device.py stands for a GPU: the real engine is MPI, tested under mpiexec.)

    ranks(2, work)    [work(comm) of rank 0, of rank 1], run at once; an exception on one ends them all
"""
import threading

import numpy as np

IN_PLACE = object()  # MPI.IN_PLACE's stand-in (plumbing/mpi.py's in_place finds it by the comm's module)


class Done:
    """A nonblocking call's request, done already."""

    def Wait(self):
        pass


class FakeComm:
    def __init__(self, table, rank):
        self.table, self.rank = table, rank

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return len(self.table["slots"])

    def Abort(self, code=1):
        self.table["barrier"].abort()

    def exchange(self, mine):
        """Every rank's contribution, in rank order."""
        slots, barrier = self.table["slots"], self.table["barrier"]
        slots[self.rank] = mine
        barrier.wait()
        every = list(slots)
        barrier.wait()
        return every

    # Python objects
    def allgather(self, obj):
        return self.exchange(obj)

    def bcast(self, obj, root=0):
        return self.exchange(obj)[root]

    def allreduce(self, obj):
        every = self.exchange(obj)
        total = every[0]
        for x in every[1:]:
            total = total + x
        return total

    # buffers
    def Bcast(self, buf, root=0):
        every = self.exchange(np.array(buf))
        buf[...] = every[root]

    def Allreduce(self, sendbuf, recvbuf):
        every = self.exchange(np.array(recvbuf if sendbuf is IN_PLACE else sendbuf))
        total = every[0].copy()
        for x in every[1:]:
            total += x
        recvbuf[...] = total

    def Iallreduce(self, sendbuf, recvbuf):
        self.Allreduce(sendbuf, recvbuf)
        return Done()

    def Ireduce_scatter(self, sendbuf, recvbuf, recvcounts):
        every = self.exchange(np.array(sendbuf))
        start = sum(recvcounts[:self.rank])
        total = every[0][start:start + recvcounts[self.rank]].copy()
        for x in every[1:]:
            total += x[start:start + recvcounts[self.rank]]
        recvbuf[...] = total
        return Done()

    def Iallgatherv(self, sendbuf, recv):
        buf, counts = recv
        buf[...] = np.concatenate(self.exchange(np.array(sendbuf)))
        return Done()

    def Gatherv(self, sendbuf, recv, root=0):
        every = self.exchange(np.array(sendbuf))
        if self.rank == root:
            buf, counts = recv
            buf.reshape(-1)[...] = np.concatenate(every)

    def Sendrecv(self, sendbuf, dest, recvbuf=None, source=0):
        every = self.exchange((dest, np.array(sendbuf)))
        to, data = every[source]
        assert to == self.rank, f"rank {source} sent to {to}, not to {self.rank}"
        recvbuf[...] = data


def ranks(n, work):
    """[work(comm) for each of n ranks], run at once in n threads. An exception on one rank breaks the
    others' barrier (as MPI_Abort ends every rank), and the first rank's exception is raised here."""
    table = {"slots": [None] * n, "barrier": threading.Barrier(n)}
    results, errors = [None] * n, [None] * n

    def run(rank):
        try:
            results[rank] = work(FakeComm(table, rank))
        except BaseException as e:  # noqa: B902  (any of them ends the others)
            errors[rank] = e
            table["barrier"].abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first = next((e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)),
                 next((e for e in errors if e is not None), None))
    if first is not None:
        raise first
    return results
