"""clean_result.html in a real browser (headless Chromium): no console errors, the figures drawn, the half-normal plots' labels apart, design collapsed, a centre-point page's curvature section shown.

How: the page is copied with a small recorder script put first in <head> (it collects uncaught errors,
failed resource loads and console.error calls, and after load writes what it found, plus what plotly drew,
into the DOM); Chromium runs it offline (every network request goes to a dead proxy) and dumps the DOM.
Chromium's own console log on stderr is checked as well. A control page with a deliberate error shows
the harness does catch errors.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from eps_screen.run.aggregate import aggregate
from eps_screen.run.simulate import simulate_screen
from eps_screen.spec.config import ScreenConfig, load_config
from eps_screen.spec.design import all_slab_cells
from tests.conftest import CONFIGS

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium (apt-get install -y chromium)")]

FIGURES = ("factor_ranking", "ab_interaction", "persona_heatmap")
REVIEWER_SECTIONS = ("simple-effects", "logit-sensitivity", "caveats", "recipe")
WINDOW = (1280, 800)  # a laptop's browser window: the size the page is read at

RECORDER = """<script>
(function () {
  var errors = [];
  window.addEventListener('error', function (e) {
    var t = e.target;
    errors.push(t && t !== window && (t.src || t.href) ? 'failed to load ' + (t.src || t.href) : 'error: ' + e.message);
  }, true);
  window.addEventListener('unhandledrejection', function (e) { errors.push('unhandled rejection: ' + e.reason); });
  var original = console.error;
  console.error = function () { errors.push('console.error: ' + Array.prototype.join.call(arguments, ' ')); return original.apply(console, arguments); };
  window.addEventListener('load', function () {
    setTimeout(function () {
      var figures = {};
      ['factor_ranking', 'ab_interaction', 'persona_heatmap'].forEach(function (id) {
        var div = document.getElementById(id);
        figures[id] = div ? {
          main_svg: div.querySelectorAll('svg.main-svg').length,
          bar_traces: div.querySelectorAll('.barlayer .trace').length,
          scatter_traces: div.querySelectorAll('.scatterlayer .trace').length,
          heatmaps: div.querySelectorAll('.hm').length
        } : null;
      });
      var sections = {};
      ['simple-effects', 'logit-sensitivity', 'caveats', 'recipe', 'curvature'].forEach(function (id) {
        var h = document.getElementById(id), text = '', tables = 0, visible = false, rows = [], figures = 0;
        if (h) {
          visible = h.getBoundingClientRect().height > 0;
          for (var n = h.nextElementSibling; n && n.tagName !== 'H2' && n.tagName !== 'DETAILS'; n = n.nextElementSibling) {
            text += ' ' + n.innerText;
            var found = n.tagName === 'TABLE' ? [n] : Array.prototype.slice.call(n.querySelectorAll('table'));
            tables += found.length;
            figures += n.querySelectorAll('svg.main-svg').length;
            // each body row's cells as drawn, and whether the row takes up room on the page
            found.forEach(function (t) {
              t.querySelectorAll('tbody tr').forEach(function (tr) {
                rows.push({cells: Array.prototype.map.call(tr.querySelectorAll('td'), function (td) { return td.innerText; }),
                           visible: tr.getBoundingClientRect().height > 0});
              });
            });
          }
        }
        sections[id] = h ? {heading: h.innerText, visible: visible, tables: tables, rows: rows, figures: figures,
                            text: text} : null;
      });
      // every tick label's box, by figure, subplot and axis: what a reader must be able to tell apart
      var ticks = {};
      ['factor_ranking', 'ab_interaction', 'persona_heatmap'].forEach(function (id) {
        var div = document.getElementById(id), boxes = {};
        if (!div) return;
        div.querySelectorAll('g.xtick text, g.ytick text').forEach(function (t) {
          if (!t.textContent.trim()) return;
          var sub = t.closest('g.subplot'), axis = t.closest('g.xtick') ? 'x' : 'y';
          var key = (sub ? sub.getAttribute('class') : '?') + ' ' + axis, r = t.getBoundingClientRect();
          (boxes[key] = boxes[key] || []).push({text: t.textContent, l: r.left, r: r.right, t: r.top, b: r.bottom,
                                               size: parseFloat(getComputedStyle(t).fontSize)});
        });
        var svg = div.querySelector('svg.main-svg').getBoundingClientRect();
        ticks[id] = {boxes: boxes, width: svg.width, height: svg.height, left: svg.left, right: svg.right};
      });
      // the half-normal plots' point labels (the effects beyond Lenth's SME), by figure and subplot
      var labels = {};
      ['half_normal_SR', 'half_normal_LR'].forEach(function (id) {
        var div = document.getElementById(id), boxes = [];
        if (!div) return;
        div.querySelectorAll('g.textpoint text').forEach(function (t) {
          if (!t.textContent.trim()) return;
          var r = t.getBoundingClientRect(), sub = t.closest('g.subplot');
          boxes.push({text: t.textContent, subplot: sub ? sub.getAttribute('class') : '?', l: r.left, r: r.right,
                      t: r.top, b: r.bottom});
        });
        var svg = div.querySelector('svg.main-svg');
        labels[id] = {boxes: boxes, points: div.querySelectorAll('.scatterlayer .point').length,
                      svg: svg ? svg.getBoundingClientRect().toJSON() : null};
      });
      var details = document.querySelector('details#design');
      var out = document.createElement('pre');
      out.id = '__report';
      out.textContent = JSON.stringify({errors: errors, figures: figures, sections: sections, ticks: ticks, labels: labels,
                                        details_open: details ? details.open : null,
                                        plotly: typeof Plotly});
      document.body.appendChild(out);
    }, 1000);
  });
})();
</script>"""


def run_in_chromium(page_html: str, work: Path) -> tuple[dict, str, str]:
    """(recorder report, dumped DOM, chromium stderr) for a page."""
    work.mkdir(parents=True, exist_ok=True)
    page = work / "page.html"
    page.write_text(page_html.replace("<head>", "<head>" + RECORDER, 1), encoding="utf-8")
    cmd = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run", "--disable-sync", f"--user-data-dir={work / 'profile'}",
        "--enable-logging=stderr", "--v=0", "--proxy-server=http://127.0.0.1:9", "--virtual-time-budget=15000",
        f"--window-size={WINDOW[0]},{WINDOW[1]}", "--dump-dom", page.as_uri(),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    found = re.search(r'<pre id="__report">(.*?)</pre>', proc.stdout, re.S)
    assert found, f"the recorder never reported (chromium exit {proc.returncode}): {proc.stderr[-2000:]}"
    return json.loads(html.unescape(found.group(1))), proc.stdout, proc.stderr


def console_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line and re.search(r"error|uncaught", line, re.I)]


def _render(config: ScreenConfig, tmp_path_factory) -> tuple[str, dict, str, str]:
    """A screen aggregated from simulated answers (seconds: no flow, nothing trained), its page run in Chromium."""
    cells = all_slab_cells(config)
    out = tmp_path_factory.mktemp("report")
    aggregate(config, simulate_screen(config, cells), [c.id for c in cells], out)
    page = (out / "clean_result.html").read_text(encoding="utf-8")
    report, dom, stderr = run_in_chromium(page, tmp_path_factory.mktemp("chromium"))
    return page, report, dom, stderr


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    return _render(ScreenConfig(bootstrap={"resamples": 500}), tmp_path_factory)


@pytest.fixture(scope="module")
def rendered_centre(tmp_path_factory):
    """sim-centre.yaml's page: 4 centre cells per source, curvature planted on SR and LR."""
    config = load_config(CONFIGS / "sim-centre.yaml")
    return _render(config.model_copy(update={"bootstrap": config.bootstrap.model_copy(update={"resamples": 500})}),
                   tmp_path_factory)


