"""What every command line says the same way: the flags that name a model, a mistake in the
flags' own words, and a whole number from a flag.

    model_flags(parser)    --model, --models-dir and (where OpenAI's files are downloaded) --base-url
    threads_flag(parser)   --threads N, BLAS's threads (interface/start.py sets them before NumPy loads)
    user_message(e)        a UserError about the Python API's top_k, as the command line's --top-k
    at_least(1)            an argparse type: a whole number no smaller than 1 ("--num-beams must be at least 1, got 0")
    number                 an argparse type: a number ("--top-p must be a number, got 'x'")
    check_output_file(f)   an output file's folder is there, before any work
    sae_flags(parser)      --sae, --use-error-term, --center-writing-weights, --fold-ln: an SAE spliced in (sae.py)
    device_flag(parser)    --device cpu|gpu (else $GPT2_DEVICE): where the arrays live (plumbing/device.py)
    array_module(args)     the flag's array module, numpy or cupy, once a GPU has answered: before any work
    on_device(xp, params)  a model's params on that device, once they are known to fit there
"""
import argparse
import os

from interface.start import THREADS, usable_cpus
from plumbing import device, shapes
from plumbing.errors import UserError, fail
from plumbing.folders import MODELS_DIR_ENV

SIZES = ", ".join(shapes.SIZES)  # 124M, 355M, 774M, 1558M
CENTRED_HELP = ("run the model as TransformerLens's center_writing_weights leaves it: the published GPT-2 small "
                "SAEs were trained on it (docs/sae.md)")
FOLD_LN_HELP = ("run the model as TransformerLens's fold_ln leaves its blocks: ln1/ln2.hook_normalized are then "
                "(x - mean) / std, before the gain and bias, as TransformerLens names them (a transcoder trained on "
                "blocks.L.ln2.hook_normalized reads that; docs/sae.md)")
MODEL_HELP = (f"{SIZES}, a model folder (OpenAI's or Hugging Face's), hf:owner/name[@revision] from the Hub, "
              "or a GGUF file (FILE.gguf, llama.cpp's)")

# The Python API's argument names, as the command lines spell them.
FLAGS = {"n_tokens": "--n-tokens", "temperature": "--temperature", "top_k": "--top-k", "top_p": "--top-p",
         "n_samples": "--n-samples", "trace_block": "--trace-block", "draft_tokens": "--draft-tokens",
         "context": "--context", "stride": "--stride", "min_p": "--min-p", "repetition_penalty": "--repetition-penalty",
         "no_repeat_ngram_size": "--no-repeat-ngram-size", "stop_strings": "--stop", "num_beams": "--num-beams",
         "num_return_sequences": "--num-return-sequences", "length_penalty": "--length-penalty",
         "site": "--site", "component": "--component", "source": "--source", "pattern": "--pattern",
         "answer": "--answer", "wrong": "--wrong"}


def model_flags(parser, positional=False, model_help=MODEL_HELP, base_url=True):
    """The model a command reads: --model (124M unless given), or with positional the argument MODEL;
    --models-dir, where the sizes are downloaded; and unless base_url is False, --base-url, a mirror
    of OpenAI's files."""
    import download  # here, not above: bpe.py and handout.py take at_least alone, without requests' start-up

    if positional:
        parser.add_argument("model", metavar="MODEL", help=model_help)
    else:
        parser.add_argument("--model", default="124M", help=f"{model_help} (default: %(default)s)")
    parser.add_argument("--models-dir", help=f"where model sizes are downloaded, a folder each (default: "
                                             f"${MODELS_DIR_ENV}, else models/ in the project's folder)")
    if base_url:
        parser.add_argument("--base-url", help=f"a mirror of OpenAI's model files, serving <size>/<file> (default: "
                                               f"${download.BASE_URL_ENV}, else OpenAI's own)")


def threads_flag(parser):
    """--threads N: the threads of the matrix products. The value is taken before NumPy loads
    (interface/start.py); here it is checked and shown in --help."""
    parser.add_argument("--threads", type=thread_count, metavar="N",
                        help=f"BLAS threads for the matrix products, at most the CPUs the process may use "
                             f"(default: $OMP_NUM_THREADS or $OPENBLAS_NUM_THREADS if set, else {THREADS}: on a "
                             "busy machine more are slower)")


def thread_count(text):
    """An argparse type: --threads, a whole number from 1 to the CPUs this process may use (usable_cpus): BLAS
    runs no more threads than those, so a larger number would be accepted and quietly not followed."""
    value = at_least(1)(text)
    if value > usable_cpus():
        raise argparse.ArgumentTypeError(f"must be at most {usable_cpus()}, the CPUs this process may use (BLAS runs "
                                         f"no more threads), got {value}")
    return value


def user_message(e):
    """A UserError as the command-line user should read it: flags, not argument names."""
    return f"{FLAGS[e.arg]} {e.message}" if e.arg in FLAGS else str(e)


