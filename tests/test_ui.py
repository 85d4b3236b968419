"""The web UI in headless Chromium against a live cluster: the cluster page, the jobs list's search and status filter, a job created through the form whose run and logs appear, a job page with 10 fire times, pause/resume/edit, DST changes marked, skipped runs with their reasons, a DAG run's graph, a run fired ahead (when it was armed, no lateness before its call), the lateness chart, a tenant reader's pages without the cluster's counts, and no JavaScript error on any page."""

from __future__ import annotations

import datetime as dt
from typing import Callable

import pytest

from raftsched.testing.browser import ARTIFACTS_DIR, chromium_driver, missing_browser
from raftsched.testing.cluster import LocalCluster
from raftsched.testing.http import ADMIN_TOKEN, wait_until
from raftsched.testing.sink import Sink

pytestmark = pytest.mark.integration

SINK_BODY = "hello from the sink"
# A slow path: a run of it stays open long enough for the next trigger to be skipped.
SLOW_PATH = "/slow"
WAIT_S = 45.0


def iso(when: dt.datetime) -> str:
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@pytest.fixture(scope="module")
def sink():
    def delay(call) -> float:
        return 4.0 if call.path.endswith(SLOW_PATH) else 0.0
    with Sink(delay_for=delay, body_for=lambda call: SINK_BODY.encode()) as s:
        yield s


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with LocalCluster(tmp_path_factory.mktemp("ui")) as c:
        c.wait_ready()
        yield c


@pytest.fixture(scope="module")
def browser():
    why = missing_browser()
    if why is not None:
        pytest.skip(why)
    from selenium.common.exceptions import (NoSuchElementException,
                                            StaleElementReferenceException)
    from selenium.webdriver.support.ui import WebDriverWait

    driver = chromium_driver()
    driver.set_page_load_timeout(WAIT_S)
    # The views re-render as they poll: an element read a moment ago may be gone.
    driver.wait = lambda: WebDriverWait(driver, WAIT_S, ignored_exceptions=(
        NoSuchElementException, StaleElementReferenceException))
    try:
        yield driver
        # Whatever order the tests ran in, no page they opened may have logged
        # a JavaScript error (a module that failed to load, a view that threw).
        errors = [entry for entry in driver.get_log("browser")
                  if entry["level"] == "SEVERE" and entry.get("source") == "javascript"]
        assert errors == [], errors
    finally:
        driver.quit()


def css(driver, selector: str):
    from selenium.webdriver.common.by import By
    return driver.find_element(By.CSS_SELECTOR, selector)


def css_all(driver, selector: str) -> list:
    from selenium.webdriver.common.by import By
    return driver.find_elements(By.CSS_SELECTOR, selector)


def wait_for(driver, what: Callable[[object], object], message: str):
    return driver.wait().until(what, message)


def wait_text(driver, selector: str, text: str) -> None:
    wait_for(driver, lambda d: text in css(d, selector).text,
             f"{text!r} in {selector} (now: {page_text(driver)[:800]!r})")


def page_text(driver) -> str:
    try:
        return css(driver, "main").text
    except Exception:   # noqa: BLE001 - only for the failure message
        return "<no main>"


def go(driver, cluster, fragment: str) -> None:
    driver.get(f"{cluster.url('n1')}/#{fragment}")


def fill(element, text: str) -> None:
    element.clear()
    element.send_keys(text)


def screenshot(driver, name: str) -> str:
    ARTIFACTS_DIR.mkdir(exist_ok=True)
    path = ARTIFACTS_DIR / name
    assert driver.save_screenshot(str(path)), path
    print(f"screenshot: {path}")
    return str(path)


@pytest.fixture(scope="module")
def signed_in(browser, cluster):
    """The browser on the UI with the admin token entered."""
    go(browser, cluster, "/")
    fill(css(browser, "#token"), ADMIN_TOKEN)
    css(browser, "#auth button").click()
    return browser


