"""What people see: rich tables and lines for each room's report, one module per room.

The rooms themselves (capacity, plan, preflight, telemetry) return data and never import
rich; `--json` prints the same data through `raydlc.views.output.emit_json`.
"""
