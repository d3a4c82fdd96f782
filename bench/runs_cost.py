#!/usr/bin/env python3
"""A step-cost file whose steps are the runs' own: every step that ONLINE experiments recorded
(DIR/traces/*.steps.jsonl, record_trace), in place of a calibration's grid and served load; the rest
(shape, KV pool, request overhead, arrival costs) from the calibration. A diagnostic, not a
calibration: validated against it, the simulator's schedule, acceptance and arrivals are tested with
the step times' drift from the calibration taken out (docs/simulator.md, "Fidelity").

    python3 bench/runs_cost.py CALIBRATION.json OUT.json RESULTS_DIR [RESULTS_DIR ...]
"""
import glob
import json
import os
import sys


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        cost = json.load(f)
    steps = []
    for d in sys.argv[3:]:
        for path in sorted(glob.glob(os.path.join(d, "traces", "*.steps.jsonl"))):
            with open(path) as f:
                for line in f:
                    s = json.loads(line)
                    s.pop("start_s", None)
                    s["phase"] = "load"
                    steps.append(s)
    if not steps:
        sys.exit(f"no recorded steps under {sys.argv[3:]} (the specs need record_trace: true)")
    cost["steps"] = steps
    cost["command"] = "bench/runs_cost.py " + " ".join(sys.argv[1:])
    with open(sys.argv[2], "w") as f:
        json.dump(cost, f)


if __name__ == "__main__":
    main()
