"""Data parallelism: one training run on many processes, the same run as on one.

    mpiexec -n 2 python train.py --from-scratch --out models/baby ...              two processes, one run
    mpiexec -n 2 python train.py --model 124M --data notes.txt --out m --zero 1    AdamW's moments in halves
    mpiexec -n 2 python sae.py train --site blocks.2.hook_resid_pre ...             an SAE the same way

MPI starts N copies of the program (its "ranks", 0 to N-1) and carries arrays between them
(plumbing/mpi.py: mpi4py, imported only then). Every rank holds the whole model. A step:

  1. the data      rank r takes its contiguous 1/N of the step's windows: the single process's windows,
                   in the single process's order (llm.c's loader), in micro-batches of at most --batch-size
  2. the gradient  each rank's gradient of its share of the step's mean loss, so that their sum is the
                   gradient of the whole step's mean loss; MPI sums them across the ranks (an all-reduce,
                   ring_allreduce here as it works), in buckets, the last layers' first (torch DDP's order)
  3. the update    every rank clips the same gradient and takes the same AdamW step: the weights stay equal,
                   bit for bit, with no second message
  ZeRO-1           (--zero 1, llm.c's -z 1) each tensor's AdamW moments are cut in N slices, a rank's one
                   slice each: the gradients summed into their slices (a reduce-scatter), each rank's AdamW on
                   its slices, the weights' slices sent to every rank (an all-gather). 1/N of the moments each.

Each step's windows, loss and learning rate are those of the same command without mpiexec: what
changes is the order of the sums, so the losses and weights are the single process's within float32's
rounding (tests/test_data_parallel.py says by how much). Rank 0 speaks for the run: it prints, samples and
writes OUT (train_log.jsonl's lines say "ranks": N), after every rank has reached the save; the folder is a
one-process run's, AdamW's moments whole, so that --resume takes it on any number of ranks.

Nothing here imports MPI: the functions take a communicator (mpi4py's COMM_WORLD) and call its methods,
as MPI's C functions are called: Sendrecv, Iallreduce, Ireduce_scatter, Iallgatherv, Gatherv, Bcast and
allgather (Python objects, for a few numbers).

    share(n, ranks, rank)             a rank's contiguous part of n things: its windows, or a tensor's slice
    ring_allreduce(comm, x)           the sum of every rank's x, around a ring of Sendrecv calls (exercise 49)
    ring_allreduce_fast(comm, x)      the same sum, by MPI's own all-reduce, started at once (the fast form)
    bucket_slices(sizes, parts)       where each tensor's slices lie in a bucket, rank by rank (exercise 50)
    buckets(trained, ...)             the gradients' buckets: the parameters in reverse, about --bucket-mb each
    step_pieces(data, recipe, ...)    this rank's part of each of the step's micro-batches, and each one's weight
    train_step(...)                   one step: the pieces' gradients, summed across the ranks, clipping, AdamW
    parallel(comm, run, zero, ...)    what train.train runs instead of its one-process step, validation and save
    sae_step(...)                     sae.py's trainer's step on N ranks: BatchTopK's choice and the dead latents global
"""
import contextlib
import math
import signal
import threading

import numpy as np

from backward import IGNORE
from optimizer import clip_scale
import dpo
import sae as S
import train
from plumbing import mpi, shapes
from plumbing.errors import WAITING, Terminated, UserError

BUCKET_MB = 25  # --bucket-mb: torch DDP's bucket_cap_mb


# ============================================================================
# 1. Who does what: a rank's share
# ============================================================================

def share(n, ranks, rank):
    """-> (start, stop): rank's contiguous part of n things cut in `ranks` parts, the first n % ranks of
    them one longer (np.array_split's cut), so that the parts cover the n once, in order."""
    small, longer = divmod(n, ranks)
    start = rank * small + min(rank, longer)
    return start, start + small + (rank < longer)


