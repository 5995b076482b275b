"""The report as a reader gets it: `kvlab report` on the built-in data, its summary page, and both
pages rendered in headless Chromium (figures load, links resolve, no table cut, a screenshot)."""
from __future__ import annotations

import collections
import html.parser
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from kvlab import claims as kvlab_claims
from kvlab import report
from kvlab._paths import ROOT
from kvlab.cli import main

MUST_ANSWER = ("01_reservation_tables", "02_length_distributions")
"""Notebooks whose sidecar must state an answer and a key figure (the others are checked where they do)."""


class _Text(html.parser.HTMLParser):
    """A page's visible text (whitespace collapsed), image sources and link targets."""

    def __init__(self):
        super().__init__()
        self.parts, self.images, self.links, self._skip = [], [], [], 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("style", "script"):
            self._skip += 1
        if tag == "img":
            self.images.append(a.get("src", ""))
        if tag == "a":
            self.links.append(a.get("href", ""))

    def handle_endtag(self, tag):
        if tag in ("style", "script"):
            self._skip -= 1

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)

    @property
    def text(self) -> str:
        return " ".join(" ".join(self.parts).split())


def _read(path: Path) -> _Text:
    p = _Text()
    p.feed(path.read_text(encoding="utf-8"))
    return p


@pytest.mark.notebook
def test_index_answers_each_notebooks_question(quick_report):
    page = _read(quick_report / "index.html")
    notebooks = report.resolve_notebooks([s[:2] for s in MUST_ANSWER])
    assert [p.stem for p in notebooks] == list(MUST_ANSWER)
    for nb in notebooks:
        res = json.loads((quick_report / f"{nb.stem}.json").read_text())
        assert f"{nb.stem}.html" in page.links
        if nb.stem in MUST_ANSWER:
            assert res.get("question") and res.get("answer") and res.get("figures"), nb.stem
        for key in ("question", "answer", "what_to_do"):
            if res.get(key):
                assert " ".join(res[key].split()) in page.text, (nb.stem, key)
        if res.get("figures"):
            key_figure = res["figures"][0]
            assert key_figure in page.images and (quick_report / key_figure).stat().st_size > 1000, nb.stem
            assert (quick_report / key_figure).with_suffix(".svg").exists()
        kinds = collections.Counter(c["kind"] for c in res.get("claims") or [])  # the structured field
        for kind, n in kinds.items():
            assert f"{n} {kind}" in page.text, (nb.stem, kind)
    # the run's inputs and provenance
    for text in ("kvlab 0.", "model Llama-3-8B", "gpu H100-SXM", "profile seed-figures", "quick True",
                 "kvlab report -p quick true"):
        assert text in page.text


@pytest.mark.notebook
def test_pages_hide_code_and_keep_tables_whole(quick_report):
    page = (quick_report / "01_reservation_tables.html").read_text(encoding="utf-8")
    assert "kvlab.report.write_results(" not in page  # no code input by default
    assert "kvlab.report.kernel_setup" not in page  # the hidden set-up cell is gone
    assert "Parameters of this run" in page
    assert not re.search(r"<td>\s*\.\.\.\s*</td>", page)  # pandas never cut a table
    # numbers formatted as the kernel's format_number writes them (hand-worked: 28531 pages -> "28,531")
    pool = json.loads((quick_report / "01_reservation_tables.json").read_text())["pool_pages_real"]
    assert f"{pool:,}" in page


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("chromium is not installed (.ci/run installs it with apt-get)")
    return exe


