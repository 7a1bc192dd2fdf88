"""The daemon's live page on a real local cluster of 3 daemons: its files and
JSON over HTTP on 127.0.0.1, and the page itself in headless Chromium (skipped
where no browser is installed: .ci/setup installs Debian's chromium and
chromium-driver, the dev extra selenium)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import urllib.request
from pathlib import Path

import pytest

from conftest import example_job, wait_for

pytestmark = pytest.mark.e2e

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
# Where the healthy page's screenshot is copied as well (docs/img/page.png is made so).
SCREENSHOT_COPY = os.environ.get("PEERD_PAGE_SCREENSHOT", "")


def get(url: str) -> tuple[str, bytes]:
    with urllib.request.urlopen(url, timeout=10) as reply:
        assert reply.status == 200, url
        return reply.headers["Content-Type"], reply.read()


def page_json(url: str) -> dict:
    kind, body = get(url + "api/status")
    assert kind == "application/json"
    return json.loads(body)


def job_of(data: dict, name: str) -> dict | None:
    return next((j for j in data["view"] if j["name"] == name), None)


def training_cluster(local_cluster, name: str, job: dict | None = None, slowdowns=None, **settings):
    """3 daemons with their pages, each joined to `name`, long enough to outlast the test."""
    cluster = local_cluster(3, metrics=True, slowdowns=slowdowns, settings=(lambda peer: settings) if settings else None)
    wait_for(lambda: all(cluster.client(p).status().peers_known == 2 for p in cluster.peers), 30,
             "every daemon to see the other two")
    text = example_job(job={"name": name, "epochs": 50, "min_peers": 3, "eval_every_rounds": 10, **(job or {})})
    for peer in cluster.peers:
        cluster.client(peer).join(text)
    return cluster


def test_the_page_and_its_json_show_the_peers_and_the_job_as_it_moves_on(local_cluster):
    cluster = training_cluster(local_cluster, "paged")
    url = cluster.peers[0].page_url
    kind, html = get(url)
    assert kind.startswith("text/html") and b'src="app.js"' in html
    assert get(url + "app.js")[0].startswith("text/javascript") and get(url + "style.css")[1]

    def training(data: dict) -> dict | None:
        job = job_of(data, "paged")
        return job if job and len(job["members"]) == 3 and job["round"] >= 3 else None

    job = wait_for(lambda: training(page_json(url)), 180, "the job's 3 members and round 3 on peer-0's page")
    data = page_json(url)
    assert data["status"]["peer_id"] == "peer-0"
    assert sorted(p["peer_id"] for p in data["peers"]["peers"]) == ["peer-1", "peer-2"]
    assert all(p["state"] == "alive" and p["jobs"] == ["paged"] for p in data["peers"]["peers"])
    assert [m["member"] for m in job["members"]] == ["peer-0", "peer-1", "peer-2"]
    assert [m["local"] for m in job["members"]] == [True, False, False]
    assert job["here"] and job["global_batch"] == 96  # 3 × local_batch 32
    wait_for(lambda: job_of(page_json(url), "paged")["round"] >= job["round"] + 5, 120, "the round to move on")
    curves = wait_for(lambda: (h := page_json(url)["history"].get("paged", {})) and len(h) == 3 and h, 60,
                      "a curve of every member")
    assert all(any(v is not None for v in c["loss"]) for c in curves.values())
    # Another daemon's page shows the same job from its side.
    other = job_of(page_json(cluster.peers[2].page_url), "paged")
    assert [m["local"] for m in other["members"]] == [False, False, True]


def _browser(tmp_path: Path):
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("no Chromium here (apt-get install chromium chromium-driver; .ci/setup does)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the dev extra has it)")
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM  # the system's browser: nothing is downloaded
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000", "--hide-scrollbars"):
        options.add_argument(arg)
    service = Service(executable_path=CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log"))
    return webdriver.Chrome(service=service, options=options), service


def _screenshot(driver, path: Path) -> None:
    """The whole page, beyond the window (Chromium's DevTools protocol)."""
    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 4000), "scale": 1}
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True,
                                                             "clip": clip})
    path.write_bytes(base64.b64decode(shot["data"]))