def test_no_console_errors(rendered):
    _, report, _, stderr = rendered
    assert report["errors"] == []
    assert console_errors(stderr) == []
    assert report["plotly"] == "object"


def test_three_figures_render(rendered):
    _, report, _, _ = rendered
    figs = report["figures"]
    assert all(figs[f] and figs[f]["main_svg"] >= 1 for f in FIGURES), figs
    assert figs["factor_ranking"]["bar_traces"] == 2  # pooled d bars for SR and LR
    assert figs["ab_interaction"]["scatter_traces"] == 4  # B0 and B1 lines, SR and LR panels
    assert figs["persona_heatmap"]["heatmaps"] == 1


def _overlaps(boxes: list[dict]) -> list[tuple[str, str]]:
    """Pairs of labels whose boxes intersect by more than 1 px both across and down: labels that run into each
    other, whichever axes or subplots they belong to."""
    def cross(a, b, lo, hi):
        return min(a[hi], b[hi]) - max(a[lo], b[lo]) > 1
    return [(a["text"], b["text"]) for i, a in enumerate(boxes) for b in boxes[i + 1:]
            if cross(a, b, "l", "r") and cross(a, b, "t", "b")]


def test_every_tick_label_can_be_read_at_the_default_size(rendered):
    """No two tick labels of one axis run into each other, none is under 9 px, and all sit inside their figure:
    the A x B figure's level words and the heatmap's 96 cells included (issue 24, item 4)."""
    _, report, _, _ = rendered
    for fig in FIGURES:
        seen = report["ticks"][fig]
        assert seen["boxes"] and seen["width"] <= WINDOW[0], (fig, seen["width"])
        every = [b for boxes in seen["boxes"].values() for b in boxes]
        assert not _overlaps(every), (fig, _overlaps(every)[:5])
        for key, boxes in seen["boxes"].items():
            assert min(b["size"] for b in boxes) >= 9, (fig, key)
            assert all(seen["left"] - 1 <= b["l"] and b["r"] <= seen["right"] + 1 for b in boxes), (fig, key)
    heat = [b for k, v in report["ticks"]["persona_heatmap"]["boxes"].items() if k.endswith(" y") for b in v]
    assert len(heat) == 96