PROBE = r"""
<script>
window.addEventListener('load', () => {
  const width = document.documentElement.clientWidth;
  const broken = [...document.images].filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src.slice(0, 80));
  const tables = [...document.querySelectorAll('table')];
  const cut = tables.filter(t => t.getBoundingClientRect().right > width + 1).map(t => t.innerText.slice(0, 80));
  const text = document.body.innerText;
  const grab = (re) => [...text.matchAll(re)].map(m => m[0].slice(0, 80));
  const EMPTY = new Set(['', 'nan', 'NaN', 'None', '<NA>', 'NaT', 'n/a', '\u2013']);
  const indexed = [], empty = [];
  for (const t of tables) {
    const rows = [...t.querySelectorAll('tr')].filter(r => r.querySelector('td'));
    if (rows.length < 2) continue;
    const width = Math.max(...rows.map(r => r.cells.length));
    const full = rows.filter(r => r.cells.length === width);
    const cell = (r, j) => r.cells[j].textContent.trim();  // textContent: folded tables count too
    const header = [...t.querySelectorAll('tr')].find(r => !r.querySelector('td'));
    const head = (j) => header && header.cells[j] ? header.cells[j].textContent.trim() : '';
    // a row-number column: no header of its own, and 0, 1, ..., N-1 down the rows
    if (head(0) === '' && full.every((r, i) => cell(r, 0) === String(i))) indexed.push(t.textContent.slice(0, 80));
    for (let j = 0; j < width; j++) {
      if (full.every(r => EMPTY.has(cell(r, j)))) empty.push(`${head(j)} in: ${t.textContent.slice(0, 60)}`);
    }
  }
  const out = document.createElement('pre');
  out.id = 'kvlab-probe';
  out.textContent = JSON.stringify({images: document.images.length, broken: broken, cut: cut, width: width,
      dicts: grab(/[{]\s*'[^'\n]{1,60}'\s*:/g), floats: grab(/\b\d+\.\d{12,}(e[-+]\d+)?/g),
      paths: grab(new RegExp(BUILD_PATHS, 'g')), indexed: indexed, empty: empty,
      words: grab(/.{0,30}\b(?:brief|issue \d+)\b.{0,30}/gi)});
  document.body.appendChild(out);
});
</script>
"""

BUILD_PATHS = "|".join(re.escape(str(p)) + "/" for p in {ROOT, ROOT.parent, Path.home(), Path(tempfile.gettempdir())}
                       if len(p.parts) > 1) + r"|(?:^|[\s'\"(=:])/(?:work|tmp|home|root|usr|opt|var|mnt|srv)/"
"""Absolute paths of the machine that built a page: the checkout, its parent, home, the temporary folder."""


def _probe(exe: str, page: Path) -> dict:
    """Load ``page`` (a copy with the probe script, in the same folder so relative links hold) in
    headless Chromium and return what the probe saw."""
    probe = page.with_name(f"_probe_{page.name}")
    script = PROBE.replace("BUILD_PATHS", json.dumps(BUILD_PATHS))
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", script + "</body>"), encoding="utf-8")
    try:
        dom = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,900",
                              "--virtual-time-budget=10000", "--dump-dom", probe.as_uri()],
                             capture_output=True, text=True, timeout=120, check=False).stdout
    finally:
        probe.unlink()
    m = re.search(r'<pre id="kvlab-probe">(.*?)</pre>', dom, flags=re.S)
    assert m, f"the probe did not run in {page.name}"
    return json.loads(html.unescape(m.group(1)))


def _screenshot(exe: str, page: Path, png: Path) -> None:
    subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1280,1600",
                    f"--screenshot={png}", page.as_uri()], capture_output=True, timeout=120, check=False)
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image as mpimg

    pixels = mpimg.imread(str(png))
    assert pixels.std() > 0.02, f"{png.name} is blank"


@pytest.mark.notebook
def test_browser_renders_index_and_a_page(quick_report, tmp_path):
    exe = _chromium()
    index = quick_report / "index.html"
    links = [h for h in _read(index).links if not re.match(r"^[a-z]+:", h)]
    assert links and all((quick_report / h).is_file() for h in links), [h for h in links if not (quick_report / h).is_file()]
    seen = _probe(exe, index)
    assert seen["images"] >= len(MUST_ANSWER) and seen["broken"] == [] and seen["cut"] == [], seen
    for stem in MUST_ANSWER:
        seen = _probe(exe, quick_report / f"{stem}.html")
        assert seen["images"] >= 2 and seen["broken"] == [] and seen["cut"] == [], (stem, seen)
    page = quick_report / "02_length_distributions.html"
    for p in (index, page):
        _screenshot(exe, p, tmp_path / f"{p.stem}.png")


READER_CHECKS = ("dicts", "floats", "paths", "indexed", "empty", "words")
"""What no page may show: a raw Python dict, a float with all its digits, an absolute path of the
build machine, a 0..N row-number column, a column without a single value, a project-internal
reference ("the brief", "issue 11") where the source should be named."""


