"""BLAS's threads on a shared machine: each workload on 1 and 2 threads (and BLAS's own default,
the cores, where that is more), idle and beside 1 and 3 busy processes (`python -c 'while 1: pass'`).

    python bench/bench_threads.py                          # everything, the median of 3 repeats
    python bench/bench_threads.py --workloads forward --busy 0 3 --repeats 1

The workloads, each in a process of its own, timed whole from outside as a user waits for it:
  train       python train.py --from-scratch: 40 steps of the README's recipe (4 layers, 4 heads, 128 wide,
              64 positions, batch 12) at --vocab-size 257 (bytes: no merges to learn first)
  perplexity  python evaluate.py perplexity on 20 kB of Shakespeare's held-out end, with the model that
              a first 40-step train run wrote (bench/out/threads-baby/)
  circuits    python circuits.py patch --site resid_pre on an IOI pair (46 positions x 4 layers), that model
  forward     gpt2() over 256 positions of 124M's shape with random weights, the median of 3 passes in one
              process (its start and loading left out)
The commands take --threads N; the forward pass, OMP/OPENBLAS/MKL_NUM_THREADS. Within each repeat the
busy levels, workloads and thread counts take turns, so the machine's other work slows them alike;
each figure is a median. The header names the machine, the commit, BLAS's kernel (threadpoolctl's
answer where it is installed, else OpenBLAS's own), OPENBLAS_CORETYPE, and `uptime`'s load before
and after, and the CPU that OpenBLAS's idle thread burns spinning after a product (what keeps a thread of ours
from the second core). When OPENBLAS_CORETYPE is set, every run is made with it set and unset. Other benchmarks
must not run at the same time: `flock /work/bench.lock python bench/bench_threads.py`.
"""
import argparse
import datetime
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(HERE, "out")
TEXT = os.path.join(ROOT, "data", "tinyshakespeare.txt")
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
# An IOI pair in the bytes that the 257-id model reads: one byte for each answer
IOI = ["--clean", "When Mary and John went out, John gave it to ", "--corrupted",
       "When Mary and John went out, Mary gave it to ", "--answer", "M", "--wrong", "J"]
BABY = ["--from-scratch", "--vocab-size", "257", "--n-layer", "4", "--n-head", "4", "--n-embd", "128",
        "--context", "64", "--batch-size", "12", "--steps", "40", "--eval-every", "1000", "--sample-every", "1000",
        "--save-every", "1000", "--quiet"]

FORWARD = """import os, statistics, sys, time
sys.path.insert(0, {root!r})
import numpy as np
from gpt2_numpy import gpt2
from plumbing.weights import load_weights
hparams, params = load_weights({folder!r})
ids = np.random.default_rng(0).integers(0, hparams["n_vocab"], 256)
gpt2(ids[None], params, hparams)
times = []
for _ in range(3):
    start = time.perf_counter()
    gpt2(ids[None], params, hparams)
    times.append(time.perf_counter() - start)
print(statistics.median(times))
"""


def random_124m():
    """124M's shape, GPT-2's initialisation (seed 0), written once (bench_speculative's random:124M)."""
    folder = os.path.join(OUT, "124M-random-init")
    if not os.path.exists(os.path.join(folder, "hparams.json")):
        sys.path.insert(0, ROOT)
        from parameters import init_params
        from plumbing import shapes
        from plumbing.checkpoint import write_checkpoint

        os.makedirs(OUT, exist_ok=True)
        print(f"writing {folder} (random weights, once)", file=sys.stderr)
        hparams = shapes.hparams("124M")
        write_checkpoint(folder, init_params(hparams), hparams, vocab_dir=os.path.join(ROOT, "data", "gpt2-vocab"))
    return folder


def baby():
    """The README's from-scratch model after 40 steps, written once."""
    folder = os.path.join(OUT, "threads-baby")
    if not os.path.exists(os.path.join(folder, "hparams.json")):
        os.makedirs(OUT, exist_ok=True)
        subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *BABY, "--data", TEXT, "--out", folder],
                       check=True)
    return folder


def held_out_20kb():
    path = os.path.join(OUT, "shakespeare-last-20kB.txt")
    with open(TEXT, encoding="utf-8") as f:
        text = f.read()[-20000:]
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def workloads(scratch):
    """{name: threads -> (argv, env changes)}; the train runs write into scratch."""
    model, small, text = random_124m(), baby(), held_out_20kb()

    def command(*argv):
        return lambda threads: ([os.path.join(ROOT, argv[0]), *argv[1:], "--threads", threads], {})

    return {"train": lambda threads: ([os.path.join(ROOT, "train.py"), *BABY, "--data", TEXT, "--out",
                                       tempfile.mkdtemp(dir=scratch) + "/run", "--threads", threads], {}),
            "perplexity": command("evaluate.py", "perplexity", text, "--model", small, "--quiet"),
            "circuits": command("circuits.py", "patch", *IOI, "--site", "resid_pre", "--model", small, "--quiet"),
            "forward": lambda threads: (["-c", FORWARD.format(root=ROOT, folder=model)],
                                        dict.fromkeys(THREAD_VARIABLES, threads))}