def test_the_cluster_page_shows_every_node_and_the_leader(signed_in, cluster):
    wait_for(signed_in, lambda d: len(css_all(d, "#nodes tbody tr")) == 3, "3 nodes listed")
    leader = cluster.leader()
    wait_text(signed_in, "#leader", leader)
    assert css(signed_in, "#nodes .leader").text == leader
    screenshot(signed_in, "ui-cluster.png")


def test_a_job_created_in_the_form_runs_and_its_logs_show(signed_in, cluster, sink):
    from selenium.webdriver.support.ui import Select

    go(signed_in, cluster, "/new")
    form = css(signed_in, "#create-form")
    fill(form.find_element("name", "name"), "ui one-off")
    Select(form.find_element("name", "kind")).select_by_value("once")
    fill(form.find_element("name", "run_at"),
         iso(dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=2)))
    fill(form.find_element("name", "url"), sink.url + "/ui")
    css(signed_in, "#create").click()
    wait_for(signed_in, lambda d: "#/jobs/job_" in d.current_url, "the new job's page")
    job_id = signed_in.current_url.rsplit("/", 1)[1]
    wait_text(signed_in, "h1", "ui one-off")
    wait_text(signed_in, "#runs", "succeeded")
    assert [c.path.rsplit("/", 1)[1] for c in sink.by_job()[job_id]] == ["ui"]

    css(signed_in, "#runs tbody a").click()
    wait_for(signed_in, lambda d: "#/runs/run_" in d.current_url, "the run's page")
    wait_text(signed_in, "#run-state", "succeeded")
    wait_text(signed_in, "#attempts", "200")
    wait_text(signed_in, "#logs", SINK_BODY)
    screenshot(signed_in, "ui-run.png")


def test_a_run_fired_ahead_shows_when_it_was_armed_and_no_lateness_before_its_call(
        signed_in, cluster, sink):
    created = cluster.api("n1", "POST", "/v1/jobs", {
        "name": "ui armed", "run_at": iso(dt.datetime.now(dt.timezone.utc)
                                          + dt.timedelta(seconds=20)),
        "target": {"type": "http", "url": sink.url + "/armed"}})
    assert created.status == 201, created
    job_id = created.body["job_id"]
    # Fired within the arming window, long before its second.
    runs = wait_until(lambda: cluster.api("n1", "GET", f"/v1/jobs/{job_id}/runs").body["runs"],
                      15, "the one-off fired ahead")
    assert runs[0]["armed_at"] is not None and runs[0]["state"] == "armed", runs[0]
    go(signed_in, cluster, f"/runs/{runs[0]['run_id']}")
    wait_text(signed_in, "#run-armed", "fired ahead")
    assert "late by -)" in page_text(signed_in)   # no start until its call
    assert sink.by_job().get(job_id, []) == []    # and it was not called early


def test_the_jobs_list_searches_by_name_and_filters_by_status(signed_in, cluster):
    for name in ("ui list alpha", "ui list beta"):
        created = cluster.api("n1", "POST", "/v1/jobs", {
            "name": name, "schedule": {"every": "1h"},
            "target": {"type": "http", "url": "http://127.0.0.1:9/never"}})
        assert created.status == 201, created
    paused = cluster.api("n1", "POST", f"/v1/jobs/{created.body['job_id']}:pause")
    assert paused.status == 200, paused
    go(signed_in, cluster, "/jobs")
    fill(css(signed_in, "#search"), "ui list")
    wait_for(signed_in, lambda d: listed_names(d) == ["ui list alpha", "ui list beta"],
             "the two jobs named ui list")
    from selenium.webdriver.support.ui import Select
    Select(css(signed_in, "#status")).select_by_value("paused")
    wait_for(signed_in, lambda d: listed_names(d) == ["ui list beta"], "only the paused one")


def listed_names(driver) -> list[str]:
    return sorted(cell.text for cell in css_all(driver, "#jobs tbody tr td:first-child"))


