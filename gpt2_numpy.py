"""GPT-2 in plain NumPy: the forward pass, generation and scoring, read top to bottom.

    python gpt2_numpy.py "Alan Turing theorized that computers would one day become"

  1. building blocks    gelu, softmax, layer_norm, matmul, linear (and LoRA's update), ffn
  2. attention          split_heads, attention_scores, attention, the KV cache, mha
  3. the model          transformer_block, embed, gpt2_hidden, gpt2
  4. generation         the processors (penalties, top-k, top-p, min-p), sampling, stop strings, generate
  5. scoring            the next-token loss, score
  6. the checks at the door: clear errors for what NumPy would get wrong quietly
  7. the hot path's forms: layer_norm_fast, blocked_attention_fast (the same arithmetic, faster; tests hold them equal)
The entry point, above the imports, hands over to interface/gpt2_cli.py; finding and reading the weights is
interface/loading.py's work. The model needs NumPy alone, and knows nothing of either.

Arrays are float32. Shapes: B batch, T positions, C = n_embd, H = n_head, D = C / H (a head's width), V =
n_vocab. Names follow OpenAI's checkpoint (wte, wpe, ln_1, c_attn, c_proj, ln_2, c_fc, ln_f), so the code and
the checkpoint explain each other; hparams are hparams.json's (and a Hugging Face config's layer_norm_epsilon).
On a GPU the lines run as written: NumPy hands np.exp(x) or x @ w to x's own __array_ufunc__ (NEP 13), np.split to
its __array_function__ (NEP 18), and a CuPy array runs its kernels; the few lines that know say why (docs/gpu.md).

Hooks: each activation passes through hook(name, array), which returns the array to go on with (no_hook:
unchanged); look_inside.py passes its own, so the forward pass is written once, here. Plain first: a fast form
(gelu_fast) stays beside its plain one, a test holds the two equal, and in a handout it calls the student's.
"""
if __name__ == "__main__":  # first, above the imports: Ctrl-C and SIGTERM are one line and 130 from here on
    from interface.start import start

    start("gpt2_cli")  # the command line (flags, printing, exit codes): this file is the model

import math

import numpy as np

from plumbing.device import host, on_device  # a GPU's array copied back to the host (NumPy alone until asked)
from plumbing.errors import UserError, plural  # a ValueError the command line prints as one line (standard library)
from plumbing.parallel import CHUNK, in_chunks, shared_among_cores  # the hot path's threads (section 7)
from plumbing.shapes import LAYER_NORM_EPS  # GPT-2's facts (standard library only)

SQRT_2_OVER_PI = math.sqrt(2 / math.pi)  # a Python float: see below
GELU_CUBIC = 0.044715  # the weight of x³ in GELU's tanh approximation (Hendrycks & Gimpel, 2016)


# ============================================================================
# 1. Building blocks
# ============================================================================
# Constants are Python floats: a NumPy float64 scalar (np.sqrt(2 / np.pi)) turns float32 arrays into float64.

def no_hook(name, x):
    """The default hook: every activation goes on unchanged (see the top of the file)."""
    return x


def gelu(x):
    """GELU, tanh approximation (as GPT-2): 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))"""
    return 0.5 * x * (1.0 + np.tanh(SQRT_2_OVER_PI * (x + GELU_CUBIC * x ** 3)))


def gelu_fast(x):
    """gelu(x), for the hot path. Since 0.5 (1 + tanh y) = 1 / (1 + exp(-2y)), GELU is also x / (1 + exp(-2y)),
    y = x (a + b x²), a = √(2/π), b = 0.044715 a: one exp where gelu has a tanh (the dearer of the two), in one
    new array updated in place (x is not changed): on a long prompt every temporary is a trip to main memory."""
    y = x * x
    y *= -2.0 * GELU_CUBIC * SQRT_2_OVER_PI
    y -= 2.0 * SQRT_2_OVER_PI
    y *= x  # -2y
    with np.errstate(over="ignore"):  # a very negative x: exp(-2y) = inf, and x / inf = -0, gelu's limit
        np.exp(y, out=y)
    y += 1.0
    return np.divide(x, y, out=y)


