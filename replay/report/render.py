"""The report as a document: blocks rendered to Markdown or to one self-contained HTML page."""
from __future__ import annotations

import base64
import html

import numpy as np


def md_table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def html_table(head: list[str], rows: list[list[str]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>\n" for r in rows)
    # a wide table scrolls sideways in its own box instead of being cut or widening the page
    return f"<div class=\"scroll\"><table>\n<thead><tr>{th}</tr></thead>\n<tbody>\n{body}</tbody>\n</table></div>"


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;color:#222;
     max-width:84em;margin:1.5em auto;padding:0 1.2em;line-height:1.45}
h1{font-size:1.5em;margin:0 0 .4em}
h2{font-size:1.15em;margin:1.8em 0 .5em;padding-bottom:.2em;border-bottom:1px solid #ddd}
p{max-width:60em}
.scroll{overflow-x:auto;max-width:100%;margin:.5em 0}
table{border-collapse:collapse;font-size:.9em;font-variant-numeric:tabular-nums}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right;white-space:nowrap}
th{background:#f2f4f7}
td:first-child,th:first-child{text-align:left}
dl.meta{display:grid;grid-template-columns:max-content 1fr;gap:.15em 1.2em;margin:.5em 0 1em;font-size:.92em}
dl.meta dt{font-weight:600;color:#444}
dl.meta dd{margin:0;font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;overflow-wrap:anywhere}
.verdict{padding:.55em 1em;border-radius:4px;font-weight:600;margin:1em 0}
.pass{background:#e7f5ec;color:#1d6b36;border:1px solid #9fd4b0}
.fail{background:#fdecea;color:#a0251b;border:1px solid #efaaa2}
.none{background:#f3f3f3;color:#555;border:1px solid #ddd;font-weight:normal}
figure{margin:.8em 0}
figure img{max-width:100%;height:auto;display:block}
"""


def render(blocks: list[tuple], fmt: str, title: str) -> str:
    """Markdown or HTML from blocks ``("h2", text)``, ``("p", text)``, ``("table", head, rows)``,
    ``("meta", [(label, value), ...])``, ``("verdict", "pass" | "fail" | "none", text)`` and
    ``("img", alt, file, png_bytes)`` (Markdown links ``file``; HTML embeds the bytes)."""
    if fmt == "markdown":
        out = [f"# {title}"]
        for b in blocks:
            if b[0] == "h2":
                out.append(f"## {b[1]}")
            elif b[0] == "p":
                out.append(b[1])
            elif b[0] == "table":
                out.append(md_table(b[1], b[2]))
            elif b[0] == "meta":
                out.append(md_table(["", ""], [[f"**{k}**", v.replace("|", "\\|")] for k, v in b[1]]))
            elif b[0] == "verdict":
                out.append(f"**{b[2]}**" if b[1] != "none" else b[2])
            else:
                out.append(f"![{b[1]}]({b[2]})")
        return "\n\n".join(out) + "\n"
    out = ["<!DOCTYPE html>", "<html lang=\"en\"><head><meta charset=\"utf-8\">",
           "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">",
           f"<title>{html.escape(title)}</title>", f"<style>{_CSS}</style>", "</head><body>",
           f"<h1>{html.escape(title)}</h1>"]
    for b in blocks:
        if b[0] == "h2":
            out.append(f"<h2>{html.escape(b[1])}</h2>")
        elif b[0] == "p":
            out.append(f"<p>{html.escape(b[1])}</p>")
        elif b[0] == "table":
            out.append(html_table(b[1], b[2]))
        elif b[0] == "meta":
            out.append("<dl class=\"meta\">" + "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>"
                                                        for k, v in b[1]) + "</dl>")
        elif b[0] == "verdict":
            out.append(f"<p class=\"verdict {b[1]}\">{html.escape(b[2])}</p>")
        else:
            data = base64.b64encode(b[3]).decode("ascii")
            out.append(f"<figure><img alt=\"{html.escape(b[1])}\" src=\"data:image/png;base64,{data}\"></figure>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def ms(x: float) -> str:
    return "-" if not np.isfinite(x) else f"{x * 1e3:.1f}"


def pct(x: float) -> str:
    return "-" if not np.isfinite(x) else f"{x:+.1%}"
