"""A real browser on the running Dagster UI (the e2e stack of tests/dagster_stack.py).

Headless Chromium (Debian's /usr/bin/chromium, driven by Playwright) opens the
partition page of a window asset and must find the partition's watermark metadata
as the UI renders it: the label `watermark` and its value, the one the latest
materialization of that partition recorded (read from GraphQL). A screenshot is
saved under test-artifacts/ (gitignored).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from urllib.parse import quote

from dagster_stack import NAME, T0, partition_key

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
]
UI_TIMEOUT_MS = 120_000  # the UI's first load compiles and fetches a lot on a loaded machine


def test_partition_page_shows_the_watermark(dagster_stack) -> None:
    from playwright.sync_api import sync_playwright

    assert shutil.which(CHROMIUM) or Path(CHROMIUM).exists(), "install Debian's chromium (make chromium)"
    st = dagster_stack
    window = "per_minute"
    pk = partition_key(T0)  # the data's first minute: it holds the tumbling results
    assert pk in st.first_settle["partitions"]
    mat = st.latest_materializations(window, [pk])[pk]
    watermark, epoch = mat["meta"]["watermark"], mat["meta"]["epoch"]
    assert watermark == "+inf"  # the stream is closed
    assert mat["meta"]["rows"] > 0

    st.gql("mutation { setNuxSeen }")  # the UI's one-time "join the community" dialog would cover the page
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "dagster-partition-watermark.png"
    url = f"{st.url}/assets/{NAME}/{window}?view=partitions&partition={quote(pk)}"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1100})
            page.goto(url, wait_until="domcontentloaded", timeout=UI_TIMEOUT_MS)
            # The partition's metadata table: label `watermark`, value as recorded.
            label = page.get_by_text("watermark", exact=True).first
            label.wait_for(state="visible", timeout=UI_TIMEOUT_MS)
            row = page.locator("tr", has=page.get_by_text("watermark", exact=True)).first
            row.get_by_text(watermark, exact=True).wait_for(state="visible", timeout=UI_TIMEOUT_MS)
            label.scroll_into_view_if_needed()
            page.screenshot(path=str(shot), full_page=False)
            body = page.inner_text("body")
        finally:
            browser.close()
    assert pk in body, "the page is not about the partition asked for"
    assert str(epoch) in body
    assert shot.stat().st_size > 10_000
