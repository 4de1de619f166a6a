"""The command line as a new user meets it: download, load, generate, score, trace, count, and errors.
Every run is a real subprocess against a mirror on 127.0.0.1 serving the tiny real-TensorFlow
checkpoint with GPT-2's real vocabulary under the name 124M. Then the decoding flags: --repetition-penalty,
--no-repeat-ngram-size, --min-p, --stop, --num-beams and its companions, run in this process on a model
trained here (tests/data/shakespeare) and a Hugging Face folder (tests/data/hf/tiny), each held to Hugging
Face generate's ids (tests/data/generate_golden.json); and every mistake beside them, one line and exit 2."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import DATA, GENERATE_GOLDEN, ROOT, closed_port, model_folder_copy, tiny_mirror
import decoding
import gpt2_numpy as g
from interface import gpt2_cli, options

TURING_TEXT = "Alan Turing theorized that computers would one day become"
GOLDEN = np.load(os.path.join(DATA, "hf_golden.npz"))


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A mirror, and a models folder that has already downloaded from it once."""
    root = tmp_path_factory.mktemp("site")
    mirror = tiny_mirror(str(root / "mirror"))
    models = root / "models"
    r = run("--models-dir", str(models), "--base-url", mirror.url, "--n-tokens", "1", "x")
    assert r.returncode == 0, r.stderr
    yield mirror, str(models)
    mirror.close()


def run(*args, env=None, **kw):
    """python gpt2_numpy.py ARGS, with the mirror's tiny model standing in for 124M (tiny_as_124m.py)."""
    return subprocess.run([sys.executable, os.path.join(ROOT, "tests", "tiny_as_124m.py"), "gpt2_numpy.py", *args],
                          capture_output=True, timeout=120, env={**os.environ, **(env or {})}, **kw)


def text(r):
    return r.stdout.decode("utf-8"), r.stderr.decode("utf-8")


def assert_one_line_error(r, message):
    """Exit 2 and one line, the error (after the line that says a download started, if one did)."""
    out, err = text(r)
    assert r.returncode == 2, err
    err = "".join(line for line in err.splitlines(keepends=True) if not line.startswith("downloading "))
    assert err.count("\n") == 1 and message in err and "Traceback" not in err, err


def test_the_readme_command_downloads_loads_and_streams(tmp_path, encoder):
    mirror = tiny_mirror(str(tmp_path / "mirror"))
    try:
        env = {"GPT2_MODELS_DIR": str(tmp_path / "models"), "GPT2_BASE_URL": mirror.url}
        r = run(TURING_TEXT, env=env)
    finally:
        mirror.close()
    out, err = text(r)
    assert r.returncode == 0, err
    assert out.startswith(TURING_TEXT) and len(out) > len(TURING_TEXT)
    assert "tokens/s" in err
    assert os.path.exists(tmp_path / "models" / "124M" / "model.ckpt.data-00000-of-00001")


def test_greedy_text_is_hugging_faces_greedy_continuation(site, encoder):
    mirror, models = site
    assert encoder.encode(TURING_TEXT) == GOLDEN["tiny_turing/ids"][0].tolist()
    r = run(TURING_TEXT, "--models-dir", models, "--greedy", "--n-tokens", "20", "--no-stop", "--quiet")
    out, err = text(r)
    assert r.returncode == 0 and err == ""
    want = encoder.decode(GOLDEN["tiny_turing/greedy"][0].tolist())
    assert out == TURING_TEXT + want + "\n"


def test_zero_new_tokens_prints_the_prompt(site):
    mirror, models = site
    assert text(run("Hello there", "--models-dir", models, "--n-tokens", "0", "--quiet"))[0] == "Hello there\n"


def test_a_terminal_that_cannot_show_the_text(site):
    mirror, models = site
    r = run("café 🤗", "--models-dir", models, "--n-tokens", "3", "--quiet", env={"PYTHONIOENCODING": "ascii"})
    assert r.returncode == 0 and r.stdout.startswith(b"caf? ?")


def test_json_generation(site):
    mirror, models = site
    r = run(TURING_TEXT, "--models-dir", models, "--greedy", "--n-tokens", "20", "--no-stop", "--json",
            "--n-samples", "2")
    out = json.loads(text(r)[0])
    assert out["model"] == "124M" and out["prompt_ids"] == GOLDEN["tiny_turing/ids"][0].tolist()
    assert len(out["samples"]) == 2
    for sample in out["samples"]:
        assert sample["ids"] == GOLDEN["tiny_turing/greedy"][0].tolist() and sample["finish"] == "length"


def test_threads_changes_nothing_but_the_speed(site):
    mirror, models = site
    # a folder by path: gpt2_numpy.py itself, without tiny_as_124m.py
    args = ("Hello", "--model", os.path.join(models, "124M"), "--greedy", "--n-tokens", "10", "--no-stop", "--quiet")
    plain = run(*args, env={"OMP_NUM_THREADS": "2"})
    one = run(*args, "--threads", "1", env={"OMP_NUM_THREADS": "2"})
    assert one.returncode == 0 and text(one)[0] == text(plain)[0]


def test_the_same_seed_gives_the_same_text(site):
    mirror, models = site
    outs = [text(run("Hello", "--models-dir", models, "--seed", "3", "--top-k", "50", "--top-p", "0.9",
                     "--temperature", "0.8", "--quiet"))[0] for _ in range(2)]
    assert outs[0] == outs[1] and outs[0].startswith("Hello")


