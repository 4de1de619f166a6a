"""GPT-2's facts, stated once: the four released sizes, every tensor's name and shape, the
layer norms' eps and the names of the tokenizer's two files.

Everything else (the checkpoint reader, the downloader, the parameter count, the
tests) takes these from here. The names are OpenAI's checkpoint names without
their "model/" prefix; the shapes are the ones the model uses ([n_in, n_out] for
a weight; the checkpoint stores it as [1, n_in, n_out], see checkpoint.py).

    d = n_embd, V = n_vocab, T = n_ctx, L = n_layer
    wte [V, d]  wpe [T, d]  h0 ... h{L-1} (the blocks, below)  ln_f/g, ln_f/b [d]
"""

N_VOCAB = 50257  # all four sizes share one vocabulary: 256 bytes + 50,000 merges + <|endoftext|>
N_CTX = 1024  # and one context length
ENDOFTEXT_ID = 50256  # <|endoftext|>, the vocabulary's last id (a vocabulary of its own has its own: encoder.eot)
LAYER_NORM_EPS = 1e-5  # every layer norm's eps (a Hugging Face config may set another: layer_norm_epsilon)
SIZES = {  # the four released models: their hparams.json
    "124M": {"n_vocab": N_VOCAB, "n_ctx": N_CTX, "n_embd": 768, "n_head": 12, "n_layer": 12},
    "355M": {"n_vocab": N_VOCAB, "n_ctx": N_CTX, "n_embd": 1024, "n_head": 16, "n_layer": 24},
    "774M": {"n_vocab": N_VOCAB, "n_ctx": N_CTX, "n_embd": 1280, "n_head": 20, "n_layer": 36},
    "1558M": {"n_vocab": N_VOCAB, "n_ctx": N_CTX, "n_embd": 1600, "n_head": 25, "n_layer": 48},
}
HPARAM_KEYS = ("n_vocab", "n_ctx", "n_embd", "n_head", "n_layer")  # what hparams.json holds
LAYER_NORM_EPS = 1e-5  # GPT-2's; a Hugging Face config may set another: hparams["layer_norm_epsilon"]
# OpenAI's tokenizer files -> Hugging Face's names for them: the same two tables (token -> id, the merges)
TOKENIZER_FILES = {"encoder.json": "vocab.json", "vocab.bpe": "merges.txt"}
TOKENIZER_JSON = "tokenizer.json"  # the fast tokenizer: the two tables in one file (all that transformers 5 saves)


def hparams_problem(hp):
    """What is wrong with an hparams.json's content, in a few words; None when nothing is."""
    if not isinstance(hp, dict) or not all(isinstance(hp.get(k), int) and not isinstance(hp.get(k), bool) and hp[k] > 0
                                           for k in HPARAM_KEYS):
        return f"needs positive integers {', '.join(HPARAM_KEYS)}"
    if hp["n_embd"] % hp["n_head"]:
        return f"has n_embd {hp['n_embd']}, not a multiple of n_head {hp['n_head']}"
    return None


def hparams(size):
    """The hparams.json of a released size: {n_vocab, n_ctx, n_embd, n_head, n_layer}."""
    return dict(SIZES[size])


def block_shapes(d, d_ff=None):
    """One transformer block's tensors, in the order the data meets them.   d = n_embd, and the
    MLP's width d_ff is 4d in GPT-2 (Hugging Face's n_inner may set another)."""
    f = d_ff or 4 * d
    return {"ln_1/g": (d,), "ln_1/b": (d,),
            "attn/c_attn/w": (d, 3 * d), "attn/c_attn/b": (3 * d,),  # q, k and v side by side
            "attn/c_proj/w": (d, d), "attn/c_proj/b": (d,),
            "ln_2/g": (d,), "ln_2/b": (d,),
            "mlp/c_fc/w": (d, f), "mlp/c_fc/b": (f,),
            "mlp/c_proj/w": (f, d), "mlp/c_proj/b": (d,)}


def tensor_shapes(hp):
    """Every tensor of a GPT-2 with these hparams: {name: shape}."""
    V, T, d = hp["n_vocab"], hp["n_ctx"], hp["n_embd"]
    shapes = {"wte": (V, d), "wpe": (T, d)}
    for i in range(hp["n_layer"]):
        shapes.update({f"h{i}/{name}": shape for name, shape in block_shapes(d, hp.get("n_inner")).items()})
    shapes.update({"ln_f/g": (d,), "ln_f/b": (d,)})
    return shapes


def nest(tensors, n_layer):
    """{name: array} -> params, nested as the names are:
    {"wte", "wpe", "blocks": [{"ln_1": {"g", "b"}, "attn": {"c_attn": {"w", "b"}, "c_proj"}, "ln_2",
                               "mlp": {"c_fc", "c_proj"}}, ...], "ln_f": {"g", "b"}}"""
    params = {"blocks": [{} for _ in range(n_layer)]}
    for name, array in tensors.items():
        first, *path = name.split("/")
        node, key, block = params, first, block_index(name)
        if block is not None:  # h3/attn/c_attn/w: block 3's attn -> c_attn -> w
            node, key, path = params["blocks"][block], path[0], path[1:]
        for part in path:  # walk down, making the dicts on the way: attn -> c_attn -> w
            node = node.setdefault(key, {})
            key = part
        node[key] = array
    return params


def flatten(params):
    """The inverse of nest: params -> {name: array}, in tensor_shapes' order. A part of them (a LoRA
    run's adapters, {"blocks": [...]} alone: "h0/attn/c_attn/lora/A") flattens the same way."""
    def walk(prefix, node):
        if isinstance(node, dict):
            for key, child in node.items():
                yield from walk(f"{prefix}{key}/", child)
        else:
            yield prefix[:-1], node

    flat = {name: params[name] for name in ("wte", "wpe") if name in params}
    for i, block in enumerate(params["blocks"]):
        flat.update(walk(f"h{i}/", block))
    flat.update(walk("ln_f/", params.get("ln_f", {})))
    if "score" in params:  # a classifier's head (classify.py), [n_labels, n_embd]
        flat["score"] = params["score"]
    return flat


def block_index(name):
    """The block a tensor's or an activation's name is in: "h3/attn/c_attn/w" and "h3.attn.z" -> 3;
    None for a name outside the blocks (wte, wpe, ln_f)."""
    first = name.replace("/", ".").split(".", 1)[0]
    return int(first[1:]) if first[:1] == "h" and first[1:].isdigit() else None


def map_tensors(f, params):
    """params (dicts and lists of arrays, nested any way: a model, its gradients, a LoRA run's
    adapters) with f(array) in place of each array, the nesting and every other value kept."""
    if isinstance(params, dict):
        return {k: map_tensors(f, v) for k, v in params.items()}
    if isinstance(params, list):
        return [map_tensors(f, v) for v in params]
    return f(params) if hasattr(params, "shape") else params
