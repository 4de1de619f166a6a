"""The command line of download.py: fetch a released size, or check a model on disk again.

    python download.py 124M                 # download (or mend) models/124M
    python download.py --verify 124M        # every tensor's CRC-32C
    python download.py --verify FOLDER      # a folder of one's own, checked as its format allows

Exit status: 0 done, 2 a user's mistake (one line on stderr), 130 interrupted (Ctrl-C or
SIGTERM: what arrived stays in its .part file, and the next run resumes it).
"""
import argparse

import download
from interface.options import at_least, model_flags
from plumbing.errors import UserError, exit_status, fail
from plumbing.folders import MODELS_DIR_ENV


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="download.py", description="Download a GPT-2 checkpoint from OpenAI (or a mirror), or verify one on disk.",
        epilog=f"Models go to --models-dir, else ${MODELS_DIR_ENV}, else models/ beside this script. Files are "
               f"fetched from --base-url, else ${download.BASE_URL_ENV}, else {download.DEFAULT_BASE_URL}.")
    model_flags(parser, positional=True, model_help=f"a size to download, one of {', '.join(download.MODEL_SIZES)}; "
                                                    "or with --verify, a model folder to check")
    parser.add_argument("--verify", action="store_true", help="check every tensor's CRC-32C instead of downloading")
    parser.add_argument("--retries", type=at_least(1), default=5, help="tries per file before giving up (default 5)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.error = fail
    args = parser.parse_args(argv)
    return exit_status(lambda: run(args))


def run(args):
    """--verify, or the download."""
    if args.verify:
        print(download.verify(args.model, args.models_dir, args.quiet))
    elif args.model.startswith("hf:"):  # the Hub's models are downloaded where they are used
        raise UserError(f"{args.model} is a Hub model: python gpt2_numpy.py --model {args.model} \"prompt\" "
                        "downloads it on first use")
    else:
        print(download.download_model(args.model, args.models_dir, args.base_url, args.quiet, tries=args.retries))