def test_several_samples_are_printed_one_after_another(site):
    mirror, models = site
    out = text(run("Hello", "--models-dir", models, "--n-samples", "3", "--seed", "1", "--quiet"))[0]
    assert [line for line in out.splitlines() if "SAMPLE" in line] == [
        f"{'=' * 20} SAMPLE {i} {'=' * 20}" for i in (1, 2, 3)]


def test_score_json_matches_hugging_face(site):
    mirror, models = site
    out = json.loads(text(run(TURING_TEXT, "--models-dir", models, "--score", "--json"))[0])
    assert out["ids"] == GOLDEN["tiny_turing/ids"][0].tolist()
    assert out["logprobs"][0] is None  # the first token has no prediction
    assert np.abs(np.array(out["logprobs"][1:]) - GOLDEN["tiny_turing/logprobs"][0]).max() <= 1e-4
    assert abs(out["loss"] - GOLDEN["tiny_turing/loss"][0]) <= 1e-5
    assert out["perplexity"] == pytest.approx(np.exp(out["loss"]))


def test_score_as_a_table(site):
    mirror, models = site
    out = text(run("Hello, world", "--models-dir", models, "--score"))[0]
    assert out.splitlines()[-1].startswith("loss ") and "perplexity" in out


def test_trace(site):
    mirror, models = site
    out = text(run("Hello, world", "--models-dir", models, "--trace"))[0]
    lines = out.splitlines()
    assert lines[1].split()[:2] == ["token", "ids"]
    assert "[1, 3, 50257]" in lines[-1] and "blocks.1.attn.hook_pattern" in out and "[1, 2, 3, 3]" in out
    one = text(run("Hello, world", "--models-dir", models, "--trace", "--trace-block", "1"))[0]
    assert "blocks.1.ln1.hook_normalized" in one and "blocks.0." not in one


def test_the_trace_table_lines_up_for_every_value(site):
    """Each number ends where its column's heading ends, in every row, token ids included."""
    mirror, models = site
    lines = text(run("Hello, world", "--models-dir", models, "--trace"))[0].splitlines()
    header = lines[0]
    ends = [header.index(word) + len(word) for word in ("mean", "std", "min", "max")]
    assert len(lines) > 20
    for line in lines[1:]:
        assert len(line) == len(header), line
        for end in ends:
            assert line[end - 1] != " " and line[end - 12] == " ", line  # a number, and a space before it
        float_values = [float(v) for v in line[ends[0] - 13:].split()]
        assert len(float_values) == 4, line


def test_top_prints_the_next_token_table(site, encoder):
    mirror, models = site
    out = text(run(TURING_TEXT, "--models-dir", models, "--top", "5"))[0].splitlines()
    assert out[1].split() == ["rank", "token", "id", "prob", "log", "p"] and len(out) == 7
    ids = [int(line.split()[-3]) for line in out[2:]]
    probs = [float(line.split()[-2]) for line in out[2:]]
    last = GOLDEN["tiny_turing/last_logits"][0]
    assert ids == np.argsort(-last)[:5].tolist()  # HF's top 5
    want = np.exp(last - last.max()) / np.exp(last - last.max()).sum()
    assert np.allclose(probs, want[ids], atol=1e-4)


def test_top_without_a_prompt_is_after_endoftext(site):
    mirror, models = site
    out = text(run("--models-dir", models, "--top", "2"))[0].splitlines()
    assert out[0] == "after 1 token, ...'<|endoftext|>':" and len(out) == 4


def test_json_generation_gives_each_steps_alternatives_after_the_sampling_settings(site):
    mirror, models = site
    r = run(TURING_TEXT, "--models-dir", models, "--json", "--top", "4", "--n-tokens", "3", "--no-stop",
            "--seed", "1", "--top-k", "2")
    sample = json.loads(text(r)[0])["samples"][0]
    assert len(sample["top"]) == 3 and all(len(step) == 4 for step in sample["top"])
    for token, step in zip(sample["ids"], sample["top"]):
        assert [e["prob"] > 0 for e in step] == [True, True, False, False]  # --top-k 2 left two
        assert abs(sum(e["prob"] for e in step) - 1) < 1e-5 and token in [e["id"] for e in step[:2]]
    first = sample["top"][0]
    last = GOLDEN["tiny_turing/last_logits"][0]
    top2 = np.argsort(-last)[:2]
    p = np.exp(last[top2] - last[top2].max())
    assert [e["id"] for e in first[:2]] == top2.tolist() and np.allclose([e["prob"] for e in first[:2]], p / p.sum(),
                                                                           atol=1e-5)


def test_lens_as_a_table_and_as_json(site, encoder):
    mirror, models = site
    table = text(run("Hello, world", "--models-dir", models, "--lens"))[0].splitlines()
    assert [line.split()[0] for line in table[2:]] == ["embed", "h0", "h1"]
    out = json.loads(text(run("Hello, world", "--models-dir", models, "--lens", "--json"))[0])
    assert out["layers"] == ["embed", "h0", "h1"] and len(out["top"]) == 3 and len(out["top"][0]) == 3
    assert out["top"][-1] == out["target"] and all(r == 0 for r in out["target_rank"][-1])
    assert out["top_token"][-1] == [encoder.decode([i]) for i in out["top"][-1]]