def at_least(least=None, why=""):
    """An argparse type: the text as a whole number, `least` or more (None: any; why: the reason, said
    after it). A mistake reads as every other message: "--num-beams must be at least 1, got 0" (fail,
    each parser's error, says it without argparse's "argument --num-beams:")."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
        if least is not None and value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}{why}, got {value}")
        return value
    return parse


def number(text):
    """An argparse type: the text as a number (float's, so inf and nan too: each flag's check says
    which it takes); a mistake reads as at_least's: "--top-p must be a number, got 'x'"."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None


def restore_flags(args, saved, not_saved, fixed=()):
    """--resume: each flag takes the saved run's value (train_config.json's), unless given now. A given one that
    differs is refused where it would make another run (fixed), else named. -> ["--flag now (the saved run had
    then)", ...]"""
    changed = []
    for name, value in saved.items():
        if name in not_saved or not hasattr(args, name):
            continue
        if name not in args.given:
            setattr(args, name, value)
        elif getattr(args, name) != value and name in fixed:
            raise UserError(f"--resume continues the run saved in {args.out}, whose --{name.replace('_', '-')} "
                            f"is {value}: leave out --{name.replace('_', '-')} {getattr(args, name)}")
        elif getattr(args, name) != value:
            changed.append(f"--{name.replace('_', '-')} {getattr(args, name)} (the saved run had {value})")
    return changed


def check_output_file(path, ending=None, flag=None):
    """A file a command writes (--html, --logits, ...): its folder must be there (no folder is made for it), and
    path not a folder's, and ending in `ending` where its format has one: said before any work rather than once
    the output is ready to write."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        fail(f"{path}: its folder {folder} does not exist")
    if os.path.isdir(path):
        fail(f"{path} is a folder: give a file's name")
    if ending and not path.endswith(ending):
        fail(f"{flag} writes a {ending} file: {path} should end in {ending}")


def sae_flags(parser):
    """The flags that splice an SAE into the model, for the commands that read it (sae_splice)."""
    parser.add_argument("--sae", metavar="SAE_DIR", help="splice an SAE in at its hook point, its reconstruction in "
                                                         "place of the activation (a folder, or hf:owner/name/PATH)")
    parser.add_argument("--use-error-term", action="store_true",
                        help="with --sae: the reconstruction plus the error term (the output unchanged)")
    parser.add_argument("--center-writing-weights", action="store_true", help=CENTRED_HELP)
    parser.add_argument("--fold-ln", action="store_true", help=FOLD_LN_HELP)


def folded(args, params):
    """The model's weights as --fold-ln asks: each block's layer norms folded into the weights after them."""
    if not getattr(args, "fold_ln", False):
        return params
    import sae

    return sae.fold_layer_norms(params)


def sae_splice(args, hparams):
    """-> (hooks, sae) for look_inside's run_with_cache and run_with_hooks, as sae_flags ask: the centring hooks
    ({} without --center-writing-weights) and the SAE spliced (None without --sae)."""
    if args.use_error_term and not args.sae:
        raise UserError("--use-error-term goes with --sae")
    import sae
    from interface import loading

    hooks = sae.centring_hooks(hparams["n_layer"]) if args.center_writing_weights else {}
    if not args.sae:
        return hooks, None
    chosen = device.to_device(loading.load_sae(args.sae, args.models_dir, getattr(args, "quiet", False)),
                              array_module(args))  # where the model is
    sae.check_fits(chosen, hparams)
    return hooks, sae.splice(chosen, args.use_error_term)


def spliced_line(args, sae):
    """What a reading says first when the model is not as it came (sae_flags): "with the SAE DIR at HOOK (reading
    HOOK_IN) with its error term and the writing weights centred". sae: sae_splice's, or None."""
    reads = f" (reading {sae[3]})" if sae and sae[3] != sae[0] else ""  # a transcoder
    what = [f"the SAE {args.sae} at {sae[0]}{reads}" + (" with its error term" if args.use_error_term else "")] \
        if sae else []
    what += ["the writing weights centred"] if args.center_writing_weights else []
    what += ["the layer norms folded"] if args.fold_ln else []
    return "with " + " and ".join(what)


def device_name(text):
    """An argparse type: cpu or gpu ("--device must be one of cpu, gpu, got 'tpu'")."""
    if text not in device.DEVICES:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(device.DEVICES)}, got {text!r}")
    return text


def device_flag(parser):
    """--device: where the model computes. The GPU needs CuPy (requirements-gpu.txt); docs/gpu.md."""
    parser.add_argument("--device", type=device_name, metavar="cpu|gpu",
                        help=f"where the arrays live: cpu (NumPy) or gpu (CuPy, pip install -r requirements-gpu.txt; "
                             f"docs/gpu.md) (default: ${device.DEVICE_ENV}, else cpu)")


def array_module(args):
    """The array module the command computes with: numpy, or cupy once a GPU has answered a probe. No CuPy,
    no GPU, an unknown $GPT2_DEVICE: a UserError (one line, exit 2), before any work."""
    return device.backend(device.chosen(getattr(args, "device", None)))


def on_device(xp, params, what="the model"):
    """params on xp's device (numpy: as they are), refused first if they do not fit in its free memory."""
    device.check_fits(xp, device.tree_bytes(params), f"loading {what}")
    return device.to_device(params, xp)
