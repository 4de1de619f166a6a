"""One self-contained HTML page of a pruned attribution graph (circuits.py graph --html PAGE.html), to open from disk.

The nodes stand where they act: a column a position of the prompt (its token under it), a row a layer, the
tokens at the bottom and the logits at the top; features are circles, error nodes grey squares. An edge is a line
from its source up to its target, blue where it adds to the target's pre-activation and red where it takes away,
as thick as its weight. Hovering over a node lights its edges and shows it in the panel: what it is, its
activation and influence, its inputs and outputs (the largest weights first), and for a feature the tokens its
decoder promotes and suppresses most through the unembedding (W_dec · W_U). A click keeps a node chosen. Nothing
is fetched: the data, the styles and the script are in the file.
"""

from interface import html_page


def page_data(content, top_logits, title, n_layer):
    """What the page shows, as JSON-ready values. content: graph_files.graph_json's object; top_logits: {a feature's
    node_id: ([(token, value)] promoted, [(token, value)] suppressed)}."""
    nodes = content["nodes"]
    index = {v["node_id"]: i for i, v in enumerate(nodes)}
    kinds = {"cross layer transcoder": "feature", "mlp reconstruction error": "error", "embedding": "token",
             "logit": "logit"}
    shown = [{"id": v["node_id"], "kind": kinds[v["feature_type"]], "pos": v["ctx_idx"],
              "layer": -1 if v["layer"] == "E" else int(v["layer"]), "influence": v["influence"],
              "activation": v["activation"], "prob": v["token_prob"], "clerp": v["clerp"],
              "logits": top_logits.get(v["node_id"])} for v in nodes]
    links = [[index[e["source"]], index[e["target"]], round(e["weight"], 6)] for e in content["links"]]
    return {"title": title, "tokens": content["metadata"]["prompt_tokens"], "n_layer": n_layer, "nodes": shown,
            "links": links}


def render_page(data):
    """The page's HTML, with `data` (page_data) inside it: html_page's, with this page's template."""
    return html_page.render_page(data, PAGE)


PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{{TITLE}}</title>
<style>
  body { font: 14px system-ui, sans-serif; margin: 20px; color: #222; background: #fff; }
  h1 { font-size: 20px; margin: 0 0 4px; } .note { color: #666; font-size: 12px; margin: 4px 0 10px; }
  #wrap { display: flex; gap: 16px; align-items: flex-start; } #scroll { overflow-x: auto; max-width: calc(100vw - 420px); }
  #graph { border: 1px solid #ddd; background: #fcfcfc; }
  #panel { width: 340px; font-size: 12px; border: 1px solid #ddd; padding: 8px 10px; min-height: 200px; }
  #panel h2 { font-size: 14px; margin: 0 0 6px; } #panel table { border-collapse: collapse; width: 100%; }
  #panel td { padding: 1px 4px; font-family: ui-monospace, monospace; white-space: pre; overflow: hidden;
              text-overflow: ellipsis; max-width: 200px; }
  #panel td.w { text-align: right; } .pos { color: #3165c4; } .neg { color: #d6483a; }
  .edge { fill: none; stroke-linecap: round; } .dim .edge { opacity: 0.06; } .dim .edge.lit { opacity: 0.95; }
  .node { cursor: pointer; } .node.lit > :first-child { stroke: #111; stroke-width: 2.5; }
  .label { font: 11px ui-monospace, monospace; fill: #333; } .axis { font: 11px system-ui; fill: #888; }
</style>
</head>
<body>
<h1>{{TITLE}}</h1>
<div class="note">The pruned attribution graph: features (circles) and error nodes (grey squares) by layer and
position, from the tokens (bottom) to the logits (top). Blue edges add to their target's pre-activation, red ones
take away; thicker is larger. Hover over a node for its inputs and outputs; click to keep it chosen (or open PAGE.html#NODE_ID).</div>
<div id="wrap"><div id="scroll"><svg id="graph"></svg></div><div id="panel"><h2>No node chosen</h2>
<div class="note">Hover over a node.</div></div></div>
<script type="application/json" id="data">{{DATA}}</script>
<script>
"use strict";
(() => {  // nothing global: window.top, window.name are the browser's
const D = JSON.parse(document.getElementById("data").textContent);
const T = D.tokens.length, L = D.n_layer, NS = "http://www.w3.org/2000/svg";
const show = s => JSON.stringify(s).slice(1, -1);
const colW = Math.max(30, Math.min(140, Math.floor((window.innerWidth - 500) / T))), rowH = 70, left = 60, top = 30;
const W = left + T * colW + 20, H = top + (L + 2) * rowH + 40;
const svg = document.getElementById("graph");
svg.setAttribute("width", W); svg.setAttribute("height", H);
const rowOf = n => n.kind === "logit" ? L + 1 : n.layer + 1;  // tokens row 0, layer l row l + 1, logits row L + 1
const yOf = row => top + (L + 1 - row) * rowH + rowH / 2;
const cells = {};
D.nodes.forEach((n, i) => { const key = rowOf(n) + "," + n.pos; (cells[key] = cells[key] || []).push(i); });
Object.values(cells).forEach(list => {
  list.sort((a, b) => (D.nodes[b].influence || 0) - (D.nodes[a].influence || 0));
  const step = Math.min(18, (colW - 16) / Math.max(1, list.length));
  list.forEach((i, j) => { const n = D.nodes[i];
    n.x = left + n.pos * colW + colW / 2 + (j - (list.length - 1) / 2) * step; n.y = yOf(rowOf(n)); });
});
D.nodes.filter(n => n.kind === "logit").forEach((n, j) => {  // the logits, most probable on the right, spread out
  n.x = left + (T - 1) * colW + colW / 2 - j * 84; n.y = yOf(L + 1) - 14 * (j % 2); });
function el(name, attrs, parent) { const e = document.createElementNS(NS, name);
  for (const k in attrs) e.setAttribute(k, attrs[k]); (parent || svg).appendChild(e); return e; }
for (let r = 0; r <= L + 1; r++) {
  el("line", {x1: left, x2: W - 20, y1: yOf(r), y2: yOf(r), stroke: "#eee"});
  el("text", {x: 6, y: yOf(r) + 4, class: "axis"}).textContent = r === 0 ? "tokens" : r === L + 1 ? "logits" : "layer " + (r - 1);
}
D.tokens.forEach((t, p) => { const x = left + p * colW + colW / 2;
  el("text", {x: x, y: H - 12 - 12 * (p % 2), "text-anchor": "middle", class: "label"}).textContent =
    show(t).slice(0, Math.max(4, Math.floor(colW / 5))); });
const maxW = Math.max(1e-12, ...D.links.map(l => Math.abs(l[2])));
const edges = el("g", {});
const edgeEls = D.links.map(([s, t, w]) => { const a = D.nodes[s], b = D.nodes[t], mid = (a.y + b.y) / 2;
  return el("path", {d: `M${a.x},${a.y} C${a.x},${mid} ${b.x},${mid} ${b.x},${b.y}`, class: "edge",
    stroke: w > 0 ? "#3165c4" : "#d6483a", "stroke-width": 0.4 + 4 * Math.abs(w) / maxW,
    opacity: 0.15 + 0.6 * Math.abs(w) / maxW}, edges); });
const nodeEls = D.nodes.map((n, i) => {
  const g = el("g", {class: "node"});
  if (n.kind === "feature") el("circle", {cx: n.x, cy: n.y, r: 6, fill: "#f2b134", stroke: "#8a6414"}, g);
  else if (n.kind === "error") el("rect", {x: n.x - 5, y: n.y - 5, width: 10, height: 10, fill: "#bbb", stroke: "#777"}, g);
  else { el("rect", {x: n.x - 7, y: n.y - 7, width: 14, height: 14, rx: 3, fill: n.kind === "logit" ? "#9fd39b" : "#cfd8e6",
                     stroke: "#667"}, g);
         if (n.kind === "logit") el("text", {x: n.x, y: n.y - 11, "text-anchor": "middle", class: "label"}, g).textContent =
           n.clerp.replace(/^Output /, "").slice(0, 18); }
  g.onmouseenter = () => { if (chosen === null) choose(i); };
  g.onclick = () => { chosen = chosen === i ? null : i; choose(i); };
  return g; });
let chosen = null;
function nodeName(n) { return n.kind === "feature" ? "feature " + n.id.split("_")[1] + " (layer " + n.layer + ")" :
  n.kind === "error" ? "error, layer " + n.layer : n.kind === "token" ? "token '" + show(D.tokens[n.pos]) + "'" : n.clerp; }
function rows(list) { return list.sort((a, b) => Math.abs(b[1]) - Math.abs(a[1])).slice(0, 12).map(([i, w]) =>
  `<tr><td>${esc(nodeName(D.nodes[i]))} @${D.nodes[i].pos}</td><td class="w ${w > 0 ? "pos" : "neg"}">${w.toFixed(4)}</td></tr>`).join(""); }
function esc(s) { return s.replace(/[&<>"]/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"})[c]); }
function choose(i) {
  const n = D.nodes[i], ins = [], outs = [];
  svg.classList.add("dim");
  nodeEls.forEach((g, j) => g.classList.toggle("lit", j === i));
  D.links.forEach(([s, t, w], k) => { const lit = s === i || t === i; edgeEls[k].classList.toggle("lit", lit);
    if (t === i) ins.push([s, w]); if (s === i) outs.push([t, w]); });
  let text = `<h2>${esc(nodeName(n))}</h2><div>position ${n.pos} '${esc(show(D.tokens[n.pos]))}'` +
    (n.activation !== null ? `, activation ${n.activation.toFixed(4)}` : "") +
    (n.influence !== null ? `, cumulative influence ${n.influence.toFixed(3)}` : "") + `</div>`;
  if (n.logits) text += `<h2>its decoder's top logits</h2><table>` + n.logits[0].map(([t, v]) =>
    `<tr><td>'${esc(show(t))}'</td><td class="w pos">${v.toFixed(3)}</td></tr>`).join("") + n.logits[1].map(([t, v]) =>
    `<tr><td>'${esc(show(t))}'</td><td class="w neg">${v.toFixed(3)}</td></tr>`).join("") + `</table>`;
  text += `<h2>inputs (${ins.length})</h2><table>${rows(ins)}</table><h2>outputs (${outs.length})</h2><table>${rows(outs)}</table>`;
  document.getElementById("panel").innerHTML = text;
}
const asked = D.nodes.findIndex(n => "#" + n.id === decodeURIComponent(location.hash));  // PAGE.html#NODE_ID
if (asked >= 0) { chosen = asked; choose(asked); }
svg.onmouseleave = () => { if (chosen === null) { svg.classList.remove("dim");
  nodeEls.forEach(g => g.classList.remove("lit")); edgeEls.forEach(e => e.classList.remove("lit")); } };
})();
</script>
</body>
</html>
"""
