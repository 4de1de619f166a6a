"""GPT-2s from the Hugging Face Hub (or a mirror of it), fetched as OpenAI's files are (fetching.py).

    python gpt2_numpy.py "prompt" --model hf:distilbert/distilgpt2
    python gpt2_numpy.py "prompt" --model hf:openai-community/gpt2@main

A repository's files are at {endpoint}/{owner}/{name}/resolve/{revision}/{file}; the
endpoint is $HF_ENDPOINT (as Hugging Face's own tools name it), else huggingface.co.
The Hub's redirects (renamed repositories, large files on a CDN) are followed. We fetch
config.json, the weights (model.safetensors, or model.safetensors.index.json and its
shards) and the tokenizer (vocab.json and merges.txt, or else tokenizer.json, all that transformers 5
saves of one) into <models>/hf/<owner>/<name>[@revision],
with the same resumable, checked, locked downloads as OpenAI's files. The Hub gives a large
file's SHA-256 in its X-Linked-ETag header: a file that does not match is not kept. Without
it, the safetensors header is checked against the file's size.
"""
import json
import os
import re

from plumbing import model_files
from plumbing.fetching import BadFile, DownloadError, NotFound, check_not_a_web_page, downloading_into, fetch_file
from plumbing.folders import default_models_dir
from plumbing.safetensors_reader import SafetensorsError, read_header
from plumbing.shapes import TOKENIZER_FILES, TOKENIZER_JSON

DEFAULT_ENDPOINT = "https://huggingface.co"
ENDPOINT_ENV = "HF_ENDPOINT"
PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9_-])?"  # no "..", no "/", nothing that leaves a folder
NAME = re.compile(rf"({PART})/({PART})(?:@({PART}))?")
TOKENIZER = tuple(TOKENIZER_FILES.values())  # Hugging Face's names for GPT-2's tokenizer files


def parse_name(name):
    """'owner/name[@revision]' -> (owner, name, revision or None); anything else is an error."""
    match = NAME.fullmatch(name)
    if not match or ".." in name:
        raise DownloadError(f"{name!r} is not a Hub model name: write hf:owner/name or hf:owner/name@revision "
                            "(letters, digits, '.', '_' and '-')")
    return match.groups()


def hub_folder(name, models_dir=None):
    owner, repo, revision = parse_name(name)
    return os.path.join(models_dir or default_models_dir(), "hf", owner, repo + (f"@{revision}" if revision else ""))


def check_hub_file(file, path, seen):
    """BadFile unless the file is plausible: no web page; JSON where JSON is due; a safetensors
    file whose SHA-256 is the Hub's (when it gave one) and whose header fits its size."""
    with open(path, "rb") as f:
        head = f.read(4096)
    check_not_a_web_page(head)
    if file.endswith(".json"):
        try:
            with open(path, encoding="utf-8") as f:
                json.load(f)
        except (ValueError, UnicodeDecodeError):
            raise BadFile("it is not valid JSON") from None
    if file.endswith(".safetensors"):
        sha = seen.get(file)
        if sha and model_files.sha256(path) != sha:
            raise BadFile(f"its SHA-256 is not {sha}, the one the Hub gave")
        try:
            read_header(path)
        except SafetensorsError as e:
            raise BadFile(e.message) from None


def weight_files(folder):
    """The safetensors files this folder's index names (or the single file)."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if not os.path.exists(index):
        return ["model.safetensors"]
    with open(index, encoding="utf-8") as f:
        shards = sorted(set(json.load(f)["weight_map"].values()))
    bad = [s for s in shards if not (isinstance(s, str) and re.fullmatch(PART, s))]
    if bad:  # a shard is fetched under its own name: it must not leave the folder
        raise DownloadError(f"the index names a shard {bad[0]!r} that is not a plain file name", path=index)
    return ["model.safetensors.index.json"] + shards


def tokenizer_files(folder):
    """The tokenizer's files the folder has: vocab.json and merges.txt, or else tokenizer.json alone."""
    return [TOKENIZER_JSON] if os.path.exists(os.path.join(folder, TOKENIZER_JSON)) and not os.path.exists(
        os.path.join(folder, TOKENIZER[0])) else list(TOKENIZER)


def is_complete(folder):
    """Every file is there and passes its check (no network: a warm run costs milliseconds)."""
    try:
        files = ["config.json", *weight_files(folder), *tokenizer_files(folder)]
        for file in files:
            check_hub_file(file, os.path.join(folder, file), {})
        return True
    except (OSError, ValueError, KeyError, TypeError, BadFile):
        return False


