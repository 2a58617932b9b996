// sidecore's live dashboard: one page, no framework, no CDN. It reads the
// daemon's picture from /api/status and then follows /api/events (server-sent
// events: a `status` picture each second, every runtime `event` as it
// happens), and draws the layout graph of each app (offcodes on their PEs,
// channels with live rates), the PE table, the event log and the panels of
// the capabilities that report through the daemon.

import { CapabilityRow, Channel, Offcode, Pe, RuntimeEvent, ServiceView, Snapshot } from "./types";
import { el, fmtRate, fmtCount, clear } from "./dom";
import { drawLayout } from "./layout";

/** Previous picture, for rates. */
let previous: Snapshot | null = null;
const MAX_LOG = 200;

function rateOf(now: number, before: number | undefined, dtMs: number): number {
  if (before === undefined || dtMs <= 0 || now < before) return 0;
  return ((now - before) * 1000) / dtMs;
}

/** Messages per second on each channel since the last picture. */
function channelRates(snap: Snapshot): Map<string, number> {
  const rates = new Map<string, number>();
  const dt = previous ? snap.at_ms - previous.at_ms : 0;
  for (const app of snap.apps) {
    const old = previous?.apps.find((a) => a.name === app.name);
    for (const ch of app.channels ?? []) {
      const before = old?.channels?.find((c) => c.name === ch.name)?.messages;
      rates.set(`${app.name}/${ch.name}`, rateOf(ch.messages, before, dt));
    }
  }
  return rates;
}

function renderApps(snap: Snapshot): void {
  const root = document.getElementById("apps")!;
  clear(root);
  if (snap.apps.length === 0) {
    root.append(el("p", { class: "empty", "data-testid": "no-apps" }, "No apps are running. Deploy one with `sidecore up -d MANIFEST`."));
    return;
  }
  const rates = channelRates(snap);
  for (const app of snap.apps) {
    const card = el("section", { class: "app", "data-testid": "app", "data-app": app.name });
    card.append(el("h2", {}, `${app.name} `, el("span", { class: `state ${app.state}` }, app.state)));
    card.append(drawLayout(app, rates));
    card.append(offcodeTable(app.name, app.offcodes));
    if ((app.channels ?? []).length > 0) card.append(channelTable(app.name, app.channels ?? [], rates));
    root.append(card);
  }
}

function offcodeTable(app: string, offcodes: Offcode[]): HTMLElement {
  const t = el("table", { class: "offcodes" });
  t.append(el("tr", {}, ...["offcode", "implementation", "PE", "state", "handled", "sent", "dropped", "turns", "restarts"].map((h) => el("th", {}, h))));
  for (const o of offcodes) {
    t.append(
      el(
        "tr",
        { "data-testid": "offcode-row", "data-offcode": `${app}/${o.name}` },
        el("td", {}, o.name),
        el("td", {}, o.implementation),
        el("td", {}, o.pe),
        el("td", { class: `state ${o.state}` }, o.state),
        el("td", { class: "num", "data-testid": "handled" }, fmtCount(o.handled)),
        el("td", { class: "num", "data-testid": "sent" }, fmtCount(o.sent)),
        el("td", { class: "num" }, fmtCount(o.dropped)),
        el("td", { class: "num", "data-testid": "turns" }, fmtCount(o.turns)),
        el("td", { class: "num", "data-testid": "restarts" }, fmtCount(o.restarts ?? 0)),
      ),
    );
  }
  return t;
}

function channelTable(app: string, chans: Channel[], rates: Map<string, number>): HTMLElement {
  const t = el("table", { class: "channels" });
  t.append(el("tr", {}, ...["channel", "transport", "from → to", "messages", "rate", "dropped", "backpressure", "occupancy"].map((h) => el("th", {}, h))));
  for (const c of chans) {
    t.append(
      el(
        "tr",
        { "data-testid": "channel-row" },
        el("td", {}, c.name),
        el("td", {}, c.transport),
        el("td", {}, `${c.from} → ${c.to.join(", ")}`),
        el("td", { class: "num", "data-testid": "channel-messages" }, c.probed ? fmtCount(c.messages) : "–"),
        el("td", { class: "num" }, c.probed ? fmtRate(rates.get(`${app}/${c.name}`) ?? 0) : "–"),
        el("td", { class: "num" }, c.probed ? fmtCount(c.dropped) : "–"),
        el("td", { class: "num" }, c.probed ? fmtCount(c.backpressure) : "–"),
        el("td", { class: "num" }, c.probed ? `${c.occupancy}/${c.capacity}` : "–"),
      ),
    );
  }
  return t;
}

function renderPes(pes: Pe[]): void {
  const t = document.getElementById("pes")!;
  clear(t);
  t.append(el("tr", {}, ...["PE", "kind", "CPU", "held", "busy", "detail"].map((h) => el("th", {}, h))));
  for (const p of pes) {
    t.append(
      el(
        "tr",
        { "data-testid": "pe-row", "data-pe": p.id },
        el("td", {}, p.id),
        el("td", {}, p.kind),
        el("td", { class: "num" }, p.cpu.toFixed(1)),
        el("td", { class: "num" }, p.allocated.toFixed(2)),
        el("td", { class: "num" }, p.busy === undefined ? "–" : `${(p.busy * 100).toFixed(0)}%`),
        el("td", {}, p.detail),
      ),
    );
  }
}