# ============================================================================
# 2. The all-reduce
# ============================================================================
# Every rank has x; every rank needs the sum of them all. Sending each x to every rank would move N - 1
# copies through each rank. A ring moves 2 (N - 1) / N of one: cut x in N chunks; in N - 1 steps each rank
# passes a chunk to its right-hand neighbour and adds the one from its left (a reduce-scatter: then rank r
# holds chunk r + 1 summed over every rank), then in N - 1 more it passes the finished chunks on (an
# all-gather). Each step sends and receives at once (Sendrecv), so no rank waits for another to listen.

def ring_allreduce(comm, x):
    """x <- Σ over the ranks of x, in place, around a ring: a reduce-scatter, then an all-gather, each of
    N - 1 Sendrecv steps of one chunk (share's cut of x in N), to the right, from the left.   x [n], n the same
    on every rank. Every rank ends with the same bits: each chunk is summed once, on one rank, then copied."""
    ranks, rank = comm.Get_size(), comm.Get_rank()
    right, left = (rank + 1) % ranks, (rank - 1) % ranks

    def chunk(i):
        return x[slice(*share(x.size, ranks, i % ranks))]

    received = np.empty_like(chunk(0))  # the first chunk is the longest
    for s in range(ranks - 1):  # reduce-scatter: chunk rank - s goes right, chunk rank - s - 1 comes in
        part = chunk(rank - s - 1)
        comm.Sendrecv(chunk(rank - s), dest=right, recvbuf=received[:part.size], source=left)
        part += received[:part.size]
    for s in range(ranks - 1):  # all-gather: chunk rank + 1 - s (summed) goes right, chunk rank - s comes in
        comm.Sendrecv(chunk(rank + 1 - s), dest=right, recvbuf=chunk(rank - s), source=left)


def ring_allreduce_fast(comm, x):
    """ring_allreduce(comm, x), for the hot path: MPI's own all-reduce, posted (Iallreduce returns at once,
    and MPI moves the data while the program goes on). -> a function that waits until x holds the sum."""
    return comm.Iallreduce(mpi.in_place(comm), x).Wait


# ============================================================================
# 3. Buckets
# ============================================================================
# One message a tensor would be a hundred and fifty small messages a step; one message for them all could
# start only once the whole backward is done. torch's DDP takes the middle way: the parameters, in reverse
# (the order the backward finishes them), in buckets of about 25 MB, each one summed as soon as it is
# written. A bucket is one flat float32 array; a tensor's gradient is a slice of it. Under ZeRO-1 a bucket
# is laid out rank by rank: rank 0's slice of every tensor in it, then rank 1's, ..., so that a
# reduce-scatter hands each rank exactly its slices, summed.

def bucket_slices(sizes, parts):
    """Where each tensor's slices lie in a bucket laid out part by part (a rank's slices together):
    sizes [n_t] (the bucket's tensors' elements), parts: how many slices each tensor is cut in (share's cut;
    1: whole tensors, one after another). -> [[(start, stop, offset)] a tensor, for each part]: the tensor's
    elements start:stop lie at bucket[offset:offset + stop - start]."""
    layout, offset = [], 0
    for part in range(parts):
        layout.append([])
        for n in sizes:
            start, stop = share(n, parts, part)
            layout[-1].append((start, stop, offset))
            offset += stop - start
    return layout


def buckets(trained, ranks, zero=False, bucket_bytes=BUCKET_MB * 2 ** 20):
    """The gradients' buckets for the trained tensors: their names in reverse, about bucket_bytes each (a
    tensor larger than that is a bucket of its own). -> [{"names", "sizes", "layout" (bucket_slices'),
    "buffer" (the bucket, float32)}]. zero: laid out rank by rank, for a reduce-scatter; else tensor by tensor."""
    flat = shapes.flatten(trained)
    groups, size = [[]], 0
    for name in reversed(list(flat)):
        if groups[-1] and size + flat[name].nbytes > bucket_bytes:
            groups, size = groups + [[]], 0
        groups[-1].append(name)
        size += flat[name].nbytes
    out = []
    for names in groups:
        sizes = [flat[name].size for name in names]
        out.append({"names": names, "sizes": sizes, "layout": bucket_slices(sizes, ranks if zero else 1),
                    "buffer": np.zeros(sum(sizes), np.float32)})
    return out