def timed(argv, env):
    """Seconds: the whole run, or for the forward pass the median it prints."""
    start = time.perf_counter()
    r = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if r.returncode != 0:
        sys.exit(f"{' '.join(argv[:3])}... failed:\n{r.stderr}")
    return float(r.stdout.split()[-1]) if argv[0] == "-c" else seconds


def blas_kernel():
    """BLAS's name, version, kernel and default threads, as the project's own NumPy reports them."""
    code = """import ctypes, numpy
try:
    import threadpoolctl
    i = [x for x in threadpoolctl.threadpool_info() if x["user_api"] == "blas"][0]
    print(i["internal_api"], i.get("version"), i.get("architecture"), "threads", i["num_threads"], "(threadpoolctl)")
except ImportError:
    path = next(l.split()[-1] for l in open("/proc/self/maps") if "openblas" in l and ".so" in l)
    lib = ctypes.CDLL(path)
    pre = next(p for p in ("scipy_openblas_", "openblas_")
               if hasattr(lib, p + "get_corename64_") or hasattr(lib, p + "get_corename"))
    end = "64_" if hasattr(lib, pre + "get_corename64_") else ""
    core, config = getattr(lib, pre + "get_corename" + end), getattr(lib, pre + "get_config" + end)
    core.restype = config.restype = ctypes.c_char_p
    print("OpenBLAS", config().decode().split()[1], core().decode(), "threads",
          getattr(lib, pre + "get_num_threads" + end)(), "(OpenBLAS's own get_corename; no threadpoolctl)")
"""
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout.strip()


SPIN = """import time, numpy as np
a = np.ones((768, 768), np.float32)
a @ a
cpu = time.process_time()
time.sleep(1.0)
print(time.process_time() - cpu)
"""


def idle_spin():
    """CPU seconds a process burns in a 1 s sleep right after one matrix product on 2 BLAS threads: OpenBLAS's
    idle thread spinning for the next product (OPENBLAS_THREAD_TIMEOUT; docs/performance.md, the second core)."""
    env = {**os.environ, **dict.fromkeys(THREAD_VARIABLES, "2")}
    return float(subprocess.run([sys.executable, "-c", SPIN], env=env, capture_output=True, text=True).stdout)


def header():
    with open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return (f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, commit {commit.stdout.strip()}, "
            f"{cpu}, {os.cpu_count()} cores; Python {sys.version.split()[0]}\n"
            f"BLAS: {blas_kernel()}; OPENBLAS_CORETYPE {os.environ.get('OPENBLAS_CORETYPE', 'unset')}\n"
            f"OpenBLAS's idle thread after one product on 2 threads: {idle_spin():.3f} s of CPU in a 1 s sleep")


def load():
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", nargs="+", default=["train", "perplexity", "circuits", "forward"])
    p.add_argument("--busy", nargs="+", type=int, default=[0, 1, 3], help="busy processes beside each run")
    p.add_argument("--threads", nargs="+", default=sorted({"1", "2", str(os.cpu_count())}, key=int))
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    coretypes = [os.environ.get("OPENBLAS_CORETYPE")] + ([None] if "OPENBLAS_CORETYPE" in os.environ else [])
    print(header(), flush=True)
    print(f"before: {load()}", flush=True)
    times = {}
    with tempfile.TemporaryDirectory() as scratch:
        run = workloads(scratch)
        for repeat in range(args.repeats):
            for busy in args.busy:
                spinners = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(busy)]
                try:
                    time.sleep(0.5 if busy else 0)
                    for name in args.workloads:
                        order = args.threads if repeat % 2 == 0 else args.threads[::-1]
                        for coretype in coretypes:
                            for threads in order:
                                argv, changes = run[name](threads)
                                env = {k: v for k, v in os.environ.items()
                                       if k not in THREAD_VARIABLES and k != "OPENBLAS_CORETYPE"}
                                env.update(changes, **({"OPENBLAS_CORETYPE": coretype} if coretype else {}))
                                seconds = timed(argv, env)
                                times.setdefault((name, busy, coretype, threads), []).append(seconds)
                                kind = f", CORETYPE {coretype}" if coretype else ""
                                print(f"  {name}, busy {busy}, {threads} thr{kind}: {seconds:.2f} s", file=sys.stderr,
                                      flush=True)
                finally:
                    for s in spinners:
                        s.kill()
                        s.wait()
            print(f"repeat {repeat + 1} done: {load()}", file=sys.stderr, flush=True)
    print(f"after: {load()}")
    print(f"\nseconds, the median of {args.repeats}; the last column: 2 threads' time over 1 thread's")
    print(f"{'workload':<12}{'busy':>5}  {'':<14}" + "".join(f"{t + ' thr':>10}" for t in args.threads) + "   2 / 1")
    for name in args.workloads:
        for busy in args.busy:
            for coretype in coretypes:
                medians = {t: statistics.median(times[name, busy, coretype, t]) for t in args.threads}
                ratio = f"{medians['2'] / medians['1']:8.2f}" if {"1", "2"} <= set(medians) else ""
                kind = f"CORETYPE {coretype}" if coretype else ("CORETYPE unset" if len(coretypes) > 1 else "")
                print(f"{name:<12}{busy:>5}  {kind:<14}" + "".join(f"{m:10.2f}" for m in medians.values()) + ratio)


if __name__ == "__main__":
    main()
