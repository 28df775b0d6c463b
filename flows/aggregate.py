"""Aggregation: reads only the result store, so it runs anywhere (CPU), any time, on a partial screen."""

from __future__ import annotations

from prefect import flow, get_run_logger
from prefect.artifacts import create_link_artifact, create_markdown_artifact
from prefect.client.orchestration import get_client

from eps_screen.plan.costs import COST_HEADERS, cost_rows, cost_sentence
from eps_screen.plan.phase_sizes import distinct_cells
from eps_screen.report.labels import level_words
from eps_screen.report.serve import report_url, shown_link
from eps_screen.report.stores import location
from eps_screen.report.tldr import tldr
from eps_screen.run import tracking
from eps_screen.run.aggregate import aggregate_stored
from eps_screen.spec.config import ScreenConfig
from eps_screen.store.result_store import ResultStore, load_screen, screen_names
from tasks import artifact_key
from flows.runtime.runs import process_alive, screen_runs


@flow(name="aggregate", log_prints=True)
def aggregate(config: ScreenConfig) -> dict:
    """Main effects, interactions, gates 3-4, predictions, figures and clean_result.html from stored cells."""
    store = ResultStore.for_config(config)
    summary, result = aggregate_stored(config, store)  # the same work as `eps-screen report` without a server
    if result is None:
        get_run_logger().warning("no finished cells in %s yet: nothing to aggregate", store.dir)
        return summary
    total = distinct_cells(config)
    where = location(store)  # the link names its store, so it works whatever store `eps-screen serve` was given
    url = report_url(where, config.name)
    summary = {**summary, "url": url, "store": where,
               "markdown": _summary_markdown(config, result, url, total, where)}
    logger = get_run_logger()
    logger.info("aggregated %s: report %s", cells_of(result.metrics.coverage.present, total),
                shown_link(url, store.report_dir / "clean_result.html"))
    for caveat in result.estimates.caveats:  # what the intervals leave out, said where the results are shown
        logger.warning("%s", caveat)
    publish(config, summary)
    tracking.log_aggregation(config, store, summary)  # cost per cell, the gates and the report on the MLflow runs
    return summary


@flow(name="aggregate-all", log_prints=True)
def aggregate_all(store: str = "results") -> dict:
    """The scheduled job: re-aggregate every screen in the store that has results newer than its report; a screen
    whose run is still going is skipped (its own phase 4 aggregates it), and said so with its "N of M cells"."""
    done = {}
    for name in screen_names(store):
        config = load_screen(store, name)
        results = ResultStore.for_config(config)
        cells = cells_of(results.finished_count(), distinct_cells(config))
        if still_running(config.name):
            print(f"{config.name}: still running ({cells} finished), skipped")
        elif _stale(results):
            summary = aggregate(config)
            publish(config, summary)
            done[config.name] = summary["report"]
            print(f"{config.name}: re-aggregated ({cells})")
        else:
            print(f"{config.name}: report up to date ({cells})")
    print(f"re-aggregated {len(done)} screen(s): {sorted(done)}")
    return done


def publish(config: ScreenConfig, summary: dict) -> None:
    """The summary (markdown) and report-link artifacts on the current flow run: the aggregate subflow, the screen
    run and the scheduled aggregate's run each call it, so each run shows them itself."""
    if not summary.get("markdown"):
        return
    create_markdown_artifact(key=artifact_key(f"summary-{config.name}"), markdown=summary["markdown"],
                             description=f"screen {config.name}: TL;DR, gates, effects")
    create_link_artifact(key=artifact_key(f"report-{config.name}"), link=summary["url"],
                         link_text="clean_result.html",
                         description=f"the report, in the store {summary['store']} (eps-screen serve serves it)")


def still_running(name: str) -> bool:
    """A run of the `screen` flow for this screen is going (its process alive or not known to be gone)."""
    with get_client(sync_client=True) as client:
        runs = screen_runs(client, name)
    return any(r.state is not None and r.state.type.value in {"RUNNING", "PENDING"} and process_alive(r) is not False
               for r in runs)


def _stale(store: ResultStore) -> bool:
    """New results since the last report: any metrics.json newer than aggregate_metrics.json."""
    report = store.mtimes("report/aggregate_metrics.json")
    if not report:
        return True
    made = max(report.values())
    return any(t > made for t in store.mtimes("cells/*/*/metrics.json").values())


def cells_of(present: int, total: int) -> str:
    """"N of M cells": M is the plan's distinct cells, the total the progress artifact counts to."""
    return f"{present} of {total} cells"


def _summary_markdown(config: ScreenConfig, result, url: str, total: int, where: str) -> str:
    """The TL;DR, the gate table, the declared factors (the values each level sets) and the pooled main-effect
    table with what its intervals omit, with the report's link and its store."""
    cov = result.metrics.coverage
    lines = [
        f"# Screen `{config.name}`: {cells_of(cov.present, total)}"
        + (" (partial: some cells are missing)" if result.partial else ""),
        f"[clean_result.html]({url}) in the store `{where}`",
        "",
        f"**TL;DR.** {_md_cell(tldr(config, result))}",
        "",
        "| gate | fired | reason |",
        "|---|---|---|",
    ]
    lines += [f"| {g.number} {g.name} | {'**yes**' if g.fired else 'no'} | {_md_cell(g.reason)} |"
              for g in result.metrics.gates]
    if cost := result.metrics.extras.get("cost"):  # estimate beside actual, as the report's Cost section
        lines += ["", f"**Cost.** {_md_cell(cost_sentence(cost))}", "", "| " + " | ".join(COST_HEADERS) + " |",
                  "|---|" + "---:|" * 4 + "---|"]
        lines += ["| " + " | ".join(_md_cell(v) for v in row) + " |" for row in cost_rows(cost)]
    words = level_words(config)
    lines += ["", "| factor | level 0 | level 1 |", "|---|---|---|"]
    lines += [f"| {f.short} {_md_cell(f.label)} | {_md_cell(words[f.short][0])} | {_md_cell(words[f.short][1])} |"
              for f in config.design.factors]
    lines += ["", f"| effect (pooled over sources) | response | low -> high | Cohen's d [{config.bootstrap.ci:.0%} CI] | clear |",
              "|---|---|---|---|---|"]
    pooled = [e for e in result.main_effects.effects if e.source == "pooled"]
    lines += [f"| {e.term} {_md_cell(e.label)} | {e.response} | {_pct(e.mean_low)} -> {_pct(e.mean_high)} | {_d(e)} | "
              f"{'**clear**' if e.clear else 'not clear'} |"  # the page's one definition (TermEffect.clear)
              for e in sorted(pooled, key=lambda e: (e.response, -abs(e.d or 0.0)))]
    lines += [f"\n**Caveat.** {_md_cell(c)}" for c in result.estimates.caveats]
    lines += ["", f"Cells present: {cells_of(cov.present, total)} ({cov.expected} expected by the phases run so far)"]
    return "\n".join(lines)


def _md_cell(text) -> str:
    """A markdown table cell: a reason such as "largest |d| is ..." must not split the row."""
    return str(text).replace("|", "\\|")


def _d(e) -> str:
    if e.d is None:
        return "n/a"
    lo, hi = e.d_ci.low, e.d_ci.high
    return f"{e.d:+.2f}" + ("" if lo is None or hi is None else f" [{lo:+.2f}, {hi:+.2f}]")


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"