def slices(bucket, part):
    """[(name, the tensor's elements start:stop, that slice of the bucket)] of one part of a bucket."""
    return [(name, start, stop, bucket["buffer"][offset:offset + stop - start])
            for name, (start, stop, offset) in zip(bucket["names"], bucket["layout"][part])]


def bucket_views(bucket_list, trained):
    """The gradients as views of their buckets (buckets laid out tensor by tensor), nested as trained is."""
    shape = {name: a.shape for name, a in shapes.flatten(trained).items()}
    return shapes.nest({name: view.reshape(shape[name]) for b in bucket_list for name, _, _, view in slices(b, 0)},
                       len(trained["blocks"]))


# ============================================================================
# 4. The data: a rank's part of each micro-batch
# ============================================================================
# The single process's step is `accum` micro-batches of up to --batch-size rows (windows, examples, pairs),
# its loss the micro-batches' mean, each micro-batch's loss the mean over what it counts (its targets that
# are not IGNORE, or its rows). A rank computes the same micro-batches (the data's draws are cheap) and takes
# its contiguous share of their rows; a piece of micro-batch j holding c of its C counted things weighs
# c / (C accum): the pieces' weighted losses, over every rank, add up to the single process's loss.

def counted(kind, micro_batch):
    """What a micro-batch's mean loss is over: a language model's targets that count, else its rows."""
    if kind in ("documents", "instruction"):
        return int((micro_batch[1] != IGNORE).sum())
    return len(micro_batch[1] if kind == "labelled" else micro_batch)


def step_pieces(data, recipe, step, ranks, rank):
    """This rank's share of the step's micro-batches: [(a piece of one, its weight)], at most one piece a
    micro-batch. The micro-batches are the single process's (train.gradients' draws, from the same
    generator, when there is no dropout to draw between them)."""
    kind, accum = train.DATA_KINDS[data["kind"]], recipe["accum"]
    rng = np.random.default_rng([recipe["seed"], step])
    micro = [kind["batch"](data, recipe, step * accum + j, rng) for j in range(accum)]
    rows = [len(m[0] if isinstance(m, tuple) else m) for m in micro]
    first, last = share(sum(rows), ranks, rank)
    pieces, at = [], 0
    for m, n in zip(micro, rows):
        start, stop = max(first - at, 0), min(last - at, n)
        at += n
        whole = counted(data["kind"], m)
        piece = tuple(a[start:stop] for a in m) if isinstance(m, tuple) else m[start:stop]
        if start < stop and whole:
            pieces.append((piece, counted(data["kind"], piece) / whole / accum))
    return [(piece, weight) for piece, weight in pieces if weight]


# ============================================================================
# 5. The step
# ============================================================================

def pack(grads, bucket_list, weight, first):
    """weight x this piece's gradients into the buckets, every slice of every tensor (written over if first,
    else added to what the earlier pieces wrote)."""
    flat = shapes.flatten(grads)
    for bucket in bucket_list:
        for part in range(len(bucket["layout"])):
            for name, start, stop, view in slices(bucket, part):
                g = flat[name].reshape(-1)[start:stop]
                if first:
                    np.multiply(g, weight, out=view)
                else:  # the piece's gradients are read here alone: scaled where they are, no temporary of their size
                    g *= weight
                    view += g