def download_hub_model(name, models_dir=None, quiet=False, tries=5, backoff=0.5, endpoint=None):
    """Make sure hf:name is on disk; returns its folder. A repository that is not there, or lacks
    what this project needs, leaves nothing behind."""
    folder = hub_folder(name, models_dir)
    if is_complete(folder):
        return folder
    url = repository_url(name, endpoint)
    fetched = []  # the files this run fetched: they go if the repository turns out to be unusable
    fetch = fetcher(folder, url, fetched, quiet=quiet, tries=tries, backoff=backoff)
    with downloading_into(folder, f"hf:{name}", quiet):  # a failure that saved nothing leaves nothing
        try:
            fetch_config(fetch, name, url)
            fetch_weights(fetch, name, folder)
            fetch_tokenizer(fetch, name)
        except NotFound:
            for path in fetched:
                os.remove(path)
            raise
    return folder


def repository_url(name, endpoint=None):
    """Where the repository's files are: {endpoint}/{owner}/{name}/resolve/{revision}."""
    owner, repo, revision = parse_name(name)
    base = (endpoint or os.environ.get(ENDPOINT_ENV) or DEFAULT_ENDPOINT).rstrip("/")
    return f"{base}/{owner}/{repo}/resolve/{revision or 'main'}"


def fetcher(folder, url, fetched, **options):
    """fetch(file): the repository's file into the folder, unless a good copy is already there;
    each file it downloads goes on `fetched`. The SHA-256s the Hub gives on the way are checked."""
    seen = {}

    def fetch(file):
        path = os.path.join(folder, file)
        if os.path.exists(path):
            try:
                check_hub_file(file, path, {})
                return
            except BadFile:
                os.remove(path)
        fetch_file(f"{url}/{file}", path, seen=seen, check=lambda part: check_hub_file(file, part, seen),
                   large=file.endswith(".safetensors"), **options)
        fetched.append(path)

    return fetch


def fetch_config(fetch, name, url):
    try:
        fetch("config.json")
    except NotFound:
        raise NotFound(f"no such model on the Hub or mirror: hf:{name} ({url}/config.json answered HTTP 404)") from None


def fetch_weights(fetch, name, folder):
    """model.safetensors, or else the index and the shards it names."""
    try:
        fetch("model.safetensors")
        return
    except NotFound:
        pass
    try:
        fetch("model.safetensors.index.json")
    except NotFound:
        raise NotFound(f"hf:{name} has no model.safetensors: if it has only pytorch_model.bin (a pickle), this "
                       "project does not load it; convert it with transformers' save_pretrained") from None
    for shard in weight_files(folder)[1:]:
        fetch(shard)


def fetch_tokenizer(fetch, name):
    """vocab.json and merges.txt, or else tokenizer.json (all that transformers 5 saves of a tokenizer)."""
    try:
        fetch(TOKENIZER[0])
    except NotFound:
        try:
            fetch(TOKENIZER_JSON)
            return
        except NotFound:
            raise NotFound(f"hf:{name} has no {TOKENIZER[0]} nor {TOKENIZER_JSON}: this project needs GPT-2's "
                           f"byte-level BPE ({' and '.join(TOKENIZER)}, or {TOKENIZER_JSON})") from None
    for file in TOKENIZER[1:]:
        try:
            fetch(file)
        except NotFound:
            raise NotFound(f"hf:{name} has no {file}: this project needs GPT-2's byte-level BPE "
                           f"({' and '.join(TOKENIZER)}, or {TOKENIZER_JSON})") from None


def download_hub_sae(name, models_dir=None, quiet=False, tries=5, backoff=0.5, endpoint=None):
    """hf:owner/name[@revision]/PATH: an SAE folder of a Hub repository (SAELens's cfg.json and
    sae_weights.safetensors under PATH), fetched as a model's files are. -> its folder"""
    repo, _, path = name.partition("/")[2].partition("/")
    repo = f"{name.partition('/')[0]}/{repo}"
    parts = path.strip("/").split("/")
    if not path.strip("/") or not all(re.fullmatch(PART, p) for p in parts):
        raise DownloadError(f"{name!r} is not an SAE on the Hub: write hf:owner/name/PATH, PATH the folder that holds "
                            "cfg.json and sae_weights.safetensors")
    folder = os.path.join(hub_folder(repo, models_dir), *parts)
    url = f"{repository_url(repo, endpoint)}/{'/'.join(parts)}"
    fetched = []
    fetch = fetcher(folder, url, fetched, quiet=quiet, tries=tries, backoff=backoff)
    with downloading_into(folder, f"hf:{name}", quiet):
        try:
            for file in ("cfg.json", "sae_weights.safetensors"):
                fetch(file)
        except NotFound:
            for done in fetched:
                os.remove(done)
            raise NotFound(f"no SAE at hf:{name} ({url}/cfg.json and sae_weights.safetensors)") from None
    return folder
