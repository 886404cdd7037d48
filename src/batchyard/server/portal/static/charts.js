// Small SVG line charts for metrics (one or many series), written for batchyard.
"use strict";
const byChart = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const COLORS = ["#2456c9", "#d1495b", "#1d7a3a", "#edae49", "#6a4c93", "#00798c", "#8c564b", "#e377c2"];
  function svg(tag, attrs, text) {
    const n = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) n.setAttribute(k, String(v));
    if (text !== undefined) n.textContent = String(text);
    return n;
  }
  function fmt(v) {
    const a = Math.abs(v);
    if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(2);
    return String(Number(v.toPrecision(4)));
  }
  // series: [{name, points: [[x, y], ...]}]; returns an <svg> with data-points = total points.
  function draw(series, opts) {
    const W = (opts && opts.width) || 560, H = (opts && opts.height) || 200;
    const L = 56, R = 12, T = 10, B = 26;
    let xs = [], ys = [], total = 0;
    for (const s of series) for (const [x, y] of s.points) { xs.push(x); ys.push(y); total++; }
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "data-points": total });
    root.append(svg("title", {}, (opts && opts.title) || "chart"));
    if (!total) { root.append(svg("text", { x: L, y: H / 2 }, "no points yet")); return root; }
    let x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
    if (x0 === x1) { x0 -= 1; x1 += 1; }
    if (y0 === y1) { const d = Math.abs(y0) * 0.1 || 1; y0 -= d; y1 += d; }
    const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
    const sy = (y) => H - B - ((y - y0) / (y1 - y0)) * (H - T - B);
    for (let i = 0; i <= 4; i++) {
      const yv = y0 + ((y1 - y0) * i) / 4, py = sy(yv);
      root.append(svg("line", { class: "grid", x1: L, x2: W - R, y1: py, y2: py }));
      root.append(svg("text", { x: L - 4, y: py + 4, "text-anchor": "end" }, fmt(yv)));
    }
    for (let i = 0; i <= 4; i++) {
      const xv = x0 + ((x1 - x0) * i) / 4;
      root.append(svg("text", { x: sx(xv), y: H - 8, "text-anchor": "middle" }, fmt(xv)));
    }
    root.append(svg("line", { class: "axis", x1: L, x2: L, y1: T, y2: H - B }));
    root.append(svg("line", { class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B }));
    series.forEach((s, i) => {
      const color = COLORS[i % COLORS.length];
      const pts = s.points.slice().sort((a, b) => a[0] - b[0]);
      const line = svg("polyline", { class: "series", stroke: color,
        points: pts.map(([x, y]) => sx(x).toFixed(1) + "," + sy(y).toFixed(1)).join(" ") });
      line.append(svg("title", {}, s.name));
      root.append(line);
      if (pts.length <= 60) for (const [x, y] of pts) root.append(svg("circle", { cx: sx(x), cy: sy(y), r: 2.2, fill: color }));
    });
    return root;
  }
  function legend(series) {
    const box = document.createElement("div"); box.className = "legend";
    series.forEach((s, i) => {
      const item = document.createElement("span"); const sw = document.createElement("i");
      sw.style.background = COLORS[i % COLORS.length];
      item.append(sw, document.createTextNode(s.name)); box.append(item);
    });
    return box;
  }
  return { draw, legend };
})();
window.byChart = byChart;
