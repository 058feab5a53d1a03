"""Generate the committed Grafana dashboard JSON from dashboards/capwatch.py.

The chart ships the file (charts/capwatch/dashboards/capwatch.json) as an
optional ConfigMap for Grafana's dashboard sidecar.

    python scripts/gendashboard.py           # regenerate the JSON
    python scripts/gendashboard.py --check   # exit 1 if the JSON is stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grafana_foundation_sdk.cog.encoder import JSONEncoder

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: the dashboards package is at the root

from dashboards.capwatch import COMMITTED, build  # noqa: E402

OUT = COMMITTED


def render() -> str:
    """The dashboard's JSON text, exactly as committed."""
    return JSONEncoder(sort_keys=True, indent=2).encode(build()) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the JSON is stale")
    args = parser.parse_args()
    fresh = render()
    where = OUT.relative_to(ROOT)
    if args.check:
        if not OUT.is_file() or OUT.read_text() != fresh:
            print(f"{where} is stale; run `make dashboard`", file=sys.stderr)
            return 1
        print(f"{where} is fresh")
        return 0
    OUT.write_text(fresh)
    print(f"generated {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