def test_html_writes_one_page(site, tmp_path):
    mirror, models = site
    page = tmp_path / "inside.html"
    r = run("The cat sat on the mat", "--models-dir", models, "--html", str(page))
    assert r.returncode == 0 and text(r)[0].startswith(f"{page}: ") and page.stat().st_size > 1000
    assert "<title>Inside 124M</title>" in page.read_text(encoding="utf-8")


def run_plain(*args):
    """python gpt2_numpy.py ARGS, with the real sizes' facts."""
    return subprocess.run([sys.executable, os.path.join(ROOT, "gpt2_numpy.py"), *args], capture_output=True, timeout=120)


def test_params_for_all_sizes():
    out = text(run_plain("--params", "all"))[0]
    for figure in ("124,439,808", "354,823,168", "774,030,080", "1,557,611,200", "8,030,261,248", "-0.23%"):
        assert figure in out


def test_params_also_counts_the_tensors_on_disk(site):
    mirror, models = site
    out = text(run_plain("--params", os.path.join(models, "124M")))[0]
    assert "counting the checkpoint's tensors gives the same" in out
    # the mirror's "124M" is the tiny model, so the real 124M formula and the tensors disagree
    out = text(run_plain("--params", "124M", "--models-dir", models))[0]
    assert "differ from the formula in wte (token embedding) (402,056 vs 38,597,376)" in out


@pytest.mark.parametrize("script", ["gpt2_numpy.py", "bpe.py", "download.py"])
def test_help_is_complete(script):
    r = subprocess.run([sys.executable, os.path.join(ROOT, script), "--help"], capture_output=True, text=True)
    assert r.returncode == 0
    wanted = {"gpt2_numpy.py": ["--model", "--models-dir", "--base-url", "--n-tokens", "--temperature", "--top-k",
                                "--top-p", "--seed", "--greedy", "--n-samples", "--score", "--params", "--trace",
                                "--json", "--quiet", "--threads", "--no-stop", "--top", "--lens", "--html"],
              "bpe.py": ["--ids", "--steps", "--vocab-dir"],
              "download.py": ["--models-dir", "--base-url", "--verify", "--retries", "--quiet"]}[script]
    assert all(flag in r.stdout for flag in wanted)


@pytest.mark.parametrize("command", [["gpt2_numpy.py"], ["train.py"], ["evaluate.py", "perplexity"], ["convert.py"],
                                     ["download.py"]], ids=lambda command: command[0])
