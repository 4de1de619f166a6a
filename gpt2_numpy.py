"""GPT-2 in plain NumPy: the forward pass, generation and scoring, read top to bottom.

    python gpt2_numpy.py "Alan Turing theorized that computers would one day become"

The file goes in the order the data flows:
  1. building blocks    gelu, softmax, layer_norm, linear, ffn
  2. attention          attention_weights, attention, mha (with a KV cache)
  3. the model          transformer_block, gpt2
  4. generation         sampling controls, generate (streams tokens), score
  5. counting and tracing  count_parameters, trace
  6. loading and the command line

Arrays are float32 throughout. Shapes use B = batch, T = positions, C = n_embd,
H = n_head, D = C / H (one head's width), V = n_vocab. Parameter names follow
OpenAI's checkpoint (wte, wpe, ln_1, c_attn, c_proj, ln_2, c_fc, ln_f), so the
code and the checkpoint explain each other.
"""
import argparse
import codecs
import json
import math
import os
import sys
import time

import numpy as np

import bpe
import download

ENDOFTEXT = 50256  # <|endoftext|>: separates documents; GPT-2 writes it when a text is done


# ============================================================================
# 1. Building blocks
# ============================================================================
# Two habits keep these fast without changing the arithmetic:
# - constants are Python floats: a NumPy float64 scalar would silently turn every
#   float32 array it touches into float64 (several times slower);
# - each function makes one new array and updates it in place (`y *= ...`): on a
#   long prompt the arrays outgrow the CPU cache, and every extra temporary is
#   another trip to main memory (gelu runs ~3x faster this way).

def gelu(x):
    """GELU, tanh approximation (as GPT-2): 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))"""
    y = x * x                          # computed as 0.5 x (1 + tanh(x (a + b x²))),
    y *= 0.044715 * 0.7978845608028654  # with a = √(2/π) and b = 0.044715 √(2/π)
    y += 0.7978845608028654
    y *= x
    np.tanh(y, out=y)
    y += 1.0
    y *= x
    y *= 0.5
    return y


def softmax(x):
    """softmax(x)_i = exp(x_i - max x) / Σ_j exp(x_j - max x), over the last axis.
    Subtracting the max changes nothing mathematically and keeps exp from overflowing."""
    e = x - x.max(axis=-1, keepdims=True)
    np.exp(e, out=e)
    e /= e.sum(axis=-1, keepdims=True)
    return e


def layer_norm(x, g, b, eps=1e-5):
    """(x - mean) / √(var + eps) · g + b, over the last axis (C).   [..., C] -> [..., C]"""
    y = x - x.mean(axis=-1, keepdims=True)
    y /= np.sqrt((y * y).mean(axis=-1, keepdims=True) + eps)  # var = mean of (x - mean)²
    y *= g
    y += b
    return y


def linear(x, w, b):
    """x @ w + b.   [..., n_in] @ [n_in, n_out] -> [..., n_out]"""
    y = x @ w
    y += b
    return y


def ffn(x, c_fc, c_proj):
    """The position-wise MLP: c_proj(gelu(c_fc(x))).   [B, T, C] -> [B, T, 4C] -> [B, T, C]"""
    return linear(gelu(linear(x, **c_fc)), **c_proj)


# ============================================================================
# 2. Attention
# ============================================================================

def causal_mask(n):
    """0 where query i may look at key j (j <= i), -inf where j is in its future.   [n, n]"""
    return np.triu(np.full((n, n), -np.inf, dtype=np.float32), k=1)


def attention_weights(q, k):
    """softmax(q kᵀ / √D + mask): how much each query takes from each key.
    q [B, H, Tq, D], k [B, H, Tk, D] -> [B, H, Tq, Tk]
    The queries are the last Tq of the Tk positions (the earlier keys may come from
    the cache): they see every earlier key, so only the last Tq keys need the mask."""
    n_queries = q.shape[-2]
    scores = (q * (1.0 / math.sqrt(q.shape[-1]))) @ k.swapaxes(-1, -2)
    if n_queries > 1:  # a single query is the newest position: it may see every key
        scores[..., -n_queries:] += causal_mask(n_queries)
    return softmax(scores)