def softmax(x):
    """softmax(x)_i = exp(x_i - max x) / Σ_j exp(x_j - max x), over the last axis.
    Subtracting the max changes nothing mathematically and keeps exp from overflowing."""
    e = x - x.max(axis=-1, keepdims=True)
    np.exp(e, out=e)
    e /= e.sum(axis=-1, keepdims=True)
    return e


def layer_norm(x, g, b, eps=LAYER_NORM_EPS):
    """(x - mean) / √(var + eps) · g + b, over the last axis (C).   [..., C] -> [..., C]"""
    y = x - x.mean(axis=-1, keepdims=True)
    y /= np.sqrt((y * y).mean(axis=-1, keepdims=True) + eps)  # var = mean of (x - mean)²
    y *= g
    y += b
    return y


def matmul(x, w):
    """x @ w as one [B·T, n_in] product (NumPy multiplies a stack a slice at a time, ~1.2x slower): [..., n_out]"""
    return (x.reshape(-1, x.shape[-1]) @ w).reshape(*x.shape[:-1], w.shape[-1])


def linear(x, w, b, lora=None):
    """x @ w + b.   [..., n_in] @ [n_in, n_out] -> [..., n_out]
    lora: a LoRA adapter on this layer ({"A", "B", "scale"}: lora_update), added to the frozen w's output."""
    y = matmul(x, w)
    y += b
    if lora is not None:
        y += lora_update(x, **lora)
    return y


def lora_update(x, A, B, scale):
    """LoRA's update (Hu et al., 2021): scale · (x A) B, scale = alpha / R; x A first: nothing n_in x n_out is made.
    [..., n_in] @ [n_in, R] @ [R, n_out] -> [..., n_out]"""
    return matmul(matmul(x, A), scale * B)


def ffn(x, c_fc, c_proj, hook=no_hook):
    """The position-wise MLP: c_proj(gelu(c_fc(x))).   [B, T, C] -> [B, T, 4C] -> [B, T, C]"""
    h = hook("mlp.c_fc", linear(x, **c_fc))  # [B, T, 4C]
    a = hook("mlp.gelu", in_chunks(gelu_fast, h))  # [B, T, 4C]
    return hook("mlp.out", linear(a, **c_proj))  # [B, T, C]


# ============================================================================
# 2. Attention
# ============================================================================

def split_heads(x, n_head):
    """[B, T, C] -> [B, H, T, D]: each head works on its own D = C / H slice."""
    B, T, C = x.shape
    return x.reshape(B, T, n_head, C // n_head).transpose(0, 2, 1, 3)


def merge_heads(x):
    """[B, H, T, D] -> [B, T, C]: the heads' outputs side by side again."""
    B, H, T, D = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, H * D)


def causal_mask(n, like=None):
    """0 where query i may look at key j (j <= i), -inf where j is in its future.   [n, n], of like's kind"""
    return np.triu(np.full((n, n), -np.inf, dtype=np.float32, like=like), k=1)


def attention_scores(q, k):
    """q kᵀ / √D + mask: how well each query matches each key.   q [B, H, Tq, D], k [B, H, Tk, D] -> [B, H, Tq, Tk]
    The queries are the last Tq of the Tk positions (the earlier keys may come from
    the cache): they see every earlier key, so only the last Tq keys need the mask."""
    n_queries = q.shape[-2]
    scores = (q * (1.0 / math.sqrt(q.shape[-1]))) @ k.swapaxes(-1, -2)
    if n_queries > 1:  # a single query is the newest position: it may see every key
        scores[..., -n_queries:] += causal_mask(n_queries, like=scores)
    return scores


def attention_weights(q, k):
    """softmax(q kᵀ / √D + mask): how much each query takes from each key; rows sum to 1.
    q [B, H, Tq, D], k [B, H, Tk, D] -> [B, H, Tq, Tk]"""
    return softmax(attention_scores(q, k))


def attention(q, k, v):
    """softmax(q kᵀ / √D + mask) v.   q [B, H, Tq, D], k, v [B, H, Tk, D] -> [B, H, Tq, D]"""
    return attention_weights(q, k) @ v


def blocked_attention(q, k, v, block=128):
    """attention(), a block of queries at a time. A block's last query sees keys only up to its own position, so
    the keys after it (the masked part of the T x T scores) are never computed: on a long prompt, half the work."""
    n_queries, n_past = q.shape[-2], k.shape[-2] - q.shape[-2]
    if n_queries <= block:
        return attention(q, k, v)
    out = np.empty_like(q)  # of q's kind: NumPy's, or a GPU's
    for start in range(0, n_queries, block):
        end = min(start + block, n_queries)
        out[..., start:end, :] = attention(q[..., start:end, :], k[..., :n_past + end, :], v[..., :n_past + end, :])
    return out