def test_the_probe_sees_what_a_reader_must_not(tmp_path):
    """The probe itself, on a page with one of each defect and a clean twin: it must flag each."""
    exe = _chromium()
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><p>Rests on {'duration_s': 1038.455005725461} (issue 24); read "
                   f"{ROOT / 'kvlab' / 'capacity.py'}</p>"
                   "<table><tr><th></th><th>a</th><th>b</th></tr><tr><th>0</th><td>1</td><td>NaN</td></tr>"
                   "<tr><th>1</th><td>2</td><td>NaN</td></tr></table></body></html>", encoding="utf-8")
    good = tmp_path / "good.html"
    good.write_text("<html><body><p>Rests on duration 1,038 s; read kvlab/capacity.py; launch with "
                    "--override-generation-config '{\"max_new_tokens\": 863}' at 4.42 requests/s</p>"
                    "<table><tr><th>seed</th><th>a</th></tr><tr><td>3</td><td>1</td></tr><tr><td>4</td><td>2</td></tr>"
                    "</table></body></html>", encoding="utf-8")
    seen = _probe(exe, bad)
    assert all(seen[k] for k in READER_CHECKS), seen
    assert len(seen["empty"]) == 1 and seen["empty"][0].startswith("b in"), seen["empty"]
    seen = _probe(exe, good)
    assert not any(seen[k] for k in READER_CHECKS), seen


@pytest.mark.notebook
def test_no_page_of_a_full_run_shows_raw_python(quick_report):
    """Every page of a full run reads as a report: no raw dict or float, no build-machine path,
    no 0..N index column, no empty column; the summary page counts each notebook's verdicts by
    their structured kind, and every claim has one."""
    exe = _chromium()
    pages = sorted(quick_report.glob("*.html"))
    stems = [p.stem for p in report.list_notebooks()]
    assert [p.stem for p in pages] == sorted([*stems, "index"])
    found = {}
    for page in pages:
        seen = _probe(exe, page)
        bad = {k: seen[k] for k in READER_CHECKS if seen[k]}
        if bad or seen["broken"] or seen["cut"]:
            found[page.name] = {**bad, "broken": seen["broken"], "cut": seen["cut"]}
    assert not found, found
    index = (quick_report / "index.html").read_text(encoding="utf-8")
    for stem in stems:
        res = json.loads((quick_report / f"{stem}.json").read_text())
        kinds = collections.Counter(c.get("kind") for c in res.get("claims") or [])
        assert all(k in kvlab_claims.KINDS for k in kinds), (stem, kinds)
        card = re.search(rf'<section class="card" id="{stem}">(.*?)</section>', index, flags=re.S)
        card = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", card.group(1))).split())
        for kind, n in kinds.items():
            assert f"{n} {kind}" in card, (stem, kind, n)


def _trace_file(tmp_path: Path, n: int = 1500) -> Path:
    from kvlab import lengths

    df = lengths.profile("azure-2023-code").sample(n, seed=3)
    path = tmp_path / "trace.csv"
    df[["prompt_tokens", "output_tokens"]].rename(
        columns={"prompt_tokens": "num_prefill_tokens", "output_tokens": "num_decode_tokens"}).to_csv(path, index=False)
    return path


def _ran_with(out: Path, stem: str) -> dict:
    import nbformat

    return dict(nbformat.read(str(out / f"{stem}.ipynb"), as_version=4).metadata["papermill"]["parameters"])


@pytest.mark.notebook
def test_one_trace_parameter_reaches_every_selected_notebook(tmp_path):
    trace = _trace_file(tmp_path)
    out = tmp_path / "run"
    assert main(["report", "01", "02", "-p", "trace", str(trace), "-p", "quick", "true", "--out", str(out),
                 "--no-progress"]) == 0
    for stem in MUST_ANSWER:
        assert _ran_with(out, stem)["trace"] == str(trace)
        assert json.loads((out / f"{stem}.json").read_text())["setup"]["workload"] == f"trace {trace}"
    assert json.loads((out / "02_length_distributions.json").read_text())["num_requests"] == 1500  # all of it
    assert f"trace {trace}" in _read(out / "index.html").text


@pytest.mark.notebook
def test_report_02_and_07_on_one_trace(tmp_path):
    seven = report.resolve_notebooks(["07"])[0]
    if "trace" not in report.notebook_parameters(seven):
        pytest.skip("notebook 07 does not take `trace` yet (it reads trace_path)")
    trace = _trace_file(tmp_path)
    out = tmp_path / "run"
    assert main(["report", "02", "07", "-p", "trace", str(trace), "-p", "quick", "true", "--out", str(out),
                 "--no-progress"]) == 0
    for stem in ("02_length_distributions", seven.stem):
        assert _ran_with(out, stem)["trace"] == str(trace)
    assert json.loads((out / "02_length_distributions.json").read_text())["num_requests"] == 1500
