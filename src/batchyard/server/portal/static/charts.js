// Small SVG line charts for metrics (one or many series), written for batchyard: round
// ("nice") tick values, axis titles, the values under the pointer, an optional log scale.
// A metric with one value per series is shown as that value, not as a lone dot.
"use strict";
const byChart = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const LIGHT = ["#2456c9", "#d1495b", "#1d7a3a", "#edae49", "#6a4c93", "#00798c", "#8c564b", "#e377c2"];
  const DARK = ["#7aa2ff", "#ff7b8a", "#5fd08a", "#f5c26b", "#b99cf0", "#4fc7d9", "#d0a896", "#f29ad8"];
  const color = (i) => (matchMedia("(prefers-color-scheme: dark)").matches ? DARK : LIGHT)[i % LIGHT.length];
  const LOG_KEY = "batchyard.logScale";
  function svg(tag, attrs, text) {
    const n = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) n.setAttribute(k, String(v));
    if (text !== undefined) n.textContent = String(text);
    return n;
  }
  // A step of 1, 2 or 5 times a power of ten, giving about `count` intervals over the span.
  function niceStep(span, count) {
    const raw = span / Math.max(1, count), mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const f = raw / mag;
    return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
  }
  function linearTicks(lo, hi, count) {
    if (lo === hi) { const d = Math.abs(lo) * 0.1 || 1; lo -= d; hi += d; }
    const step = niceStep(hi - lo, count);
    const start = Math.floor(lo / step + 1e-9) * step, end = Math.ceil(hi / step - 1e-9) * step;
    const values = [];
    for (let v = start, i = 0; v <= end + step / 2 && i < 50; v = start + ++i * step) values.push(Math.abs(v) < step / 1e6 ? 0 : v);
    return { lo: start, hi: end, values, step };
  }
  function logTicks(lo, hi) {
    let a = Math.floor(Math.log10(lo)), b = Math.ceil(Math.log10(hi));
    if (a === b) { a -= 1; b += 0; }
    const values = [];
    const every = Math.max(1, Math.ceil((b - a) / 6));
    for (let e = a; e <= b; e += every) {
      values.push(Math.pow(10, e));
      if (b - a <= 2 && e < b) values.push(2 * Math.pow(10, e), 5 * Math.pow(10, e));
    }
    values.sort((x, y) => x - y);
    return { lo: Math.pow(10, a), hi: Math.pow(10, b), values, step: null };
  }
  // Digits enough for the tick step (0.25 -> 2 decimals); big and tiny values shortened.
  function fmt(v, step) {
    if (v === 0) return "0";
    const a = Math.abs(v);
    if (a >= 1e6 || a < 1e-4) return v.toExponential(a >= 1e6 ? 1 : 0).replace("e+", "e");
    if (a >= 1e4 && (!step || step >= 1000)) return Number((v / 1000).toPrecision(3)) + "k";
    const ref = step || a;
    const decimals = Math.max(0, Math.min(6, Math.ceil(-Math.log10(ref) - 1e-9)));
    return v.toFixed(decimals);
  }
  function value(v) {  // a value under the pointer or on its own: 4 significant digits
    if (typeof v !== "number") return String(v);
    const a = Math.abs(v);
    if (a !== 0 && (a >= 1e6 || a < 1e-4)) return v.toExponential(3);
    return String(Number(v.toPrecision(4)));
  }
  function nearest(pts, x) {  // pts sorted by x
    let lo = 0, hi = pts.length - 1;
    while (hi - lo > 1) { const mid = (lo + hi) >> 1; if (pts[mid][0] < x) lo = mid; else hi = mid; }
    return Math.abs(pts[lo][0] - x) <= Math.abs(pts[hi][0] - x) ? pts[lo] : pts[hi];
  }
  // series: [{name, points: [[x, y], ...]}]; returns an <svg> with data-points = total points
  // and data-scale = linear|log. opts: width, height, title, xTitle, yTitle, log.
  function draw(series, opts) {
    opts = opts || {};
    const W = opts.width || 560, H = opts.height || 210;
    const L = 64, R = 14, T = 10, B = 38;
    const log = !!opts.log;
    const clean = series.map((s, i) => ({ name: s.name, color: color(i),
      points: s.points.filter(([, y]) => Number.isFinite(y) && (!log || y > 0)).sort((a, b) => a[0] - b[0]) }));
    let xs = [], ys = [], total = 0;
    for (const s of clean) for (const [x, y] of s.points) { xs.push(x); ys.push(y); total++; }
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "data-points": total, "data-scale": log ? "log" : "linear" });
    root.append(svg("title", {}, opts.title || "chart"));
    if (!total) { root.append(svg("text", { x: L, y: H / 2 }, "no points yet")); return root; }
    let x0 = Math.min(...xs), x1 = Math.max(...xs);
    const xt = linearTicks(x0, x1, Math.max(3, Math.round(W / 90)));
    if (Number.isInteger(x0) && Number.isInteger(x1) && xt.step < 1) {  // steps are whole numbers
      xt.values = xt.values.filter((v) => Number.isInteger(Math.round(v * 1e9) / 1e9));
      xt.step = 1;
    }
    x0 = xt.lo; x1 = xt.hi;
    const yt = log ? logTicks(Math.min(...ys), Math.max(...ys)) : linearTicks(Math.min(...ys), Math.max(...ys), Math.max(2, Math.round(H / 45)));
    const ty = (y) => (log ? Math.log10(y) : y);
    const y0 = ty(yt.lo), y1 = ty(yt.hi);
    const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
    const sy = (y) => H - B - ((ty(y) - y0) / (y1 - y0)) * (H - T - B);
    for (const yv of yt.values) {
      const py = sy(yv);
      root.append(svg("line", { class: "grid", x1: L, x2: W - R, y1: py, y2: py }));
      root.append(svg("text", { x: L - 5, y: py + 4, "text-anchor": "end", class: "tick-y" }, fmt(yv, yt.step)));
    }
    for (const xv of xt.values) {
      root.append(svg("text", { x: sx(xv), y: H - B + 15, "text-anchor": "middle", class: "tick-x" }, fmt(xv, xt.step)));
    }
    root.append(svg("line", { class: "axis", x1: L, x2: L, y1: T, y2: H - B }));
    root.append(svg("line", { class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B }));
    root.append(svg("text", { class: "axis-title", x: L + (W - L - R) / 2, y: H - 4, "text-anchor": "middle" },
      opts.xTitle || "step"));
    root.append(svg("text", { class: "axis-title", x: -(T + (H - T - B) / 2), y: 12, "text-anchor": "middle",
      transform: "rotate(-90)" }, (opts.yTitle || opts.title || "value") + (log ? " (log)" : "")));
    for (const s of clean) {
      const line = svg("polyline", { class: "series", stroke: s.color,
        points: s.points.map(([x, y]) => sx(x).toFixed(1) + "," + sy(y).toFixed(1)).join(" ") });
      line.append(svg("title", {}, s.name));
      root.append(line);
      if (s.points.length <= 60) for (const [x, y] of s.points) root.append(svg("circle", { cx: sx(x), cy: sy(y), r: 2.2, fill: s.color }));
    }
    hover(root, clean, { sx, sy, x0, x1, L, R, T, B, W, H, xTitle: opts.xTitle || "step" });
    return root;
  }
  // The values of every series at the step nearest the pointer, in a box beside it.
  function hover(root, series, g) {
    const layer = svg("g", { class: "hover", display: "none" });
    const guide = svg("line", { y1: g.T, y2: g.H - g.B });
    const box = svg("rect", { rx: 3 }), text = svg("text", {});
    layer.append(guide, box, text);
    const dots = series.map((s) => { const c = svg("circle", { r: 3.5, fill: s.color }); layer.append(c); return c; });
    const catcher = svg("rect", { x: g.L, y: g.T, width: g.W - g.L - g.R, height: g.H - g.T - g.B,
      fill: "transparent", "pointer-events": "all", class: "hover-area" });
    root.append(layer, catcher);
    function show(ev) {
      const m = root.getScreenCTM();
      if (!m) return;
      const px = (ev.clientX - m.e) / m.a;
      const xv = g.x0 + ((px - g.L) / (g.W - g.L - g.R)) * (g.x1 - g.x0);
      let best = null;
      for (const s of series) if (s.points.length) { const p = nearest(s.points, xv); if (best === null || Math.abs(p[0] - xv) < Math.abs(best - xv)) best = p[0]; }
      if (best === null) return;
      const lines = [g.xTitle + " " + value(best)];
      series.forEach((s, i) => {
        const p = s.points.length ? nearest(s.points, best) : null;
        if (p && p[0] === best) {
          dots[i].setAttribute("cx", g.sx(p[0])); dots[i].setAttribute("cy", g.sy(p[1])); dots[i].removeAttribute("display");
          lines.push(s.name + ": " + value(p[1]));
        } else dots[i].setAttribute("display", "none");
      });
      const gx = g.sx(best);
      guide.setAttribute("x1", gx); guide.setAttribute("x2", gx);
      text.replaceChildren(...lines.map((l, i) => svg("tspan", { x: 0, dy: i ? 14 : 0 }, l)));
      const wide = Math.max(...lines.map((l) => l.length)) * 6.6 + 12, high = lines.length * 14 + 8;
      const bx = gx + 10 + wide > g.W - g.R ? gx - 10 - wide : gx + 10, by0 = g.T + 4;
      box.setAttribute("x", bx); box.setAttribute("y", by0); box.setAttribute("width", wide); box.setAttribute("height", high);
      text.setAttribute("transform", `translate(${bx + 6}, ${by0 + 15})`);
      for (const t of text.children) t.setAttribute("x", 0);
      layer.removeAttribute("display");
      root.dataset.hover = lines.join("\n");
    }
    catcher.addEventListener("pointermove", show);
    catcher.addEventListener("pointerdown", show);  // a tap on a touch screen
    catcher.addEventListener("pointerleave", () => { layer.setAttribute("display", "none"); delete root.dataset.hover; });
  }
  function legend(series) {
    const box = document.createElement("div"); box.className = "legend";
    series.forEach((s, i) => {
      const item = document.createElement("span"); const sw = document.createElement("i");
      sw.style.background = color(i);
      item.append(sw, document.createTextNode(s.name)); box.append(item);
    });
    return box;
  }
  function logPrefs() { try { return new Set(JSON.parse(localStorage.getItem(LOG_KEY) || "[]")); } catch (e) { return new Set(); } }
  function setLog(key, on) {
    const s = logPrefs(); if (on) s.add(key); else s.delete(key);
    try { localStorage.setItem(LOG_KEY, JSON.stringify(Array.from(s))); } catch (e) { /* private mode */ }
  }
  // One metric: a heading, a log-scale toggle where every value is positive, and either the
  // chart or, when each series holds a single value, the values themselves.
  function panel(name, series, opts) {
    opts = opts || {};
    const box = document.createDocumentFragment();
    const head = by.el("div", { class: "chart-head" }, by.el(opts.heading || "h3", { text: name }));
    const body = by.el("div", { class: "chart-body" });
    const filled = series.filter((s) => s.points.length);
    const single = filled.length > 0 && filled.every((s) => s.points.length === 1);
    if (single) {
      body.append(by.el("div", { class: "single-value", "data-single": "1" }, ...filled.map((s) => by.el("span", {},
        by.el("b", { text: value(s.points[0][1]) }), by.el("small", { text: s.name + (opts.showStep === false ? "" : " · step " + value(s.points[0][0])) })))));
      box.append(head, body);
      return box;
    }
    const positive = filled.length > 0 && filled.every((s) => s.points.every(([, y]) => y > 0));
    const key = opts.key || name;
    let log = positive && logPrefs().has(key);
    const render = () => body.replaceChildren(draw(series, { ...opts, title: name, yTitle: opts.yTitle || name, log }));
    if (positive) {
      const toggle = by.el("input", { type: "checkbox", class: "log-toggle" });
      toggle.checked = log;
      toggle.addEventListener("change", () => { log = toggle.checked; setLog(key, log); render(); });
      head.append(by.el("label", {}, toggle, " log scale"));
    }
    render();
    box.append(head, body, legend(series));
    return box;
  }
  return { draw, legend, panel, niceStep, fmt };
})();
window.byChart = byChart;
