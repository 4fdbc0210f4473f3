"""The report's document: headings, paragraphs, tables and figures, rendered to Markdown (figures
as files beside it) and to one self-contained HTML page (CSS inline, figures as base64 PNG)."""

from __future__ import annotations

import base64
import html
import io
import re
from dataclasses import dataclass, field

from orchestrator.analysis.markdown import table_lines


@dataclass
class Doc:
    """A report under construction: an ordered list of blocks (heading, paragraph, table, figure)."""

    title: str
    blocks: list = field(default_factory=list)

    def h(self, text: str, level: int = 2):
        self.blocks.append(("h", level, text))

    def p(self, text: str):
        self.blocks.append(("p", text))

    def note(self, text: str):
        """A small paragraph under a table: what its cells mean, why a cell says n/a (once per
        document: the same explanation under every table of its kind would only be noise)."""
        if not any(b[0] == "note" and b[1] == text for b in self.blocks):
            self.blocks.append(("note", text))

    def table(self, headers: list[str], rows: list[list], caption: str | None = None, align: str | None = None):
        """``align``: one character per column, ``l`` or ``r`` (default: first l, the rest r)."""
        align = align or "l" + "r" * (len(headers) - 1)
        self.blocks.append(("table", headers, [[str(c) for c in r] for r in rows], caption, align))

    def figure(self, name: str, fig, caption: str):
        """A matplotlib figure, as PNG (``fig`` None: nothing)."""
        if fig is None:
            return
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
        self._image(name, buf.getvalue(), caption, "png")

    def animation(self, name: str, gif: bytes, caption: str):
        """An animated GIF (a bug's episodes side by side)."""
        self._image(name, gif, caption, "gif")

    def _image(self, name: str, data: bytes, caption: str, ext: str):
        taken = {n for n, _ in self.images()}
        base, i = name, 2
        while f"{name}.{ext}" in taken:
            name, i = f"{base}-{i}", i + 1
        self.blocks.append(("img", name, data, caption, ext))

    def images(self) -> list[tuple[str, bytes]]:
        """``(file name, bytes)`` of every image, in order."""
        return [(f"{b[1]}.{b[4]}", b[2]) for b in self.blocks if b[0] == "img"]

    def markdown(self, fig_dir: str) -> str:
        out = [f"# {self.title}", ""]
        for b in self.blocks:
            if b[0] == "h":
                out += ["#" * b[1] + " " + b[2], ""]
            elif b[0] == "p":
                out += [b[1], ""]
            elif b[0] == "note":
                out += [b[1], ""]
            elif b[0] == "table":
                _, headers, rows, caption, align = b
                if caption:
                    out += [f"*{caption}*", ""]
                out += table_lines(headers, rows, align) + [""]
            elif b[0] == "img":
                out += [f"![{b[3]}]({fig_dir}/{b[1]}.{b[4]})", "", f"*{b[3]}*", ""]
        return "\n".join(out)

    def html(self) -> str:
        body = [f"<h1>{_inline(self.title)}</h1>"]
        for b in self.blocks:
            if b[0] == "h":
                body.append(f"<h{b[1]}>{_inline(b[2])}</h{b[1]}>")
            elif b[0] == "p":
                body.append(f"<p>{_inline(b[1])}</p>")
            elif b[0] == "note":
                body.append(f'<p class="note">{_inline(b[1])}</p>')
            elif b[0] == "table":
                _, headers, rows, caption, align = b
                cap = f"<caption>{_inline(caption)}</caption>" if caption else ""
                th = "".join(f'<th class="{a}">{_inline(h)}</th>' for h, a in zip(headers, align))
                trs = "".join("<tr>" + "".join(f'<td class="{a}">{_cell(c)}</td>' for c, a in zip(r, align)) + "</tr>"
                              for r in rows)
                body.append(f'<div class="wide"><table>{cap}<thead><tr>{th}</tr></thead>'
                            f'<tbody>{trs}</tbody></table></div>')
            elif b[0] == "img":
                data = base64.b64encode(b[2]).decode()
                mime = "image/gif" if b[4] == "gif" else "image/png"
                body.append(f'<figure><img alt="{html.escape(b[3])}" data-name="{b[1]}" '
                            f'src="data:{mime};base64,{data}"><figcaption>{_inline(b[3])}</figcaption></figure>')
        return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(self.title)}</title>'
                f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;max-width:1280px;margin:2em auto;padding:0 1em;
color:#222;line-height:1.45}
h1{border-bottom:2px solid #444}h2{border-bottom:1px solid #bbb;margin-top:2em}
table{border-collapse:collapse;margin:0.6em 0 1em;font-size:0.86em}
caption{caption-side:top;text-align:left;font-style:italic;padding-bottom:0.3em;color:#444}
th,td{border:1px solid #ccc;padding:0.25em 0.6em}th{background:#f0f0f0}
td.r,th.r{text-align:right;font-variant-numeric:tabular-nums}td.l,th.l{text-align:left}
th{vertical-align:bottom}td.l:first-child{white-space:nowrap}p.note{font-size:0.86em;color:#444;margin-top:-0.4em}
tbody tr:nth-child(even){background:#fafafa}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #ddd}figcaption{font-size:0.9em;color:#555}
code{background:#f3f3f3;padding:0 0.2em}.wide{overflow-x:auto}
"""


def _cell(text: str) -> str:
    """A table cell: a value and its CI margin stay on one line ("208.7 ± 206.7"); the cell may
    break before its "(n=3)", so that a table fits the page instead of running off it."""
    return _inline(text).replace(" ± ", "\u00a0±\u00a0")


def _inline(text: str) -> str:
    """HTML-escape, then `code` and **bold**."""
    t = html.escape(str(text))
    t = re.sub(r"`([^`]+)`", r"<code>\1</code>", t)
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", t)

