"""`eps-screen deploy`: create/update the work pools and apply deployments/prefect.yaml (flows/runtime/deploy.py)."""

from __future__ import annotations

from flows.cli.session import command_env, console
from flows.runtime.deploy import deploy, template_json


def run(args) -> int:
    command_env()
    if args.print_template:
        print(template_json(args.print_template))
        return 0
    return deploy(console(), pools=args.pool, gpus=args.gpus, aggregate_cron=args.aggregate_cron,
                  aggregate_store=args.aggregate_store)
