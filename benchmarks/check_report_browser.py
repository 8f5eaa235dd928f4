"""Check a study's report.html in a real browser (headless Chromium; not in CI, which has none), and screenshot it.

    python benchmarks/check_report_browser.py results/<study>/report.html [--screenshot docs/images/report_html.png]

For the page as it opens and for a few filter presets (``report.html#dispatcher=...&pp=...&near=...``, the page's own
link syntax), Chromium renders the page (``--dump-dom`` after 8 s of virtual time) with console logging on; the check
fails on any console message (``Uncaught`` errors included) and unless the page's script drew the front (plotly's SVG)
and filled the near-the-fastest answer with what the same filter gives in Python (the trial with the most headroom
within the band of the fastest). Needs ``chromium`` on the PATH (Debian's package).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote


def _render(page: Path, fragment: str) -> tuple[str, list[str]]:
    cmd = [
        "chromium", "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
        "--virtual-time-budget=8000", "--dump-dom", page.resolve().as_uri() + fragment,
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    console = [line for line in p.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    return p.stdout, console


def _expected(
    rows: list[dict], dispatcher: str = "", recompute: str = "", pp: str = "", near: float = 5.0
) -> int | None:
    keep = [
        r
        for r in rows
        if (not dispatcher or r["dispatcher"] == dispatcher)
        and (not recompute or r["recompute"] == recompute)
        and (not pp or str(r["pp"]) == pp)
        and r["tps"] is not None
    ]
    if not keep:
        return None
    best = max(r["tps"] for r in keep)
    band = [r for r in keep if r["tps"] >= (1 - near / 100) * best]
    return max(band, key=lambda r: (r["headroom"] if r["headroom"] is not None else -1e300, r["tps"]))["trial"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("page", type=Path)
    ap.add_argument("--screenshot", type=Path, default=None)
    a = ap.parse_args()
    if shutil.which("chromium") is None:
        print("chromium is not installed (apt-get install chromium)", file=sys.stderr)
        return 2
    text = a.page.read_text(encoding="utf-8")
    data = json.loads(
        re.search(r'<script type="application/json" id="report-data">(.*?)</script>', text, re.S)
        .group(1)
        .replace("<\\/", "</")
    )
    rows = data["rows"]
    disp = sorted({r["dispatcher"] for r in rows})
    pps = sorted({str(r["pp"]) for r in rows})
    cases = [
        {},
        {"dispatcher": disp[0]},
        {"pp": pps[0], "near": 10.0},
        {"dispatcher": disp[-1], "pp": pps[-1], "near": 10.0},
        {"recompute": rows[0]["recompute"]},
    ]
    failed = 0
    for case in cases:
        frag = "#" + "&".join(f"{k}={quote(str(v))}" for k, v in case.items()) if case else ""
        dom, console = _render(a.page, frag)
        want = _expected(rows, **case)
        m = re.search(r'id="near-answer">(trial (\d+)|none)', dom)
        got = int(m.group(2)) if m and m.group(2) else None
        if m is None:
            console.append("no near-the-fastest answer on the page")
        svg = dom.count("main-svg")
        ok = not console and got == want and svg >= 3
        failed += not ok
        print(
            json.dumps(
                {
                    "preset": frag or "(none)",
                    "console_messages": console,
                    "near_answer_trial": got,
                    "expected": want,
                    "plotly_svgs": svg,
                    "ok": ok,
                }
            )
        )
    if a.screenshot:
        subprocess.run(
            [
                "chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                f"--screenshot={a.screenshot}", "--window-size=1400,2600", "--virtual-time-budget=8000",
                a.page.resolve().as_uri(),
            ],
            capture_output=True,
            timeout=180,
        )
        print(f"wrote {a.screenshot}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
