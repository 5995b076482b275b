"""The HTML a person reads: one clean page per notebook and the run's summary page (``index.html``).

Pages hide code by default (``show_code=True`` keeps it), drop the report's hidden set-up cell and
the text of progress bars, list the run's parameters in a folded block under the title, and wrap
long table cells instead of cutting them. The summary page opens with the run's inputs and gives,
per notebook, its question, its computed answer, what to do, its key figure and its claims
verdict counts, read from the notebook's JSON sidecar.
"""
from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any, Iterable, Mapping

from .._paths import ROOT, SHARED_DATA_DIR
from .kernel_setup import SETUP_TAG
from .tables import setup_items

TABLE_CSS = """
<style>
/* kvlab report: tables whole and wrapped, never cut */
body.jp-Notebook { max-width: 1400px; margin: 0 auto; }
.jp-RenderedHTMLCommon table { table-layout: auto; max-width: 100%; font-size: 12px; }
.jp-RenderedHTMLCommon td, .jp-RenderedHTMLCommon th { padding: 0.3em 0.45em; }
.jp-RenderedHTMLCommon td { white-space: normal; overflow-wrap: break-word; max-width: 36em; }
.jp-RenderedHTMLCommon th { white-space: normal; overflow-wrap: normal; max-width: 12em; }
.jp-OutputArea-output { overflow-x: auto; }
.jp-OutputArea-output pre { white-space: pre-wrap; overflow-wrap: break-word; word-break: normal; }
.jp-OutputArea-output img { max-width: 100%; height: auto; }
details.kvlab-parameters { margin: 0.5em 0 1em; }
details.kvlab-parameters code { white-space: pre-wrap; }
.jp-RenderedHTMLCommon table.kvlab-table td, .jp-RenderedHTMLCommon table.kvlab-table th { text-align: left; }
.jp-RenderedHTMLCommon table.kvlab-table td.num, .jp-RenderedHTMLCommon table.kvlab-table th.num { text-align: right; }
</style>
"""
_TH = re.compile(r"(<th[^>]*>)([^<]*)(</th>)")
"""A table header cell: long column names may break after their underscores (``_<wbr>``)."""
_TQDM_LINE = re.compile(r"\d+%\|.*\||\|\s*\d+/\d+\s*\[|\d+it \[")


def _terminal_text(text: str) -> str:
    """Stream text as a terminal shows it: each ``\\r`` overwrites its line; progress-bar lines
    (tqdm's format) dropped."""
    lines = [line.split("\r")[-1] if "\r" in line.rstrip("\r") else line.rstrip("\r") for line in text.split("\n")]
    return "\n".join(line for line in lines if not _TQDM_LINE.search(line))


def project_relative(text: str, root: Path = ROOT) -> str:
    """``text`` with the build machine's folders written relative to the project: the checkout's
    path dropped (``kvlab/capacity.py``), its parent's written ``../`` (``../shared/data``).

    >>> project_relative("read /home/me/kvlab/kvlab/sim.py and /home/me/shared/data", Path("/home/me/kvlab"))
    'read kvlab/sim.py and ../shared/data'
    """
    root = Path(root)
    shared = [(SHARED_DATA_DIR.resolve(), "../shared/data/")] if root == ROOT else []
    for folder, short in ((root, ""), *shared, (root.parent, "../")):
        text = text.replace(str(folder).rstrip("/") + "/", short)
    return text


def _relative_outputs(cell: Any) -> None:
    """Every text a cell shows, its build-machine folders written relative (:func:`project_relative`)."""
    for out in cell.get("outputs", []):
        if "text" in out:
            out["text"] = project_relative("".join(out["text"]))
        for mime, value in (out.get("data") or {}).items():
            if mime.startswith("text/") and isinstance(value, (str, list)):
                out["data"][mime] = project_relative("".join(value))
    if cell.cell_type == "markdown":
        cell.source = project_relative(cell.source)


