"""One self-contained HTML page of what look_inside.py computes, to open from disk.

    python gpt2_numpy.py "The cat sat on the mat. The cat" --html cat.html

It shows the prompt's tokens, every layer's attention (one small heatmap per head; pick a
layer and a head for a large one with token labels, and hover for the weight), the
logit-lens grid coloured by probability, and the next-token table. Nothing is fetched: the
data, the styles and the script are all in the file. The attention weights are stored as
bytes (0..255 for 0..1, so within 1/510 of the computed values) to keep the page small.
"""
import base64
import html
import json

import numpy as np

import look_inside
from plumbing import device, folders
from plumbing.errors import UserError

MAX_BYTES = 100_000_000  # past this, a browser struggles: the prompt should be shorter
N_NEXT = 10


def quantize(weights):
    """Attention weights in [0, 1] -> bytes 0..255 (round to nearest)."""
    return np.round(np.clip(weights, 0, 1) * 255).astype(np.uint8)


def page_data(tokens, patterns, lens_tokens, lens_probs, layers, next_tokens, title):
    """Everything the page shows, as JSON-ready values.
    patterns [L, H, T, T]; lens_tokens, lens_probs [L+1, T]; next_tokens [(token, prob, logprob)]."""
    L, H, T, _ = patterns.shape
    return {"title": title, "tokens": tokens, "n_layer": L, "n_head": H,
            "attention": base64.b64encode(quantize(patterns).tobytes()).decode("ascii"),
            "layers": layers, "lens_tokens": lens_tokens, "lens_probs": np.round(lens_probs, 4).tolist(),
            "next": [{"token": t, "prob": round(float(p), 6), "logprob": round(float(lp), 6)}
                     for t, p, lp in next_tokens]}


def render_page(data, page=None):
    """The page's HTML (PAGE, or another page's template with {{TITLE}} and {{DATA}}), with `data` (page_data)
    inside it."""
    payload = json.dumps(data, ensure_ascii=True).replace("</", "<\\/")  # no "</script>" can end it early
    return (page or PAGE).replace("{{TITLE}}", html.escape(data["title"])).replace("{{DATA}}", payload)


def write_page(path, ids, encoder, params, hparams, title="GPT-2", n_next=N_NEXT, sae=None, hooks=None,
               tuned_lens=None):
    """Run the model on ids, write the page to path (whole, or not at all); -> its size in bytes.
    n_next: the rows of the next-token table. sae, hooks: look_inside.run_with_cache's (an SAE spliced in, the
    centring): the page is the spliced model's, and its title says so. tuned_lens: a lens's translators; its
    reading of ids (lens.tuned_lens, from the same run) is shown as a second grid beside the logit lens's."""
    L, H, T = hparams["n_layer"], hparams["n_head"], len(ids)
    estimate = L * H * T * T * 4 // 3
    if estimate > MAX_BYTES:
        raise UserError(f"the page for {T} tokens would hold {estimate / 1e6:,.0f} MB of attention weights: "
                        "use a shorter prompt")
    names = look_inside.lens_activations(L) + [f"blocks.{i}.attn.hook_pattern" for i in range(L)]
    logits, cache = look_inside.run_with_cache([ids], params, hparams, names=names, sae=sae, hooks=hooks)  # once
    title = f"{title}, the SAE at {sae[0]} spliced in" if sae else title
    patterns = device.host(np.stack([cache[f"blocks.{i}.attn.hook_pattern"][0] for i in range(L)]))  # [L, H, T, T]
    lens = device.to_host(look_inside.logit_lens([ids], params, hparams, run=(logits, cache)))  # a page is the host's
    top, probs, logprobs = look_inside.next_token_table(logits[0, -1], n_next)
    data = page_data([encoder.decode([i]) for i in ids], patterns,
                     [[encoder.decode([int(i)]) for i in row] for row in lens["top"][:, 0]], lens["top_prob"][:, 0],
                     look_inside.lens_labels(L),
                     [(encoder.decode([int(i)]), p, lp) for i, p, lp in zip(top, probs, logprobs)], title)
    if tuned_lens is not None:
        import lens as tuned_lens_chapter  # only with --tuned-lens

        tuned = device.to_host(tuned_lens_chapter.tuned_lens([ids], params, hparams, tuned_lens, run=(logits, cache)))
        data |= {"tuned_tokens": [[encoder.decode([int(i)]) for i in row] for row in tuned["top"][:, 0]],
                 "tuned_probs": np.round(tuned["top_prob"][:, 0], 4).tolist()}
    return folders.write_page(path, render_page(data))


PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Inside {{TITLE}}</title>
<style>
  body { font: 14px system-ui, sans-serif; margin: 20px; color: #222; background: #fff; }
  h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 22px 0 8px; }
  .note { color: #666; font-size: 12px; }
  .tok { display: inline-block; padding: 1px 4px; margin: 1px; border: 1px solid #ccc; border-radius: 3px;
         font-family: ui-monospace, monospace; white-space: pre; background: #f7f7f7; }
  .tok.hot { background: #ffd27f; }
  #heads { display: flex; flex-wrap: wrap; gap: 6px; margin: 6px 0; }
  #heads figure { margin: 0; text-align: center; font-size: 11px; cursor: pointer; }
  #heads figcaption { display: block; }
  #heads canvas { border: 1px solid #ccc; } #heads figure.on canvas { border: 2px solid #d33; }
  #big { border: 1px solid #999; }
  #tip { position: fixed; pointer-events: none; background: #222; color: #fff; padding: 3px 6px; border-radius: 3px;
         font-size: 12px; display: none; white-space: pre; }
  table { border-collapse: collapse; } td, th { padding: 2px 5px; font-size: 12px; }
  #lens td, #tuned td { font-family: ui-monospace, monospace; white-space: pre; border: 1px solid #eee; max-width: 90px;
             overflow: hidden; text-overflow: ellipsis; }
  #lens th, #tuned th { font-weight: normal; color: #666; }
  #next td { border-bottom: 1px solid #eee; font-family: ui-monospace, monospace; }
  .bar { display: inline-block; height: 10px; background: #4a7fd0; }
</style>
</head>
<body>
<h1>Inside {{TITLE}}</h1>
<div class="note">gpt2-numpy: one forward pass over the prompt. Hover over a heatmap for the weights.</div>
<h2>The prompt's tokens</h2>
<div id="tokens"></div>
<h2>Attention</h2>
<label>layer <select id="layer"></select></label>
<label>head <select id="head"></select></label>
<span class="note">each row is a query position, each column a key it may look at (rows sum to 1)</span>
<div id="heads"></div>
<canvas id="big"></canvas>
<h2>The logit lens</h2>
<div class="note">each layer's most likely next token at each position: ln_f(residual stream) @ wte&#7488;;
darker is more probable; the last row is the model's prediction</div>
<div style="overflow-x: auto"><table id="lens"></table></div>
<div id="tuned-part" style="display: none">
<h2>The tuned lens</h2>
<div class="note">the same, each layer's residual stream first moved by its translator, h + h A&#7488; + b, trained so that
its reading matches the model's final distribution (lens.py)</div>
<div style="overflow-x: auto"><table id="tuned"></table></div>
</div>
<h2>The next token</h2>
<table id="next"></table>
<div id="tip"></div>
<script type="application/json" id="data">{{DATA}}</script>
<script>
"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
const T = D.tokens.length, L = D.n_layer, H = D.n_head;
const raw = atob(D.attention), A = new Uint8Array(raw.length);
for (let i = 0; i < raw.length; i++) A[i] = raw.charCodeAt(i);
const weight = (l, h, q, k) => A[((l * H + h) * T + q) * T + k] / 255;
const show = s => JSON.stringify(s).slice(1, -1);
const tip = document.getElementById("tip");
function tipAt(ev, text) { tip.textContent = text; tip.style.display = "block";
  tip.style.left = (ev.clientX + 12) + "px"; tip.style.top = (ev.clientY + 12) + "px"; }
function hideTip() { tip.style.display = "none"; }

const tokenSpans = D.tokens.map((t, i) => { const s = document.createElement("span"); s.className = "tok";
  s.textContent = t; s.title = "position " + i; document.getElementById("tokens").appendChild(s); return s; });

function heat(v) { const c = Math.round(255 * (1 - v)); return "rgb(" + c + "," + c + ",255)"; }
function draw(canvas, l, h, cell, labels) {
  const pad = labels ? 90 : 0;
  canvas.width = pad + T * cell; canvas.height = pad + T * cell;
  const g = canvas.getContext("2d");
  g.fillStyle = "#fff"; g.fillRect(0, 0, canvas.width, canvas.height);
  for (let q = 0; q < T; q++) for (let k = 0; k < T; k++) {
    g.fillStyle = k > q ? "#eee" : heat(weight(l, h, q, k));
    g.fillRect(pad + k * cell, pad + q * cell, cell, cell);
  }
  if (!labels) return;
  g.fillStyle = "#222"; g.font = Math.min(12, cell) + "px monospace"; g.textBaseline = "middle";
  for (let i = 0; i < T; i++) {
    const name = show(D.tokens[i]).slice(0, 10);
    g.textAlign = "right"; g.fillText(name, pad - 4, pad + i * cell + cell / 2);
    g.save(); g.translate(pad + i * cell + cell / 2, pad - 4); g.rotate(-Math.PI / 2);
    g.textAlign = "left"; g.fillText(name, 0, 0); g.restore();
  }
  canvas.onmousemove = ev => {
    const r = canvas.getBoundingClientRect();
    const k = Math.floor((ev.clientX - r.left - pad) / cell), q = Math.floor((ev.clientY - r.top - pad) / cell);
    tokenSpans.forEach((s, i) => s.classList.toggle("hot", i === q || i === k));
    if (q < 0 || k < 0 || q >= T || k >= T) return hideTip();
    tipAt(ev, "layer " + l + " head " + h + "\\nfrom " + q + " '" + show(D.tokens[q]) + "' to " + k + " '" +
      show(D.tokens[k]) + "'\\nweight " + (k > q ? "0 (future: masked)" : weight(l, h, q, k).toFixed(3)));
  };
  canvas.onmouseleave = () => { hideTip(); tokenSpans.forEach(s => s.classList.remove("hot")); };
}
const layerSel = document.getElementById("layer"), headSel = document.getElementById("head");
for (let l = 0; l < L; l++) layerSel.add(new Option(l, l));
for (let h = 0; h < H; h++) headSel.add(new Option(h, h));
function update() {
  const l = +layerSel.value, h = +headSel.value, heads = document.getElementById("heads");
  heads.innerHTML = "";
  const small = Math.max(1, Math.floor(96 / T));
  for (let j = 0; j < H; j++) {
    const f = document.createElement("figure"), c = document.createElement("canvas");
    f.className = j === h ? "on" : ""; draw(c, l, j, small, false);
    const caption = document.createElement("figcaption"); caption.textContent = "head " + j;
    f.appendChild(c); f.appendChild(caption);
    f.onclick = () => { headSel.value = j; update(); };
    heads.appendChild(f);
  }
  draw(document.getElementById("big"), l, h, Math.max(3, Math.min(28, Math.floor(640 / T))), true);
}
layerSel.onchange = update; headSel.onchange = update; update();

function grid(table, tokens, probs) {
  const head = table.insertRow(); head.appendChild(document.createElement("th"));
  D.tokens.forEach(t => { const th = document.createElement("th"); th.textContent = show(t); head.appendChild(th); });
  D.layers.forEach((name, l) => {
    const row = table.insertRow(), th = document.createElement("th"); th.textContent = name; row.appendChild(th);
    tokens[l].forEach((t, i) => { const td = row.insertCell(), p = probs[l][i];
      td.textContent = show(t); td.style.background = "rgba(74,127,208," + p.toFixed(3) + ")";
      if (p > 0.5) td.style.color = "#fff";
      td.title = name + ", after '" + show(D.tokens[i]) + "': '" + show(t) + "' p = " + p.toFixed(4); });
  });
}
grid(document.getElementById("lens"), D.lens_tokens, D.lens_probs);
if (D.tuned_tokens) {
  document.getElementById("tuned-part").style.display = "";
  grid(document.getElementById("tuned"), D.tuned_tokens, D.tuned_probs);
}

const next = document.getElementById("next");
next.innerHTML = "<tr><th>token</th><th>prob</th><th>log p</th><th></th></tr>";
D.next.forEach(n => { const r = next.insertRow();
  r.insertCell().textContent = "'" + show(n.token) + "'"; r.insertCell().textContent = n.prob.toFixed(4);
  r.insertCell().textContent = n.logprob.toFixed(3);
  const bar = document.createElement("span"); bar.className = "bar"; bar.style.width = (200 * n.prob) + "px";
  r.insertCell().appendChild(bar); });
</script>
</body>
</html>
"""