def test_every_command_that_reads_a_model_names_all_four_sizes_and_the_same_flags(command):
    """interface/options.py's model flags, one helper for every parser: the sizes come from shapes.SIZES."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, *command[:1]), *command[1:], "--help"], capture_output=True,
                       text=True, timeout=60)
    help_text = " ".join(r.stdout.split())
    assert r.returncode == 0 and "124M, 355M, 774M, 1558M" in help_text, help_text
    assert "--models-dir MODELS_DIR where model sizes are downloaded" in help_text
    assert "--base-url BASE_URL a mirror of OpenAI's model files" in help_text


# --- errors: one line, exit 2 --------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["--model", "350M", "hi"], "unknown model '350M'"),
    (["--top-p", "2", "hi"], "--top-p must be in (0, 1]"),
    (["--top-p", "0", "hi"], "--top-p must be in (0, 1]"),
    (["--temperature", "-1", "hi"], "--temperature must be 0 (greedy) or 1e-30 to 1e30, got -1.0"),
    (["--n-tokens", "-1", "hi"], "error: --n-tokens must be at least 0, got -1"),
    (["--n-tokens", "abc", "hi"], "error: --n-tokens must be a whole number, got 'abc'"),
    (["--top-k", "0", "hi"], "error: --top-k must be at least 1, got 0"),
    (["--n-samples", "0", "hi"], "error: --n-samples must be at least 1, got 0"),
    (["--threads", "0", "hi"], "error: --threads must be at least 1, got 0"),
    (["--seed", "-1", "hi"], "error: --seed must be at least 0, got -1"),
    (["--seed=-1", "--draft", "lookup", "hi"], "error: --seed must be at least 0, got -1"),
    (["--top-p", "much", "hi"], "error: --top-p must be a number, got 'much'"),
    (["--trace", "--trace-block", "-1", "hi"], "error: --trace-block must be at least 0, got -1"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--score"], "--score, --trace, --lens and --html need a text"),
    (["--lens"], "--score, --trace, --lens and --html need a text"),
    (["--top", "0", "hi"], "error: --top must be at least 1, got 0"),
    (["--greedy", "--temperature", "0.7", "hi"], "--greedy is --temperature 0: give one of them"),
    (["--greedy", "--top-k", "5", "hi"], "error: --top-k is for sampling and does not go with --greedy (which samples "
                                         "nothing)"),
    (["--greedy", "--top-p", "0.9", "hi"], "error: --top-p is for sampling and does not go with --greedy"),
    (["--greedy", "--min-p", "0.1", "hi"], "error: --min-p is for sampling and does not go with --greedy"),
    (["--greedy", "--seed", "3", "hi"], "error: --seed is for sampling and does not go with --greedy"),
    (["--temperature", "0", "--seed", "3", "hi"], "error: --seed is for sampling and does not go with --temperature 0 "
                                                  "(greedy decoding, which samples nothing)"),
    (["--temperature", "0", "--top-k", "5", "--draft", "lookup", "hi"], "error: --top-k is for sampling and does not "
                                                                        "go with --temperature 0"),
    (["--lens", "--n-samples", "2", "hi"], "--n-samples is for generating text; --lens reads the text once"),
    (["--score", "--seed", "3", "hi"], "--seed is for generating text; --score reads the text once"),
    (["--top", "3", "--temperature", "0.5", "hi"], "--temperature is for generating text; --top reads"),
    (["--trace-block", "1", "hi"], "--trace-block goes with --trace"),
    (["--html", "/no/such/folder/page.html", "hi"], "error: /no/such/folder/page.html: its folder /no/such/folder does "
                                                    "not exist"),  # before the model loads
    (["--model", os.path.join(ROOT, "README.md"), "hi"], "README.md: is not a folder: --model takes a model folder"),
])
def test_bad_arguments(args, message):
    assert_one_line_error(run(*args), message)


def test_too_long_a_prompt(site):
    mirror, models = site
    r = run(TURING_TEXT, "--models-dir", models, "--n-tokens", "60")
    assert_one_line_error(r, "exceed the context of 64 tokens")
    assert r.stdout == b""  # checked before anything is printed


def test_scoring_a_text_longer_than_the_context(site):
    mirror, models = site
    assert_one_line_error(run("word " * 70, "--models-dir", models, "--score"), "at most 65 can be scored")


def test_scoring_a_single_token(site):
    mirror, models = site
    assert_one_line_error(run("Hello", "--models-dir", models, "--score"), "at least 2 tokens")


def test_a_trace_block_that_does_not_exist(site):
    mirror, models = site
    assert_one_line_error(run("Hello", "--models-dir", models, "--trace", "--trace-block", "2"),
                          "--trace-block must be in 0..1")


def test_a_bug_shows_its_traceback_and_is_not_called_a_user_error(tmp_path):
    """A student's typical slip: c_fc and c_proj swapped in ffn. NumPy raises a ValueError
    (shapes do not match); that is a bug, so the CLI must not turn it into 'error: ...' and 2."""
    folder = model_folder_copy("tiny", str(tmp_path / "tiny"))
    broken = ("import sys, gpt2_numpy\nfrom interface import gpt2_cli\n"
              "def ffn(x, c_fc, c_proj, hook=gpt2_numpy.no_hook):\n"
              "    return gpt2_numpy.linear(gpt2_numpy.gelu(gpt2_numpy.linear(x, **c_proj)), **c_fc)\n"
              "gpt2_numpy.ffn = ffn\n"
              "sys.exit(gpt2_cli.main(sys.argv[1:]))\n")
    r = subprocess.run([sys.executable, "-c", broken, "hi", "--model", folder, "--quiet"], capture_output=True,
                       text=True, cwd=ROOT, timeout=120)
    assert r.returncode not in (0, 2), r.stderr
    assert "Traceback" in r.stderr and "in ffn" in r.stderr and "matmul" in r.stderr
    assert not r.stderr.startswith("error:")


def test_user_errors_name_flags_from_a_table_not_from_rewritten_text():
    e = g.UserError("must be a whole number >= 1, got 0", arg="top_k")
    assert str(e) == "top_k must be a whole number >= 1, got 0"  # the Python API's name
    assert options.user_message(e) == "--top-k must be a whole number >= 1, got 0"
    assert set(options.FLAGS) >= {"n_tokens", "temperature", "top_k", "top_p", "n_samples", "context", "stride"}


def test_a_prompt_that_is_not_utf8():
    assert_one_line_error(run(b"caf\xe9"), "not valid UTF-8")


def test_a_folder_without_a_checkpoint(tmp_path):
    assert_one_line_error(run("hi", "--model", str(tmp_path)), "hparams.json")


def test_a_corrupt_checkpoint(site, tmp_path):
    mirror, models = site
    folder = tmp_path / "copy"
    folder.mkdir()
    for f in os.listdir(os.path.join(models, "124M")):
        data = open(os.path.join(models, "124M", f), "rb").read()
        if f == "model.ckpt.index":
            data = data[:100] + bytes([data[100] ^ 0xFF]) + data[101:]
        (folder / f).write_bytes(data)
    assert_one_line_error(run("hi", "--model", str(folder)), "model.ckpt.index: checksum mismatch")


def test_no_network(tmp_path):
    r = run("hi", "--models-dir", str(tmp_path), "--base-url", f"http://127.0.0.1:{closed_port()}")
    assert_one_line_error(r, "could not download")
    assert os.listdir(tmp_path) == []  # nothing was saved: not a file, not the lock, not 124M/


def test_a_full_disk(site, tmp_path):
    mirror, _ = site
    folder = tmp_path / "124M"
    folder.mkdir()
    os.symlink("/dev/full", folder / "checkpoint.part")
    r = run("hi", "--models-dir", str(tmp_path), "--base-url", mirror.url)
    assert_one_line_error(r, "No space left on device")
    assert not (folder / "checkpoint").exists()


def test_ctrl_c_during_a_download_exits_130_and_keeps_only_the_part_file(tmp_path):
    mirror = tiny_mirror(str(tmp_path / "mirror"))
    mirror.faults["model.ckpt.data-00000-of-00001"] = ["stall"]
    part = tmp_path / "models" / "124M" / "model.ckpt.data-00000-of-00001.part"
    try:
        p = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "tiny_as_124m.py"), "gpt2_numpy.py", "hi",
                              "--models-dir",
                              str(tmp_path / "models"), "--base-url", mirror.url],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.time() + 30
        while not (part.exists() and part.stat().st_size > 0) and time.time() < deadline:
            time.sleep(0.05)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    finally:
        mirror.close()
    assert p.returncode == 130
    assert b"Traceback" not in err and b"interrupted" in err
    assert part.exists() and not (tmp_path / "models" / "124M" / "model.ckpt.data-00000-of-00001").exists()


def test_ctrl_c_during_generation_exits_130(monkeypatch, tmp_path):
    def interrupted(*args, **kw):
        raise KeyboardInterrupt
        yield

    monkeypatch.setattr(g, "generate", interrupted)
    folder = model_folder_copy("tiny", str(tmp_path / "tiny"))
    assert gpt2_cli.main(["hi", "--model", folder, "--quiet"]) == 130


def test_no_prompt_says_it_samples_unconditionally_and_counts_endoftext(site):
    mirror, models = site
    r = run("--models-dir", models, "--n-tokens", "3", "--seed", "0", "--no-stop")
    out, err = text(r)
    assert r.returncode == 0 and out.strip()
    assert err.splitlines()[0] == "no prompt: sampling unconditionally, after <|endoftext|>"
    assert "prompt of 1 token and first token" in err and "3 tokens in" in err
    js = json.loads(text(run("--models-dir", models, "--n-tokens", "2", "--seed", "0", "--json"))[0])
    assert js["prompt_ids"] == [50256]


def test_a_download_without_a_terminal_says_what_how_big_and_where(tmp_path):
    mirror = tiny_mirror(str(tmp_path / "mirror"))
    try:
        r = run("--models-dir", str(tmp_path / "models"), "--base-url", mirror.url, "--n-tokens", "1", "hi")
    finally:
        mirror.close()
    err = text(r)[1]
    size = os.path.getsize(os.path.join(DATA, "tiny", "model.ckpt.data-00000-of-00001"))
    lines = [line for line in err.splitlines() if line.startswith("downloading ")]
    assert r.returncode == 0 and len(lines) == 1, err
    assert lines[0] == (f"downloading model.ckpt.data-00000-of-00001 ({size:,} bytes) from {mirror.url}/124M/"
                        f"model.ckpt.data-00000-of-00001 into {tmp_path / 'models' / '124M'}")


def test_text_given_to_the_api_instead_of_ids_says_how_to_get_ids():
    for call in (lambda: list(g.generate("Hello", None, {"n_ctx": 8})), lambda: g.score("Hello", None, {}),
                 lambda: g.gpt2("Hello", None, 2), lambda: g.gpt2(np.array(["Hello"]), None, 2)):
        with pytest.raises(TypeError, match=r"takes token ids, not text: ids = encoder.encode\(text\)"):
            call()


# --- two readings at once: refused in one line, or combined where that is what is meant ---------

@pytest.mark.parametrize("args, message", [
    (["--lens", "--html", "x.html", "hi"], "--html's page shows the logit lens too: give --lens for the table, or "
                                           "--html FILE for the page"),
    (["--trace", "--html", "x.html", "hi"], "--trace and --html are two readings of the text: give one of them"),
    (["--score", "--top", "3", "hi"], "--score and --top are two readings of the text: give one of them"),
    (["--score", "--lens", "hi"], "--score and --lens are two readings of the text: give one of them"),
    (["--params", "124M", "--score", "hi"], "--params and --score are two readings of the text: give one of them"),
    (["--json", "--html", "x.html", "hi"], "--html writes no JSON: leave out --json"),
    (["--json", "--params", "124M"], "--params writes no JSON: leave out --json"),
    (["--score", "--json", "--top", "3", "hi"], "--top with --json is for generating text; --score reads the text once"),
])
def test_two_readings_that_disagree_are_one_line(args, message, tmp_path):
    r = run(*args, cwd=tmp_path)
    assert_one_line_error(r, message)
    assert r.stdout == b"" and not (tmp_path / "x.html").exists()


def test_html_with_top_k_gives_the_page_k_next_tokens(site, tmp_path):
    mirror, models = site
    page = tmp_path / "inside.html"
    r = run("The cat sat on the mat", "--models-dir", models, "--html", str(page), "--top", "5")
    assert r.returncode == 0, text(r)[1]
    html = page.read_text(encoding="utf-8")
    data = json.loads(html.split('<script type="application/json" id="data">')[1].split("</script>")[0])
    assert len(data["next"]) == 5
    plain = tmp_path / "plain.html"
    assert run("The cat sat on the mat", "--models-dir", models, "--html", str(plain)).returncode == 0
    plain_data = plain.read_text(encoding="utf-8").split('id="data">')[1].split("</script>")[0]
    assert len(json.loads(plain_data)["next"]) == 10 and json.loads(plain_data)["next"][:5] == data["next"]


def test_trace_as_json_is_the_tables_numbers(site):
    mirror, models = site
    table = text(run("Hello, world", "--models-dir", models, "--trace"))[0].splitlines()[1:]
    out = json.loads(text(run("Hello, world", "--models-dir", models, "--trace", "--json"))[0])
    assert len(out["stages"]) == len(table) and out["ids"] == [15496, 11, 995]
    for stage, line in zip(out["stages"], table):
        assert line[:34].strip() == stage["name"] and line[34:56].strip() == str(stage["shape"])
        assert [float(v) for v in line[56:].split()] == pytest.approx(
            [stage[k] for k in ("mean", "std", "min", "max")], rel=1e-5, abs=1e-30)


def test_a_newline_token_is_escaped_once(site, encoder):
    mirror, models = site
    assert encoder.encode("Hello\n")[-1] == 198
    out = text(run("Hello\n", "--models-dir", models, "--top", "2"))[0]
    assert out.splitlines()[0] == "after 2 tokens, ...'\\n':"
    assert gpt2_cli.quoted_token(encoder, 198) == "'\\n'" and gpt2_cli.quoted_token(encoder, 197) == "'\\t'"
    rows = text(run("Hello\nworld", "--models-dir", models, "--score"))[0].splitlines()
    assert rows[2].split()[:2] == ["'\\n'", "198"]


def test_help_describes_every_command():
    r = run_plain("--help")
    description = text(r)[0].split("\n\n")[1]
    assert all(flag in description for flag in ("--score", "--params", "--trace", "--top", "--lens", "--html"))


def test_a_vocabulary_with_more_ids_than_the_model_names_the_folder(tmp_path):
    folder = model_folder_copy("odd", str(tmp_path / "odd"))  # a 96-id model beside GPT-2's 50,257-id vocabulary
    assert_one_line_error(run("hi", "--model", folder, "--quiet"),
                          f"{folder}: its vocabulary has 50,257 ids, its model 96: the tokenizer's files and the "
                          "weights come from different models")


@pytest.mark.parametrize("command", [
    ["gpt2_numpy.py", "hi", "--model", "{adapter}"],
    ["gpt2_numpy.py", "--params", "{adapter}"],
    ["evaluate.py", "perplexity", "{text}", "--model", "{adapter}"],
    ["train.py", "--model", "{adapter}", "--data", "{text}", "--out", "{out}"],
    ["convert.py", "{adapter}", "{out}", "--to", "hf"],
    ["download.py", "--verify", "{adapter}"],
], ids=lambda command: " ".join(command[:2]))
def test_an_adapter_alone_as_a_model_is_named_everywhere_a_model_is_read(tmp_path, command):
    """PEFT's two files without a model are a change to a model: every command says so, and what to give."""
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 8}')
    (adapter / "adapter_model.safetensors").write_bytes(b"\x08" + bytes(7) + b"{}      ")
    (tmp_path / "notes.txt").write_text("some notes to read " * 20)
    args = [a.format(adapter=adapter, text=tmp_path / "notes.txt", out=tmp_path / "out") for a in command]
    r = subprocess.run([sys.executable, os.path.join(ROOT, *args[:1]), *args[1:]], capture_output=True, timeout=120)
    assert_one_line_error(r, f"{adapter}: holds a LoRA adapter (adapter_config.json, adapter_model.safetensors) but "
                             "no model: give the folder the LoRA run wrote")
    assert sorted(os.listdir(tmp_path)) == ["adapter", "notes.txt"]


