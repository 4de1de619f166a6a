"""Write tests/data/circuits_golden.npz: TransformerLens 4.3.0's circuit experiments on three small GPT-2s.

Dev-only: torch 2.13, transformers 5.24, transformer-lens 4.3.0. Run it offline:

    HF_HUB_OFFLINE=1 python tests/data/make_circuits_golden.py

The models are Hugging Face folders that TransformerLens boots with TransformerBridge.boot_transformers:

  ioi      tests/data/hf/tiny (GPT-2's vocabulary, 2 blocks of 2 heads, random weights): two IOI pairs,
           "When Mary and John went to the store, John gave a drink to" against "..., Mary gave ...",
           each pair with its own answer (" Mary" / " John", " Tom" / " James"), tokenized by TL's to_tokens
  inner    tests/data/hf/inner (3 blocks of 3 heads, n_inner 24, layer_norm_epsilon 1e-3, 96 ids): two random
           pairs of 9 ids, one answer for both
  trained  tests/data/circuits_model, trained by train.py (make_circuits_model.py), converted to a Hugging Face
           folder by the project's convert.py: two pairs of Shakespeare-shaped text, ":" against ","

The bridge as booted computes the raw checkpoint's numbers (its logits are GPT2LMHeadModel's): every
experiment but direct logit attribution runs on it. Direct logit attribution runs on a second bridge,
enable_compatibility_mode(fold_value_biases=False): its fold_ln puts ln_f's gain into W_U, as circuits.dla
projects on g ⊙ (wte[A] − wte[B]); its centring changes nothing that apply_ln_to_stack does not undo, and
without fold_value_biases each head's result keeps its share of the value bias. The script prints how far
TL's other settings (no processing; the default, which folds the value biases) are from those numbers.

Under "<case>/": the tokens ("clean", "corrupted" [B, T]), "answer" and "wrong" [B], the metric (the logit
difference at the last position, averaged over the pairs) of each run ("metric_clean", "metric_corrupted");
"patch/<site>" from get_act_patch_*, but "patch/resid_mid": the residual stream itself patched, by TL's forward
hooks, since the bridge's hook_resid_mid is ln2.hook_in ("patch/resid_mid_ln2" holds get_act_patch_resid_mid's
numbers, which patch what the MLP reads alone); "dla/components" (+ "dla/labels") from decompose_resid + logit_attrs,
"dla/heads" from stack_head_results + logit_attrs, averaged over the pairs; "attribution/<site>" from TL's
forward and backward hooks (cache_activation_and_gradient on the batch), with "attribution_patch/head" and
"/mlp_out" from attribution_patch's node scores (on the first pair alone for ioi, whose pairs have answers of
their own, which attribution_patch's one metric cannot tell apart); "grad/<TransformerLens name>" the
metric's gradient at every activation of the corrupted run, by TL's names (torch autograd, through TL's backward
hooks; ln1.hook_normalized is the bridge's x̂, before the gain, and ln1.hook_out the layer norm's output; for
trained, at the four that attribution reads, to keep the file small);
"path/<L>.<H>/<q|k|v>" from get_act_patch_direct_path; "heads/<text>/<pattern>" from detect_head (a text,
error_measure "mul") and, for N random ids said twice after <|endoftext|> ("heads/random/..." with
"heads/random/tokens"), from detect_head's own steps on those ids.
"""
import os
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from importlib.metadata import version  # noqa: E402
from transformer_lens import head_detector, patching  # noqa: E402
from transformer_lens.model_bridge import TransformerBridge  # noqa: E402
from transformer_lens.tools.analysis import attribution_patching  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)

PATCHES = {  # our site name -> TL's sweep
    "resid_pre": patching.get_act_patch_resid_pre, "resid_mid": patching.get_act_patch_resid_mid,
    "attn_out": patching.get_act_patch_attn_out, "mlp_out": patching.get_act_patch_mlp_out,
    "head": patching.get_act_patch_attn_head_out_by_pos, "head_all": patching.get_act_patch_attn_head_out_all_pos,
    "q": patching.get_act_patch_attn_head_q_all_pos, "k": patching.get_act_patch_attn_head_k_all_pos,
    "v": patching.get_act_patch_attn_head_v_all_pos, "pattern": patching.get_act_patch_attn_head_pattern_all_pos}
