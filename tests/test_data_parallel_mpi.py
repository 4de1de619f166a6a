"""data_parallel.py on MPI itself: `mpiexec -n 2`, each rank on one BLAS thread, a small model. The ring
all-reduce is MPI's Allreduce, bit for bit; every rank ends with the same weights, bit for bit, and they
are the one-process run's; an SAE too. And the faults: a user's mistake is one line, once, exit 2, nothing
written; a bug shows its traceback and ends every rank; a rank killed ends the run, OUT whole or absent;
Ctrl-C to mpiexec saves, exits 130, and --resume on one process goes on as if nothing had happened.

Each test launches mpiexec once (a second or two each); without mpi4py and mpiexec they are skipped."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import train
from conftest import ROOT
from interface import train_cli
from plumbing import shapes
from plumbing.weights import load_weights
from test_data_parallel import LOSS_CLOSE, UPDATE_CLOSE, small_model


def find_mpiexec():
    """mpiexec beside this Python (pip's mpich wheel puts it there), else on PATH; None without mpi4py."""
    try:
        import importlib.util
        if importlib.util.find_spec("mpi4py") is None:
            return None
    except ImportError:
        return None
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return beside if os.path.isfile(beside) else shutil.which("mpiexec")


MPIEXEC = find_mpiexec()
# Open MPI's mpiexec (prterun) answers Ctrl-C by sending the ranks SIGTERM and exits 1 itself, without
# passing on their last lines (docs/parallel.md); MPICH's Hydra passes SIGINT and the ranks' 130
OPEN_MPI = MPIEXEC is not None and "Open MPI" in subprocess.run([MPIEXEC, "--version"], capture_output=True,
                                                                text=True).stdout
pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="needs mpi4py and mpiexec: pip install -r "
                                                        "requirements-mpi.txt, then python -m pytest "
                                                        "tests/test_data_parallel_mpi.py")


def launch(n, *argv, wait=True, **kwargs):
    """mpiexec -n n python ARGV, in the project's folder, each rank on one BLAS thread (conftest's environment)."""
    command = [MPIEXEC, "-n", str(n), sys.executable, *argv]
    if not wait:
        return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                **kwargs)
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120, **kwargs)


@pytest.fixture(scope="module")
def small(tmp_path_factory, corpus):
    return small_model(str(tmp_path_factory.mktemp("mpi") / "small"), corpus.read_text(encoding="utf-8"))


# Run under mpiexec: the ring against MPI's Allreduce; plain data parallelism and ZeRO-1, 4 steps each, on
# every rank; an SAE's steps. Rank 0 writes what it found (every rank's weights' bytes compared there).
DRIVER = """
import hashlib, json, sys
import numpy as np
import data_parallel, sae as S, train
from plumbing import mpi, shapes
model, data, out = sys.argv[1:]
comm = mpi.world()
found = {}
for n in (1, 3, 1000, 100003):
    x = np.random.default_rng([comm.Get_rank(), n]).standard_normal(n).astype(np.float32)
    ring, allreduce = x.copy(), np.empty_like(x)
    data_parallel.ring_allreduce(comm, ring)
    comm.Allreduce(x, allreduce)
    found[f"ring {n}"] = bool(np.array_equal(ring, allreduce))
for zero in (0, 1):
    recipe = train.recipe_with(steps=4, batch_size=4, context=16, warmup=1, lr=3e-3, eval_every=4, save_every=100)
    run = train.set_up(out, recipe, [data], base=model, quiet=True)
    train.train(run, f"{out}/zero{zero}", {}, quiet=True, parallel=data_parallel.parallel(comm, run, zero))
    flat = shapes.flatten(run["params"])
    digest = hashlib.sha256(b"".join(flat[k].tobytes() for k in flat)).hexdigest()
    found[f"ranks' weights {zero}"] = len(set(comm.allgather(digest))) == 1
    found[f"losses {zero}"] = [line.get("loss", line.get("val_loss")) for line in run["log"]]
    if comm.Get_rank() == 0:
        np.savez(f"{out}/weights{zero}.npz", **flat)
x = np.random.default_rng(0).standard_normal((64, 16)).astype(np.float32)
settings = {"architecture": "batchtopk", **S.TRAINING_DEFAULTS["batchtopk"], "k": 3.0, "dead_feature_window": 2}
alone, together = S.new_training_sae(16, 48, settings), S.new_training_sae(16, 48, settings)
state, mine = S.new_training_state(alone), S.new_training_state(together)
part = x[slice(*data_parallel.share(64, comm.Get_size(), comm.Get_rank()))]
for _ in range(4):
    S.training_step(x, alone, state, 1e-2, settings, 0.1)
    data_parallel.sae_step(comm, part, together, mine, 1e-2, settings, 0.1)
found["sae"] = max(float(np.abs(alone[k] - together[k]).max()) for k in S.trained(alone))
found["sae counters"] = bool(np.array_equal(state["since_fired"], mine["since_fired"]))
if comm.Get_rank() == 0:
    with open(f"{out}/found.json", "w") as f:
        json.dump(found, f)
"""