/** Panels for capabilities that report through offcode counters. */
function renderPanels(snap: Snapshot): void {
  const root = document.getElementById("panels")!;
  clear(root);
  const all = snap.apps.flatMap((a) => a.offcodes.map((o) => ({ app: a.name, o })));
  const wasm = all.filter(({ o }) => o.pe === "wasm" || o.implementation.includes("wasm"));
  const fw = all.filter(({ o }) => o.implementation === "firewall");
  const panel = (title: string, rows: [string, string][], testid: string) => {
    const p = el("section", { class: "panel", "data-testid": testid }, el("h3", {}, title));
    if (rows.length === 0) p.append(el("p", { class: "empty" }, "nothing deployed"));
    for (const [k, v] of rows) p.append(el("div", { class: "kv", "data-testid": "kv" }, el("span", {}, k), el("span", { class: "num" }, v)));
    root.append(p);
  };
  panel(
    "Wasm extensions",
    wasm.map(({ app, o }) => [`${app}/${o.name}`, `${fmtCount(o.metrics["invocations"] ?? 0)} calls · ${o.metrics["violations"] ?? 0} violations`]),
    "panel-wasm",
  );
  panel(
    "Firewalls",
    fw.map(({ app, o }) => [`${app}/${o.name} (${o.pe})`, `accept ${fmtCount(o.metrics["accepted"] ?? 0)} · deny ${fmtCount((o.metrics["denied"] ?? 0) + (o.metrics["default_denied"] ?? 0))}`]),
    "panel-firewall",
  );
  for (const s of snap.services ?? []) {
    if (s.up && s.capability) {
      root.append(capabilityPanel(s));
      continue;
    }
    const rows: [string, string][] = s.up
      ? s.samples.filter(([k]) => !k.endsWith("_sum")).slice(0, 40).map(([k, v]) => [k.replace(/^sidecore_/, ""), fmtCount(v)])
      : [["down", s.error ?? "no answer"]];
    panel(`${s.name} (${s.addr})`, rows, `panel-service-${s.name}`);
  }
  if ((snap.services ?? []).length === 0) {
    panel(
      "Services",
      [["Sikker, FileWall, Orion, TCPServers", "run with --metrics ADDR and start the daemon with --service NAME=ADDR to see them here"]],
      "panel-services",
    );
  }
}

/** A row's value as the panel shows it. */
function fmtRow(r: CapabilityRow): string {
  if (r.text !== undefined) return r.text;
  switch (r.unit) {
    case "/s":
      return fmtRate(r.value);
    case "ms":
      return `${r.value.toFixed(3)} ms`;
    case "B/s":
      return `${fmtCount(Math.round(r.value))}B/s`;
    default:
      return fmtCount(Math.round(r.value));
  }
}

/** The panel of a capability the daemon scrapes (Sikker, FileWall, Orion, TCPServers). */
function capabilityPanel(s: ServiceView): HTMLElement {
  const cap = s.capability!;
  const p = el(
    "section",
    { class: `panel capability ${cap.kind}`, "data-testid": `panel-${cap.kind}`, "data-service": s.name },
    el("h3", {}, `${cap.title}: ${s.name} `, el("span", { class: "addr" }, s.addr)),
  );
  if (cap.rows.length === 0) p.append(el("p", { class: "empty" }, "nothing reported yet"));
  for (const r of cap.rows) {
    p.append(
      el(
        "div",
        { class: "kv", "data-testid": "kv", "data-key": r.key, "data-value": String(r.text ?? r.value) },
        el("span", {}, r.key),
        el("span", { class: r.text === undefined ? "num" : "word" }, fmtRow(r)),
      ),
    );
  }
  return p;
}

function addEvent(e: RuntimeEvent): void {
  const log = document.getElementById("log")!;
  const { at, app, offcode, event, ...rest } = e;
  const detail = Object.entries(rest)
    .map(([k, v]) => `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`)
    .join(" ");
  const li = el("li", { "data-testid": "event" }, el("span", { class: "at" }, `${(at / 1000).toFixed(3)} s`), ` ${app}/${offcode} `, el("b", {}, event), ` ${detail}`);
  log.prepend(li);
  while (log.children.length > MAX_LOG) log.lastElementChild?.remove();
}

function render(snap: Snapshot): void {
  renderApps(snap);
  renderPes(snap.pes);
  renderPanels(snap);
  document.getElementById("updated")!.textContent = `picture at ${(snap.at_ms / 1000).toFixed(1)} s`;
  previous = snap;
}

function connect(): void {
  const status = document.getElementById("conn")!;
  const es = new EventSource("/api/events");
  es.addEventListener("open", () => {
    status.textContent = "live";
    status.className = "live";
  });
  es.addEventListener("status", (m) => render(JSON.parse((m as MessageEvent).data) as Snapshot));
  es.addEventListener("event", (m) => addEvent(JSON.parse((m as MessageEvent).data) as RuntimeEvent));
  es.addEventListener("error", () => {
    status.textContent = "reconnecting…";
    status.className = "down";
  });
}

async function start(): Promise<void> {
  try {
    const log = (await (await fetch("/api/log")).json()) as RuntimeEvent[];
    for (const e of log.slice(-MAX_LOG)) addEvent(e);
  } catch {
    // The live stream still brings new events.
  }
  connect();
}

void start();