def test_a_half_normal_plot_per_response_renders_with_labels_that_do_not_overlap(rendered):
    """Every contrast of the 2^5 drawn in each of the four panels (pooled and three sources) of each response; the
    effects beyond Lenth's SME labelled, no two labels running into each other, all inside the figure."""
    _, report, _, _ = rendered
    for fig in ("half_normal_SR", "half_normal_LR"):
        seen = report["labels"][fig]
        assert seen["points"] == 4 * 31, (fig, seen["points"])
        assert {b["subplot"] for b in seen["boxes"]} and len(seen["boxes"]) >= 4, fig
        assert not _overlaps(seen["boxes"]), (fig, _overlaps(seen["boxes"])[:5])
        svg = seen["svg"]
        assert all(svg["left"] - 1 <= b["l"] and b["r"] <= svg["right"] + 1 and svg["top"] - 1 <= b["t"]
                   and b["b"] <= svg["bottom"] + 1 for b in seen["boxes"]), fig
    assert {"A", "B", "A:B"} <= {b["text"] for b in report["labels"]["half_normal_SR"]["boxes"]}


def test_design_section_is_collapsed(rendered):
    page, report, dom, _ = rendered
    assert report["details_open"] is False
    tag = re.search(r"<details[^>]*id=\"design\"[^>]*>", dom).group(0)
    assert "open" not in tag
    section = page[page.index('<details id="design">'):page.index("</details>")]
    assert "<summary>Experimental design</summary>" in section
    for needle in ("The 32 cells", "Source stratification", "Seed plan", "Bootstrap scheme", "Loss-mask variant",
                   "e0_negatives = eot", "Kill criteria and their outcomes"):
        assert needle in section, needle
    cell_table = section[section.index("The 32 cells"):section.index("Smoke fraction")]
    assert cell_table.count("<tr>") == 33  # header + 32 cells