def test_a_job_page_shows_10_fire_times_and_pause_resume_and_edit_work(signed_in, cluster):
    created = cluster.api("n1", "POST", "/v1/jobs", {
        "name": "ui nightly", "schedule": {"cron": "30 2 * * *", "timezone": "Europe/Berlin"},
        "target": {"type": "http", "url": "http://127.0.0.1:9/never"}})
    assert created.status == 201, created
    job_id = created.body["job_id"]
    go(signed_in, cluster, f"/jobs/{job_id}")
    wait_for(signed_in, lambda d: len(css_all(d, "#fires tbody tr")) == 10, "10 fire times")
    first = css(signed_in, "#fires tbody tr").text
    assert "02:30:00+01:00" in first, first      # Berlin in winter
    assert "01:30:00Z" in first, first

    css(signed_in, "#act-pause").click()
    wait_text(signed_in, "#job-status", "paused")
    wait_text(signed_in, "#action-result", "the job is paused")
    css(signed_in, "#act-resume").click()
    wait_text(signed_in, "#job-status", "active")

    css(signed_in, "#act-edit").click()
    fill(css(signed_in, "#edit-form input[name=name]"), "ui nightly renamed")
    css(signed_in, "#edit-form button").click()
    wait_text(signed_in, "h1", "ui nightly renamed")
    assert cluster.api("n2", "GET", f"/v1/jobs/{job_id}?consistent=true").body["name"] == \
        "ui nightly renamed"
    screenshot(signed_in, "ui-job.png")


def test_the_preview_marks_a_dst_change(signed_in, cluster):
    from selenium.webdriver.support.ui import Select

    go(signed_in, cluster, "/new")
    form = css(signed_in, "#create-form")
    Select(form.find_element("name", "kind")).select_by_value("cron")
    assert not form.find_element("name", "run_at").is_displayed()   # one-off only
    fill(form.find_element("name", "cron"), "30 3 * * *")
    fill(form.find_element("name", "timezone"), "Europe/Berlin")
    fill(form.find_element("name", "after"), "2026-03-25T00:00:00Z")
    css(signed_in, "#preview").click()
    wait_for(signed_in, lambda d: len(css_all(d, "#preview-fires tbody tr")) == 10,
             "10 previewed fire times")
    marked = css_all(signed_in, "#preview-fires tr.dst-row")
    assert len(marked) == 1
    assert "2026-03-29T03:30:00+02:00" in marked[0].text
    assert "DST change: +01:00 \u2192 +02:00" in marked[0].text
    screenshot(signed_in, "ui-new.png")


def test_why_it_did_not_run_shows_a_skipped_run_and_its_reason(signed_in, cluster, sink):
    created = cluster.api("n1", "POST", "/v1/jobs", {
        "name": "ui slow", "schedule": {"cron": "0 3 1 1 *"},
        "concurrency": {"policy": "skip_if_running"},
        "target": {"type": "http", "url": sink.url + SLOW_PATH}})
    assert created.status == 201, created
    job_id = created.body["job_id"]
    first = cluster.api("n1", "POST", f"/v1/jobs/{job_id}:trigger")
    assert first.status == 201, first
    second = wait_until(lambda: (lambda r: r if r.status == 201 else None)(
        cluster.api("n1", "POST", f"/v1/jobs/{job_id}:trigger")), 10, "a second run")
    assert second.body["state"] == "skipped", second
    go(signed_in, cluster, "/why")
    wait_text(signed_in, "#not-run", second.body["run_id"])
    wait_text(signed_in, "#not-run", "skip_if_running")
    wait_text(signed_in, "#refusals", "circuit breakers open")   # per node, from /v1/cluster
    screenshot(signed_in, "ui-why.png")
    go(signed_in, cluster, f"/jobs/{job_id}")
    wait_text(signed_in, "#job-why #not-run", "skip_if_running")