ATTRIBUTED = {"resid_pre": "hook_resid_pre", "attn_out": "hook_attn_out", "mlp_out": "hook_mlp_out",
              "head": "attn.hook_z"}
BLOCK = ["hook_resid_pre", "ln1.hook_normalized", "ln1.hook_out", "attn.hook_q", "attn.hook_k", "attn.hook_v",
         "attn.hook_attn_scores", "attn.hook_pattern", "attn.hook_z", "hook_attn_out", "hook_resid_mid",
         "ln2.hook_normalized", "ln2.hook_out", "mlp.hook_pre", "mlp.hook_post", "hook_mlp_out", "hook_resid_post"]
DETECTORS = {"previous": "previous_token_head", "duplicate": "duplicate_token_head", "induction": "induction_head"}


def boot(folder, processing=None):
    """A TransformerBridge on a local folder: as booted (the raw model), or with TL's processing
    (enable_compatibility_mode's settings; {} is its default, which folds and centres everything)."""
    model = TransformerBridge.boot_transformers(folder, device="cpu")
    if processing is not None:
        model.enable_compatibility_mode(disable_warnings=True, **processing)
    return model.eval()


def logit_difference(answer, wrong):
    """TL's metric for prompt pairs: logits[-1, A] - logits[-1, B], averaged over the batch."""
    a, w = torch.tensor(answer)[:, None], torch.tensor(wrong)[:, None]

    def metric(logits):
        last = logits[:, -1]
        return (last.gather(1, a) - last.gather(1, w)).mean()

    return metric


def all_names(n_layer):
    return ["hook_embed", "hook_pos_embed"] + [f"blocks.{i}.{s}" for i in range(n_layer) for s in BLOCK] + \
        ["ln_final.hook_normalized", "ln_final.hook_out"]


def case(out, name, folder, clean, corrupted, answer, wrong, sources, texts, random_n, dla_folder=None):
    model = boot(folder)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    clean, corrupted = torch.tensor(clean), torch.tensor(corrupted)
    metric = logit_difference(answer, wrong)
    with torch.no_grad():
        clean_logits, clean_cache = model.run_with_cache(clean)
        corrupted_logits, corrupted_cache = model.run_with_cache(corrupted)
    g = {"clean": clean.numpy(), "corrupted": corrupted.numpy(), "answer": np.array(answer),
         "wrong": np.array(wrong), "metric_clean": metric(clean_logits).item(),
         "metric_corrupted": metric(corrupted_logits).item()}
    for site, sweep in PATCHES.items():
        g[f"patch/{site}"] = sweep(model, corrupted, clean_cache, metric)
    g["patch/resid_mid_ln2"] = g["patch/resid_mid"]  # the bridge's hook_resid_mid is ln2.hook_in: the MLP's input
    g["patch/resid_mid"] = resid_mid_patch(model, corrupted, clean_cache, corrupted_cache, metric)
    g.update(dla(dla_folder or folder, clean, answer, wrong))
    g.update(attribution(model, clean, corrupted, metric, answer, wrong, name))
    for (layer, head) in sources:
        for component in "qkv":
            g[f"path/{layer}.{head}/{component}"] = patching.get_act_patch_direct_path(
                model, corrupted, clean_cache, corrupted_cache, metric, layer, head, component, verbose=False)
    for label, text in texts.items():
        for ours, theirs in DETECTORS.items():
            g[f"heads/{label}/{ours}"] = head_detector.detect_head(model, text, theirs, error_measure="mul")
        g[f"heads/{label}/tokens"] = model.to_tokens(text).numpy()[0]
    g.update(random_heads(model, random_n, L, H))
    for k, v in g.items():
        out[f"{name}/{k}"] = v.detach().numpy() if isinstance(v, torch.Tensor) else np.asarray(v)
    print(name, {k: v.shape for k, v in g.items() if hasattr(v, "shape")})