def gradients(params, hparams, data, step, recipe, buffers, frozen, group, post):
    """This rank's weighted gradients of its pieces, in group["buckets"], each bucket posted (post(bucket) ->
    a function that waits for it) as soon as the last piece's gradients are in it. -> (the step's metrics,
    the local share of each: summed across the ranks by the caller; the waits)"""
    comm, bucket_list = group["comm"], group["buckets"]
    pieces = step_pieces(data, recipe, step, comm.Get_size(), comm.Get_rank())
    rng = np.random.default_rng([recipe["seed"], step, 1 + comm.Get_rank()])  # dropout's, a rank's own
    kind, metrics = train.DATA_KINDS[data["kind"]], {}
    if not pieces:  # a rank with nothing this step (an epoch's short last batch) adds zeros
        for bucket in bucket_list:
            bucket["buffer"].fill(0.0)
    for i, (piece, weight) in enumerate(pieces):
        loss, grads, more = kind["loss"](piece, params, hparams, data, recipe, rng, buffers, frozen)
        for name, value in {"loss": loss, **more}.items():
            metrics[name] = metrics.get(name, 0.0) + weight * value
        if i < len(pieces) - 1:
            pack(grads, bucket_list, weight, i == 0)
    waits = []
    for bucket in bucket_list:  # the last piece's, a bucket at a time, each one posted once it is written
        if pieces:
            pack(grads, [bucket], pieces[-1][1], len(pieces) == 1)
        waits.append(post(bucket))
    return metrics, waits


def summed(comm, metrics):
    """{name: Σ over the ranks}, in rank order (every rank gets the same bits)."""
    every = comm.allgather(metrics)
    return {name: math.fsum(m.get(name, 0.0) for m in every) for name in dict.fromkeys(k for m in every for k in m)}


def train_step(params, hparams, state, data, step, recipe, buffers, group):
    """One step on this rank: train.train_step itself (the norm, the schedule, clipping, AdamW), its
    gradients this rank's pieces' summed across the ranks a bucket at a time, each rank's the same: so every
    rank takes the same AdamW step. Under ZeRO-1 the step is this rank's slices' (the weights', their
    gradients', the moments'), clipped already by the global norm, then the weights' slices are gathered.
    group: parallel()'s. -> the step's metrics, {"lr", "loss", ...}, the whole step's."""
    comm, zero = group["comm"], group["zero"]

    def post(bucket):  # its sum across the ranks, started: ZeRO-1's reduce-scatter, else the all-reduce
        return post_reduce_scatter(comm, bucket) if zero else ring_allreduce_fast(comm, bucket["buffer"])

    def summed_gradients(params, hparams, data, step, recipe, buffers, frozen):
        metrics, waits = gradients(params, hparams, data, step, recipe, buffers, group["frozen"], group, post)
        metrics = summed(comm, metrics)
        for wait in waits:  # every bucket summed before the optimizer reads it
            wait()
        if zero:
            clip_slices(comm, group["buckets"], recipe["grad_clip"])
        return metrics, group["my_grads" if zero else "grads"]

    metrics = train.train_step(params, hparams, state, data, step, recipe, buffers,
                               group["my_params"] if zero else (group["trained"] if group["frozen"] else None),
                               gradients=summed_gradients)
    if zero:
        gather_weights(comm, group["buckets"], group["trained"])
    return metrics


def clip_slices(comm, bucket_list, max_norm):
    """Under ZeRO-1, the gradients' slices clipped by the norm of them all (each rank's slices' sum of squares,
    summed across the ranks), so that train_step, which sees this rank's slices alone, finds nothing more to
    clip; a norm that is not finite is written into them, so that train_step finds it too, on every rank."""
    norm = math.sqrt(math.fsum(comm.allgather(math.fsum(float(np.vdot(b["mine"], b["mine"])) for b in bucket_list))))
    scale = clip_scale(norm, max_norm) if math.isfinite(norm) else 1.0
    for b in bucket_list:
        if not math.isfinite(norm):
            b["mine"].fill(norm)
        elif scale != 1.0:
            b["mine"] *= np.float32(scale)


# ============================================================================
# 6. ZeRO stage 1: AdamW's moments in slices
# ============================================================================

