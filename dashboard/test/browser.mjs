// The dashboard's end-to-end check in headless Chromium (Debian's, driven by
// playwright-core). Run by crates/sidecore/tests/dashboard.rs against a real
// daemon running a real app:
//
//   node browser.mjs URL SIDECORE_BIN SOCKET APP SCREENSHOT [KIND=SERVICE]
//
// It asserts that the layout graph shows every offcode on the PE the daemon
// reports, that a live counter increases, and that `sidecore down APP` removes
// the app from the page; with KIND=SERVICE (e.g. orion=watch), that the
// capability panel of that scraped service appears with a value that moves
// live; it saves a screenshot either way. Exit 0 on success, 1 with the
// reason on stderr.

import { chromium } from "playwright-core";
import { execFileSync } from "node:child_process";

const [url, bin, socket, app, screenshot, service] = process.argv.slice(2);
const chromiumPath = process.env.CHROMIUM ?? "/usr/bin/chromium";

function fail(msg) {
  throw new Error(msg);
}

const browser = await chromium.launch({
  executablePath: chromiumPath,
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
});
let code = 0;
const page = await browser.newPage({ viewport: { width: 1300, height: 900 } });
try {
  await page.goto(url);
  await page.waitForSelector(`[data-testid=app][data-app="${app}"]`, { timeout: 15000 });

  // Every offcode on its PE, as the daemon itself reports them.
  const status = await (await fetch(new URL("/api/status", url))).json();
  const want = status.apps.find((a) => a.name === app);
  if (!want) fail(`the daemon does not report ${app}`);
  const card = page.locator(`[data-testid=app][data-app="${app}"]`);
  const shown = await card.locator("[data-testid=offcode]").evaluateAll((gs) =>
    gs.map((g) => [g.getAttribute("data-offcode"), g.getAttribute("data-pe")]),
  );
  for (const o of want.offcodes) {
    if (!shown.some(([n, pe]) => n === o.name && pe === o.pe)) {
      fail(`the graph does not show ${o.name} on ${o.pe}; it shows ${JSON.stringify(shown)}`);
    }
  }
  const columns = await card.locator("[data-testid=pe-column]").allTextContents();
  for (const o of want.offcodes) {
    if (!columns.includes(o.pe)) fail(`no column for PE ${o.pe}: ${JSON.stringify(columns)}`);
  }

  // A live counter increases without reloading the page.
  const turns = async () =>
    Number(
      (await card.locator("[data-testid=offcode-row] [data-testid=turns]").first().textContent())
        .replace(/[^0-9.]/g, ""),
    );
  const rows = () => card.locator("[data-testid=offcode-row] [data-testid=turns]").allTextContents();
  const before = JSON.stringify(await rows());
  await page.waitForFunction(
    ([sel, b]) => JSON.stringify([...document.querySelectorAll(sel)].map((e) => e.textContent)) !== b,
    [`[data-app="${app}"] [data-testid=offcode-row] [data-testid=turns]`, before],
    { timeout: 10000 },
  );
  if (!(await turns()) && (await turns()) !== 0) fail("the turns counter is not a number");
  const events = await page.locator("[data-testid=event]").count();
  if (events === 0) fail("the event log is empty");

  // A scraped service's capability panel, with a live value.
  let panelNote = "";
  if (service) {
    const [kind, name] = service.split("=");
    const live = { orion: "fetches", sikker: "checks", filewall: "operations", tcps: "bytes in/s" }[kind];
    const panel = `[data-testid=panel-${kind}][data-service="${name}"]`;
    await page.waitForSelector(panel, { timeout: 15000 });
    const cell = `${panel} [data-key="${live}"]`;
    await page.waitForSelector(cell, { timeout: 10000 });
    const first = await page.locator(cell).getAttribute("data-value");
    await page.waitForFunction(
      ([sel, v]) => document.querySelector(sel)?.getAttribute("data-value") !== v,
      [cell, first],
      { timeout: 10000 },
    );
    const then = await page.locator(cell).getAttribute("data-value");
    if (!(Number(then) > Number(first))) fail(`${kind} panel: ${live} went from ${first} to ${then}`);
    if (kind === "orion") {
      const state = await page.locator(`${panel} [data-key="liveness"]`).getAttribute("data-value");
      if (!["alive", "suspect", "dead"].includes(state)) fail(`orion panel: liveness is ${state}`);
    }
    panelNote = `, the ${kind} panel of ${name} live (${live} ${first} → ${then})`;
  }

  await page.screenshot({ path: screenshot, fullPage: true });

  // Stopping the app removes it from the page.
  execFileSync(bin, ["down", app, "--socket", socket], { stdio: "inherit" });
  await page.waitForSelector(`[data-testid=app][data-app="${app}"]`, { state: "detached", timeout: 10000 });
  console.log(`dashboard ok: ${want.offcodes.length} offcodes on their PEs, live counters, ${events} events, removed on down${panelNote}`);
} catch (e) {
  code = 1;
  console.error(`dashboard check failed: ${e.message}`);
  await page.screenshot({ path: screenshot, fullPage: true }).catch(() => {});
} finally {
  await browser.close();
}
process.exit(code);
