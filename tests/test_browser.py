"""A real browser on the running Dagster UI (the e2e stack of tests/dagster_stack.py).

Headless Chromium (Debian's /usr/bin/chromium, driven by Playwright) opens the
partition page of a window asset and must find the partition's watermark metadata
as the UI renders it: the label `watermark` and its value, the one the latest
materialization of that partition recorded (read from GraphQL). Then, on the same
window asset's pages (issue 25): the lineage graph with the stream's asset upstream
(and reported), the partition's own row count, the watermark chart rendered inline as
an image the browser loaded, and the check evaluated per partition (its history lists
the partition; "Execute all" is enabled). Screenshots are saved under test-artifacts/
(gitignored).
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


def _open(p, url: str):
    browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
    page = browser.new_page(viewport={"width": 1500, "height": 1100})
    page.goto(url, wait_until="domcontentloaded", timeout=UI_TIMEOUT_MS)
    return browser, page


def test_window_asset_page_shows_lineage_rows_chart_and_checks(dagster_stack) -> None:
    """On a window asset's pages, as a person sees them (issue 25): the lineage graph with the
    stream's asset upstream of the window; the partition's own row count and the watermark chart
    rendered as an image (loaded, not behind "[Show Markdown]"); and the per-partition check
    result, listed under its partition. Screenshots: test-artifacts/dagster-{lineage,partition-
    rows,partition-chart,checks}.png."""
    from playwright.sync_api import sync_playwright

    from wire_dagster.checkpoint import Checkpoints

    st = dagster_stack
    window = "per_minute"
    pk = partition_key(T0)
    m = Checkpoints(st.store, NAME).latest()
    assert m is not None
    rows = m.outputs[window][str(T0)].rows
    mat = st.materialization([NAME, window], pk)
    assert mat is not None and mat["meta"]["rows"] == rows > 0
    assert str(mat["meta"]["watermark_chart"]).startswith("![watermarks in event time")
    node = st.asset_node([NAME, window])
    assert ["streams", NAME] in [k["path"] for k in node["dependencyKeys"]]  # the e2e pipeline reads stream "e2e"
    ARTIFACTS.mkdir(exist_ok=True)
    st.gql("mutation { setNuxSeen }")
    base = f"{st.url}/assets/{NAME}/{window}"

    with sync_playwright() as p:
        # 1. Lineage: the stream's node (an external asset named after the stream) upstream of the window's.
        browser, page = _open(p, f"{base}?view=lineage")
        try:
            stream_node = page.locator(f'[data-tooltip="{NAME}"]').first
            window_node = page.locator(f'[data-tooltip="{window}"]').first
            stream_node.wait_for(state="visible", timeout=UI_TIMEOUT_MS)
            window_node.wait_for(state="visible", timeout=UI_TIMEOUT_MS)
            # The stream's node shows its latest report (the run that committed its chunks).
            page.get_by_text("Loading…").first.wait_for(state="hidden", timeout=UI_TIMEOUT_MS)
            page.get_by_text("Materialized", exact=True).first.wait_for(state="visible", timeout=UI_TIMEOUT_MS)
            page.screenshot(path=str(ARTIFACTS / "dagster-lineage.png"))
            a, b = stream_node.bounding_box(), window_node.bounding_box()
            # Upstream comes first in the graph's direction: above it (the default, vertical) or left of it.
            assert a is not None and b is not None, (a, b)
            assert a["y"] + a["height"] <= b["y"] or a["x"] + a["width"] <= b["x"], (a, b)
        finally:
            browser.close()

        # 2. The partition: its own rows, and the chart as an image the browser loaded.
        browser, page = _open(p, f"{base}?view=partitions&partition={quote(pk)}")
        try:
            row = page.locator("tr", has=page.get_by_text("rows", exact=True)).first
            row.get_by_text(str(rows), exact=True).wait_for(state="visible", timeout=UI_TIMEOUT_MS)
            img = page.locator('img[alt^="watermarks in event time"]').first
            img.wait_for(state="visible", timeout=UI_TIMEOUT_MS)
            page.wait_for_function(
                "el => el.complete && el.naturalWidth > 0", arg=img.element_handle(), timeout=UI_TIMEOUT_MS
            )
            size = img.evaluate("el => [el.naturalWidth, el.naturalHeight]")
            assert size[0] >= 600 and size[1] >= 300, size
            assert (
                page.get_by_text("[Show Markdown]").count() == 0
                or not page.get_by_text("[Show Markdown]").first.is_visible()
            )
            row.scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / "dagster-partition-rows.png"))
            img.scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / "dagster-partition-chart.png"))
            body = page.inner_text("body")
        finally:
            browser.close()
        assert pk in body

        # 3. The check, evaluated per partition: the latest evaluation names its partition, the
        # execution history lists the partition's own, and "Execute all" is enabled.
        browser, page = _open(p, f"{base}?view=checks")
        try:
            page.get_by_text("partition_complete", exact=True).first.wait_for(state="visible", timeout=UI_TIMEOUT_MS)
            page.get_by_text("Partition", exact=True).first.wait_for(state="visible", timeout=UI_TIMEOUT_MS)
            execute_all = page.get_by_role("button", name="Execute all")
            assert execute_all.is_enabled()
            page.get_by_text("Execution history", exact=True).first.click()
            page.get_by_text(pk, exact=True).first.wait_for(state="visible", timeout=UI_TIMEOUT_MS)
            page.screenshot(path=str(ARTIFACTS / "dagster-checks.png"))
            body = page.inner_text("body")
        finally:
            browser.close()
    assert "Execute all" in body
    for name in (
        "dagster-lineage.png",
        "dagster-partition-rows.png",
        "dagster-partition-chart.png",
        "dagster-checks.png",
    ):
        assert (ARTIFACTS / name).stat().st_size > 10_000, name
