"""What every command line says the same way: the flags that name a model, a mistake in the
flags' own words, and a whole number from a flag.

    model_flags(parser)    --model, --models-dir and (where OpenAI's files are downloaded) --base-url
    user_message(e)        a UserError about the Python API's top_k, as the command line's --top-k
    at_least(1)            an argparse type: a whole number no smaller than 1
"""
import download
from plumbing import shapes
from plumbing.fetching import MODELS_DIR_ENV

SIZES = ", ".join(shapes.SIZES)  # 124M, 355M, 774M, 1558M
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