def new_kv_cache(hparams, batch, length, like=None):
    """Room for `length` positions of keys and values in every layer, and how many are filled.
    Per layer: {"k": [B, H, length, D], "v": [B, H, length, D], "n": 0}, arrays of like's kind (the weights')"""
    shape = (batch, hparams["n_head"], length, hparams["n_embd"] // hparams["n_head"])
    return [{"k": np.empty(shape, np.float32, like=like), "v": np.empty(shape, np.float32, like=like), "n": 0}
            for _ in range(hparams["n_layer"])]


def kv_append(kv, k, v):
    """Store this step's keys and values after the cached ones; return all of them so far.   k, v [B, H, T, D] ->
    [B, H, n + T, D]. A new token never changes an old key, so the old ones are kept: a step costs T, not T²."""
    n, T = kv["n"], k.shape[2]
    kv["k"][:, :, n:n + T] = k
    kv["v"][:, :, n:n + T] = v
    kv["n"] = n + T
    return kv["k"][:, :, :n + T], kv["v"][:, :, :n + T]


def mha(x, c_attn, c_proj, n_head, kv=None, hook=no_hook):
    """Multi-head causal self-attention.   [B, T, C] -> [B, T, C]
    c_attn makes q, k, v at once; each head attends on its own slice; c_proj mixes the heads."""
    q, k, v = (split_heads(a, n_head) for a in np.split(linear(x, **c_attn), 3, axis=-1))  # 3 x [B, H, T, D]
    q, k, v = hook("attn.q", q), hook("attn.k", k), hook("attn.v", v)
    if kv is not None:
        k, v = kv_append(kv, k, v)  # [B, H, past + T, D]
    if hook is no_hook:  # nobody looks at the weights, so the masked half need not exist
        z = blocked_attention_fast(q, k, v)
    else:
        z = hook("attn.weights", softmax(hook("attn.scores", attention_scores(q, k)))) @ v
    return hook("attn.out", linear(merge_heads(hook("attn.z", z)), **c_proj))  # [B, H, T, D] -> [B, T, C]


# ============================================================================
# 3. The model
# ============================================================================

def layer_norm_eps(hparams):
    """The layer norms' eps: a Hugging Face config may set its own (layer_norm_epsilon); GPT-2's is 1e-5."""
    return hparams.get("layer_norm_epsilon", LAYER_NORM_EPS)


def transformer_block(x, ln_1, attn, ln_2, mlp, hparams, kv=None, hook=no_hook):
    """Pre-LN residual block: x + mha(ln_1(x)), then x + ffn(ln_2(x)).   [B, T, C] -> [B, T, C]
    It passes "resid_pre", "ln_1", "resid_mid", "ln_2", "resid_post" through hook, and hook on to mha and
    ffn. hparams give the heads (n_head) and the layer norms' eps."""
    eps = layer_norm_eps(hparams)
    x = hook("resid_pre", x)
    x = hook("resid_mid", x + mha(hook("ln_1", layer_norm_fast(x, **ln_1, eps=eps)), **attn, n_head=hparams["n_head"],
                                  kv=kv, hook=hook))
    return hook("resid_post", x + ffn(hook("ln_2", layer_norm_fast(x, **ln_2, eps=eps)), **mlp, hook=hook))


def block_hook(hook, i):
    """The hook as block i calls it: its names get the checkpoint's prefix, "h{i}."."""
    return no_hook if hook is no_hook else lambda name, x: hook(f"h{i}.{name}", x)


def embed(ids, wte, wpe, start=0, hook=no_hook):
    """The model's input: each token's row of wte plus its position's row of wpe, positions counted from
    `start` (the tokens already in the KV cache). Each part passes through hook ("wte", "wpe").   [B, T] -> [B, T, C]"""
    return hook("wte", wte[np.asarray(ids, like=wte)]) + hook("wpe", wpe[start:start + ids.shape[1]])  # like=: NEP 35


def gpt2_hidden(ids, params, hparams, kv_cache=None, last_only=False, hook=no_hook):
    """The model up to its output layer: embeddings, blocks, ln_f.   ids [B, T] -> [B, T, C]
    (the last position only, [B, 1, C], with last_only). ids are checked ones (checked_ids)."""
    x = embed(ids, params["wte"], params["wpe"], kv_cache[0]["n"] if kv_cache else 0, hook)  # [B, T, C]
    for i, (block, kv) in enumerate(zip(params["blocks"], kv_cache or [None] * len(params["blocks"]))):
        x = transformer_block(x, **block, hparams=hparams, kv=kv, hook=block_hook(hook, i))
    return hook("ln_f", layer_norm_fast(x[:, -1:] if last_only else x, **params["ln_f"], eps=layer_norm_eps(hparams)))


def gpt2(ids, params, hparams, kv_cache=None, last_only=False, hook=no_hook):
    """Token ids -> next-token logits at each position.
    wte[ids] + wpe[positions] -> blocks -> ln_f -> x @ wteᵀ
    ids [B, T] -> logits [B, T, V]; only the last position with last_only. One sequence, ids [T], is taken
    as a batch of one and gives [T, V]. With a kv_cache, ids are the positions after those already cached."""
    ids = checked_ids(ids, params, kv_cache[0]["n"] if kv_cache else 0)
    if ids.ndim == 1:  # one sequence: the caller's shorthand, as a batch of one
        return gpt2(ids[None], params, hparams, kv_cache, last_only, hook)[0]
    x = gpt2_hidden(ids, params, hparams, kv_cache, last_only, hook)  # [B, T, C]
    return matmul(x, params["wte"].T)  # [B, T, V]: the output layer is the embedding, transposed


# ============================================================================
# 4. Generation
# ============================================================================
# A step's logits [B, V] pass through Hugging Face generate's processors in its order: the penalties
# on the raw logits (repetition, then n-grams), then the temperature, top-k, top-p and min-p.

def penalize_repeats(logits, ids, penalty):
    """CTRL's repetition penalty: s -> s / P where s > 0, else s · P, once on each id in the sequence
    (prompt included).   logits [B, V], ids [B, T] -> [B, V]"""
    seen = np.zeros(logits.shape, dtype=bool)
    seen[np.arange(len(ids))[:, None], ids] = True
    return np.where(seen, np.where(logits > 0, logits / penalty, logits * penalty), logits)


def ban_repeated_ngrams(logits, ids, n):
    """-inf for each token that would complete an n-gram already in the sequence (prompt included): an
    n-gram whose first n - 1 tokens are the sequence's last n - 1 bans its last.   [B, V], [B, T] -> [B, V]"""
    if ids.shape[1] < n:
        return logits
    ngrams = np.lib.stride_tricks.sliding_window_view(ids, n, axis=1)  # [B, T - n + 1, n]
    rows, at = np.nonzero((ngrams[:, :, :-1] == ids[:, None, ids.shape[1] - n + 1:]).all(axis=-1))
    out = logits.astype(np.float32)  # a copy: the caller's logits stay as they were
    out[rows, ngrams[rows, at, -1]] = -np.inf
    return out


def penalized(logits, ids, repetition_penalty=1.0, no_repeat_ngram_size=0):
    """The penalties that are on, in generate's order.   logits [B, V], ids [B, T] -> [B, V]"""
    if repetition_penalty != 1.0:
        logits = penalize_repeats(logits, ids, repetition_penalty)
    return ban_repeated_ngrams(logits, ids, no_repeat_ngram_size) if no_repeat_ngram_size else logits


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


def min_p_filter(logits, p):
    """min-p (Nguyen et al., 2024): -inf for each token below p times the likeliest (which stays).   [B, V] -> [B, V]"""
    probs = softmax(logits)
    return np.where(probs < p * probs.max(axis=-1, keepdims=True), -np.inf, logits).astype(np.float32)


def sampling_probs(logits, temperature=1.0, top_k=None, top_p=1.0, min_p=0.0):
    """The distribution the next token is drawn from: softmax(logits / temperature), cut by
    top_k, top_p and min_p, in that order, after the temperature.   [B, V] -> [B, V]"""
    logits = logits / temperature
    if top_k:
        logits = top_k_filter(logits, top_k)
    if top_p < 1.0:
        logits = top_p_filter(logits, top_p)
    return softmax(min_p_filter(logits, min_p) if min_p else logits)


def sample_next(logits, rng, temperature=1.0, top_k=None, top_p=1.0, min_p=0.0):
    """Pick each row's next token.   logits [B, V] -> ids [B]
    temperature 0 is greedy (argmax); otherwise a draw from sampling_probs, by inverting
    the cumulative distribution at a uniform draw."""
    if temperature == 0:
        return logits.argmax(axis=-1)
    cdf = np.cumsum(sampling_probs(logits, temperature, top_k, top_p, min_p), axis=-1)  # [B, V]
    u = rng.random((len(cdf), 1), dtype=np.float32) * cdf[:, -1:]
    return np.minimum((cdf <= u).sum(axis=-1), cdf.shape[-1] - 1)


def stop_string_end(text, n_new, stop_strings):
    """Where the first stop string that the last token completes ends, an index into text; None if none.
    text: the sequence's bytes, prompt included; n_new: the last token's. A string is completed where
    it ends inside those last bytes: it may begin in earlier tokens, even the prompt's, and end mid-token."""
    found = [(text.find(s, max(0, len(text) - n_new - len(s) + 1)), s) for s in stop_strings]
    return min((at + len(s) for at, s in found if at >= 0), default=None)


def generate(ids, params, hparams, n_tokens=40, temperature=1.0, top_k=None, top_p=1.0, seed=None, n_samples=1,
             stop=None, hook=no_hook, watch=None, min_p=0.0, repetition_penalty=1.0, no_repeat_ngram_size=0,
             stop_strings=(), token_bytes=None):
    """Check the request now (a mistake raises before any step), then return the steps: a generator
    that yields the next token of every sample, one step at a time, as arrays [n_samples].
    The prompt goes through the model once (filling the KV cache); then each step feeds only the newest
    token; the samples run as one batch. stop: the id that ends a text (encoder.eot; None: never stop);
    a sample that has ended yields it (or 0) until all have. An empty prompt starts from `stop`, as
    OpenAI's unconditional sampler starts from <|endoftext|>. The processors run in generate's order
    (section 4's top); stop_strings end a sample at the token that completes one (token_bytes: each id's
    bytes). watch(logits [n_samples, V]) sees each step's penalized logits."""
    check_sampling(n_tokens, temperature, top_k, top_p, n_samples, min_p, repetition_penalty, no_repeat_ngram_size,
                   stop_strings, token_bytes)
    prompt = checked_prompt(ids, params, hparams, n_tokens, stop)  # [T]
    rng, sampling = np.random.default_rng(seed), dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    rules = dict(repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size)
    return generate_steps(np.tile(prompt, (n_samples, 1)), params, hparams, n_tokens, rng, sampling, stop, hook, watch,
                          rules, [s.encode("utf-8") for s in stop_strings], token_bytes)


def generate_steps(batch, params, hparams, n_tokens, rng, sampling, stop, hook, watch, rules, stop_strings,
                   token_bytes):
    """generate's loop, on a checked prompt batch [B, T]: prefill, then one token a step."""
    B, T = batch.shape
    seqs = np.concatenate([batch, np.zeros((B, n_tokens), batch.dtype)], axis=1)  # what the penalties look back on
    texts = [b"".join(token_bytes[i] for i in batch[0])] * B if stop_strings else None
    kv_cache = new_kv_cache(hparams, B, T + n_tokens, like=params["wte"])
    logits = host(gpt2(batch, params, hparams, kv_cache, last_only=True, hook=hook)[:, -1])  # [B, V], drawn on the host
    done = np.zeros(B, dtype=bool)
    for step in range(n_tokens):
        logits = penalized(logits, seqs[:, :T + step], **rules)
        if watch:
            watch(logits)
        next_ids = np.where(done, stop if stop is not None else 0, sample_next(logits, rng, **sampling))  # [B]
        yield next_ids
        seqs[:, T + step] = next_ids
        for i in np.flatnonzero(~done) if stop_strings else ():
            texts[i] += token_bytes[next_ids[i]]
            done[i] = stop_string_end(texts[i], len(token_bytes[next_ids[i]]), stop_strings) is not None
        done |= next_ids == stop
        if done.all() or step == n_tokens - 1:
            return
        logits = host(gpt2(next_ids[:, None], params, hparams, kv_cache, last_only=True, hook=hook)[:, -1])


# ============================================================================
# 5. Scoring
# ============================================================================

def log_softmax(x):
    """log softmax(x), over the last axis, without forming tiny probabilities first."""
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def token_logprobs(logits, targets):
    """log p(target) at each position: log softmax(logits)[target].   logits [..., V], targets [...] -> [...]"""
    return np.take_along_axis(log_softmax(logits), np.asarray(targets, like=logits)[..., None], -1)[..., 0]


def next_token_loss(logits, targets):
    """The mean next-token negative log-likelihood, in nats per token: -mean log p(target).
    logits [..., V], targets [...] -> a float. What training lowers, and what scoring reports."""
    return float(-token_logprobs(logits, targets).mean())


def score(ids, params, hparams):
    """How likely the model finds a text.   ids [T] -> (logprobs [T-1], loss, perplexity)
    logprobs[i] = log p(ids[i+1] | ids[:i+1]): the first token has no prediction.
    loss = next_token_loss (nats per token); perplexity = exp(loss)."""
    check_not_text(ids)
    ids = np.asarray(ids)
    if ids.ndim != 1 or len(ids) < 2:
        raise UserError("scoring needs at least 2 tokens: the first one is only context")
    check_ids(ids, params["wte"].shape[0], len(ids) - 1, params["wpe"].shape[0])  # the last token is only predicted
    logits = gpt2(ids[None, :-1], params, hparams)[0]  # [T-1, V]
    logprobs = host(token_logprobs(logits, ids[1:]))  # [T-1], on the host
    loss = float(-logprobs.mean())  # next_token_loss(logits, ids[1:]), without computing the logprobs again
    return logprobs, loss, math.exp(loss)


# ============================================================================
# 6. The checks at the door
# ============================================================================
# What comes in from outside (ids, settings) is checked where it comes in, with an error that
# names the mistake; inside, the functions above trust what they are given.

def checked_ids(ids, params, start=0):
    """ids as an integer array [B, T] or [T], each a token of the vocabulary, fitting the context
    after `start` positions."""
    check_not_text(ids)
    ids = np.asarray(ids)
    if ids.ndim not in (1, 2):
        raise UserError(f"token ids must be [B, T] (or one sequence, [T]), got shape {ids.shape}")
    check_ids(ids, params["wte"].shape[0], start + ids.shape[-1], params["wpe"].shape[0])
    return ids


def check_not_text(ids):
    """The model reads token ids; text given by mistake gets a TypeError saying how to make them."""
    if isinstance(ids, (str, bytes)) or (isinstance(ids, np.ndarray) and ids.dtype.kind in "SU"):
        raise TypeError("the model takes token ids, not text: ids = encoder.encode(text), with the encoder "
                        "from interface.loading.load_model(...) or bpe.get_encoder(folder)")


def check_ids(ids, n_vocab, end, n_ctx):
    """Clear errors for what NumPy would get wrong quietly (negative ids wrap around)."""
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"token ids must be integers, got {ids.dtype}")
    if ids.size and (ids.min() < 0 or ids.max() >= n_vocab):
        bad = ids[(ids < 0) | (ids >= n_vocab)].flat[0]
        raise UserError(f"token id {bad} is outside 0..{n_vocab - 1}")
    if end > n_ctx:
        raise UserError(f"{end} positions do not fit the model's context of {n_ctx}")


