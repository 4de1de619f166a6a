"""One self-contained HTML page of a circuits.py experiment: its result as a heatmap, to open from disk.

    python circuits.py patch --clean "..." --corrupted "..." --answer " Mary" --wrong " John" --html patch.html

The page shows the prompt's tokens and one table of coloured cells (layers x positions, layers x heads, or
a column of shares): blue above the centre value, red below it, white at it, the colour's strength the
distance over the largest one; hovering over a cell shows its row, its column and its value. A cell not
measured (None: path patching's layers up to the source) is left grey and out of the scale. The centre is
the corrupted run's metric for a patching sweep (0 once normalized) and 0 otherwise. Nothing is fetched:
the data and the styles are in the file, and there is no script.
"""
import html

from plumbing import folders


def colour(value, center, scale):
    """White at center, to blue (above) or red (below) at center ± scale: an rgb() for a cell's background."""
    t = max(-1.0, min(1.0, (value - center) / scale)) if scale > 0 else 0.0
    target = (49, 101, 196) if t > 0 else (214, 72, 58)
    r, g, b = (round(255 + abs(t) * (c - 255)) for c in target)
    return f"rgb({r},{g},{b})"


def render_page(title, description, tokens, rows, columns, values, center):
    """The page's HTML. values [rows][columns], None where not measured; center: the value shown white."""
    scale = max((abs(v - center) for row in values for v in row if v is not None), default=0.0)
    esc = html.escape
    head = "".join(f"<th>{esc(str(c))}</th>" for c in columns)
    body = []
    for r, row in zip(rows, values):
        cells = "".join(f'<td class="none" title="{esc(str(r))}, {esc(str(c))}: not measured"></td>' if v is None else
                        f'<td style="background:{colour(v, center, scale)}" title="{esc(str(r))}, {esc(str(c))}: '
                        f'{v:.6g}">{v:.2f}</td>' for c, v in zip(columns, row))
        body.append(f"<tr><th>{esc(str(r))}</th>{cells}</tr>")
    tokens_html = "".join(f'<span class="tok">{esc(t)}</span>' for t in tokens)
    return PAGE.format(title=esc(title), description=esc(description), tokens=tokens_html, head=head,
                       body="\n".join(body), center=f"{center:.4g}", scale=f"{scale:.4g}")


def write_page(path, title, description, tokens, rows, columns, values, center):
    """Write the page (render_page's) to path, whole or not at all. -> its size in bytes"""
    return folders.write_page(path, render_page(title, description, tokens, rows, columns, values, center))


PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
  body {{ font: 14px system-ui, sans-serif; margin: 20px; color: #222; background: #fff; }}
  h1 {{ font-size: 20px; margin: 0 0 4px; }} .note {{ color: #666; font-size: 12px; margin: 6px 0 14px; }}
  .tok {{ display: inline-block; padding: 1px 4px; margin: 1px; border: 1px solid #ccc; border-radius: 3px;
          font-family: ui-monospace, monospace; white-space: pre; background: #f7f7f7; }}
  table {{ border-collapse: collapse; margin-top: 14px; }}
  td, th {{ padding: 3px 6px; font-size: 12px; text-align: right; font-family: ui-monospace, monospace; }}
  td {{ border: 1px solid #fff; min-width: 42px; }} th {{ font-weight: normal; color: #555; white-space: pre; }}
  td.none {{ background: #f7f7f7; }}
</style>
</head>
<body>
<h1>{title}</h1>
<div class="note">{description}</div>
<div>{tokens}</div>
<table>
<tr><th></th>{head}</tr>
{body}
</table>
<div class="note">white: {center}; full blue: {center} + {scale}, full red: {center} - {scale}. Hover over a cell for
its value.</div>
</body>
</html>
"""
