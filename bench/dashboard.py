"""The dashboard in headless Chromium against the local stack: first paint and
first rows of the jobs page, and the heatmap's draw time at 16,384 ranks
against 64 ranks (a ratio measured in the same run).

    .venv/bin/python bench/dashboard.py [--quick] [--loads N]

Ends with ``dashboard-bench: first_paint_ms=.. rows_ms=.. heatmap_ratio=..``.
``--quick`` (the smoke test): one load of each page, 26 jobs (a page of 25
and more), the heatmap at 64 and 1,024 ranks. Needs Debian's ``chromium``
and ``chromedriver``.
"""
from __future__ import annotations

import json
import pathlib
import shutil
import statistics
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from devstack.browser import CHROMEDRIVER, CHROMIUM, sign_in, start_chrome, wait, wide_job  # noqa: E402
from devstack.stack import Api, start_stack  # noqa: E402

TOKENS = [{"token": "bench", "tenant": "bench"}]


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--loads", type=int, default=None, help="page loads per measure (3)")
    args = parser.parse_args()
    loads = harness.pick(args.loads, 3, 1, args.quick)
    wide = 1024 if args.quick else 16384
    jobs = 26 if args.quick else 50
    if not (CHROMIUM and CHROMEDRIVER):
        sys.exit("chromium and chromedriver are needed (make browser)")
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="gpujobs-bench-ui-"))
    stack = start_stack(tmp, TOKENS)
    try:
        driver, service = start_chrome(str(tmp / "profile"))
    except BaseException:
        stack.stop()
        raise
    try:
        api = Api(stack.api, "bench")
        for i in range(jobs):
            api.post("/v1/jobs", json={"name": f"bench-{i}", "command": ["true"], "ranks": 1,
                                       "gpu_type": "none"})
        sign_in(driver, stack.api + "/", "bench")
        paint, rows = [], []
        for _ in range(loads):
            driver.get(stack.api + "/#/jobs")
            driver.refresh()
            wait(driver).until(lambda d: len(d.find_elements("css selector", "#jobs-body tr")) == 25)
            t = driver.execute_script("""
                const fcp = performance.getEntriesByName('first-contentful-paint')[0];
                return [fcp ? fcp.startTime : null, performance.now()];""")
            paint.append(t[0])
            rows.append(t[1])
        draws = {}
        for n, per in ((64, 8), (wide, 256)):
            job, ranks = wide_job(n, per)
            job["id"] = f"job_BENCH{n}"
            sid = driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": """
                const FAKE = %s, real = window.fetch;
                window.fetch = (url, opts) => String(url).includes('/v1/jobs/' + FAKE.job.id)
                  ? Promise.resolve(new Response(JSON.stringify(String(url).endsWith('/ranks')
                      ? FAKE.ranks : FAKE.job), {status: 200}))
                  : real(url, opts);""" % json.dumps({"job": job, "ranks": ranks})})["identifier"]
            samples = []
            for _ in range(loads):
                driver.get(stack.api + f"/#/jobs/{job['id']}/ranks")
                driver.refresh()
                wait(driver).until(lambda d, n=n: d.find_element("id", "heatmap").get_attribute("data-cells") == str(n))
                samples.append(float(driver.find_element("id", "heatmap").get_attribute("data-draw-ms")))
            driver.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", {"identifier": sid})
            draws[n] = statistics.median(samples)
        print(f"jobs page: first contentful paint median {statistics.median(paint):.0f} ms, "
              f"25 rows shown at {statistics.median(rows):.0f} ms after navigation start "
              f"({loads} loads)")
        ratio = draws[wide] / max(draws[64], 0.1)
        print(f"heatmap draw: 64 ranks {draws[64]:.1f} ms, {wide:,} ranks {draws[wide]:.1f} ms "
              f"(ratio {ratio:.0f}x for {wide // 64}x the cells)")
        harness.machine_line("dashboard", first_paint_ms=round(statistics.median(paint)),
                             rows_ms=round(statistics.median(rows)),
                             heatmap_ratio=round(ratio, 1))
    finally:
        driver.quit()
        service.stop()
        stack.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