def attention(q, k, v):
    """softmax(q kᵀ / √D + mask) v.   q [B, H, Tq, D], k, v [B, H, Tk, D] -> [B, H, Tq, D]"""
    return attention_weights(q, k) @ v


def blocked_attention(q, k, v, block=128):
    """attention(), a block of queries at a time. A block's last query sees keys only
    up to its own position, so the keys after it (the masked part of the T x T
    scores) are never computed: on a long prompt that halves the work."""
    n_queries, n_past = q.shape[-2], k.shape[-2] - q.shape[-2]
    if n_queries <= block:
        return attention(q, k, v)
    out = np.empty(q.shape, dtype=q.dtype)
    for start in range(0, n_queries, block):
        end = min(start + block, n_queries)
        out[..., start:end, :] = attention(q[..., start:end, :], k[..., :n_past + end, :], v[..., :n_past + end, :])
    return out


def split_heads(x, n_head):
    """[B, T, C] -> [B, H, T, D]: each head works on its own D = C / H slice."""
    B, T, C = x.shape
    return x.reshape(B, T, n_head, C // n_head).transpose(0, 2, 1, 3)


def merge_heads(x):
    """[B, H, T, D] -> [B, T, C]: the heads' outputs side by side again."""
    B, H, T, D = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, H * D)


def new_kv_cache(hparams, batch, length):
    """Room for `length` positions of keys and values in every layer, and how many are filled.
    Per layer: {"k": [B, length, C], "v": [B, length, C], "n": 0}"""
    shape = (batch, length, hparams["n_embd"])
    return [{"k": np.empty(shape, np.float32), "v": np.empty(shape, np.float32), "n": 0}
            for _ in range(hparams["n_layer"])]


def kv_append(kv, k, v):
    """Store this step's keys and values after the cached ones; return all of them so far.
    k, v [B, T, C] -> [B, n + T, C]. A new token never changes an old key, so the old
    ones are kept instead of recomputed: one token per step costs T, not T²."""
    n, T = kv["n"], k.shape[1]
    kv["k"][:, n:n + T] = k
    kv["v"][:, n:n + T] = v
    kv["n"] = n + T
    return kv["k"][:, :n + T], kv["v"][:, :n + T]


def mha(x, c_attn, c_proj, n_head, kv=None):
    """Multi-head causal self-attention.   [B, T, C] -> [B, T, C]
    c_attn makes q, k, v at once; each head attends on its own slice; c_proj mixes the heads."""
    q, k, v = np.split(linear(x, **c_attn), 3, axis=-1)  # 3 x [B, T, C]
    if kv is not None:
        k, v = kv_append(kv, k, v)  # [B, past + T, C]
    q, k, v = split_heads(q, n_head), split_heads(k, n_head), split_heads(v, n_head)  # [B, H, T, D]
    return linear(merge_heads(blocked_attention(q, k, v)), **c_proj)


# ============================================================================
# 3. The model
# ============================================================================

def transformer_block(x, ln_1, attn, ln_2, mlp, n_head, kv=None):
    """Pre-LN residual block: x + mha(ln_1(x)), then x + ffn(ln_2(x)).   [B, T, C] -> [B, T, C]"""
    x = x + mha(layer_norm(x, **ln_1), **attn, n_head=n_head, kv=kv)
    return x + ffn(layer_norm(x, **ln_2), **mlp)


def gpt2(ids, params, n_head, kv_cache=None, last_only=False):
    """Token ids -> next-token logits at each position.
    wte[ids] + wpe[positions] -> blocks -> ln_f -> x @ wteᵀ
    ids [B, T] or [T] -> logits [B, T, V] or [T, V]; only the last position with last_only.
    With a kv_cache, ids are the positions after those already cached."""
    ids = np.asarray(ids)
    flat = ids.ndim == 1
    ids = ids.reshape(1, -1) if flat else ids
    start = kv_cache[0]["n"] if kv_cache else 0
    check_ids(ids, params["wte"].shape[0], start + ids.shape[1], params["wpe"].shape[0])
    x = params["wte"][ids] + params["wpe"][start:start + ids.shape[1]]  # [B, T, C]
    for block, kv in zip(params["blocks"], kv_cache or [None] * len(params["blocks"])):
        x = transformer_block(x, **block, n_head=n_head, kv=kv)
    x = layer_norm(x[:, -1:] if last_only else x, **params["ln_f"])
    logits = x @ params["wte"].T  # [B, T, V]: the output layer is the embedding, transposed
    return logits[0] if flat else logits