def zero_slices(bucket_list, rank):
    """ZeRO-1's part of each bucket for this rank: "mine", the slices a reduce-scatter sums into it, and
    "my_slices", [(name, the tensor's elements start:stop, that slice of mine)]."""
    for b in bucket_list:
        part = b["layout"][rank]
        base = part[0][2] if part else 0
        b["mine"] = np.zeros(sum(stop - start for start, stop, _ in part), np.float32)
        b["my_slices"] = [(name, start, stop, b["mine"][offset - base:offset - base + stop - start])
                          for name, (start, stop, offset) in zip(b["names"], part)]


def zero_state(trained, state, bucket_list):
    """This rank's slices of the weights (views of them), of the gradients (views of its buckets' "mine")
    and of AdamW's moments (copies: the whole moments go), nested as trained is."""
    flat, n_layer = shapes.flatten(trained), len(trained["blocks"])
    mine = [(name, start, stop, view) for b in bucket_list for name, start, stop, view in b["my_slices"]]
    return (shapes.nest({name: flat[name].reshape(-1)[start:stop] for name, start, stop, _ in mine}, n_layer),
            shapes.nest({name: view for name, _, _, view in mine}, n_layer),
            {"step": state["step"], **{k: {name: np.array(state[k][name].reshape(-1)[start:stop])
                                           for name, start, stop, _ in mine} for k in ("m", "v")}})


def post_reduce_scatter(comm, bucket):
    """The bucket summed over the ranks, each rank receiving its own part alone, into bucket["mine"]
    (MPI's Ireduce_scatter, posted). -> a function that waits for it."""
    counts = [sum(stop - start for start, stop, _ in part) for part in bucket["layout"]]
    return comm.Ireduce_scatter(bucket["buffer"], bucket["mine"], counts).Wait


def gather_weights(comm, bucket_list, trained):
    """Every rank's updated slices of the weights, to every rank: an all-gather a bucket, rank by rank into
    the bucket (its gradients are read already), then every other rank's slice into its tensor."""
    flat, rank = shapes.flatten(trained), comm.Get_rank()
    waits = []
    for b in bucket_list:
        for name, start, stop, view in b["my_slices"]:
            view[...] = flat[name].reshape(-1)[start:stop]
        counts = [sum(stop - start for start, stop, _ in part) for part in b["layout"]]
        waits.append(comm.Iallgatherv(b["mine"], [b["buffer"], counts]).Wait)
    for b, wait in zip(bucket_list, waits):
        wait()
        for part in range(len(b["layout"])):
            for name, start, stop, view in slices(b, part) if part != rank else ():
                flat[name].reshape(-1)[start:stop] = view


def whole_state(comm, trained, state):
    """AdamW's moments whole on rank 0 (None elsewhere), gathered from every rank's slices, for a save."""
    ranks, flat = comm.Get_size(), shapes.flatten(trained)
    whole = {"step": state["step"], "m": {}, "v": {}} if comm.Get_rank() == 0 else None
    for k in ("m", "v"):
        for name, a in flat.items():
            counts = [stop - start for start, stop in (share(a.size, ranks, r) for r in range(ranks))]
            out = np.empty(a.shape, np.float32) if whole else None
            comm.Gatherv(state[k][name], [out, counts] if whole else None, root=0)
            if whole:
                whole[k][name] = out
    return whole


# ============================================================================
# 7. The run on N ranks: what train.train calls instead
# ============================================================================