def test_a_dag_run_shows_its_graph_coloured_by_state(signed_in, cluster, sink):
    def task(tid: str, *deps: str) -> dict:
        return {"id": tid, "target": {"type": "http", "url": f"{sink.url}/dag/{tid}"},
                "depends_on": list(deps)}
    created = cluster.api("n1", "POST", "/v1/jobs", {"name": "ui dag", "dag": {"tasks": [
        task("extract"), task("fx"), task("load", "extract", "fx"), task("report", "load")]}})
    assert created.status == 201, created
    run = cluster.api("n1", "POST", f"/v1/jobs/{created.body['job_id']}:trigger")
    assert run.status == 201, run
    go(signed_in, cluster, f"/runs/{run.body['run_id']}")
    wait_for(signed_in, lambda d: {g.get_attribute("data-state")
                                   for g in css_all(d, "#dag .dag-task")} == {"succeeded"},
             "every task of the DAG drawn as succeeded")
    tasks = {g.get_attribute("data-task") for g in css_all(signed_in, "#dag .dag-task")}
    assert tasks == {"extract", "fx", "load", "report"}
    fill_colour = css(signed_in, "#dag .dag-task rect").get_attribute("fill")
    assert fill_colour == "#4caf50"
    screenshot(signed_in, "ui-dag.png")
    css(signed_in, "#dag a[href*='#/runs/run_']").click()
    wait_text(signed_in, "dl", "task of")
    wait_text(signed_in, "#logs", SINK_BODY)
    go(signed_in, cluster, f"/jobs/{created.body['job_id']}")
    wait_text(signed_in, "dl", "DAG of 4 tasks")
    wait_text(signed_in, "#runs", "succeeded")


def test_the_lateness_chart_plots_the_last_hours_runs(signed_in, cluster, sink):
    created = cluster.api("n1", "POST", "/v1/jobs", {
        "name": "ui lateness", "schedule": {"cron": "0 3 1 1 *"},
        "target": {"type": "http", "url": sink.url + "/late"}})
    assert created.status == 201, created
    run_ids = set()
    for _ in range(2):
        run = cluster.api("n1", "POST", f"/v1/jobs/{created.body['job_id']}:trigger")
        assert run.status == 201, run
        run_ids.add(run.body["run_id"])
    go(signed_in, cluster, "/lateness")
    wait_for(signed_in, lambda d: run_ids <= {c.get_attribute("data-run")
                                              for c in css_all(d, "#lateness-chart circle")},
             "the hour's runs plotted")
    assert "runs started, last hour" in css(signed_in, "#lateness-stats").text
    labels = [t.text for t in css_all(signed_in, "#lateness-chart text.axis")]
    assert labels[-5:] == ["-60 min", "-45 min", "-30 min", "-15 min", "now"], labels
    assert labels[0] == "0 ms", labels     # the y axis, from 0 up
    screenshot(signed_in, "ui-lateness.png")



def test_a_tenants_reader_sees_its_runs_but_not_the_clusters_counts(signed_in, cluster):
    made = cluster.api("n1", "POST", "/v1/tokens", {"tenant": "default", "role": "reader",
                                                     "name": "ui-reader"})
    assert made.status == 201, made
    wait_until(lambda: all(cluster.api(nid, "GET", "/v1/node/clock", token=made.body["token"])
                           .status == 200 for nid in cluster.ids), 10, "the reader known")
    try:
        go(signed_in, cluster, "/")
        fill(css(signed_in, "#token"), made.body["token"])
        css(signed_in, "#auth button").click()
        wait_text(signed_in, "main .error", "may not read")   # the cluster page: 403
        go(signed_in, cluster, "/lateness")
        wait_text(signed_in, "#lateness-stats", "runs started, last hour")
        assert "first calls made by" not in css(signed_in, "#lateness-stats").text
        go(signed_in, cluster, "/why")
        wait_text(signed_in, "#refusals", "operator or admin token")
    finally:   # the other tests sign in as the admin
        go(signed_in, cluster, "/")
        fill(css(signed_in, "#token"), ADMIN_TOKEN)
        css(signed_in, "#auth button").click()