def resid_mid_patch(model, corrupted, clean_cache, corrupted_cache, metric):
    """The residual stream between attention and MLP patched, one position of one layer at a time: through
    hook_attn_out, set to clean resid_mid - corrupted resid_pre, since resid_mid = resid_pre + attn_out and
    nothing before the patch changes. (TL 4.3.0's get_act_patch_resid_mid patches ln2's input instead.)"""
    L, T = model.cfg.n_layers, corrupted.shape[1]
    out = torch.zeros(L, T)
    for layer in range(L):
        target = clean_cache[f"blocks.{layer}.hook_resid_mid"] - corrupted_cache[f"blocks.{layer}.hook_resid_pre"]
        for pos in range(T):
            def hook(attn_out, hook, pos=pos, target=target):
                attn_out = attn_out.clone()
                attn_out[:, pos] = target[:, pos]
                return attn_out

            logits = model.run_with_hooks(corrupted, fwd_hooks=[(f"blocks.{layer}.hook_attn_out", hook)])
            out[layer, pos] = metric(logits).item()
    return out


def dla(folder, clean, answer, wrong):
    """Direct logit attribution at the last position, by component and by head, averaged over the pairs; and
    how far TL's other settings are from it."""
    found = {}
    settings = {"ours": dict(fold_value_biases=False), "default": {}, "none": dict(no_processing=True)}
    for setting, processing in settings.items():
        model = boot(folder, processing)
        with torch.no_grad():
            _, cache = model.run_with_cache(clean)
            stack, labels = cache.decompose_resid(layer=-1, pos_slice=-1, return_labels=True)
            by_component = cache.logit_attrs(stack, torch.tensor(answer), torch.tensor(wrong), pos_slice=-1)
            heads = cache.stack_head_results(layer=-1, pos_slice=-1)
            by_head = cache.logit_attrs(heads, torch.tensor(answer), torch.tensor(wrong), pos_slice=-1)
        found[setting] = (by_component.mean(-1).numpy(), by_head.mean(-1).numpy(), labels)
    components, heads, labels = found["ours"]
    for setting in ("default", "none"):
        print(f"  dla, {setting} processing: components differ by {np.abs(found[setting][0] - components).max():.3g}, "
              f"heads by {np.abs(found[setting][1] - heads).max():.3g} (largest {np.abs(heads).max():.3g})")
    return {"dla/components": components, "dla/labels": np.array(labels), "dla/heads": heads}


def attribution(model, clean, corrupted, metric, answer, wrong, name):
    """Attribution patching's scores, (a_clean - a_corrupted) · d metric / d a summed over a's last axis, by TL's
    forward and backward hooks on the batch; attribution_patch's own node scores; the gradients themselves."""
    L = model.cfg.n_layers
    names = all_names(L)
    clean_run = attribution_patching.cache_activation_and_gradient(model, clean, metric, names, compute_gradient=False)
    corrupted_run = attribution_patching.cache_activation_and_gradient(model, corrupted, metric, names)
    kept = names if name != "trained" else [n for n in names if n.endswith(tuple(ATTRIBUTED.values()))]
    out = {f"grad/{n}": corrupted_run.gradients[n] for n in kept}  # the trained model's: those attribution reads
    for site, hook in ATTRIBUTED.items():
        per = [((clean_run.activations[f"blocks.{i}.{hook}"] - corrupted_run.activations[f"blocks.{i}.{hook}"]) *
                corrupted_run.gradients[f"blocks.{i}.{hook}"]).sum(-1).sum(0) for i in range(L)]
        out[f"attribution/{site}"] = torch.stack(per)  # [L, T] or [L, T, H]; the batch's mean metric averages it
    pairs = slice(0, 1) if name == "ioi" else slice(None)  # its metric sees one pair's logits at a time
    result = attribution_patching.attribution_patch(model, clean[pairs], corrupted[pairs],
                                                    logit_difference(answer[:1], wrong[:1]))
    T, H = clean.shape[1], model.cfg.n_heads
    head, mlp = np.zeros((L, T, H), np.float32), np.zeros((L, T), np.float32)
    for node, score in result.node_scores.items():
        if node.kind == "attn_head_out":
            head[node.layer, node.position, node.head] = score
        elif node.kind == "mlp_out":
            mlp[node.layer, node.position] = score
    if name != "ioi":  # the same definition two ways: attribution_patch's per-pair mean, and the batch's gradient
        assert np.allclose(head, out["attribution/head"].numpy(), atol=1e-6), "attribution_patch disagrees"
    out.update({"attribution_patch/head": head, "attribution_patch/mlp_out": mlp})
    return out