def test_two_ranks_are_mpis_allreduce_and_the_one_process_run(small, corpus, tmp_path):
    r = launch(2, "-c", DRIVER, small, str(corpus), str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    with open(tmp_path / "found.json", encoding="utf-8") as f:
        found = json.load(f)
    assert all(found[f"ring {n}"] for n in (1, 3, 1000, 100003)), "ring_allreduce must be MPI's Allreduce, bit for bit"
    recipe = train.recipe_with(steps=4, batch_size=4, context=16, warmup=1, lr=3e-3, eval_every=4, save_every=100)
    one = train.set_up(str(tmp_path / "one"), recipe, [str(corpus)], base=small, quiet=True)
    train.train(one, str(tmp_path / "one"), {}, quiet=True)
    start, end = shapes.flatten(load_weights(small)[1]), shapes.flatten(one["params"])
    for zero in (0, 1):
        assert found[f"ranks' weights {zero}"], "every rank's weights, bit for bit"
        np.testing.assert_allclose(found[f"losses {zero}"], [line.get("loss", line.get("val_loss"))
                                                             for line in one["log"]], rtol=LOSS_CLOSE)
        with np.load(tmp_path / f"weights{zero}.npz") as z:
            num = sum(float(np.sum((z[k].astype(np.float64) - end[k]) ** 2)) for k in end)
        den = sum(float(np.sum((end[k].astype(np.float64) - start[k]) ** 2)) for k in end)
        assert (num / den) ** 0.5 < UPDATE_CLOSE
    assert found["sae"] < 1e-5 and found["sae counters"]


# a rank's number, as MPICH's Hydra (PMI_RANK) or Open MPI's mpiexec (OMPI_COMM_WORLD_RANK) says it
RANK = "os.environ.get('PMI_RANK', os.environ.get('OMPI_COMM_WORLD_RANK'))"
OPEN_MPI_SAYS = "prterun detected that one or more processes exited with non-zero status"


def launchers_lines(stderr):
    """stderr less the launcher's own report after ours: Open MPI's mpiexec adds a box when a rank exits
    with a status other than 0 (MPICH's Hydra adds nothing)."""
    ours, _, theirs = stderr.partition("-" * 74 + "\n")
    assert not theirs or OPEN_MPI_SAYS in theirs, stderr
    return ours


def wrapped(work):
    """python -c: `work` (lines run first, on every rank), then train.py's command line, as python train.py."""
    return ["-c", f"import os, sys\nsys.path.insert(0, {ROOT!r})\n{work}\nfrom interface.start import start\n"
                  "start('train_cli')"]


def short_run(model, data, out, *more):
    return ["--model", model, "--data", str(data), "--out", str(out), "--batch-size", "4", "--context", "16",
            "--warmup", "1", "--lr", "3e-3", "--eval-every", "1000", "--sample-every", "1000", "--quiet", *more]


def test_a_users_mistake_is_one_line_once_and_exit_2(small, tmp_path):
    start = time.perf_counter()
    r = launch(2, "train.py", *short_run(small, tmp_path / "missing.txt", tmp_path / "o", "--steps", "4"))
    assert (r.returncode, launchers_lines(r.stderr), r.stdout) == (
        2, f"error: {tmp_path / 'missing.txt'}: No such file or directory\n", "")
    assert time.perf_counter() - start < 30 and not os.path.exists(tmp_path / "o")


PLANTED = """import data_parallel
real = data_parallel.train_step
def planted(*args):
    if args[4] == 2 and RANK == "1":
        raise ZeroDivisionError("a planted bug")
    return real(*args)
data_parallel.train_step = planted""".replace("RANK", RANK)


def test_a_bug_on_one_rank_shows_its_traceback_and_ends_every_rank(small, corpus, tmp_path):
    start = time.perf_counter()
    r = launch(2, *wrapped(PLANTED), *short_run(small, corpus, tmp_path / "o", "--steps", "50"))
    assert r.returncode not in (0, 2, 130) and time.perf_counter() - start < 30
    assert r.stderr.count("Traceback (most recent call last)") == 1 and "ZeroDivisionError: a planted bug" in r.stderr
    assert not os.path.exists(tmp_path / "o")


def saved_whole(out):
    """OUT as a save leaves it: the model loads, its state and log agree on the step."""
    load_weights(out)
    with np.load(os.path.join(out, train.STATE_FILE)) as z:
        step = int(z["step"])
    with open(os.path.join(out, train.LOG_FILE), encoding="utf-8") as f:
        log = [json.loads(line) for line in f]
    assert step > 0 and [line["step"] for line in log if "loss" in line] == list(range(1, step + 1))
    return step, log


SLOW = """import time, data_parallel
real = data_parallel.train_step
def slow(*args):
    time.sleep(0.05)
    return real(*args)
data_parallel.train_step = slow
with open(os.path.join(sys.argv[sys.argv.index("--out") + 1] + f".pid{RANK}"), "w") as f:
    f.write(str(os.getpid()))""".replace("RANK", RANK)


def until_saved(out, process):
    for _ in range(600):
        if os.path.exists(os.path.join(out, train.LOG_FILE)) or process.poll() is not None:
            return
        time.sleep(0.05)


def test_a_killed_rank_ends_the_run_and_out_is_the_last_whole_save(small, corpus, tmp_path):
    out = str(tmp_path / "o")
    p = launch(2, *wrapped(SLOW), *short_run(small, corpus, out, "--steps", "200", "--save-every", "3"), wait=False)
    until_saved(out, p)
    with open(out + ".pid1", encoding="utf-8") as f:
        os.kill(int(f.read()), signal.SIGKILL)
    start = time.perf_counter()
    p.communicate(timeout=60)
    assert p.returncode != 0 and time.perf_counter() - start < 30
    step, _ = saved_whole(out)
    assert step % 3 == 0


def test_ctrl_c_to_mpiexec_saves_exits_130_and_resume_on_one_process_goes_on(small, corpus, tmp_path, capsys):
    """ZeRO-1 on 2 ranks, Ctrl-C to mpiexec after the first save: every rank stops before the same step, the
    moments are gathered into the save, exit 130, one line; then --resume on one process to the end is the
    straight one-process run."""
    out, steps = str(tmp_path / "o"), ["--steps", "30", "--save-every", "3"]
    p = launch(2, *wrapped(SLOW), *short_run(small, corpus, out, *steps, "--zero", "1"), wait=False)
    until_saved(out, p)
    p.send_signal(signal.SIGINT)
    _, stderr = p.communicate(timeout=60)
    step, log = saved_whole(out)
    assert 3 <= step < 30, stderr
    if OPEN_MPI:
        assert p.returncode == 1, stderr
    else:
        assert p.returncode == 130 and stderr.count(f"interrupted: saved step {step} in {out}; --resume continues") \
            == 1, stderr
    assert {line["ranks"] for line in log if "loss" in line} == {2}
    assert train_cli.main(short_run(small, corpus, out, *steps, "--resume")) == 0
    assert train_cli.main(short_run(small, corpus, tmp_path / "straight", *steps)) == 0
    resumed, straight = (saved_whole(folder)[1] for folder in (out, str(tmp_path / "straight")))
    np.testing.assert_allclose([line["loss"] for line in resumed if "loss" in line],
                               [line["loss"] for line in straight if "loss" in line], rtol=LOSS_CLOSE)
    start = shapes.flatten(load_weights(small)[1])
    a, b = (shapes.flatten(load_weights(folder)[1]) for folder in (out, str(tmp_path / "straight")))
    num = sum(float(np.sum((a[k].astype(np.float64) - b[k]) ** 2)) for k in b)
    den = sum(float(np.sum((b[k].astype(np.float64) - start[k]) ** 2)) for k in b)
    assert (num / den) ** 0.5 < UPDATE_CLOSE
