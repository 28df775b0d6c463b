"""`eps-screen` with its simulated cells counted, and slowed or held, for tests that stop a screen mid-run:
`python tests/integration/counted_cells.py run CONFIG ...`.

Every simulated cell computation started appends its cell id to $CELL_COUNTER; each then sleeps $SLOW_CELL_S
(default 0); one started after $BLOCK_AFTER others of this process's counter never finishes (default: none held),
so a signal sent once the store holds those cells lands while a cell is in flight, whatever the machine's speed.
"""

import os
import sys
import threading
import time

import eps_screen.run.simulate as sim

_simulate = sim.simulate_cell_answers


def counted(config, cell, *args, **kwargs):  # the pipeline imports this name at call time
    with open(os.environ["CELL_COUNTER"], "a") as f:
        f.write(cell.id + "\n")
    with open(os.environ["CELL_COUNTER"]) as f:
        started = len(f.read().split())
    if started > int(os.environ.get("BLOCK_AFTER", sys.maxsize)):
        threading.Event().wait()  # in flight until a signal ends the run
    time.sleep(float(os.environ.get("SLOW_CELL_S", "0")))
    return _simulate(config, cell, *args, **kwargs)


sim.simulate_cell_answers = counted

if __name__ == "__main__":
    from flows.cli import main

    sys.exit(main(sys.argv[1:]))