def test_every_command_ends_the_same_way(capsys):
    """plumbing.errors.exit_status, which gpt2_numpy.py, bpe.py, train.py and download.py all end through."""
    from plumbing.errors import UserError, exit_status

    assert exit_status(lambda: None) == 0 and exit_status(lambda: 3) == 3

    def mistake():
        raise UserError("is not a size", arg="--model")

    with pytest.raises(SystemExit) as e:
        exit_status(mistake)
    assert e.value.code == 2 and capsys.readouterr().err == "error: --model is not a size\n"

    def ctrl_c():
        raise KeyboardInterrupt

    assert exit_status(ctrl_c) == 130 and capsys.readouterr().err == "interrupted\n"  # stderr is no terminal here

    def killed():  # SIGTERM (kill, timeout, a scheduler) ends a command as Ctrl-C does, in other words
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # it arrives here

    before = signal.getsignal(signal.SIGTERM)
    assert exit_status(killed) == 130 and capsys.readouterr().err == "terminated\n"
    assert signal.getsignal(signal.SIGTERM) == before  # the command's handler goes with it

    def bug():
        raise ValueError("matmul: shapes do not match")

    with pytest.raises(ValueError, match="matmul"):  # a bug is not a user's mistake: its traceback shows
        exit_status(bug)


