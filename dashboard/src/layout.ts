// The layout graph of one app: a column per PE the app uses, each offcode a
// box in its PE's column, each channel an arrow from sender to receivers
// labelled with its live rate.

import { App } from "./types";
import { svg, fmtRate } from "./dom";

const COL_W = 260;
const BOX_W = 150;
const BOX_H = 34;
const ROW_H = 56;
const TOP = 40;

export function drawLayout(app: App, rates: Map<string, number>): SVGElement {
  const pes = [...new Set(app.offcodes.map((o) => o.pe))];
  const pos = new Map<string, { x: number; y: number }>();
  const rows = new Map<string, number>();
  for (const o of app.offcodes) {
    const col = pes.indexOf(o.pe);
    const row = rows.get(o.pe) ?? 0;
    rows.set(o.pe, row + 1);
    pos.set(o.name, { x: 20 + col * COL_W, y: TOP + row * ROW_H });
  }
  const height = TOP + Math.max(1, ...rows.values()) * ROW_H + 10;
  const g = svg("svg", { class: "layout", "data-testid": "layout", width: 40 + pes.length * COL_W, height });
  g.append(
    svg("defs", {}, svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" }, svg("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#555" }))),
  );
  pes.forEach((pe, i) => {
    g.append(svg("rect", { x: 10 + i * COL_W, y: 6, width: COL_W - 20, height: height - 12, rx: 8, class: "pe-col" }));
    g.append(svg("text", { x: 20 + i * COL_W, y: 26, class: "pe-label", "data-testid": "pe-column" }, pe));
  });
  for (const ch of app.channels ?? []) {
    const a = pos.get(ch.from);
    if (!a) continue;
    for (const to of ch.to) {
      const b = pos.get(to);
      if (!b) continue;
      const [x1, y1] = [a.x + BOX_W, a.y + BOX_H / 2];
      const [x2, y2] = b.x > a.x ? [b.x, b.y + BOX_H / 2] : [b.x + BOX_W / 2, b.y];
      g.append(svg("line", { x1, y1, x2, y2, class: "channel", "marker-end": "url(#arrow)" }));
      const label = ch.probed ? `${ch.name} ${fmtRate(rates.get(`${app.name}/${ch.name}`) ?? 0)}` : `${ch.name} (${ch.transport})`;
      g.append(svg("text", { x: (x1 + x2) / 2, y: (y1 + y2) / 2 - 8, "text-anchor": "middle", class: "channel-label", "data-testid": "channel-rate" }, label));
    }
  }
  for (const o of app.offcodes) {
    const p = pos.get(o.name)!;
    const box = svg("g", { "data-testid": "offcode", "data-offcode": o.name, "data-pe": o.pe });
    box.append(svg("rect", { x: p.x, y: p.y, width: BOX_W, height: BOX_H, rx: 5, class: `offcode ${o.state}` }));
    box.append(svg("text", { x: p.x + 8, y: p.y + 21 }, o.name));
    g.append(box);
  }
  return g;
}