def parallel(comm, run, zero=0, bucket_mb=BUCKET_MB):
    """What train.train runs, for set_up's run on this rank of comm: {"step", "validation", "save", "steps",
    "waits", "speaks", "logged"} (train.train's docstring). First the trained tensors are broadcast from
    rank 0 (every rank starts from its weights); under ZeRO-1 (zero=1) run["state"] becomes this rank's
    slices of the moments."""
    if zero not in (0, 1):
        raise UserError(f"--zero {zero}: ZeRO stage 1 (AdamW's moments in slices) is the one here: choose 0 or 1")
    trained, ranks = run["trained"], comm.Get_size()
    for a in shapes.flatten(trained).values():
        comm.Bcast(a, root=0)
    bucket_list = buckets(trained, ranks, zero, bucket_mb * 2 ** 20)
    group = {"comm": comm, "zero": zero, "trained": trained, "buckets": bucket_list, "frozen": bool(run["lora"])}
    if zero:
        zero_slices(bucket_list, comm.Get_rank())
        group["my_params"], group["my_grads"], run["state"] = zero_state(trained, run["state"], bucket_list)
    else:
        group["grads"] = bucket_views(bucket_list, trained)

    def step(params, hparams, state, data, step_number, recipe, buffers, adapters):
        return train_step(params, hparams, state, data, step_number, recipe, buffers, group)

    def save(out, run, config):
        saved_state = whole_state(comm, trained, run["state"]) if zero else run["state"]
        said_once(comm, lambda: train.save(out, run | {"state": saved_state}, config))

    return {"step": step, "validation": lambda *args: validation(comm, *args), "save": save,
            "steps": lambda first, last: steps_together(comm, first, last), "waits": contextlib.nullcontext,
            "speaks": comm.Get_rank() == 0, "logged": {"ranks": ranks}}