def test_a_stop_inside_ctrl_c_waits_comes_once_the_block_is_done(capsys):
    """A training step is done whole: Ctrl-C or SIGTERM inside the block waits for its end."""
    from plumbing.errors import ctrl_c_waits, exit_status

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # a shell may start us with it ignored
    try:
        for stop, said in ((signal.SIGINT, "interrupted"), (signal.SIGTERM, "terminated")):
            done = []

            def step():
                with ctrl_c_waits():
                    os.kill(os.getpid(), stop)
                    time.sleep(0.05)
                    done.append("the step")
                done.append("the next step")

            assert exit_status(step) == 130 and done == ["the step"] and capsys.readouterr().err == said + "\n"
    finally:
        signal.signal(signal.SIGINT, previous)


# === the decoding flags, in this process, each held to Hugging Face generate's ids =================
TRAINED, HF_TINY = os.path.join(DATA, "shakespeare"), os.path.join(DATA, "hf", "tiny")

ROMEO, CAT = "ROMEO:\n", "The cat sat on the mat"


def golden(name):
    return next(case for case in GENERATE_GOLDEN if case["name"] == name)


def run_here(capsys, *args):
    """python gpt2_numpy.py ARGS, in this process -> (exit status, stdout, stderr)."""
    try:
        status = gpt2_cli.main([*args, "--quiet"])
    except SystemExit as e:
        status = e.code
    out, err = capsys.readouterr()
    return status, out, err


