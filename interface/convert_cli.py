"""The command line of convert.py: which model, where to write it, and in which format.

    python convert.py MODEL OUT --to hf       # MODEL: a size, a model folder or hf:owner/name
    python convert.py MODEL OUT --to openai
    python convert.py MODEL OUT.gguf --to gguf [--gguf-type f32|f16|q8_0]   # MODEL may be a .gguf too

OUT is checked first, then MODEL is fetched (a size or a Hub model is downloaded on first use),
then convert.convert writes OUT. Exit status: 0 done, 2 a user's mistake (one line on stderr),
130 interrupted (Ctrl-C or SIGTERM), with nothing of OUT left behind.
"""
import argparse
import sys

import convert
from interface import loading
from interface.options import model_flags
from plumbing import gguf
from plumbing.errors import UserError, exit_status, fail
from plumbing.folders import check_new_folder, in_models_folder


def main(argv=None):
    p = argparse.ArgumentParser(prog="convert.py", allow_abbrev=False,
                                description="Write a GPT-2 as a Hugging Face folder, as OpenAI's files, or as a "
                                            "GGUF file (llama.cpp's).",
                                epilog="transformers, TransformerLens and lm-eval load --to hf's folder; every "
                                       "command here loads either (docs/fine_tuning.md).")
    model_flags(p, positional=True)
    p.add_argument("out", metavar="OUT", help="the folder to write, or with --to gguf the file (it must not exist)")
    p.add_argument("--to", required=True, choices=list(convert.FORMATS),
                   help="hf: Hugging Face's format; openai: OpenAI's; gguf: llama.cpp's (one file)")
    p.add_argument("--gguf-type", choices=convert.GGUF_TYPES,
                   help="with --to gguf: the weights' type, f32 (the default), f16 or q8_0 (8 bits)")
    p.add_argument("--quiet", action="store_true", help="no progress display while downloading")
    p.error = fail
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    return exit_status(lambda: run(args))


def run(args):
    if args.gguf_type and args.to != "gguf":
        raise UserError("--gguf-type goes with --to gguf")
    if args.to == "gguf" and not gguf.is_gguf(args.out):  # every command knows a GGUF file by its name
        raise UserError(f"--to gguf writes a file that --model then reads by its name: give OUT a name that ends in "
                        f".gguf ({args.out}.gguf)")
    with in_models_folder(args.out, args.models_dir):  # OUT models/124M-hf on a fresh clone
        check_new_folder(args.out, advice=f"choose a new {'file' if args.to == 'gguf' else 'folder'} for OUT",
                         empty_ok=False)  # before any download
        folder = loading.fetch_model(args.model, args.models_dir, args.base_url, quiet=args.quiet)
        out = convert.convert(folder, args.out, args.to, args.gguf_type or "f32")
    kind = f" ({args.gguf_type or 'f32'})" if args.to == "gguf" else ""
    print(f"wrote {out}: {args.model} in {convert.FORMATS[args.to]} format{kind}")
