"""Aggregation: reads only the result store, so it runs anywhere (CPU), any time, on a partial screen."""

from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger
from prefect.artifacts import create_link_artifact, create_markdown_artifact

from eps_screen.config import ScreenConfig
from eps_screen.store import ResultStore, screen_names
from flows.ops import aggregate_here, load_screen
from tasks.cells import artifact_key


def _md_cell(text) -> str:
    """A markdown table cell: a reason such as "largest |d| is ..." must not split the row."""
    return str(text).replace("|", "\\|")


def _summary_markdown(config: ScreenConfig, result, report: Path) -> str:
    cov = result.metrics.coverage
    lines = [
        f"# Screen `{config.name}`",
        f"Report: `{report}`" + (" (partial: some cells are missing)" if result.partial else ""),
        "",
        "| gate | fired | reason |",
        "|---|---|---|",
    ]
    lines += [f"| {g.number} {g.name} | {'**yes**' if g.fired else 'no'} | {_md_cell(g.reason)} |"
              for g in result.metrics.gates]
    lines += ["", f"Cells present: {cov.model_dump().get('present', '')}"]
    return "\n".join(lines)


@flow(name="aggregate", log_prints=True)
def aggregate(config: ScreenConfig) -> dict:
    """Main effects, interactions, gates 3-4, predictions, figures and clean_result.html from stored cells."""
    summary, result = aggregate_here(config)  # the same work as `eps-screen report` without a server
    if result is None:
        store = ResultStore.for_config(config)
        get_run_logger().warning("no finished cells in %s yet: nothing to aggregate", store.dir)
        return summary
    report = result.paths["clean_result.html"]
    create_markdown_artifact(
        key=artifact_key(f"summary-{config.name}"), markdown=_summary_markdown(config, result, report)
    )
    create_link_artifact(
        key=artifact_key(f"report-{config.name}"), link=report.as_uri(), link_text="clean_result.html"
    )
    return summary


def _stale(store: ResultStore) -> bool:
    """New results since the last report: any metrics.json newer than aggregate_metrics.json."""
    report = store.mtimes("report/aggregate_metrics.json")
    if not report:
        return True
    made = max(report.values())
    return any(t > made for t in store.mtimes("cells/*/*/metrics.json").values())


@flow(name="aggregate-all", log_prints=True)
def aggregate_all(store: str = "results") -> dict:
    """The scheduled job: re-aggregate every screen in the store that has results newer than its report."""
    done = {}
    for name in screen_names(store):
        config = load_screen(store, name)
        if _stale(ResultStore.for_config(config)):
            done[config.name] = aggregate(config)["report"]
    print(f"re-aggregated {len(done)} screen(s): {sorted(done)}")
    return done
