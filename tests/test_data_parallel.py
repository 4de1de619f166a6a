"""data_parallel.py: a run on N ranks is the single process's run. Its pieces first (a rank's share,
ZeRO-1's slices, the ring all-reduce), then every trainer on two and three ranks against one process,
ZeRO-1 against plain data parallelism, a run resumed on another number of ranks, and sae.py's trainer.

The ranks here are threads with tests/fake_comm.py's communicator, whose sums run in rank order: these
tests need no MPI. tests/test_data_parallel_mpi.py runs the same code under mpiexec, on MPI itself.

How close is "the same run": each step's loss is a mean over the same tokens, in float32, summed in another
order: within 1e-6 of itself. The weights are compared by their updates (trained - start): within 1e-3 of
the update's size, as one vector. Not element by element: AdamW divides each gradient by its own running
scale, so an element whose exact gradient is 0 (the attention's key bias: softmax does not see it) moves
±lr on its rounding noise in either run. Another seed on one side (planted) is 0.1 off or more."""
import copy
import json
import os
import sys

import numpy as np
import pytest

import bpe
import data_parallel
import sae as S
import train
from conftest import in_process, train_args
from interface import sae_cli, train_cli
from fake_comm import ranks
from plumbing import mpi, sae_files, shapes
from plumbing.checkpoint import write_checkpoint
from plumbing.errors import UserError
from plumbing.weights import load_weights
from test_train_classify import SPAM
from test_dpo import GOLDEN as DPO_GOLDEN

LOSS_CLOSE = 1e-6  # relative, each step's loss and each validation metric
UPDATE_CLOSE = 1e-3  # relative, the weights' update as one vector
SHORT = dict(steps=5, batch_size=4, context=16, warmup=1, lr=3e-3, eval_every=5, sample_every=1000, save_every=5)


# ----------------------------------------------------------------------------
# The pieces
# ----------------------------------------------------------------------------

def test_without_a_launcher_the_program_is_one_process_and_never_imports_mpi4py():
    assert mpi.launched_ranks({}) == 1 and mpi.world({}) is None
    assert mpi.world({"PMI_SIZE": "1", "PMI_RANK": "0"}) is None  # mpiexec -n 1: today's program
    assert "mpi4py" not in sys.modules
    for environ, n in (({"PMI_SIZE": "4"}, 4), ({"OMPI_COMM_WORLD_SIZE": "3"}, 3), ({"MV2_COMM_WORLD_SIZE": "2"}, 2),
                       ({"PMIX_RANK": "0", "SLURM_STEP_NUM_TASKS": "8"}, 8), ({"SLURM_STEP_NUM_TASKS": "8"}, 1)):
        assert mpi.launched_ranks(environ) == n, environ


def test_a_ranks_share_is_its_contiguous_part_the_first_ones_one_longer():
    for n in (0, 1, 5, 7, 12):
        for ranks_n in (1, 2, 3, 5):
            starts = np.cumsum([0] + [len(part) for part in np.array_split(np.arange(n), ranks_n)])
            assert [data_parallel.share(n, ranks_n, r) for r in range(ranks_n)] == list(zip(starts[:-1], starts[1:]))


def test_zero_slices_cut_each_tensor_in_n_and_lay_a_ranks_slices_together():
    """Exercise 50: each tensor cut in `parts` contiguous slices (share's), and the bucket laid out part by
    part: part r's slices, one a tensor in order, are bucket[start_r:end_r] with no gap, so that a
    reduce-scatter hands rank r exactly them; every element of every tensor once."""
    sizes = [10, 1, 7, 4]  # 1 element for 3 ranks: two of them get an empty slice
    for parts in (1, 2, 3):
        layout = data_parallel.bucket_slices(sizes, parts)
        assert len(layout) == parts and all(len(part) == len(sizes) for part in layout)
        offset = 0
        for r, part in enumerate(layout):
            for n, (start, stop, at) in zip(sizes, part):
                assert (start, stop) == data_parallel.share(n, parts, r), (parts, r, n, start, stop)
                assert at == offset, f"part {r}'s slices must follow each other in the bucket: {layout}"
                offset += stop - start
        assert offset == sum(sizes)
    assert data_parallel.bucket_slices([3, 2], 1) == [[(0, 3, 0), (0, 2, 3)]]  # whole tensors, one after another