def random_heads(model, n, L, H):
    """detect_head's scores for n random ids said twice after <|endoftext|>: its steps, on ids instead of a text
    (detect_head tokenizes a string, which random ids need not survive)."""
    rng = np.random.default_rng(0)
    eot = model.tokenizer.bos_token_id
    half = rng.integers(0, model.cfg.d_vocab - 1, n)
    half = half + (half >= eot)  # anything but <|endoftext|>
    tokens = torch.tensor(np.concatenate([[eot], half, half]))[None]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, remove_batch_dim=True)
    out = {"heads/random/tokens": tokens[0].numpy()}
    for ours, theirs in DETECTORS.items():
        detection = getattr(head_detector, f"get_{theirs}_detection_pattern")(tokens)
        scores = np.zeros((L, H), np.float32)
        for layer in range(L):
            for head in range(H):
                scores[layer, head] = head_detector.compute_head_attention_similarity_score(
                    cache["pattern", layer, "attn"][head], detection, exclude_bos=False, exclude_current_token=False,
                    error_measure="mul")
        out[f"heads/random/{ours}"] = scores
    return out


IOI = [("When Mary and John went to the store, John gave a drink to",
        "When Mary and John went to the store, Mary gave a drink to", " Mary", " John"),
       ("When Tom and James went to the park, James gave a ball to",
        "When Tom and James went to the park, Tom gave a ball to", " Tom", " James")]
SHAKESPEARE = [("ROMEO:\nI will speak.\n\nJULIET:", "ROMEO:\nI will speak.\n\nJULIET,"),
               ("KING:\nI will go, sir.\n\nQUEEN:", "KING:\nI will go, sir.\n\nQUEEN,")]


def tokens(model, texts):
    """[B, T]: each text by to_tokens on its own (on a list, to_tokens pads the shorter ones), all one length."""
    return np.stack([model.to_tokens(text)[0].numpy() for text in texts])


def main():
    import convert

    out = {"versions": np.array([f"torch {torch.__version__}", f"transformer-lens {version('transformer-lens')}"])}
    tiny = os.path.join(HERE, "hf", "tiny")
    tok = boot(tiny)
    ids = [int(tok.to_single_token(w)) for pair in IOI for w in pair[2:]]
    case(out, "ioi", tiny, tokens(tok, [p[0] for p in IOI]), tokens(tok, [p[1] for p in IOI]),
         ids[0::2], ids[1::2], sources=[(0, 0), (0, 1)],
         texts={"cat": "The cat sat on the mat. The cat sat on the mat."}, random_n=12)
    rng = np.random.default_rng(1)
    clean = rng.integers(0, 96, (2, 9))
    corrupted = clean.copy()
    corrupted[:, [2, 5]] = rng.integers(0, 96, (2, 2))
    case(out, "inner", os.path.join(HERE, "hf", "inner"), clean, corrupted, [7, 7], [30, 30],
         sources=[(0, 2), (1, 0)], texts={}, random_n=6)
    with tempfile.TemporaryDirectory() as scratch:
        folder = convert.convert(os.path.join(HERE, "circuits_model"), os.path.join(scratch, "hf"), "hf")
        trained = boot(folder)
        clean, corrupted = (tokens(trained, [p[i] for p in SHAKESPEARE]) for i in (0, 1))
        newline, space = int(trained.to_single_token("\n")), int(trained.to_single_token(" "))
        case(out, "trained", folder, clean, corrupted, [newline] * 2, [space] * 2, sources=[(0, 1), (1, 3)],
             texts={"romeo": "Romeo, Romeo! Romeo, Romeo!"}, random_n=15)
    np.savez_compressed(os.path.join(HERE, "circuits_golden.npz"), **out)
    print(os.path.join(HERE, "circuits_golden.npz"), os.path.getsize(os.path.join(HERE, "circuits_golden.npz")))


if __name__ == "__main__":
    main()
