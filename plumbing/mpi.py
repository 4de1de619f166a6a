"""MPI, through mpi4py, when a launcher started more than one process (the only file that imports mpi4py).

    mpiexec -n 2 python train.py ARGS               two processes ("ranks"), one run (data_parallel.py)
    mpiexec -n 2 python -m mpi4py train.py ARGS     the same, under mpi4py's guard (any exception: MPI_Abort)

    launched_ranks()   how many processes the launcher started, from its environment alone (1: none, or -n 1)
    world()            MPI's COMM_WORLD when that is more than one, else None: mpi4py is imported only then
    in_place(comm)     MPI's IN_PLACE marker, of the library the communicator comes from

With no launcher, or `mpiexec -n 1`, a command is the program it always was: world() is None and mpi4py
is never imported. Each launcher says how many processes it started in its own variable, set before
Python starts: MPICH's Hydra (mpiexec), Intel MPI and Slurm's srun with PMI-1 or PMI-2 set PMI_SIZE,
Open MPI's mpirun OMPI_COMM_WORLD_SIZE, MVAPICH's MV2_COMM_WORLD_SIZE, and a PMIx launcher (srun
--mpi=pmix, Open MPI 5's prterun) PMIX_RANK beside Slurm's or Open MPI's count (docs/parallel.md says
which were tried).

Under world(), rank 0 speaks for the run: the other ranks' stdout and stderr go to /dev/null, so that a
message is said once, not once a rank; and a bug (an exception nothing caught) prints its traceback on
the rank where it happened, then MPI_Abort ends every rank, so that none waits forever for a partner
that has gone.
"""
import os
import sys
import traceback

from plumbing.errors import UserError

# (variable, the launchers that set it): the first one set says how many processes the launcher started
SIZES = (("PMI_SIZE", "MPICH's Hydra, Intel MPI, Slurm's srun with PMI-1 or PMI-2"),
         ("OMPI_COMM_WORLD_SIZE", "Open MPI's mpirun"),
         ("MV2_COMM_WORLD_SIZE", "MVAPICH's mpirun_rsh"),
         ("PMIX_SIZE", "a PMIx launcher that sets it"))
PMIX_SIZES = ("SLURM_STEP_NUM_TASKS", "OMPI_COMM_WORLD_SIZE")  # beside PMIX_RANK: srun --mpi=pmix, prterun
INSTALL = "pip install -r requirements-mpi.txt (mpi4py and MPICH; on a cluster, pip install mpi4py builds on its MPI)"


def launched_ranks(environ=None):
    """How many processes the launcher started, read from its environment (SIZES): 1 when no launcher
    started this one, or when it started one alone."""
    environ = os.environ if environ is None else environ
    names = [name for name, _ in SIZES] + (list(PMIX_SIZES) if "PMIX_RANK" in environ else [])
    for name in names:
        if environ.get(name, "").isdigit():
            return max(1, int(environ[name]))
    return 1


def world(environ=None):
    """MPI's COMM_WORLD when a launcher started more than one process, else None (mpi4py is not imported).
    Rank 0 alone speaks from then on; a bug ends every rank (the module's docstring)."""
    n = launched_ranks(environ)
    if n == 1:
        return None
    try:
        from mpi4py import MPI
    except ImportError:
        raise UserError(f"a launcher started {n} processes, but mpi4py is not installed: {INSTALL}") from None
    comm = MPI.COMM_WORLD
    if comm.Get_size() != n:
        raise UserError(f"the launcher says {n} processes, but MPI sees {comm.Get_size()}: mpi4py was built for "
                        f"another MPI than the launcher's ({MPI.Get_library_version().splitlines()[0]})")
    if comm.Get_rank() != 0:
        quiet = open(os.devnull, "w")
        sys.stdout = sys.stderr = quiet
    sys.excepthook = lambda kind, value, tb: abort_every_rank(comm, kind, value, tb)
    return comm


def abort_every_rank(comm, kind, value, tb):
    """A bug's traceback, on the real stderr of the rank where it happened, then MPI_Abort: every rank ends."""
    sys.__stderr__.write("".join(traceback.format_exception(kind, value, tb)))  # one write: the launcher, which stops
    sys.__stderr__.flush()  # passing output on at the abort, has it whole (line by line, a busy one cut it short)
    comm.Abort(1)


def in_place(comm):
    """MPI.IN_PLACE, of the library comm comes from (mpi4py's, or a test's stand-in), without importing it."""
    return sys.modules[type(comm).__module__].IN_PLACE
