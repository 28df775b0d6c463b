"""The `screen/preset` deployment's flow: a screen started from the UI with five fields instead of the ~90 of the
whole ScreenConfig (the `screen/screen` deployment, which `eps-screen run --submit` uses).

The same flow name as flows/screen.py's, so every screen run, however started, is a run of the flow `screen`,
named screen-NAME and tagged screen:NAME, with the same phases, gates and artifacts: after resolving its config
this runs the same body (flows.screen.run_screen) in this run, not as a subflow.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from prefect import flow, get_run_logger
from prefect.states import Failed

from eps_screen.spec.config import ConfigError
from eps_screen.spec.presets import preset_summaries, resolve
from flows.runtime.runs import record_owner
from flows.screen import JOB_NAMES, PHASES, run_name, run_screen

REPO = Path(__file__).resolve().parents[1]
# The form's choices and their help come from the shipped configs (deployments/configs/*.yaml): each one's name,
# and the first sentence of its opening comment.
PRESETS = preset_summaries(REPO)
Preset = Literal[tuple(PRESETS)]  # type: ignore[valid-type]


def _with_preset_help(fn):
    """The preset's help in the docstring (Prefect reads each argument's help from it), before the flow is made."""
    fn.__doc__ = fn.__doc__.replace("{presets}", "; ".join(f"{name}: {text}" for name, text in PRESETS.items()))
    return fn


@flow(name="screen", on_running=[record_owner], flow_run_name=run_name, validate_parameters=True,
      description="A factorial screen from a shipped preset (deployments/configs) or a config file, with overrides. "
                  + PHASES + JOB_NAMES)
@_with_preset_help
def screen_preset(preset: Preset = "tiny", config_path: str = "", name: str = "", store: str = "",
                  overrides: dict[str, Any] = {}):  # never mutated; a dict default gives the form a JSON editor, not a None toggle
    """A screen from a preset.

    Args:
        preset: A shipped config, deployments/configs/PRESET.yaml in the repository (tiny is what `eps-screen
            run` runs). {presets}.
        config_path: A config file to use instead of the preset: absolute, or relative to the repository (the run's
            working directory). Empty: the preset.
        name: The screen's name: the run is named screen-NAME and results go to STORE/NAME. Empty: the config's.
        store: The result store, a directory (relative to the repository, or absolute) or a URL such as
            s3://bucket/prefix. Empty: the config's.
        overrides: Config fields to change, by dotted path or as a partial config, e.g.
            {"execution.pool": "local-gpu", "eval": {"samples": 2}}. Checked when the run starts; a bad field fails
            it at once with one line naming the field.
    """
    try:
        config = resolve(preset, config_path, name, store, overrides)
    except ConfigError as err:
        for line in err.problems:
            get_run_logger().error("%s", line)
        return Failed(message="; ".join(err.problems))
    get_run_logger().info("config: %s%s", config_path or f"preset {preset}",
                          f" with {', '.join(sorted(overrides))} changed" if overrides else "")
    return run_screen(config)

