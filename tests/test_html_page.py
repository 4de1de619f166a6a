"""html_page.py: one self-contained page; its numbers are the computed arrays within the byte
quantization, it names nothing outside itself, and it stays small."""
import base64
import json
import os
import re

import numpy as np
import pytest

import bpe
from conftest import VOCAB, checkpoint_dir
import look_inside as li
from interface import html_page
from plumbing.checkpoint import load_checkpoint


def embedded(page):
    return json.loads(re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S).group(1))


@pytest.fixture(scope="module")
def tiny_page(tmp_path_factory):
    encoder = bpe.get_encoder(VOCAB)
    hp, params = load_checkpoint(checkpoint_dir("tiny"))
    ids = encoder.encode("The cat sat on the mat. The cat sat on the")
    path = tmp_path_factory.mktemp("page") / "page.html"
    size = html_page.write_page(str(path), ids, encoder, params, hp, title="tiny </script><b>")
    return path.read_text(encoding="utf-8"), size, ids, encoder, hp, params


def test_the_page_holds_the_computed_numbers_within_the_quantization(tiny_page):
    page, size, ids, encoder, hp, params = tiny_page
    data = embedded(page)
    L, H, T = hp["n_layer"], hp["n_head"], len(ids)
    logits, cache = li.run_with_cache([ids], params, hp)
    patterns = np.stack([cache[f"blocks.{i}.attn.hook_pattern"][0] for i in range(L)])
    stored = np.frombuffer(base64.b64decode(data["attention"]), np.uint8).reshape(L, H, T, T) / 255
    assert np.abs(stored - patterns).max() <= 0.5 / 255 + 1e-7
    lens = li.logit_lens([ids], params, hp)
    assert data["lens_tokens"] == [[encoder.decode([int(i)]) for i in row] for row in lens["top"][:, 0]]
    assert np.abs(np.array(data["lens_probs"]) - lens["top_prob"][:, 0]).max() <= 5e-5
    assert data["tokens"] == [encoder.decode([i]) for i in ids] and data["layers"] == ["embed", "h0", "h1"]
    top, probs, _ = li.next_token_table(logits[0, -1], 10)
    assert [n["token"] for n in data["next"]] == [encoder.decode([int(i)]) for i in top]
    assert np.allclose([n["prob"] for n in data["next"]], probs, atol=1e-6)
    assert size == len(page.encode("utf-8"))


def test_the_page_names_nothing_outside_itself(tiny_page):
    page = tiny_page[0]
    assert not re.search(r"https?:|//[a-z]|\bsrc=|\bhref=|@import|url\(", page, re.I)
    assert page.count("<script") == 2 and "<link" not in page
    assert "</script><b>" not in page.split("<body>")[0]  # the title is escaped


def test_a_124m_page_at_64_tokens_stays_under_5_mb():
    rng = np.random.default_rng(0)
    L, H, T = 12, 12, 64
    patterns = rng.random((L, H, T, T)).astype(np.float32)
    words = ["".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), 12)) for _ in range(T)]  # long tokens
    data = html_page.page_data(words, patterns, [words] * (L + 1), rng.random((L + 1, T)), [str(i) for i in range(13)],
                               [(w, 0.1, -2.3) for w in words[:10]], "124M")
    size = len(html_page.render_page(data).encode("utf-8"))
    assert size < 5_000_000 and size > L * H * T * T  # the weights are in it, as bytes


def test_a_page_that_cannot_be_written_leaves_nothing(tmp_path):
    encoder = bpe.get_encoder(VOCAB)
    hp, params = load_checkpoint(checkpoint_dir("tiny"))
    with pytest.raises(html_page.UserError, match="cannot write the page"):
        html_page.write_page(str(tmp_path / "missing" / "page.html"), [1, 2], encoder, params, hp)
    (tmp_path / "a folder").mkdir()
    with pytest.raises(html_page.UserError, match="a folder: cannot write the page"):  # the rename fails
        html_page.write_page(str(tmp_path / "a folder"), [1, 2], encoder, params, hp)
    assert os.listdir(tmp_path) == ["a folder"] and os.listdir(tmp_path / "a folder") == []  # no temporary file


def test_too_long_a_prompt_for_a_page_is_refused_before_any_work():
    hp = {"n_vocab": 50257, "n_ctx": 1024, "n_embd": 1600, "n_head": 25, "n_layer": 48}
    with pytest.raises(html_page.UserError, match="use a shorter prompt"):
        html_page.write_page("unused.html", list(range(1024)), None, None, hp)
    assert not os.path.exists("unused.html")


def test_the_page_runs_the_model_once_and_labels_the_lens_as_the_table_does(tmp_path, monkeypatch):
    encoder = bpe.get_encoder(VOCAB)
    hp, params = load_checkpoint(checkpoint_dir("tiny"))
    calls = []
    forward = li.gpt2
    monkeypatch.setattr(li, "gpt2", lambda *a, **k: calls.append(1) or forward(*a, **k))
    html_page.write_page(str(tmp_path / "p.html"), encoder.encode("one two three"), encoder, params, hp)
    assert len(calls) == 1
    assert li.lens_labels(2) == ["embed", "h0", "h1"]
    assert embedded((tmp_path / "p.html").read_text(encoding="utf-8"))["layers"] == li.lens_labels(hp["n_layer"])


def test_the_page_of_a_model_with_an_sae_spliced_in_is_the_spliced_runs(tmp_path):
    """write_page(sae=, hooks=): gpt2_numpy.py --html --sae. The attention after the SAE, the lens and the next
    tokens are the spliced model's, and the title says what is spliced."""
    import sae as S
    from conftest import DATA
    from plumbing import hf_model, sae_files

    hp, params, _ = hf_model.load_hf_folder(os.path.join(DATA, "hf", "tiny"))
    encoder = bpe.get_encoder(VOCAB)
    ids = encoder.encode("First Citizen: we are accounted poor")
    spliced = S.splice(sae_files.load_sae(os.path.join(DATA, "sae_golden", "sae")))
    hooks = S.centring_hooks(hp["n_layer"])
    html_page.write_page(str(tmp_path / "p.html"), ids, encoder, params, hp, title="tiny", sae=spliced, hooks=hooks)
    data = embedded((tmp_path / "p.html").read_text(encoding="utf-8"))
    logits, cache = li.run_with_cache([ids], params, hp, sae=spliced, hooks=hooks)
    T = len(ids)
    stored = np.frombuffer(base64.b64decode(data["attention"]), np.uint8).reshape(2, 2, T, T) / 255
    assert np.abs(stored[1] - cache["blocks.1.attn.hook_pattern"][0]).max() <= 0.5 / 255 + 1e-7
    top, probs, _ = li.next_token_table(logits[0, -1], 10)
    assert [n["token"] for n in data["next"]] == [encoder.decode([int(i)]) for i in top]
    assert np.allclose([n["prob"] for n in data["next"]], probs, atol=1e-6)
    plain = li.run_with_cache([ids], params, hp)[0]
    assert np.abs(li.next_token_table(plain[0, -1], 10)[1] - probs).max() > 1e-4  # the SAE changed them
    assert data["title"] == "tiny, the SAE at blocks.1.hook_resid_pre spliced in"
