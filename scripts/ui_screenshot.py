#!/usr/bin/env python3
"""Regenerate docs/ui.png: the web UI's page of a job with some runs.

Starts a local 3-node cluster and an HTTP sink on 127.0.0.1, creates a monthly
job in Europe/Berlin (its next 10 fire times cross a DST change), backfills
its last six months (one of them answered with a 500) and triggers it once,
then photographs the job's page in headless Chromium.

    .venv/bin/python scripts/ui_screenshot.py [--out docs/ui.png]
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
from pathlib import Path

from raftsched.testing.browser import chromium_driver, missing_browser
from raftsched.testing.cluster import LocalCluster
from raftsched.testing.http import ADMIN_TOKEN, wait_until
from raftsched.testing.sink import Sink

ROOT = Path(__file__).resolve().parents[1]
TERMINAL = {"succeeded", "failed", "skipped", "missed", "cancelled"}
# The backfilled month whose call the sink answers with a 500.
FAILING_MONTH = "-09-"
WAIT_S = 60.0


def seed(cluster: LocalCluster, url: str) -> str:
    """The job, with its backfilled and triggered runs all ended."""
    created = cluster.api("n1", "POST", "/v1/jobs", {
        "name": "monthly-invoices", "schedule": {"cron": "0 6 1 * *", "timezone": "Europe/Berlin"},
        "target": {"type": "http", "url": url + "/invoices"}, "retry": {"max_attempts": 1},
        "labels": {"team": "billing"}})
    assert created.status == 201, created
    job_id = created.body["job_id"]
    now = dt.datetime.now(dt.timezone.utc)
    start = (now - dt.timedelta(days=183)).isoformat(timespec="seconds").replace("+00:00", "Z")
    end = now.isoformat(timespec="seconds").replace("+00:00", "Z")
    started = cluster.api("n1", "POST", f"/v1/jobs/{job_id}:backfill",
                          {"start": start, "end": end})
    assert started.status == 202, started
    wait_until(lambda: cluster.api("n1", "GET", f"/v1/backfills/{started.body['backfill_id']}")
               .body["state"] != "running", WAIT_S, "the backfill to end")
    triggered = cluster.api("n1", "POST", f"/v1/jobs/{job_id}:trigger")
    assert triggered.status == 201, triggered

    def all_ended() -> bool:
        runs = cluster.api("n1", "GET", f"/v1/jobs/{job_id}/runs").body["runs"]
        return len(runs) >= 2 and all(r["state"] in TERMINAL for r in runs)
    wait_until(all_ended, WAIT_S, "every run to end")
    return job_id


def photograph(cluster: LocalCluster, job_id: str, out: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver = chromium_driver()
    try:
        driver.get(cluster.url("n1") + "/")
        driver.find_element(By.ID, "token").send_keys(ADMIN_TOKEN)
        driver.find_element(By.CSS_SELECTOR, "#auth button").click()
        driver.get(f"{cluster.url('n1')}/#/jobs/{job_id}")
        wait = WebDriverWait(driver, WAIT_S)
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#fires tbody tr")) == 10)
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#runs tbody tr")) >= 5)
        out.parent.mkdir(parents=True, exist_ok=True)
        assert driver.save_screenshot(str(out)), out
    finally:
        driver.quit()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "ui.png")
    args = parser.parse_args()
    why = missing_browser()
    if why is not None:
        print(f"ui_screenshot: {why}", file=sys.stderr)
        return 1

    def status(call) -> int:
        return 500 if FAILING_MONTH in call.headers.get("X-Raftsched-Scheduled-For", "") else 200
    with tempfile.TemporaryDirectory() as tmp, Sink(status_for=status) as sink, \
            LocalCluster(tmp) as cluster:
        cluster.wait_ready()
        job_id = seed(cluster, sink.url)
        photograph(cluster, job_id, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
