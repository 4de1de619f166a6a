"""Tokenizer throughput: bpe.py against OpenAI's classic loop and tiktoken, in one run.

    python bench/bench_bpe.py [--mb 12] [--repeats 3] [--baseline DIR]

--baseline DIR also runs the bpe.py of another checkout (say, main before a change:
`git worktree add DIR main`), interleaved with this one, so both face the same load.

The corpus (not committed) is assembled from text already on the machine: the
translated messages of every gettext catalogue (*.mo: dozens of languages and
scripts) and Python's own standard library (English and code), mixed until it
reaches --mb megabytes of UTF-8. It is cached in bench/out/bpe_corpus.txt.

Each tokenizer runs in a fresh process: "cold" is the first pass over the corpus
(empty caches, includes building nothing: the encoder is built before the clock
starts), "warm" the second pass. tiktoken (if installed, built offline from the
vendored files) runs single-threaded. Figures are medians over --repeats processes.
"""
import argparse
import gettext
import glob
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import sysconfig

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
VOCAB = os.path.join(ROOT, "data", "gpt2-vocab")
CORPUS = os.path.join(HERE, "out", "bpe_corpus.txt")


def assemble_corpus(megabytes):
    pieces = []
    for path in sorted(glob.glob("/usr/share/**/*.mo", recursive=True)):
        try:
            with open(path, "rb") as f:
                catalogue = gettext.GNUTranslations(f)
            pieces += [v for v in catalogue._catalog.values() if isinstance(v, str) and v.strip()]
        except Exception:  # a catalogue in an odd charset: skip it
            continue
    for path in sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "**", "*.py"), recursive=True)):
        with open(path, encoding="utf-8", errors="replace") as f:
            pieces.append(f.read())
    random.Random(0).shuffle(pieces)
    out, size = [], 0
    for p in pieces:
        out.append(p)
        size += len(p.encode("utf-8"))
        if size >= megabytes * 1e6:
            break
    os.makedirs(os.path.dirname(CORPUS), exist_ok=True)
    with open(CORPUS, "w", encoding="utf-8") as f:
        f.write("\n".join(out))


# OpenAI's classic algorithm, rewritten here as the baseline: per pre-token,
# repeatedly find the lowest-ranked pair among all pairs and merge it, with a string cache.
CLASSIC = r'''
import json, regex
def classic_encoder(folder):
    encoder = json.load(open(folder + "/encoder.json", encoding="utf-8"))
    lines = open(folder + "/vocab.bpe", encoding="utf-8").read().split("\n")[1:-1]
    ranks = {tuple(l.split()): i for i, l in enumerate(lines)}
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b); cs.append(256 + n); n += 1
    byte_encoder = dict(zip(bs, map(chr, cs)))
    pat = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
    cache = {}
    def bpe(token):
        if token in cache:
            return cache[token]
        word = tuple(token)
        pairs = set(zip(word, word[1:]))
        while pairs:
            bigram = min(pairs, key=lambda p: ranks.get(p, float("inf")))
            if bigram not in ranks:
                break
            first, second = bigram
            new, i = [], 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                except ValueError:
                    new.extend(word[i:]); break
                new.extend(word[i:j]); i = j
                if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                    new.append(first + second); i += 2
                else:
                    new.append(word[i]); i += 1
            word = tuple(new)
            if len(word) == 1:
                break
            pairs = set(zip(word, word[1:]))
        cache[token] = word = " ".join(word)
        return word
    def encode(text):
        ids = []
        for token in regex.findall(pat, text):
            token = "".join(byte_encoder[b] for b in token.encode("utf-8"))
            ids.extend(encoder[t] for t in bpe(token).split(" "))
        return ids
    return encode
'''

RUNNER = r'''
import json, os, sys, time
sys.path.insert(0, ROOT)
text = open(CORPUS, encoding="utf-8").read()
if WHICH in ("ours", "baseline"):
    import bpe
    encode = bpe.get_encoder(VOCAB).encode
elif WHICH == "classic":
    exec(CLASSIC)
    encode = classic_encoder(VOCAB)
else:
    os.environ["TIKTOKEN_CACHE_DIR"] = ""
    sys.path.insert(0, os.path.join(ROOT, "tests", "data"))
    from make_bpe_golden import reference_encoding
    encode = reference_encoding().encode_ordinary
times, ids = [], None
for _ in range(2):
    t = time.perf_counter()
    ids = encode(text)
    times.append(time.perf_counter() - t)
print(json.dumps({"cold": times[0], "warm": times[1], "n_ids": len(ids), "checksum": sum(ids) % 1000003}))
'''


def run(which, root=ROOT):
    code = (f"ROOT={root!r}; CORPUS={CORPUS!r}; VOCAB={VOCAB!r}; WHICH={which!r}; CLASSIC={CLASSIC!r}\n" + RUNNER)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "RAYON_NUM_THREADS": "1"})
    if r.returncode:
        raise SystemExit(r.stderr)
    return json.loads(r.stdout)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, default=12)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--baseline", help="another checkout whose bpe.py runs too, interleaved")
    args = p.parse_args()
    if not os.path.exists(CORPUS) or os.path.getsize(CORPUS) < args.mb * 1e6 * 0.99:
        assemble_corpus(args.mb)
    size = os.path.getsize(CORPUS) / 1e6
    print(f"corpus: {size:.1f} MB of UTF-8 ({CORPUS})")
    which = ["ours", "classic"] + (["baseline"] if args.baseline else [])
    if importlib.util.find_spec("tiktoken"):
        which.append("tiktoken")
    else:
        print("tiktoken is not installed: skipped")
    results = {}
    for _ in range(args.repeats):  # interleaved, so that load on the machine hits all alike
        for w in which:
            results.setdefault(w, []).append(run(w, args.baseline if w == "baseline" else ROOT))
    checks = {w: (r[0]["n_ids"], r[0]["checksum"]) for w, r in results.items()}
    print("same ids from all:", len(set(checks.values())) == 1, checks)
    mbps = {w: {k: statistics.median(size / x[k] for x in r) for k in ("cold", "warm")} for w, r in results.items()}
    print(f"{'tokenizer':<10}{'cold MB/s':>12}{'warm MB/s':>12}")
    for w, m in mbps.items():
        print(f"{w:<10}{m['cold']:>12.2f}{m['warm']:>12.2f}")
    print(f"ours / classic: cold {mbps['ours']['cold'] / mbps['classic']['cold']:.2f}x, "
          f"warm {mbps['ours']['warm'] / mbps['classic']['warm']:.2f}x")
    if "baseline" in mbps:
        print(f"ours / baseline: cold {mbps['ours']['cold'] / mbps['baseline']['cold']:.2f}x, "
              f"warm {mbps['ours']['warm'] / mbps['baseline']['warm']:.2f}x")
    if "tiktoken" in mbps:
        print(f"ours / tiktoken: cold {mbps['ours']['cold'] / mbps['tiktoken']['cold']:.2f}x, "
              f"warm {mbps['ours']['warm'] / mbps['tiktoken']['warm']:.2f}x")


if __name__ == "__main__":
    main()