def test_the_ring_all_reduce_is_every_ranks_sum_on_every_rank():
    """Exercise 49: ring_allreduce leaves each rank's x the sum of all of them, the same bits on every rank,
    for sizes that N does not divide and sizes smaller than N; on 2 ranks each sum is one addition, a + b,
    as MPI's Allreduce (tests/test_data_parallel_mpi.py holds the two equal under mpiexec)."""
    for ranks_n in (2, 3, 4):
        for n in (1, 3, 10, 1001):
            xs = [np.random.default_rng([r, n]).standard_normal(n).astype(np.float32) for r in range(ranks_n)]

            def ring(comm):
                x = xs[comm.Get_rank()].copy()
                data_parallel.ring_allreduce(comm, x)
                return x

            out = ranks(ranks_n, ring)
            exact = np.sum(np.array(xs, np.float64), axis=0)
            assert all(np.array_equal(o, out[0]) for o in out), "every rank must end with the same bits"
            np.testing.assert_allclose(out[0], exact, rtol=1e-6, atol=1e-6 * ranks_n)
            if ranks_n == 2:
                assert np.array_equal(out[0], xs[0] + xs[1])


# ----------------------------------------------------------------------------
# Every trainer: N ranks against one process
# ----------------------------------------------------------------------------

def jsonl(path, items):
    path.write_text("".join(json.dumps(item) + "\n" for item in items), encoding="utf-8")
    return str(path)


def small_model(folder, text):
    """A model folder whose vocabulary is small (300 ids learned from the text; the released one's 50,257
    would make the logits the whole cost): GPT-2's initialisation, 2 layers, 16 wide."""
    bpe.write_vocab(folder, bpe.train_vocab(text, 300))
    hparams = {"n_vocab": 300, "n_ctx": 32, "n_embd": 16, "n_head": 2, "n_layer": 2}
    return write_checkpoint(folder, train.init_params(hparams, 1), hparams, vocab_dir=folder)


@pytest.fixture(scope="module")
def data(tmp_path_factory, corpus):
    folder = tmp_path_factory.mktemp("dp")
    words = corpus.read_text(encoding="utf-8").split()
    pairs = DPO_GOLDEN["pairs"] * 2
    return {"model": small_model(str(folder / "small"), corpus.read_text(encoding="utf-8") + json.dumps(pairs)),
            "documents": str(corpus),
            "instruction": jsonl(folder / "pairs.jsonl", [{"prompt": f"Say {w}:", "response": f" {w * (i % 3 + 1)}"}
                                                          for i, w in enumerate(words[:40])]),
            "labelled": jsonl(folder / "spam.jsonl", [{"text": t, "label": label} for t, label in SPAM * 3]),
            "preference": jsonl(folder / "prefs.jsonl", pairs)}


def run_on(n, out, data, kind, zero=0, resume=False, lora=None, new=None, **settings):
    """train.set_up and train.train on n ranks (threads; n = 1: this process, no parallel) -> rank 0's run,
    with "all": every rank's."""
    recipe = train.recipe_with(**{**SHORT, **settings})
    lora = lora and {"rank": lora, "alpha": None, "targets": ["c_attn", "c_proj"], "base": "tiny"}

    def work(comm):
        rank = comm.Get_rank() if comm else 0
        run = train.set_up(out, recipe, [data[kind]], base=data["model"], new=new, lora=lora, resume=resume,
                           vocab_dir=f"{out}.vocab{rank}", quiet=True)
        parallel = comm and data_parallel.parallel(comm, run, zero)
        run["start"] = shapes.map_tensors(np.copy, run["trained"])
        train.train(run, out, {}, quiet=True, parallel=parallel)
        return run

    if n == 1:
        run = work(None)
        return run | {"all": [run]}
    every = ranks(n, work)
    return every[0] | {"all": every}


def losses(run):
    return [line.get("loss", line.get("val_loss")) for line in run["log"]]


def update_difference(a, b):
    """‖(a - start) - (b - start)‖ / ‖b - start‖ over every trained tensor, as one vector (b's start)."""
    fa, fb, s = shapes.flatten(a["trained"]), shapes.flatten(b["trained"]), shapes.flatten(b["start"])
    num = sum(float(np.sum((fa[k].astype(np.float64) - fb[k]) ** 2)) for k in fb)
    den = sum(float(np.sum((fb[k].astype(np.float64) - s[k]) ** 2)) for k in fb)
    return (num / den) ** 0.5


