"""A report as a list of plain elements, written out twice: as Markdown (figures as
relative links) and as one self-contained HTML page (figures inline as base64 PNG,
so the file opens in a browser with no server and can be mailed as it is).

Text may hold two inline marks, `code` and **bold**, which read the same in both.
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union


@dataclass
class Heading:
    text: str
    level: int = 2


@dataclass
class Paragraph:
    text: str


@dataclass
class Bullets:
    items: list[str]


@dataclass
class Table:
    headers: list[str]
    rows: list[list[str]]
    right_aligned: set[int] = field(default_factory=set)  # column indices holding numbers


@dataclass
class Figure:
    path: Path
    caption: str


@dataclass
class Preformatted:
    title: str  # shown as a collapsible summary in HTML
    text: str


Element = Union[Heading, Paragraph, Bullets, Table, Figure, Preformatted]

# The HTML page's text column, and so the width a figure is shown at on a wide screen: drawn at
# exactly that many pixels, a figure shows at its own size, neither scaled down nor blurred.
PAGE_WIDTH_PX = 1100
PAGE_PADDING_PX = 16
FIGURE_WIDTH_PX = PAGE_WIDTH_PX - 2 * PAGE_PADDING_PX - 2  # less the image's 1px border


def to_markdown(title: str, elements: list[Element], base_dir: Path) -> str:
    out = [f"# {title}", ""]
    for element in elements:
        if isinstance(element, Heading):
            out += ["#" * element.level + " " + element.text, ""]
        elif isinstance(element, Paragraph):
            out += [element.text, ""]
        elif isinstance(element, Bullets):
            out += [f"- {item}" for item in element.items] + [""]
        elif isinstance(element, Table):
            align = ["---:" if i in element.right_aligned else "---" for i in range(len(element.headers))]
            out.append("| " + " | ".join(_md_cell(h) for h in element.headers) + " |")
            out.append("| " + " | ".join(align) + " |")
            out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in element.rows]
            out.append("")
        elif isinstance(element, Figure):
            out += [
                f"![{element.caption}]({element.path.relative_to(base_dir).as_posix()})",
                "",
                f"*{element.caption}*",
                "",
            ]
        elif isinstance(element, Preformatted):
            out += [f"**{element.title}**", "", "```", element.text.replace("```", "'''"), "```", ""]
    return "\n".join(out).rstrip() + "\n"


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_html(title: str, elements: list[Element]) -> str:
    body = [f"<h1>{_inline(title)}</h1>"]
    for element in elements:
        if isinstance(element, Heading):
            body.append(f"<h{element.level}>{_inline(element.text)}</h{element.level}>")
        elif isinstance(element, Paragraph):
            body.append(f"<p>{_inline(element.text)}</p>")
        elif isinstance(element, Bullets):
            body.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in element.items) + "</ul>")
        elif isinstance(element, Table):
            body.append(_html_table(element))
        elif isinstance(element, Figure):
            data = base64.b64encode(element.path.read_bytes()).decode("ascii")
            body.append(
                f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(element.caption)}">'
                f"<figcaption>{_inline(element.caption)}</figcaption></figure>"
            )
        elif isinstance(element, Preformatted):
            body.append(
                f"<details><summary>{_inline(element.title)}</summary><pre>{html.escape(element.text)}</pre></details>"
            )
    return _PAGE.format(
        title=html.escape(title), body="\n".join(body), page_width=PAGE_WIDTH_PX, padding=PAGE_PADDING_PX
    )


def _html_table(table: Table) -> str:
    def cell(tag: str, i: int, text: str) -> str:
        cls = ' class="num"' if i in table.right_aligned else ""
        return f"<{tag}{cls}>{_inline(text)}</{tag}>"

    head = "<tr>" + "".join(cell("th", i, h) for i, h in enumerate(table.headers)) + "</tr>"
    rows = ["<tr>" + "".join(cell("td", i, c) for i, c in enumerate(row)) + "</tr>" for row in table.rows]
    return f"<table><thead>{head}</thead><tbody>{''.join(rows)}</tbody></table>"


def _inline(text: str) -> str:
    escaped = html.escape(text, quote=False)
    escaped = re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", escaped)


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
body {{ font-family: system-ui, -apple-system, "Segoe UI", sans-serif; max-width: {page_width}px; margin: 2em auto;
       padding: 0 {padding}px; color: #1d1d1f; line-height: 1.45; }}
h1 {{ font-size: 1.6em; border-bottom: 2px solid #ddd; padding-bottom: .3em; }}
h2 {{ font-size: 1.25em; margin-top: 1.8em; border-bottom: 1px solid #eee; padding-bottom: .2em; }}
table {{ border-collapse: collapse; margin: .8em 0; font-size: .92em; }}
th, td {{ border: 1px solid #ddd; padding: .3em .6em; text-align: left; vertical-align: top; }}
th {{ background: #f4f5f7; }}
td.num, th.num {{ text-align: right; font-variant-numeric: tabular-nums; }}
tbody tr:nth-child(even) {{ background: #fafafa; }}
figure {{ margin: 1em 0; }}
figure img {{ max-width: 100%; height: auto; border: 1px solid #eee; }}
figcaption {{ color: #555; font-size: .9em; }}
code {{ background: #f4f5f7; padding: 0 .25em; border-radius: 3px; }}
pre {{ background: #f7f7f7; padding: .8em; overflow-x: auto; font-size: .85em; }}
details {{ margin: .5em 0; }}
</style>
</head>
<body>
{body}
</body>
</html>
"""