def _clean(nb: Any, *, show_code: bool, parameters: Mapping[str, Any] | None) -> Any:
    import nbformat

    cells = []
    for cell in nb.cells:
        tags = cell.get("metadata", {}).get("tags", [])
        if SETUP_TAG in tags:
            continue
        if not show_code and ("parameters" in tags or "injected-parameters" in tags):
            continue
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out.get("name") == "stderr":
                out["text"] = _terminal_text("".join(out.get("text", "")))
        if "outputs" in cell:
            cell["outputs"] = [o for o in cell["outputs"] if not (o.get("output_type") == "stream" and not o["text"].strip())]
        _relative_outputs(cell)
        cells.append(cell)
    if parameters is not None:
        rows = "".join(f"<tr><td><code>{html.escape(str(k))}</code></td>"
                       f"<td><code>{html.escape(project_relative(str(v)))}</code></td></tr>" for k, v in parameters.items())
        block = nbformat.v4.new_markdown_cell(
            f'<details class="kvlab-parameters"><summary>Parameters of this run</summary>'
            f"<table><tr><th>parameter</th><th>value</th></tr>{rows}</table></details>")
        first_md = next((i for i, c in enumerate(cells) if c.cell_type == "markdown"), -1)
        cells.insert(first_md + 1, block)
    nb.cells = cells
    return nb


def export_html(executed: str | Path, html_path: str | Path, *, show_code: bool = False,
                parameters: Mapping[str, Any] | None = None) -> Path:
    """Export an executed notebook to a standalone HTML page a reader can follow.

    Parameters
    ----------
    executed : path
        The executed notebook (``.ipynb``).
    html_path : path
        Where the page is written.
    show_code : bool
        Keep code cells' input (default: outputs and prose only).
    parameters : mapping, optional
        The run's parameter values, listed in a folded block under the title.
    """
    import nbformat
    from nbconvert import HTMLExporter

    nb = _clean(nbformat.read(str(executed), as_version=4), show_code=show_code, parameters=parameters)
    exporter = HTMLExporter(exclude_input=not show_code, exclude_input_prompt=not show_code,
                            exclude_output_prompt=not show_code)
    body, _ = exporter.from_notebook_node(nb)
    body = body.replace("</head>", TABLE_CSS + "</head>", 1)
    body = _TH.sub(lambda m: m.group(1) + m.group(2).replace("_", "_<wbr>") + m.group(3), body)
    Path(html_path).write_text(body, encoding="utf-8")
    return Path(html_path)


def notebook_title(executed: str | Path) -> tuple[str, str]:
    """A notebook's title (its first heading) and question (the paragraph starting
    ``**Question.**``, else empty), read from its first markdown cell."""
    import nbformat

    nb = nbformat.read(str(executed), as_version=4)
    md = next((c.source for c in nb.cells if c.cell_type == "markdown"), "")
    title = next((ln.lstrip("#").strip() for ln in md.splitlines() if ln.startswith("#")), Path(executed).stem)
    m = re.search(r"\*\*Question\.?\*\*\s*(.*?)(?:\n\s*\n|$)", md, flags=re.S)
    question = " ".join(m.group(1).split()) if m else ""
    return title, question


def _e(text: Any) -> str:
    return html.escape(str(text))


def _md_inline(text: str) -> str:
    """Escape ``text`` and render its inline markdown: ```code```, ``**bold**`` and ``*italic*``.

    >>> _md_inline("is `s` cheaper to **recompute** or *swap* (a < b)?")
    'is <code>s</code> cheaper to <b>recompute</b> or <i>swap</i> (a &lt; b)?'
    """
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", _e(text))
    out = re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", out)
    return re.sub(r"(?<![\w*])\*([^*\s][^*]*)\*(?![\w*])", r"<i>\1</i>", out)


INDEX_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #222; max-width: 1180px;
       margin: 0 auto; padding: 1.5em; line-height: 1.45; }