def validation(comm, params, hparams, val_data, recipe):
    """train.validation across the ranks: each rank a share of the batches, the means summed (each rank's
    part of the mean, over everything held out); preference pairs: each rank a share of the batches' log-
    probabilities, gathered, then TRL's metrics over them all."""
    ranks, rank, rows = comm.Get_size(), comm.Get_rank(), val_data["rows"]
    if not len(rows):
        return {}
    if val_data["kind"] != "preference":
        return summed(comm, train.DATA_KINDS[val_data["kind"]]["validate"](params, hparams, val_data, recipe,
                                                                          share=(rank, ranks)))
    size = recipe["batch_size"]
    first, last = (size * i for i in share(-(-len(rows) // size), ranks, rank))  # whole batches, as one process's
    logps = dpo.pair_logps(rows[first:last], params, hparams, recipe["context"], val_data["pad_id"], size)
    return dpo.pairs_metrics(np.concatenate(comm.allgather(logps)), val_data["ref"], val_data["lengths"],
                             val_data["beta"], val_data["loss_type"])


def said_once(comm, work):
    """work() on rank 0 alone (a save, a message), after every rank has come to it; a UserError it raises
    is raised on every rank, so that every rank stops with the same line. comm None: work(), alone."""
    if comm is None:
        return work()
    error = None
    if comm.Get_rank() == 0:
        try:
            work()
        except UserError as e:
            error = str(e)
    error = comm.bcast(error, root=0)
    if error is not None:
        raise UserError(error)


@contextlib.contextmanager
def agreed(comm):
    """`with agreed(comm):` a UserError raised in the block on any rank is raised on every rank (the first
    rank's), once they all reach the block's end: a file one rank cannot read stops every rank, which then
    all exit together, where a rank that left alone would leave the others waiting. comm None: nothing."""
    error = None
    try:
        yield
    except UserError as e:
        if comm is None:
            raise
        error = str(e)
    errors = [e for e in (comm.allgather(error) if comm is not None else []) if e is not None]
    if errors:
        raise UserError(errors[0])


def steps_together(comm, first, last):
    """range(first, last), each step begun once every rank has said whether it was asked to stop: Ctrl-C
    or SIGTERM, on any rank (mpiexec passes Ctrl-C to every rank), held from here to the end of the run,
    stops every rank before the same step (KeyboardInterrupt, or Terminated), so that the save after it is
    every rank's. (One process: train.train's ctrl_c_waits, around each step.)"""
    arrived = []
    main = threading.current_thread() is threading.main_thread()
    previous = {s: signal.signal(s, lambda signum, frame: arrived.append(signum))
                for s in WAITING if main and signal.getsignal(s) is not signal.SIG_IGN}
    try:
        for step in range(first, last):
            asked = set().union(*comm.allgather(set(arrived)))
            if asked:
                raise Terminated if signal.SIGTERM in asked else KeyboardInterrupt
            yield step
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


# ============================================================================
# 8. An SAE on N ranks (sae.py train)
# ============================================================================
# Each rank takes its contiguous 1/N of each batch of activations. The losses and gradients are means over
# the tokens, so the ranks' means, averaged, are the whole batch's. What a step decides from the whole
# batch is decided from the whole batch: BatchTopK's ⌊k N⌋ largest activations, the latents that fired
# (the dead latents' counters), and BatchTopK's running threshold (the smallest activation that fired).

def batch_topk_across(comm, n_tokens):
    """sae.batch_topk_mask, over every rank's part of a batch of n_tokens: the ⌊k n_tokens⌋ largest of
    them all, wherever they are. Each rank offers its own largest (no more can be chosen from one rank),
    the cut is the ⌊k n⌋-th largest of those, and a tie at the cut is taken rank by rank."""
    def choose(acts, k):  # acts [N_rank, d_sae], ReLU'd -> bool
        flat, n = acts.ravel(), int(k * n_tokens)
        m = min(max(n, 0), flat.size)  # no more than the whole batch's n can come from this rank
        offered = np.partition(flat, flat.size - m)[flat.size - m:] if m else flat[:0]
        every = np.concatenate(comm.allgather(offered))
        if n <= 0 or n >= every.size:  # none, or every one (every rank offered all it has)
            return np.full(acts.shape, n > 0)
        cut = np.partition(every, every.size - n)[every.size - n]
        mask = flat > cut
        above, ties = zip(*comm.allgather((int(mask.sum()), int((flat == cut).sum()))))
        take = min(max(n - sum(above) - sum(ties[:comm.Get_rank()]), 0), ties[comm.Get_rank()])
        mask[np.flatnonzero(flat == cut)[:take]] = True
        return mask.reshape(acts.shape)

    return choose


def mean_across(comm, arrays):
    """{name: array} -> the mean of each over the ranks (one all-reduce of them all, flattened into one array)."""
    flat = np.concatenate([a.reshape(-1) for a in arrays.values()], dtype=np.float32)
    ring_allreduce_fast(comm, flat)()
    flat *= np.float32(1.0 / comm.Get_size())
    out, at = {}, 0
    for name, a in arrays.items():
        out[name] = flat[at:at + a.size].reshape(a.shape)
        at += a.size
    return out


def sae_across(comm, n_tokens):
    """sae.training_step's whole-batch decisions (its `across`) for a rank's part of a batch of n_tokens: BatchTopK's
    choice from every rank's activations, the losses and gradients averaged over the ranks, the latents that fired
    on any rank, the smallest activation of them all. Each is a collective call, made in the same order on every
    rank."""
    def mean(losses, grads):
        return {name: value / comm.Get_size() for name, value in summed(comm, losses).items()}, mean_across(comm, grads)

    def smallest(mine):  # None where a rank had none fire
        every = [m for m in comm.allgather(mine) if m is not None]
        return min(every) if every else None

    return {"choose": batch_topk_across(comm, n_tokens), "mean": mean,
            "any": lambda fired: np.logical_or.reduce(comm.allgather(fired)), "smallest": smallest}


def sae_step(comm, x, sae, state, lr, settings, coefficient=0.0, target=None):
    """sae.training_step on this rank's part x [N / ranks, d_in] of a batch (and of a transcoder's target):
    the same step, every rank's SAE the same after it. -> losses, the whole batch's"""
    return S.training_step(x, sae, state, lr, settings, coefficient, target,
                           sae_across(comm, x.shape[0] * comm.Get_size()))