# The page redraws every poll: read it in one script, never through elements a redraw replaces.
def _lines(driver, job: str, curve: str) -> int:
    """How many members' lines the chart draws with at least two points."""
    return driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].filter(p => (p.getAttribute('d') || '')"
        ".includes('L')).length", f'section.job[data-job="{job}"] svg.curve-{curve} path.line')


def _row(driver, job: str, member: str) -> dict[str, str]:
    return driver.execute_script(
        "const s = document.querySelector(arguments[0]); if (!s) return {};"
        "const heads = [...s.querySelectorAll('table.members th')].map(h => h.textContent);"
        "const row = s.querySelector(`tr[data-member='${arguments[1]}']`); if (!row) return {};"
        "return Object.fromEntries([...row.cells].map((c, k) => [heads[k], c.textContent]));",
        f'section.job[data-job="{job}"]', member)


def _summary(driver, job: str) -> tuple[int, str]:
    """The job's round (data-round) and its summary line."""
    got = driver.execute_script("const e = document.querySelector(arguments[0]);"
                                "return e ? [e.dataset.round, e.textContent] : null",
                                f'section.job[data-job="{job}"] .summary')
    return (int(got[0]), got[1]) if got else (-1, "")


def test_the_page_in_a_browser_draws_the_curves_and_shows_a_killed_worker_restarting(local_cluster, tmp_path):
    driver, service = _browser(tmp_path)
    try:
        # DBS, peer-2 slower: batches by speed. A long backoff keeps the killed
        # worker "restarting" for many of the page's polls.
        cluster = training_cluster(local_cluster, "browsed", job={"global_batch": 96}, slowdowns=(1, 1, 2),
                                   worker={"restart_backoff_s": 10.0})
        url = cluster.peers[0].page_url
        driver.get(url)
        wait_for(lambda: _lines(driver, "browsed", "loss") == 3, 180, "the loss curves of the 3 members")
        peers = driver.execute_script("return [...document.querySelectorAll('#peers tbody tr')].map(r => r.dataset.peer)")
        assert sorted(peers) == ["peer-0", "peer-1", "peer-2"]
        first, text = _summary(driver, "browsed")
        assert f"round {first}" in text and "3 members" in text
        wait_for(lambda: _summary(driver, "browsed")[0] >= first + 5, 120, "the round to move on on the page")
        wait_for(lambda: _lines(driver, "browsed", "metric") == 3, 180, "an evaluation of every member")
        assert all(_row(driver, "browsed", f"peer-{k}")["state"] == "running" for k in range(3))
        # The LR law in force, and this daemon's worker's factor (DBS at 96, the reference: 1).
        assert "LR: sqrt law against the reference batch 96, cap 2" in _summary(driver, "browsed")[1]
        factors = [_row(driver, "browsed", f"peer-{k}")["LR factor"] for k in range(3)]
        assert factors == ["1", "-", "-"]  # a peer's is on its own daemon's page
        if SCREENSHOT_COPY:  # for the docs: curves of a couple of minutes
            wait_for(lambda: all(min(c["t"]) <= -120 for c in page_json(url)["history"]["browsed"].values()), 300,
                     "two minutes of curves")
        _screenshot(driver, tmp_path / "page.png")
        if SCREENSHOT_COPY:
            shutil.copyfile(tmp_path / "page.png", SCREENSHOT_COPY)

        pid = cluster.client(cluster.peers[0]).status().jobs[0].worker_pid
        os.kill(pid, signal.SIGKILL)
        row = wait_for(lambda: (r := _row(driver, "browsed", "peer-0")).get("state") == "restarting" and r, 60,
                       "peer-0's killed worker to show as restarting")
        assert row["why not training"].startswith("restarting after a crash")
        _screenshot(driver, tmp_path / "restarting.png")
    finally:
        driver.quit()
        if service.process is not None and service.process.poll() is None:
            service.process.kill()  # by its PID; quit() stops it as a rule
            service.process.wait()
