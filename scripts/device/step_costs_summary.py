"""The tables of a `bench --perf --step-costs` JSON report under a label (step_costs_ab.sh),
as the bench prints them (perf_steps.format_table).

    python3 scripts/device/step_costs_summary.py REPORT.json LABEL
"""
import json
import sys

from eagle_zoo.perf_steps import format_table

for table in json.load(open(sys.argv[1]))["step_costs"]:
    print(f"== {sys.argv[2]}")
    print(f"{table['shape']}: {table['error']}" if "error" in table else format_table(table))