def test_reviewer_sections_render(rendered):
    """Issue 12, part 3: simple effects, logit sensitivity, caveats and recipe are on the page, visible, with their
    tables (tests/test_report_review.py checks the same content on the HTML string, without a browser)."""
    _, report, _, _ = rendered
    sections = report["sections"]
    assert all(sections[s] and sections[s]["visible"] for s in REVIEWER_SECTIONS), sections
    assert sections["curvature"] is None  # no centre points, no section (the centre-point page has one: below)
    simple, logit = sections["simple-effects"], sections["logit-sensitivity"]
    assert simple["heading"] == "Simple effects: A at each level of B" and simple["tables"] == 1
    assert "A's effect [CI]" in simple["text"] and "B0:" in simple["text"] and "B1:" in simple["text"]
    assert logit["heading"] == "Logit-scale sensitivity" and logit["tables"] == 1
    assert "log-odds effect [CI]" in logit["text"] and "rate scale only" in logit["text"]
    caveats = sections["caveats"]["text"]
    for needle in ("What the intervals condition on", "Training-run noise", "Few clusters",
                   "Interactions depend on the scale", "The smoke fraction aliases main effects with interactions",
                   "D with A:B", "What d means here", "non-monotone"):
        assert needle in caveats, needle
    recipe = sections["recipe"]
    assert recipe["tables"] == 1 and "rank 32, alpha 64" in recipe["text"] and "temperature 1.0" in recipe["text"]


def test_the_centre_point_page_shows_its_curvature_section(rendered_centre):
    """sim-centre.yaml (issue 44, item 4): the curvature section's heading and both verdicts are on screen, its table
    drawn with a row per response for each source and pooled, on a page with no errors. The section has no figure."""
    _, report, _, stderr = rendered_centre
    assert report["errors"] == [] and console_errors(stderr) == []
    curvature = report["sections"]["curvature"]
    assert curvature and curvature["visible"] and curvature["heading"] == "Curvature: centre points", curvature
    assert "Source rate curves between the levels" in curvature["text"]
    assert "Leakage curves between the levels" in curvature["text"]
    assert curvature["tables"] == 1 and curvature["figures"] == 0
    rows = curvature["rows"]
    assert rows and all(r["visible"] for r in rows)
    drawn = sorted((r["cells"][0], r["cells"][1]) for r in rows)
    expected = sorted((response, source) for response in ("SR", "LR")
                      for source in ("librarian", "surgeon", "programmer", "pooled"))
    assert drawn == expected
    pooled = {r["cells"][0]: r["cells"] for r in rows if r["cells"][1] == "pooled"}
    assert all(cells[-1] == "curves" for cells in pooled.values()), pooled  # the planted curvature, found
    # the rest of the page still draws beside the new section: the half-normal plots of the 2^(5-1)
    assert all(report["labels"][f]["points"] == 4 * 15 for f in ("half_normal_SR", "half_normal_LR")), report["labels"]


def test_self_contained_with_plotly_once(rendered):
    page, _, _, _ = rendered
    assert page.count("* plotly.js v") == 1
    assert not re.search(r"<script[^>]+src=", page)
    assert not re.search(r"<link[^>]+href=\"https?:", page)


def test_harness_catches_errors(tmp_path):
    broken = "<html><head><title>x</title></head><body><script>console.error('boom'); notAFunction();</script></body></html>"
    report, _, stderr = run_in_chromium(broken, tmp_path)
    assert any("boom" in e for e in report["errors"])
    assert any("notAFunction" in e for e in report["errors"])
    assert console_errors(stderr)