h1 { margin-bottom: 0.2em; } .lead { color: #555; margin-top: 0; }
table.inputs { border-collapse: collapse; margin: 0.5em 0 1.5em; }
table.inputs td, table.inputs th { text-align: left; padding: 0.25em 0.8em; border-bottom: 1px solid #e4e4e4;
       vertical-align: top; overflow-wrap: anywhere; }
.card { display: grid; grid-template-columns: 340px 1fr; gap: 1.2em; padding: 1em 0; border-top: 1px solid #ddd; }
.card img { width: 340px; height: auto; border: 1px solid #e4e4e4; }
.card .nofig { width: 340px; height: 120px; display: flex; align-items: center; justify-content: center;
       color: #888; border: 1px dashed #ccc; }
.card h2 { margin: 0 0 0.3em; font-size: 1.2em; }
.q { color: #444; } .a { font-weight: 600; margin: 0.4em 0; } .todo { background: #f3f7ff; padding: 0.4em 0.6em;
       border-left: 3px solid #4a7bd0; }
.meta { color: #666; font-size: 0.9em; } .verdicts span { display: inline-block; margin-right: 0.8em; }
.missing { color: #a15c00; } code { background: #f4f4f4; padding: 0 0.2em; border-radius: 3px; }
ul.rests { margin: 0.2em 0 0; padding-left: 1.2em; columns: 2 22em; column-gap: 1.5em; }
ul.rests li { break-inside: avoid; }
"""

REST_CHARS = 160
"""The longest text of one "Rests on" item (the sidecar's JSON has it whole)."""


def _rests_on(setup: Any) -> str:
    """A sidecar's ``setup`` as the card's "Rests on" list (:func:`kvlab.report.tables.setup_items`)."""
    if not isinstance(setup, Mapping) or not setup:
        return ""
    items = []
    for label, text in setup_items(setup):
        text = project_relative(text)
        text = text if len(text) <= REST_CHARS else text[: REST_CHARS - 1].rstrip() + "…"
        items.append(f"<li><b>{_e(label)}</b>: {_md_inline(text)}</li>")
    return f'<div class="meta">Rests on:<ul class="rests">{"".join(items)}</ul></div>' if items else ""


def _card(entry: Mapping[str, Any]) -> str:
    res = entry.get("results") or {}
    figures = [f for f in res.get("figures") or [] if isinstance(f, str)]
    fig = (f'<a href="{_e(figures[0])}"><img src="{_e(figures[0])}" alt="key figure of {_e(entry["stem"])}"></a>'
           if figures else '<div class="nofig">no key figure</div>')
    question = res.get("question") or entry.get("question") or ""
    answer = project_relative(res["answer"]) if res.get("answer") else None
    todo = project_relative(res["what_to_do"]) if res.get("what_to_do") else None
    parts = [f'<h2><a href="{_e(entry["html"])}">{_md_inline(entry["title"])}</a></h2>']
    if question:
        parts.append(f'<p class="q"><b>Question.</b> {_md_inline(question)}</p>')
    parts.append(f'<p class="a">{_md_inline(answer)}</p>' if answer
                 else '<p class="a missing">This notebook does not state its answer in its results yet; '
                      'open its page.</p>')
    if todo:
        parts.append(f'<p class="todo"><b>What to do.</b> {_md_inline(todo)}</p>')
    counts = entry.get("verdicts") or {}
    if counts:
        spans = "".join(f"<span>{n} {_e(kind)}</span>" for kind, n in counts.items())
        parts.append(f'<p class="verdicts"><b>Claims:</b> {spans}</p>')
    parts.append(_rests_on(res.get("setup")))
    links = [f'<a href="{_e(entry["html"])}">page</a>', f'<a href="{_e(entry["ipynb"])}">executed notebook</a>',
             f'<a href="{_e(entry["json"])}">results (JSON)</a>']
    links += [f'<a href="{_e(f)}">{_e(f)}</a>' for f in figures[1:]]
    parts.append(f'<p class="meta">Ran in {entry["runtime_s"]:.0f} s · {" · ".join(links)}</p>')
    return f'<section class="card" id="{_e(entry["stem"])}">{fig}<div>{"".join(parts)}</div></section>'


def index_html(run: Mapping[str, Any], entries: Iterable[Mapping[str, Any]]) -> str:
    """The summary page of a run.

    Parameters
    ----------
    run : mapping
        ``name``, ``date`` (text), ``runtime_s``, ``version``, ``command`` and ``inputs``: a list
        of ``(name, text)`` rows describing what the run rests on.
    entries : iterable of mapping
        Per notebook: ``stem``, ``title``, ``question`` (from the notebook's text), ``html``,
        ``ipynb``, ``json`` (file names), ``runtime_s``, ``results`` (its sidecar) and
        ``verdicts`` (verdict kind -> count).
    """
    inputs = "".join(f"<tr><th>{_e(k)}</th><td>{_e(project_relative(str(v)))}</td></tr>" for k, v in run["inputs"])
    cards = "\n".join(_card(e) for e in entries)
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>kvlab report {_e(run['name'])}</title><style>{INDEX_CSS}</style></head><body>"
            f"<h1>kvlab report</h1><p class='lead'>{_e(run['name'])}: what each notebook asked, what it found "
            f"and what to do. Each title opens the notebook's full page.</p>"
            f"<table class='inputs'><tr><th>run</th><td>{_e(run['date'])}, {run['runtime_s']:.0f} s, "
            f"kvlab {_e(run['version'])}</td></tr>{inputs}"
            f"<tr><th>command</th><td><code>{_e(run['command'])}</code></td></tr></table>"
            f"{cards}</body></html>\n")