def check_ids(ids, n_vocab, end, n_ctx):
    """Clear errors for what NumPy would get wrong quietly (negative ids wrap around)."""
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"token ids must be integers, got {ids.dtype}")
    if ids.size and (ids.min() < 0 or ids.max() >= n_vocab):
        bad = ids[(ids < 0) | (ids >= n_vocab)].flat[0]
        raise ValueError(f"token id {bad} is outside 0..{n_vocab - 1}")
    if end > n_ctx:
        raise ValueError(f"{end} positions do not fit the model's context of {n_ctx}")


# ============================================================================
# 4. Generation and scoring
# ============================================================================

def top_k_filter(logits, k):
    """Keep the k largest logits of each row, -inf elsewhere.   [B, V] -> [B, V]"""
    if k >= logits.shape[-1]:
        return logits
    kth = np.partition(logits, -k, axis=-1)[:, -k:].min(axis=-1, keepdims=True)
    return np.where(logits < kth, -np.inf, logits).astype(np.float32)


def top_p_filter(logits, p):
    """Nucleus: keep the most likely tokens until their probability reaches p, -inf elsewhere.
    A token stays if the tokens more likely than it hold less than p.   [B, V] -> [B, V]"""
    order = np.argsort(-logits, axis=-1)
    probs = softmax(np.take_along_axis(logits, order, axis=-1))
    drop_sorted = np.cumsum(probs, axis=-1) - probs >= p
    drop = np.empty_like(drop_sorted)
    np.put_along_axis(drop, order, drop_sorted, axis=-1)
    return np.where(drop, -np.inf, logits).astype(np.float32)


def sample_next(logits, rng, temperature=1.0, top_k=None, top_p=1.0):
    """Pick each row's next token.   logits [B, V] -> ids [B]
    temperature 0 is greedy (argmax); otherwise softmax(logits / temperature), cut by top_k
    and top_p, sampled by inverting the cumulative distribution at a uniform draw."""
    if temperature == 0:
        return logits.argmax(axis=-1)
    logits = logits / temperature
    if top_k:
        logits = top_k_filter(logits, top_k)
    if top_p < 1.0:
        logits = top_p_filter(logits, top_p)
    cdf = np.cumsum(softmax(logits), axis=-1)  # [B, V]
    u = rng.random((len(cdf), 1), dtype=np.float32) * cdf[:, -1:]
    return np.minimum((cdf <= u).sum(axis=-1), cdf.shape[-1] - 1)


