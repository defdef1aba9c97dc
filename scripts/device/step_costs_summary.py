"""One line per strategy of a `bench --perf --step-costs` JSON report (step_costs_ab.sh).

    python3 scripts/device/step_costs_summary.py REPORT.json LABEL
"""
import json
import sys

for table in json.load(open(sys.argv[1]))["step_costs"]:
    for r in table.get("rows", []):
        graphs = ", ".join(f"{k} {v:.1f}" for k, v in r["graphs_us"].items())
        print(f"{sys.argv[2]} {table['shape']} {r['strategy']}: step {r['step_us']:.1f} us ({r['vs_plain']:.3f}x plain), "
              f"GPU busy {r['gpu_busy_us']:.1f}, host {r['host_us']:.1f}, {r['kernels']:.0f} kernels; {graphs}")