def run_json(capsys, *args):
    status, out, err = run_here(capsys, *args, "--json")
    assert status == 0, err
    return json.loads(out)


@pytest.mark.parametrize("flags, name", [
    (["--repetition-penalty", "1.3"], "shakespeare: greedy, repetition_penalty 1.3"),
    (["--no-repeat-ngram-size", "3"], "shakespeare: greedy, no_repeat_ngram_size 3"),
    (["--repetition-penalty", "1.2", "--no-repeat-ngram-size", "2"],
     "shakespeare: greedy, repetition_penalty 1.2, no_repeat_ngram_size 2"),
    (["--stop", " then", "--stop", " be"], "shakespeare: greedy, stop strings two, the second first")])
def test_greedy_with_the_processors_on_a_trained_folder_is_generates(capsys, flags, name):
    case = golden(name)
    out = run_json(capsys, ROMEO, "--model", TRAINED, "--greedy", "--n-tokens", "16", *flags)
    assert out["prompt_ids"] == case["prompt_ids"]
    assert out["samples"][0]["ids"] == case["sequences"][0]


def test_a_stop_string_ending_mid_token_is_printed_and_nothing_after_it(capsys):
    """Streamed, the text ends with the stop string, though the token that completed it goes on; --json
    gives generate's ids, through that token, and the same text."""
    case = golden("shakespeare: greedy, stop strings ending mid-token")  # " bei", inside " being"
    status, out, err = run_here(capsys, ROMEO, "--model", TRAINED, "--greedy", "--n-tokens", "16", "--stop", " bei")
    assert status == 0 and out == ROMEO + "I'll bei\n", (out, err)
    sample = run_json(capsys, ROMEO, "--model", TRAINED, "--greedy", "--n-tokens", "16", "--stop", " bei")["samples"][0]
    assert sample == {"ids": case["sequences"][0], "text": "I'll bei", "finish": "stop"}


def test_stop_strings_and_the_no_repeat_mask_on_a_hugging_face_folder(capsys):
    case = golden("hf/tiny: greedy, stop strings spanning tokens")
    out = run_json(capsys, CAT, "--model", HF_TINY, "--greedy", "--no-stop", "--n-tokens", "16",
                   "--no-repeat-ngram-size", "1", "--stop", case["generate"]["stop_strings"][0])
    assert out["samples"][0]["ids"] == case["sequences"][0] and out["samples"][0]["finish"] == "stop"
    assert out["samples"][0]["text"].endswith("fl757acca")


def test_several_samples_each_end_at_their_own_stop_string(capsys):
    out = run_json(capsys, ROMEO, "--model", TRAINED, "--n-samples", "3", "--seed", "2", "--stop", "e", "--n-tokens",
                   "30")
    for sample in out["samples"]:
        assert sample["finish"] == "stop" and sample["text"].endswith("e") and sample["text"].count("e") == 1


def test_beam_search_on_a_trained_folder_is_generates_with_its_scores(capsys):
    case = golden("shakespeare: beams 4, its own <|endoftext|>, never written")
    out = run_json(capsys, ROMEO, "--model", TRAINED, "--num-beams", "4", "--num-return-sequences", "4",
                   "--n-tokens", "16")
    assert out["num_beams"] == 4 and [s["ids"] for s in out["samples"]] == case["sequences"]
    np.testing.assert_allclose([s["score"] for s in out["samples"]], case["scores"], rtol=1e-5)
    assert {s["finish"] for s in out["samples"]} == {"length"}


def test_beams_that_a_stop_string_ends(capsys):
    case = golden("shakespeare: beams 3, stop string")
    stop = case["generate"]["stop_strings"][0]
    out = run_json(capsys, "First Citizen:\n", "--model", TRAINED, "--num-beams", "3", "--num-return-sequences", "3",
                   "--n-tokens", "16", "--stop", stop, "--length-penalty", "1")
    assert [s["ids"] for s in out["samples"]] == case["sequences"]
    assert [s["finish"] == "stop" for s in out["samples"]] == [len(s) < 16 for s in case["sequences"]]
    assert all(s["text"].endswith(stop) for s in out["samples"] if s["finish"] == "stop")


def test_beams_are_printed_best_first_with_their_scores(capsys):
    status, out, err = run_here(capsys, ROMEO, "--model", TRAINED, "--num-beams", "3", "--num-return-sequences", "2",
                           "--n-tokens", "10")
    assert status == 0, err
    assert out.count("BEAM ") == 2 and out.index("BEAM 1, score -") < out.index("BEAM 2, score -")


def test_min_p_cuts_each_steps_alternatives(capsys):
    out = run_json(capsys, ROMEO, "--model", TRAINED, "--seed", "3", "--min-p", "0.2", "--top", "50", "--n-tokens",
                   "5")
    for step in out["samples"][0]["top"]:
        best = step[0]["prob"]
        assert all(entry["prob"] >= 0.2 * best - 1e-6 or entry["prob"] == 0 for entry in step)
        assert any(entry["prob"] == 0 for entry in step)  # something was cut