def assert_same_run(many, one, ranks_n):
    assert [line.get("ranks") for line in many["log"] if "loss" in line] == [ranks_n] * SHORT["steps"]
    np.testing.assert_allclose(losses(many), losses(one), rtol=LOSS_CLOSE)
    scale = max(abs(v) for line in one["log"] for k, v in line.items() if k != "step")
    for name in {k for line in one["log"] for k in line} - {"step", "lr", "loss", "val_loss"}:  # the kinds' metrics
        # DPO's rewards are differences of log-probabilities: within rounding of those, not of themselves
        np.testing.assert_allclose([line.get(name, 0) for line in many["log"]], [line.get(name, 0) for line in
                                   one["log"]], rtol=LOSS_CLOSE, atol=LOSS_CLOSE * scale, err_msg=name)
    assert update_difference(many, one) < UPDATE_CLOSE
    flat = [shapes.flatten(r["trained"]) for r in many["all"]]
    assert all(np.array_equal(f[k], flat[0][k]) for f in flat for k in f), "every rank's weights, bit for bit"


CASES = {  # name: (kind, ranks, settings): every trainer, and steps whose windows do not split evenly
    "fine-tuning": ("documents", 2, {}),
    "fine-tuning, 3 ranks, --accum 2": ("documents", 3, dict(batch_size=3, accum=2)),
    "LoRA": ("documents", 2, dict(lora=2)),
    "instruction data": ("instruction", 2, dict(accum=2, batch_size=2)),
    "a classifier": ("labelled", 2, dict(batch_size=4)),
    "DPO": ("preference", 2, dict(batch_size=4, lr=1e-2)),
    "DPO with LoRA": ("preference", 2, dict(batch_size=2, accum=2, lr=1e-2, lora=2)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_trainer_on_n_ranks_is_the_one_process_run(data, tmp_path, case):
    kind, ranks_n, settings = CASES[case]
    one = run_on(1, str(tmp_path / "one"), data, kind, **settings)
    many = run_on(ranks_n, str(tmp_path / "many"), data, kind, **settings)
    assert_same_run(many, one, ranks_n)


def test_from_scratch_zero_1_is_plain_data_parallel_and_one_process(data, tmp_path):
    """The README's recipe, small: a vocabulary learned on each rank, GPT-2's initialisation, then plain data
    parallelism and ZeRO-1 on two ranks: both the one-process run; and a planted difference (the single
    process with another seed) is far outside what they are held to."""
    new = {"vocab_size": 270, "tokenizer": None, "n_layer": 2, "n_head": 2, "n_embd": 16}
    one = run_on(1, str(tmp_path / "one"), data, "documents", new=new)
    for zero in (0, 1):
        many = run_on(2, str(tmp_path / f"zero{zero}"), data, "documents", zero=zero, new=new)
        assert_same_run(many, one, 2)
    other = run_on(1, str(tmp_path / "seed"), data, "documents", new=new, seed=1)
    assert update_difference(other, one) > 100 * UPDATE_CLOSE
    assert max(abs(a - b) / b for a, b in zip(losses(other), losses(one))) > 100 * LOSS_CLOSE


def test_a_step_that_diverges_stops_every_rank_with_the_same_line(data, tmp_path):
    """A learning rate far too large: the loss is not finite on every rank at the same step (it is the whole
    step's), so every rank saves the steps before it (rank 0 writes) and stops with one UserError."""
    with pytest.raises(UserError, match=r"^step \d+: the loss is nan: the run diverged; saved step \d+ .*--lr 1e\+30"):
        run_on(2, str(tmp_path / "o"), data, "documents", lr=1e30, zero=1)
    assert os.path.isfile(tmp_path / "o" / train.STATE_FILE)


@pytest.mark.parametrize("flag, message", [("1", "--zero 1 cuts AdamW's moments among processes: run it under mpiexec"),
                                           ("2", "--zero 2: ZeRO stage 1 (AdamW's moments in slices) is the one here")],
                         ids=["1 on one process", "2"])
def test_zero_without_processes_or_another_stage_is_one_line(data, tmp_path, capsys, flag, message):
    argv = train_args(data["model"], data["documents"], tmp_path / "o", "--zero", flag)
    r = in_process(train_cli.main, capsys, *argv)
    assert r.returncode == 2 and r.stderr.startswith(f"error: {message}") and r.stderr.count("\n") == 1
    assert not os.path.exists(tmp_path / "o")


def test_what_the_ranks_cannot_share_is_one_line_on_every_rank(data, tmp_path):
    """A step's windows that N does not divide, an SAE's --batch-tokens that N does not divide, a GPU: refused
    before any work, the same line on every rank (rank 0 says it), nothing written."""
    def train_run(comm):
        return train_cli.run(train_cli.parse_args(train_args(data["model"], data["documents"], tmp_path / "o",
                                                             "--batch-size", "3")), comm)

    with pytest.raises(UserError, match="^2 processes cannot share a step's 3 windows"):
        ranks(2, train_run)
    with pytest.raises(UserError, match="^--device gpu on several processes is not written yet"):
        train_cli.check_ranks(train_cli.parse_args(train_args(data["model"], data["documents"], tmp_path / "o")),
                              object(), xp=object())
    x = np.zeros((64, 16), np.float32)
    np.save(tmp_path / "acts.npy", x)

    def sae_run(comm):
        args = sae_cli.parse_args(["train", "--model", data["model"], "--site", "blocks.0.hook_resid_pre",
                                   "--activations", str(tmp_path / "acts.npy"), "--d-sae", "8", "--l1", "1",
                                   "--tokens", "60", "--batch-tokens", "15", "--out", str(tmp_path / "sae")])
        args.comm = comm
        return sae_cli.train(args)

    with pytest.raises(UserError, match="^2 processes cannot share --batch-tokens 15"):
        ranks(2, sae_run)
    assert sorted(os.listdir(tmp_path)) == ["acts.npy"]


def test_zero_1_holds_a_ranks_slice_of_the_moments_alone(data, tmp_path):
    def moments(comm):
        run = train.set_up(str(tmp_path / "o"), train.recipe_with(**SHORT), [data["documents"]], base=data["model"])
        data_parallel.parallel(comm, run, zero=1)
        return sum(a.nbytes for k in ("m", "v") for a in run["state"][k].values())

    whole = 2 * sum(a.nbytes for a in shapes.flatten(load_weights(data["model"])[1]).values())
    assert ranks(2, moments) == [whole // 2, whole // 2]  # every tensor of the model has an even size
    assert sum(ranks(3, moments)) == whole


def test_a_run_saved_on_two_ranks_resumes_on_one_and_back(data, tmp_path):
    """--resume across a change of N: 3 steps on 2 ranks with ZeRO-1 (its moments gathered whole into the
    save), 3 more on 1, 3 more on 2: the same run as on one process throughout (each leg's --steps is the
    schedule's end, as on the command line). Each step's line says its ranks."""
    legs = {}
    for ranks_n in ((1, 1, 1), (2, 1, 2)):
        out = str(tmp_path / "".join(map(str, ranks_n)))
        for leg, n in enumerate(ranks_n):
            legs[ranks_n] = run_on(n, out, data, "documents", zero=n > 1, resume=leg > 0, steps=3 * (leg + 1),
                                   save_every=3, eval_every=3)
        with open(os.path.join(out, train.LOG_FILE), encoding="utf-8") as f:
            saved = [json.loads(line) for line in f]
        assert [line.get("ranks", 1) for line in saved if "loss" in line] == [n for n in ranks_n for _ in range(3)]
    straight, mixed = legs[(1, 1, 1)], legs[(2, 1, 2)]
    np.testing.assert_allclose(losses(mixed), losses(straight), rtol=LOSS_CLOSE)
    assert update_difference(mixed, straight) < UPDATE_CLOSE


# ----------------------------------------------------------------------------
# sae.py's trainer
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["batchtopk", "jumprelu"])
def test_an_sae_on_two_ranks_is_the_one_process_trainer(arch):
    """BatchTopK's ⌊k N⌋ largest are chosen from the whole batch, the dead latents' counters and its running
    threshold see the whole batch: every step's losses, the counters and the SAE are the single process's."""
    x = np.random.default_rng(0).standard_normal((64, 16)).astype(np.float32)
    settings = {"architecture": arch, **S.TRAINING_DEFAULTS[arch], "dead_feature_window": 2} | (
        {"k": 3.0} if arch == "batchtopk" else {"jumprelu_init_threshold": 1.5, "pre_act_loss_coefficient": 0.5})
    start = S.new_training_sae(16, 48, settings, seed=0)
    one, state = copy.deepcopy(start), S.new_training_state(start)
    alone = [S.training_step(x, one, state, 1e-2, settings, 0.1) for _ in range(6)]

    def work(comm):
        sae, mine = copy.deepcopy(start), S.new_training_state(start)
        part = x[slice(*data_parallel.share(len(x), comm.Get_size(), comm.Get_rank()))]
        return [data_parallel.sae_step(comm, part, sae, mine, 1e-2, settings, 0.1) for _ in range(6)], sae, mine

    (together, sae, mine), (_, other, _) = ranks(2, work)
    for a, b in zip(together, alone):
        assert a.keys() == b.keys()
        np.testing.assert_allclose([a[k] for k in a], [b[k] for k in a], rtol=1e-6, atol=1e-6)
    assert np.array_equal(mine["since_fired"], state["since_fired"]) and mine["since_fired"].any()
    for k in S.trained(one):
        np.testing.assert_allclose(sae[k], one[k], rtol=1e-5, atol=1e-6)
        assert np.array_equal(sae[k], other[k])


def test_a_skip_transcoder_on_two_ranks_is_the_one_process_trainer():
    """A transcoder's target travels with its input: each rank rebuilds its own rows' targets, and the step is
    the single process's (W_skip trained too)."""
    rng = np.random.default_rng(1)
    x, y = (rng.standard_normal((32, 16)).astype(np.float32) for _ in range(2))
    settings = {"architecture": "standard", **S.TRAINING_DEFAULTS["standard"]}
    start = S.new_transcoder(16, 16, 40, settings, seed=0, skip=True)
    one, state = copy.deepcopy(start), S.new_training_state(start)
    alone = [S.training_step(x, one, state, 1e-2, settings, 0.1, target=y) for _ in range(3)]

    def work(comm):
        sae, mine = copy.deepcopy(start), S.new_training_state(start)
        part = slice(*data_parallel.share(len(x), comm.Get_size(), comm.Get_rank()))
        return [data_parallel.sae_step(comm, x[part], sae, mine, 1e-2, settings, 0.1, y[part]) for _ in range(3)], sae

    (together, sae), (_, other) = ranks(2, work)
    for a, b in zip(together, alone):
        np.testing.assert_allclose([a[k] for k in b], [b[k] for k in b], rtol=1e-6, atol=1e-6)
    assert np.abs(one["W_skip"]).max() > 0
    for k in S.trained(one):
        np.testing.assert_allclose(sae[k], one[k], rtol=1e-5, atol=1e-6)
        assert np.array_equal(sae[k], other[k])


def test_sae_py_train_on_two_ranks_saves_the_one_process_run(data, tmp_path):
    """The command itself: each rank takes its half of every batch, the log says "ranks", rank 0 alone saves,
    and the saved SAE and its log are the single process's."""
    x = np.random.default_rng(2).standard_normal((64, 16)).astype(np.float32)
    np.save(tmp_path / "acts.npy", x)

    def run(out, comm=None):
        args = sae_cli.parse_args(["train", "--model", data["model"], "--site", "blocks.0.hook_resid_pre",
                                   "--activations", str(tmp_path / "acts.npy"), "--d-sae", "24",
                                   "--architecture", "batchtopk", "--k", "3", "--tokens", "96",
                                   "--batch-tokens", "16", "--quiet", "--out", str(out)])
        args.comm = comm
        return sae_cli.train(args)

    assert run(tmp_path / "one") == 0
    assert ranks(2, lambda comm: run(tmp_path / "two", comm)) == [0, 0]
    read = {w: sae_files.load_sae(str(tmp_path / w)) for w in ("one", "two")}
    for k in ("W_enc", "b_enc", "W_dec", "b_dec"):
        np.testing.assert_allclose(read["two"][k], read["one"][k], rtol=1e-5, atol=1e-6)
    logs = {}
    for w in ("one", "two"):
        with open(tmp_path / w / sae_cli.LOG_FILE, encoding="utf-8") as f:
            logs[w] = [json.loads(line) for line in f]
    assert len(logs["two"]) == len(logs["one"]) == 6 and all(e["ranks"] == 2 for e in logs["two"])
    np.testing.assert_allclose([e["loss"] for e in logs["two"]], [e["loss"] for e in logs["one"]], rtol=1e-6)
    assert sorted(os.listdir(tmp_path / "two")) == sorted(os.listdir(tmp_path / "one"))
