"""What every command line says the same way: the flags that name a model, a mistake in the
flags' own words, and a whole number from a flag.

    model_flags(parser)    --model, --models-dir and (where OpenAI's files are downloaded) --base-url
    user_message(e)        a UserError about the Python API's top_k, as the command line's --top-k
    at_least(1)            an argparse type: a whole number no smaller than 1
    sae_flags(parser)      --sae, --use-error-term, --center-writing-weights: an SAE spliced in (sae.py)
"""
import download
from plumbing import shapes
from plumbing.errors import UserError
from plumbing.fetching import MODELS_DIR_ENV

SIZES = ", ".join(shapes.SIZES)  # 124M, 355M, 774M, 1558M
CENTRED_HELP = ("run the model as TransformerLens's center_writing_weights leaves it: the published GPT-2 small "
                "SAEs were trained on it (docs/sae.md)")
MODEL_HELP = f"{SIZES}, a model folder (OpenAI's or Hugging Face's), or hf:owner/name[@revision] from the Hub"

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
    if positional:
        parser.add_argument("model", metavar="MODEL", help=model_help)
    else:
        parser.add_argument("--model", default="124M", help=f"{model_help} (default: %(default)s)")
    parser.add_argument("--models-dir", help=f"where model sizes are downloaded, a folder each (default: "
                                             f"${MODELS_DIR_ENV}, else models/ in the project's folder)")
    if base_url:
        parser.add_argument("--base-url", help=f"a mirror of OpenAI's model files, serving <size>/<file> (default: "
                                               f"${download.BASE_URL_ENV}, else OpenAI's own)")


def user_message(e):
    """A UserError as the command-line user should read it: flags, not argument names."""
    return f"{FLAGS[e.arg]} {e.message}" if e.arg in FLAGS else str(e)


def at_least(least):
    """An argparse type: the text as a whole number, which must be `least` or more (argparse's
    error then names the flag and says "invalid whole number >= 1 value")."""
    def parse(text):
        value = int(text)
        if value < least:
            raise ValueError
        return value
    parse.__name__ = f"whole number >= {least}"
    return parse


def sae_flags(parser):
    """The flags that splice an SAE into the model, for the commands that read it (sae_splice)."""
    parser.add_argument("--sae", metavar="SAE_DIR", help="splice an SAE in at its hook point, its reconstruction in "
                                                         "place of the activation (a folder, or hf:owner/name/PATH)")
    parser.add_argument("--use-error-term", action="store_true",
                        help="with --sae: the reconstruction plus the error term (the output unchanged)")
    parser.add_argument("--center-writing-weights", action="store_true", help=CENTRED_HELP)


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
    chosen = loading.load_sae(args.sae, args.models_dir, getattr(args, "quiet", False))
    sae.check_fits(chosen, hparams)
    return hooks, sae.splice(chosen, args.use_error_term)