def checked_prompt(ids, params, hparams, n_tokens, stop):
    """A prompt to generate from, as ids [T]: one sequence that fits the context with n_tokens more;
    an empty one is `stop` alone (<|endoftext|>), which must then be given."""
    check_not_text(ids)
    ids = list(ids)
    if not ids and stop is None:
        raise UserError("an empty prompt starts from the stop token, <|endoftext|>: give its id as stop "
                        "(encoder.eot), or a prompt")
    ids = ids or [stop]
    if len(ids) + n_tokens > hparams["n_ctx"]:
        raise UserError(f"the prompt's {plural(len(ids), 'token')} plus {plural(n_tokens, 'new one')} exceed "
                        f"the context of {plural(hparams['n_ctx'], 'token')}")
    prompt = checked_ids(ids, params)
    if prompt.ndim != 1:
        raise UserError(f"the prompt must be one sequence of ids [T], got shape {prompt.shape}")
    return prompt.astype(np.int64, copy=False)


def is_whole_number(value, least):
    """An int (Python's or NumPy's, never a bool or a float) of at least `least`."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= least


def check_sampling(n_tokens, temperature, top_k, top_p, n_samples, min_p=0.0, repetition_penalty=1.0,
                   no_repeat_ngram_size=0, stop_strings=(), token_bytes=None):
    """Clear errors for generation settings that make no sense; each names its argument."""
    for arg, value, ok, rule in (
            ("n_tokens", n_tokens, is_whole_number(n_tokens, 0), "a whole number >= 0"),
            ("temperature", temperature, temperature == 0 or 1e-30 <= temperature <= 1e30, "0 (greedy) or 1e-30 to 1e30"),
            ("top_k", top_k, top_k is None or is_whole_number(top_k, 1), "a whole number >= 1"),
            ("top_p", top_p, 0 < top_p <= 1, "in (0, 1]"),
            ("n_samples", n_samples, is_whole_number(n_samples, 1), "a whole number >= 1"),
            ("min_p", min_p, 0 <= min_p <= 1, "in [0, 1]"),
            ("repetition_penalty", repetition_penalty, 1e-30 <= repetition_penalty <= 1e30, "1e-30 to 1e30 (1 is none)"),
            ("no_repeat_ngram_size", no_repeat_ngram_size, is_whole_number(no_repeat_ngram_size, 0),
             "a whole number >= 0 (0 is none)"),
            ("stop_strings", stop_strings, not isinstance(stop_strings, str) and all(isinstance(s, str) and s for s in
             stop_strings) and (token_bytes is not None or not stop_strings), "texts, none empty, with token_bytes")):
        if not ok:
            raise UserError(f"must be {rule}, got {value!r}", arg=arg)



# ============================================================================
# 7. The hot path's forms
# ============================================================================
# The plain functions' arithmetic arranged for speed, each held equal to its plain form by a test; in a handout each
# calls the student's (handout.py's TWINS). The element-wise work runs a few rows at a time on BLAS's threads.

def layer_norm_fast(x, g, b, eps=LAYER_NORM_EPS):
    """layer_norm, a few rows at a time on BLAS's threads (plumbing/parallel.py), each chunk's passes in the cache."""
    return in_chunks(lambda rows: layer_norm(rows, g, b, eps), x)


def blocked_attention_fast(q, k, v, block=128):
    """blocked_attention with each block's softmax folded into its product: softmax(s) v = (e v) / Σ e, e = exp(s -
    max s), so the division is on the [Tq, D] output, not the [Tq, Tk] weights; the scores are masked and exp'd in
    place, a head at a time on BLAS's threads (each in the cache), the products on BLAS's. Up to one block of queries
    it is attention() itself, bit for bit what a hooked pass computes.   -> [B, H, Tq, D]"""
    B, H, n_queries, D = q.shape
    if n_queries <= block:
        return attention(q, k, v)
    n_past, mask = k.shape[-2] - n_queries, causal_mask(block, like=q)
    out, q, k_t = np.empty_like(q), q * (1.0 / math.sqrt(D)), k.swapaxes(-1, -2)
    room = np.empty(B * H * block * k.shape[-2], np.result_type(q, k), like=q)  # one block's scores, made once
    for start in range(0, n_queries, block):
        n, keys = min(block, n_queries - start), n_past + min(start + block, n_queries)
        s = np.matmul(q[..., start:start + n, :], k_t[..., :keys], out=room[:B * H * n * keys].reshape(B, H, n, keys))
        heads, sums = s.reshape(B * H, n, keys), np.empty((B * H, n, 1), s.dtype, like=q)

        def numerators(share):  # exp(s - max s) in place, and its row sums, a few heads at a time
            for h in share:
                x = heads[h]
                x[..., -n:] += mask[:n, :n]
                x -= x.max(axis=-1, keepdims=True)
                np.exp(x, out=x)
                sums[h] = x.sum(axis=-1, keepdims=True)

        many = s.size > CHUNK and not on_device(s)  # else every head at once (a small model's few scores)
        shared_among_cores(numerators, [slice(h, h + 1) for h in range(B * H)] if many else [slice(None)])
        np.matmul(s, v[..., :keys, :], out=out[..., start:start + n, :])
        out[..., start:start + n, :] /= sums.reshape(B, H, n, 1)
    return out
