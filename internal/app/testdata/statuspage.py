"""Drives braid's live status page in headless Chromium for TestStatusPageBrowser.

Usage: statuspage.py URL CHROMEDRIVER CHROMIUM SECONDS [ROLE_URL...]

Loads URL, waits for the page's third poll, prints one JSON line {"phase": "idle", ...} with
what the page plots (window.braid), then waits for a line on stdin (the test starts traffic),
waits SECONDS, prints {"phase": "traffic", ...}; then opens each ROLE_URL in turn, waits for its
third poll and prints {"phase": "role", "url": ..., ...}; last {"phase": "log", "entries": [...]}:
the browser's console over all of them. The test judges; this script only reads.
"""
import json
import shutil
import sys
import tempfile
import time

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service

SNAPSHOT = """
const canvases = [...document.querySelectorAll('canvas.chart')];
function ink(c) {  // pixels of the first two lines' colours (#3b6fb6, #d9822b), read from a copy
  const copy = document.createElement('canvas');
  copy.width = c.width; copy.height = c.height;
  const x = copy.getContext('2d', {willReadFrequently: true});
  x.drawImage(c, 0, 0);
  const d = x.getImageData(0, 0, c.width, c.height).data;
  let n = 0;
  for (let i = 0; i < d.length; i += 4) {
    const near = (r, g, b) => Math.abs(d[i] - r) < 40 && Math.abs(d[i+1] - g) < 40 && Math.abs(d[i+2] - b) < 40 && d[i+3] > 100;
    if (near(59, 111, 182) || near(217, 130, 43)) n++;
  }
  return n;
}
return JSON.stringify({
  samples: window.braid.samples, errors: window.braid.errors, role: window.braid.role,
  charts: window.braid.charts, series: window.braid.series,
  canvases: canvases.map(c => ({id: c.dataset.chart, points: +c.dataset.points, width: c.width, ink: ink(c)})),
  resources: [location.href].concat(performance.getEntriesByType('resource').map(e => e.name)),
  title: document.title,
});
"""


def open_page(drv, url):
    """Loads url and waits (up to 20 s) for the page's third poll of its status."""
    drv.get(url)
    deadline = time.time() + 20
    while time.time() < deadline:
        if drv.execute_script("return window.braid ? window.braid.samples : -1") >= 3:
            return
        time.sleep(0.2)


def main():
    url, driver_path, chromium, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    role_urls = sys.argv[5:]
    opts = Options()
    opts.binary_location = chromium
    profile = tempfile.mkdtemp(prefix="braid-statuspage-")
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--no-first-run", "--disable-extensions", "--disable-background-networking",
              "--disable-component-update", "--disable-sync", "--window-size=1400,1000",
              "--user-data-dir=" + profile):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    drv = webdriver.Chrome(service=Service(driver_path), options=opts)
    try:
        drv.set_page_load_timeout(20)
        open_page(drv, url)
        print(json.dumps({"phase": "idle", "snap": json.loads(drv.execute_script(SNAPSHOT))}), flush=True)
        sys.stdin.readline()
        time.sleep(seconds)
        print(json.dumps({"phase": "traffic", "snap": json.loads(drv.execute_script(SNAPSHOT))}), flush=True)
        log = drv.get_log("browser")
        for u in role_urls:
            open_page(drv, u)
            print(json.dumps({"phase": "role", "url": u, "snap": json.loads(drv.execute_script(SNAPSHOT))}), flush=True)
            log += drv.get_log("browser")
        print(json.dumps({"phase": "log", "entries": log}), flush=True)
    finally:
        drv.quit()
        shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    main()