@pytest.mark.parametrize("args, message", [
    (["--repetition-penalty", "0"], "--repetition-penalty must be 1e-30 to 1e30 (1 is none), got 0.0"),
    (["--repetition-penalty", "-1.5"], "--repetition-penalty must be 1e-30 to 1e30"),
    (["--repetition-penalty", "1e308"], "--repetition-penalty must be 1e-30 to 1e30"),
    (["--repetition-penalty", "nan"], "--repetition-penalty must be 1e-30 to 1e30"),
    (["--temperature", "1e308"], "--temperature must be 0 (greedy) or 1e-30 to 1e30"),
    (["--temperature", "1e-308"], "--temperature must be 0 (greedy) or 1e-30 to 1e30"),
    (["--temperature", "nan"], "--temperature must be 0 (greedy) or 1e-30 to 1e30"),
    (["--top-p", "nan"], "--top-p must be in (0, 1], got nan"),
    (["--min-p", "inf"], "--min-p must be in [0, 1], got inf"),
    (["--num-beams", "2", "--length-penalty", "1e308"], "--length-penalty must be in [-50, 50], got 1e+308"),
    (["--num-beams", "2", "--length-penalty", "nan"], "--length-penalty must be in [-50, 50], got nan"),
    (["--no-repeat-ngram-size", "-1"], "--no-repeat-ngram-size must be at least 0, got -1"),
    (["--min-p", "1.5"], "--min-p must be in [0, 1], got 1.5"),
    (["--min-p", "-0.1"], "--min-p must be in [0, 1]"),
    (["--stop", ""], "error: --stop is empty: give the text to stop at"),
    (["--num-beams", "0"], "error: --num-beams must be at least 1, got 0"),
    (["--num-return-sequences", "0"], "error: --num-return-sequences must be at least 1, got 0"),
    (["--length-penalty", "long"], "error: --length-penalty must be a number, got 'long'"),
    (["--num-beams", "2", "--num-return-sequences", "3"], "error: --num-return-sequences 3 is more than --num-beams 2: "
                                                          "beam search returns at most its beams"),
    (["--num-beams", "2", "--draft", "lookup"], "--draft and --num-beams 2 (beam search, which samples nothing) do "
                                                "not combine"),
    (["--num-beams", "2", "--n-samples", "2"], "--n-samples is for sampling; --num-beams 2"),
    (["--num-beams", "2", "--temperature", "0.7"], "--temperature is for sampling and does not go with --num-beams 2"),
    (["--num-beams", "2", "--top-k", "5"], "--top-k is for sampling"),
    (["--num-beams", "2", "--top-p", "0.9"], "--top-p is for sampling"),
    (["--num-beams", "2", "--min-p", "0.1"], "--min-p is for sampling"),
    (["--num-beams", "2", "--seed", "1"], "--seed is for sampling"),
    (["--num-beams", "2", "--json", "--top", "3"], "--top with --json gives sampling's alternatives"),
    (["--length-penalty", "2"], "--length-penalty goes with --num-beams 2 or more"),
    (["--early-stopping"], "--early-stopping goes with --num-beams 2 or more"),
    (["--num-return-sequences", "2"], "--num-return-sequences goes with --num-beams 2 or more"),
    (["--draft", "lookup", "--repetition-penalty", "1.2"], "--repetition-penalty and --draft do not combine"),
    (["--num-beams", "2", "--score"], "--num-beams is for generating text; --score reads the text once"),
])
def test_a_mistake_beside_the_decoding_flags_is_one_line_and_exit_2(capsys, args, message):
    status, out, err = run_here(capsys, "hi", "--model", TRAINED, *args)
    assert status == 2 and out == "" and err.count("\n") == 1 and message in err, err


def test_beams_with_greedy_are_still_beam_search(capsys):
    greedy = run_json(capsys, ROMEO, "--model", TRAINED, "--num-beams", "2", "--greedy", "--n-tokens", "8")
    plain = run_json(capsys, ROMEO, "--model", TRAINED, "--num-beams", "2", "--n-tokens", "8")
    assert greedy == plain and "score" in plain["samples"][0]


def test_ctrl_c_during_beam_search_exits_130(monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(decoding, "beam_search", interrupted)
    status, out, err = run_here(capsys, ROMEO, "--model", TRAINED, "--num-beams", "2")
    assert status == 130 and err == "interrupted\n"


def test_a_stop_string_ends_speculative_decoding_where_it_ends_plain_decoding(capsys):
    args = (ROMEO, "--model", TRAINED, "--greedy", "--n-tokens", "16", "--stop", " bei")
    assert run_here(capsys, *args, "--draft", "lookup") == run_here(capsys, *args)


def test_counts_of_one_are_said_in_the_singular(capsys):
    status, out, err = run_here(capsys, "The cat", "--model", HF_TINY, "--score")
    assert status == 0 and "nats/token over 1 prediction, perplexity" in out, out


@pytest.mark.parametrize("flags", [["--n-tokens", "64"], ["--n-tokens", "64", "--num-beams", "2"],
                                   ["--n-tokens", "64", "--draft", "lookup"], ["--n-tokens", "0", "--num-beams", "2"]])
def test_an_empty_prompt_that_cannot_be_is_its_error_alone(capsys, flags):
    """Checked first, then said: no "no prompt" note before the error (64 is the tiny model's whole context)."""
    try:
        status = gpt2_cli.main(["", "--model", HF_TINY, *flags])
    except SystemExit as e:
        status = e.code
    out, err = capsys.readouterr()
    assert status == 2 and out == "" and err.count("\n") == 1 and err.startswith("error: "), err