def check_sampling(n_tokens, temperature, top_k, top_p, n_samples):
    """Clear errors for sampling settings that make no sense."""
    if not (isinstance(n_tokens, (int, np.integer)) and n_tokens >= 0):
        raise ValueError(f"n_tokens must be a whole number >= 0, got {n_tokens!r}")
    if not (temperature >= 0 and math.isfinite(temperature)):
        raise ValueError(f"temperature must be >= 0 (0 means greedy), got {temperature!r}")
    if top_k is not None and not (isinstance(top_k, (int, np.integer)) and top_k >= 1):
        raise ValueError(f"top_k must be a whole number >= 1, got {top_k!r}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    if not (isinstance(n_samples, (int, np.integer)) and n_samples >= 1):
        raise ValueError(f"n_samples must be a whole number >= 1, got {n_samples!r}")


def generate(ids, params, hparams, n_tokens=40, temperature=1.0, top_k=None, top_p=1.0, seed=None,
             n_samples=1, stop=ENDOFTEXT):
    """Yield the next token of every sample, one step at a time: arrays [n_samples].

    The prompt goes through the model once (filling the KV cache); then each step
    feeds only the newest token. The samples run as one batch. A sample that has
    produced `stop` (None: never stop) keeps yielding it; the loop ends when all have.
    An empty prompt starts from <|endoftext|>, as OpenAI's unconditional sampler does."""
    check_sampling(n_tokens, temperature, top_k, top_p, n_samples)
    ids = list(ids) or [ENDOFTEXT]
    if len(ids) + n_tokens > hparams["n_ctx"]:
        raise ValueError(f"the prompt's {len(ids)} tokens plus {n_tokens} new ones exceed "
                         f"the context of {hparams['n_ctx']} tokens")
    rng = np.random.default_rng(seed)
    kv_cache = new_kv_cache(hparams, n_samples, len(ids) + n_tokens)
    batch = np.tile(np.asarray(ids, dtype=np.int64), (n_samples, 1))  # [B, T]
    logits = gpt2(batch, params, hparams["n_head"], kv_cache, last_only=True)[:, -1]  # [B, V]
    done = np.zeros(n_samples, dtype=bool)
    for step in range(n_tokens):
        next_ids = np.where(done, stop if stop is not None else 0,
                            sample_next(logits, rng, temperature, top_k, top_p))  # [B]
        yield next_ids
        done |= next_ids == stop
        if done.all() or step == n_tokens - 1:
            return
        logits = gpt2(next_ids[:, None], params, hparams["n_head"], kv_cache, last_only=True)[:, -1]


def log_softmax(x):
    """log softmax(x), over the last axis, without forming tiny probabilities first."""
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def score(ids, params, hparams):
    """How likely the model finds a text.   ids [T] -> (logprobs [T-1], loss, perplexity)
    logprobs[i] = log p(ids[i+1] | ids[:i+1]): the first token has no prediction.
    loss = mean of -logprobs (nats per token); perplexity = exp(loss)."""
    ids = np.asarray(ids)
    if ids.ndim != 1 or len(ids) < 2:
        raise ValueError("scoring needs at least 2 tokens: the first one is only context")
    logprobs = log_softmax(gpt2(ids[:-1], params, hparams["n_head"]))  # [T-1, V]
    token_logprobs = logprobs[np.arange(len(ids) - 1), ids[1:]]  # [T-1]
    loss = float(-token_logprobs.mean())
    return token_logprobs, loss, math.exp(loss)


# ============================================================================
# 5. Counting parameters, and tracing one forward pass
# ============================================================================

GPT2_SIZES = {  # the four released models; all have n_vocab 50257 and n_ctx 1024
    "124M": {"n_layer": 12, "n_embd": 768, "n_head": 12},
    "355M": {"n_layer": 24, "n_embd": 1024, "n_head": 16},
    "774M": {"n_layer": 36, "n_embd": 1280, "n_head": 20},
    "1558M": {"n_layer": 48, "n_embd": 1600, "n_head": 25},
}


def gpt2_hparams(size):
    return {"n_vocab": 50257, "n_ctx": 1024, **GPT2_SIZES[size]}


def count_parameters(hparams, n_kv_head=None, d_ff=None, gated_mlp=False, tied_head=True, biases=True,
                     norm="layernorm", learned_positions=True):
    """Exact parameter count of each part of a decoder-only transformer. The defaults are GPT-2;
    the options describe others (GPT-3 is GPT-2's shape; Llama uses n_kv_head, gated_mlp,
    an untied head, no biases, RMSNorm and no position table)."""
    V, T, d, L, H = (hparams[k] for k in ("n_vocab", "n_ctx", "n_embd", "n_layer", "n_head"))
    kv = d * (n_kv_head or H) // H  # width of k and of v: d, unless heads share keys and values
    f = d_ff or 4 * d
    norm_size = 2 * d if norm == "layernorm" else d  # a LayerNorm has gain and bias; RMSNorm a gain
    attn = {"c_attn.w": d * (d + 2 * kv), "c_attn.b": (d + 2 * kv) * biases,
            "c_proj.w": d * d, "c_proj.b": d * biases}
    mlp = {"c_fc.w": d * f * (2 if gated_mlp else 1), "c_fc.b": f * (2 if gated_mlp else 1) * biases,
           "c_proj.w": f * d, "c_proj.b": d * biases}
    block = {"attention": sum(attn.values()), "mlp": sum(mlp.values()), "layer norms": 2 * norm_size}
    parts = {"wte (token embedding)": V * d, "wpe (position embedding)": T * d * learned_positions,
             "blocks": L * sum(block.values()), "ln_f": norm_size, "head": 0 if tied_head else V * d}
    total = sum(parts.values())
    embedding = parts["wte (token embedding)"] + parts["wpe (position embedding)"] + parts["head"]
    approx = 12 * L * d * d
    return {"parts": parts, "block": block, "attention": attn, "mlp": mlp, "total": total,
            "non_embedding": total - embedding, "wte_share": parts["wte (token embedding)"] / total,
            "approx_12Ld2": approx, "approx_error": (approx - (total - embedding)) / (total - embedding)}


def count_tensors(params):
    """The same parts counted from the arrays themselves, independently of the formula."""
    def size(layer):  # the arrays of one layer, e.g. {w, b} or {g, b}
        return sum(a.size for a in layer.values())

    blocks = params["blocks"]
    return {"wte (token embedding)": params["wte"].size, "wpe (position embedding)": params["wpe"].size,
            "blocks": sum(size(b["attn"]["c_attn"]) + size(b["attn"]["c_proj"]) + size(b["mlp"]["c_fc"])
                          + size(b["mlp"]["c_proj"]) + size(b["ln_1"]) + size(b["ln_2"]) for b in blocks),
            "ln_f": size(params["ln_f"]), "head": 0}


def trace(ids, params, n_head, blocks=None):
    """The forward pass again, step by step, recording every stage: [(name, array)].
    It calls the same functions as gpt2() (a test holds their logits equal), so the
    model itself carries no tracing code. blocks: which blocks to record (default all)."""
    ids = np.atleast_2d(np.asarray(ids))
    check_ids(ids, params["wte"].shape[0], ids.shape[1], params["wpe"].shape[0])
    stages = [("token ids", ids)]
    x = params["wte"][ids]
    stages.append(("wte[ids]", x))
    x = x + params["wpe"][:ids.shape[1]]
    stages.append(("+ wpe", x))
    for i, block in enumerate(params["blocks"]):
        record = blocks is None or i in blocks
        h = layer_norm(x, **block["ln_1"])
        q, k, v = (split_heads(a, n_head) for a in np.split(linear(h, **block["attn"]["c_attn"]), 3, axis=-1))
        weights = attention_weights(q, k)
        a = linear(merge_heads(weights @ v), **block["attn"]["c_proj"])
        x = x + a
        h2 = layer_norm(x, **block["ln_2"])
        f = linear(h2, **block["mlp"]["c_fc"])
        g = gelu(f)
        m = linear(g, **block["mlp"]["c_proj"])
        x_out = x + m
        if record:
            stages += [(f"h{i}.ln_1", h), (f"h{i}.attn.q", q), (f"h{i}.attn.k", k), (f"h{i}.attn.v", v),
                       (f"h{i}.attn.weights", weights), (f"h{i}.attn.c_proj", a), (f"h{i}.+ attn", x),
                       (f"h{i}.ln_2", h2), (f"h{i}.mlp.c_fc", f), (f"h{i}.mlp.gelu", g),
                       (f"h{i}.mlp.c_proj", m), (f"h{i}.+ mlp", x_out)]
        x = x_out
    x = layer_norm(x, **params["ln_f"])
    stages.append(("ln_f", x))
    stages.append(("logits = x @ wteᵀ", x @ params["wte"].T))
    return stages


# ============================================================================
# 6. Loading, and the command line
# ============================================================================

def load_model(model="124M", models_dir=None, base_url=None, quiet=False):
    """-> (encoder, hparams, params) for a size (downloaded on first use) or a checkpoint folder."""
    folder = download.download_model(model, models_dir, base_url, quiet=quiet)
    hparams, params = download.load_checkpoint(folder)
    return bpe.get_encoder(folder), hparams, params


def fail(message):
    """A user's mistake: one line on stderr, exit status 2."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def positive_int(text):
    value = int(text)
    if value < 1:
        raise ValueError
    return value


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="GPT-2 in plain NumPy: generate text, score a text, count parameters, trace shapes.",
        epilog="Models download on first use to --models-dir, else $GPT2_MODELS_DIR, else models/ beside this "
               "file; --base-url or $GPT2_BASE_URL picks a mirror.")
    p.add_argument("prompt", nargs="?", default=None,
                   help="text to continue (or to score with --score, or to trace with --trace); "
                        "empty: sample unconditionally")
    p.add_argument("--model", default="124M", help="124M (default), 355M, 774M, 1558M, or a checkpoint folder")
    p.add_argument("--models-dir", help="where model sizes are downloaded")
    p.add_argument("--base-url", help="a mirror of OpenAI's model files")
    p.add_argument("--n-tokens", type=int, default=40, help="tokens to generate (default 40)")
    p.add_argument("--temperature", type=float, default=1.0, help="softmax temperature; 0 = greedy (default 1)")
    p.add_argument("--top-k", type=int, default=None, help="sample only from the k most likely tokens")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: smallest set with this mass")
    p.add_argument("--seed", type=int, default=None, help="random seed: the same seed gives the same text")
    p.add_argument("--greedy", action="store_true", help="always take the most likely token (temperature 0)")
    p.add_argument("--n-samples", type=int, default=1, help="independent samples, run as one batch")
    p.add_argument("--no-stop", action="store_true", help="keep going after <|endoftext|>")
    p.add_argument("--score", action="store_true", help="print each token's log-probability, the loss "
                                                        "and the perplexity of the prompt")
    p.add_argument("--params", nargs="?", const="124M", metavar="MODEL",
                   help="count parameters by part for a size, or 'all' (no prompt needed)")
    p.add_argument("--trace", action="store_true", help="run one forward pass on the prompt and print "
                                                        "every stage's shape and statistics")
    p.add_argument("--trace-block", type=int, default=None, help="with --trace: only this block")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--threads", type=positive_int, default=None, help="BLAS threads (default: BLAS decides)")
    p.add_argument("--quiet", action="store_true", help="no progress bars, no speed report")
    p.error = fail
    args = p.parse_args(argv)
    if args.greedy:
        args.temperature = 0.0
    try:
        check_sampling(args.n_tokens, args.temperature, args.top_k, args.top_p, args.n_samples)
    except ValueError as e:
        fail(str(e).replace("n_tokens", "--n-tokens").replace("top_k", "--top-k").replace("top_p", "--top-p")
             .replace("n_samples", "--n-samples").replace("temperature must", "--temperature must"))
    if args.prompt is None and args.params is None:
        args.prompt = ""
    if args.prompt is not None:
        try:
            args.prompt.encode("utf-8")
        except UnicodeEncodeError:
            fail("the prompt is not valid UTF-8 text")
    if (args.score or args.trace) and not args.prompt:
        fail("--score and --trace need a text")
    return args


def use_threads(n):
    """BLAS reads its thread count once, when NumPy loads; so to change it, start again with it set."""
    if n and os.environ.get("OMP_NUM_THREADS") != str(n):
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(n)
        os.execv(sys.executable, [sys.executable] + sys.argv)


def print_params(model, models_dir):
    """--params: the count by part, and the tensors on disk counted too when they are there."""
    sizes = list(GPT2_SIZES) if model == "all" else [model]
    if model != "all" and model not in GPT2_SIZES:
        folder = download.model_folder(model, models_dir)
        hp, params = download.load_checkpoint(folder)
        return print_param_table({model: (hp, params)})
    loaded = {}
    for size in sizes:
        folder = download.model_folder(size, models_dir)
        params = download.load_checkpoint(folder)[1] if os.path.exists(os.path.join(folder, "hparams.json")) else None
        loaded[size] = (gpt2_hparams(size), params)
    print_param_table(loaded)
    if model == "all":
        print()
        print_published()


def print_param_table(models):
    counts = {name: count_parameters(hp) for name, (hp, _) in models.items()}
    names = list(models)
    width = max(14, *(len(n) + 2 for n in names))
    rows = [(part, lambda c, part=part: c["parts"][part], ",") for part in next(iter(counts.values()))["parts"]]
    rows += [("  per block: attention", lambda c: c["block"]["attention"], ","),
             ("  per block: mlp", lambda c: c["block"]["mlp"], ","),
             ("  per block: 2 layer norms", lambda c: c["block"]["layer norms"], ","),
             ("total", lambda c: c["total"], ","),
             ("non-embedding", lambda c: c["non_embedding"], ","),
             ("token embedding share", lambda c: c["wte_share"], ".1%"),
             ("12·L·d² (approximation)", lambda c: c["approx_12Ld2"], ","),
             ("  its error", lambda c: c["approx_error"], ".3%")]
    print(f"{'part':<28}" + "".join(f"{n:>{width}}" for n in names))
    for label, value, fmt in rows:
        print(f"{label:<28}" + "".join(f"{value(counts[n]):>{width}{fmt}}" for n in names))
    for name, (hp, params) in models.items():
        if params is None:
            continue
        found = count_tensors(params)
        diffs = [p for p in found if found[p] != counts[name]["parts"][p]]
        if diffs:
            print(f"{name}: the checkpoint's tensors differ from the formula in " +
                  ", ".join(f"{p} ({found[p]:,} vs {counts[name]['parts'][p]:,})" for p in diffs))
        else:
            print(f"{name}: counting the checkpoint's tensors gives the same {sum(found.values()):,}")


PUBLISHED = [  # name, published size, shape (Brown et al. 2020, Table 2.1; Llama 3 model card)
    ("GPT-3 Small", 125e6, dict(n_layer=12, n_embd=768, n_head=12), {}),
    ("GPT-3 Medium", 350e6, dict(n_layer=24, n_embd=1024, n_head=16), {}),
    ("GPT-3 Large", 760e6, dict(n_layer=24, n_embd=1536, n_head=16), {}),
    ("GPT-3 XL", 1.3e9, dict(n_layer=24, n_embd=2048, n_head=24), {}),
    ("GPT-3 2.7B", 2.7e9, dict(n_layer=32, n_embd=2560, n_head=32), {}),
    ("GPT-3 6.7B", 6.7e9, dict(n_layer=32, n_embd=4096, n_head=32), {}),
    ("GPT-3 13B", 13e9, dict(n_layer=40, n_embd=5140, n_head=40), {}),  # 5140 as printed (40 x 128 = 5120)
    ("GPT-3 175B", 175e9, dict(n_layer=96, n_embd=12288, n_head=96), {}),
    ("Llama 3 8B", 8.03e9, dict(n_layer=32, n_embd=4096, n_head=32, n_vocab=128256, n_ctx=8192),
     dict(n_kv_head=8, d_ff=14336, gated_mlp=True, tied_head=False, biases=False, norm="rmsnorm",
          learned_positions=False)),
]


def published_counts():
    """[(name, published, counted)] for the shapes above (GPT-3: n_ctx 2048, vocabulary 50257)."""
    return [(name, published, count_parameters({"n_vocab": 50257, "n_ctx": 2048, **shape}, **options)["total"])
            for name, published, shape, options in PUBLISHED]


def print_published():
    print(f"{'published shapes':<16}{'published':>12}{'counted':>20}{'difference':>12}")
    for name, published, counted in published_counts():
        print(f"{name:<16}{published / 1e9:>11.3g}B{counted:>20,}{(counted - published) / published:>12.2%}")


def print_trace(stages):
    print(f"{'stage':<22}{'shape':<22}{'mean':>10}{'std':>10}{'min':>10}{'max':>10}")
    for name, a in stages:
        a32 = a.astype(np.float32)
        print(f"{name:<22}{str(list(a.shape)):<22}{a32.mean():>10.4f}{a32.std():>10.4f}"
              f"{a32.min():>10.4f}{a32.max():>10.4f}")


def run_score(args, encoder, hparams, params):
    ids = encoder.encode(args.prompt)
    if len(ids) > hparams["n_ctx"] + 1:  # the last token is only predicted, never read
        fail(f"the text has {len(ids)} tokens; at most {hparams['n_ctx'] + 1} can be scored")
    logprobs, loss, perplexity = score(ids, params, hparams)
    if args.json:
        print(json.dumps({"ids": ids, "logprobs": [None] + [round(float(x), 6) for x in logprobs],
                          "loss": loss, "perplexity": perplexity}))
        return
    print(f"{'token':<20}{'id':>7}{'log p':>10}")
    for i, token in enumerate(ids):
        lp = "" if i == 0 else f"{logprobs[i - 1]:10.4f}"
        print(f"{encoder.decode([token]).translate(bpe.SHOW)!r:<20}{token:>7}{lp:>10}")
    print(f"loss {loss:.4f} nats/token over {len(ids) - 1} predictions, perplexity {perplexity:.2f}")


def run_generate(args, encoder, hparams, params):
    prompt_ids = encoder.encode(args.prompt)
    stop = None if args.no_stop else ENDOFTEXT
    start = time.perf_counter()
    steps = generate(prompt_ids, params, hparams, args.n_tokens, args.temperature, args.top_k, args.top_p,
                     args.seed, args.n_samples, stop)
    stream = args.n_samples == 1 and not args.json
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
    samples = [[] for _ in range(args.n_samples)]
    first_token_time = None
    for next_ids in steps:  # the first step checks the settings: nothing is printed before it
        if first_token_time is None:
            first_token_time = time.perf_counter()
            if stream:
                sys.stdout.write(args.prompt)
        for sample, token in zip(samples, next_ids.tolist()):
            if not sample or sample[-1] != stop:
                sample.append(token)
        if stream and next_ids[0] != stop:
            sys.stdout.write(utf8.decode(encoder.decode_bytes(next_ids[:1])))
            sys.stdout.flush()
    if first_token_time is None:  # no step at all (--n-tokens 0)
        first_token_time = time.perf_counter()
        if stream:
            sys.stdout.write(args.prompt)
    elapsed = time.perf_counter() - start
    finish = ["endoftext" if s and s[-1] == stop else "length" for s in samples]
    samples = [s[:-1] if f == "endoftext" else s for s, f in zip(samples, finish)]
    if args.json:
        print(json.dumps({"model": args.model, "prompt_ids": prompt_ids,
                          "samples": [{"ids": s, "text": encoder.decode(s), "finish": f}
                                      for s, f in zip(samples, finish)]}))
    elif stream:
        print(utf8.decode(b"", final=True))
    else:
        for i, s in enumerate(samples):
            print(f"{'=' * 20} SAMPLE {i + 1} {'=' * 20}\n{args.prompt}{encoder.decode(s)}")
    n = sum(len(s) for s in samples)
    if not args.quiet and n:
        after_first = elapsed - (first_token_time - start)
        print(f"[{n} tokens in {elapsed:.2f} s: prompt of {len(prompt_ids)} tokens and first token in "
              f"{first_token_time - start:.2f} s, then {(n - args.n_samples) / max(after_first, 1e-9):.1f} "
              f"tokens/s]", file=sys.stderr)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    use_threads(args.threads)
    sys.stdout.reconfigure(errors="replace")  # a terminal that cannot show a character gets '?'
    try:
        if args.params is not None:
            return print_params(args.params, args.models_dir)
        encoder, hparams, params = load_model(args.model, args.models_dir, args.base_url, quiet=args.quiet)
        if args.trace:
            ids = encoder.encode(args.prompt)
            blocks = None if args.trace_block is None else {args.trace_block}
            if args.trace_block is not None and not 0 <= args.trace_block < hparams["n_layer"]:
                fail(f"--trace-block must be in 0..{hparams['n_layer'] - 1}")
            print_trace(trace(ids, params, hparams["n_head"], blocks))
        elif args.score:
            run_score(args, encoder, hparams, params)
        else:
            run_generate(args, encoder, hparams, params)
    except (download.DownloadError, download.CheckpointError, bpe.VocabError, ValueError) as e:
        fail(str(e))
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (e.g. `| head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
