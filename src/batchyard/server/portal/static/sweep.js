// Sweep page: the trials table, the objective over trials (each trial's value and the best
// so far) and a parallel-coordinates chart of parameters -> objective; polled while running.
// Every text goes in as text (by.el / textContent), never as HTML.
"use strict";
(() => {
  const root = document.getElementById("sweep");
  if (!root) return;
  const api = root.dataset.api, jobs = root.dataset.jobs;
  const NS = "http://www.w3.org/2000/svg";
  const TERMINAL = ["succeeded", "failed", "canceled"];
  function svg(tag, attrs, text) {
    const n = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) n.setAttribute(k, String(v));
    if (text !== undefined) n.textContent = String(text);
    return n;
  }
  const fmt = (v) => typeof v === "number" ? String(Number(v.toPrecision(4))) : String(v);
  function objectiveChart(s) {
    const scored = s.trials.filter((t) => typeof t.objective === "number").sort((a, b) => a.index - b.index);
    const better = s.objective.goal === "maximize" ? Math.max : Math.min;
    let best = null;
    const bestPts = scored.map((t) => { best = best === null ? t.objective : better(best, t.objective); return [t.index, best]; });
    const series = [{ name: "trial", points: scored.map((t) => [t.index, t.objective]) }, { name: "best so far", points: bestPts }];
    return [byChart.draw(series, { title: s.objective.primary_metric + " by trial", xTitle: "trial", yTitle: s.objective.primary_metric,
      width: Math.max(280, Math.round(document.getElementById("objective-chart").clientWidth || 560)) }), byChart.legend(series)];
  }
  // One vertical axis per parameter and one for the objective; one line per trial, coloured
  // from poor (red) to good (blue). Choices are spread evenly on their axis; a log-uniform
  // (or log-normal) parameter gets a log axis with a tick per power of ten. The chart is
  // drawn at its own size (at least AXIS px per axis), never squeezed: on a phone its box
  // scrolls sideways and its labels stay readable.
  const AXIS = 112, LOG_TYPES = ["loguniform", "qloguniform", "lognormal", "qlognormal"];
  const short = (text, n) => (text.length > n ? text.slice(0, n - 1) + "…" : text);
  function logTicks(lo, hi) {
    const out = [];
    for (let e = Math.ceil(Math.log10(lo) - 1e-9); e <= Math.floor(Math.log10(hi) + 1e-9); e++) out.push(Math.pow(10, e));
    if (out.length < 2) return [lo, hi];
    const step = Math.ceil(out.length / 8);  // at most ~8 labels: they stay apart
    return out.filter((_, i) => i % step === 0);
  }
  function parallel(s, avail) {
    const names = Object.keys(s.search_space);
    const axes = names.concat([s.objective.primary_metric]);
    // titles on two alternating rows (neighbours never meet); tick labels right of each axis
    const H = 272, T = 46, B = 22, L = 44, R = 84;
    const W = Math.max(Math.round(avail || 560), L + R + AXIS * Math.max(1, axes.length - 1));
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img", "data-lines": 0, class: "parallel" });
    root.append(svg("title", {}, "parameters and objective of every trial"));
    const rows = s.trials.filter((t) => t.params);
    if (!rows.length) { root.append(svg("text", { x: L, y: H / 2 }, "no trials yet")); return root; }
    const x = (i) => L + (axes.length === 1 ? 0 : (i * (W - L - R)) / (axes.length - 1));
    const scales = axes.map((axis, i) => {
      const isObj = i === names.length;
      const vals = rows.map((t) => (isObj ? t.objective : t.params[axis])).filter((v) => typeof v === "number");
      const spec = isObj ? null : s.search_space[axis];
      if (spec && spec.type === "choice") {
        const cats = spec.values.map(String);
        return { cats, pos: (v) => cats.length < 2 ? 0.5 : cats.indexOf(String(v)) / (cats.length - 1) };
      }
      const logScale = !!spec && LOG_TYPES.includes(spec.type) && vals.every((v) => v > 0);
      const tf = (v) => (logScale ? Math.log(v) : v);
      let lo = Math.min(...vals.map(tf)), hi = Math.max(...vals.map(tf));
      if (!isFinite(lo)) { lo = 0; hi = 1; }
      if (lo === hi) { lo -= logScale ? 0.5 : 1; hi += logScale ? 0.5 : 1; }
      const range = { lo: logScale ? Math.exp(lo) : lo, hi: logScale ? Math.exp(hi) : hi };
      return { ...range, log: logScale, ticks: logScale ? logTicks(range.lo, range.hi) : [range.lo, range.hi],
        pos: (v) => (tf(v) - lo) / (hi - lo) };
    });
    const y = (p) => H - B - p * (H - T - B);
    const objs = rows.map((t) => t.objective).filter((v) => typeof v === "number");
    const oLo = Math.min(...objs), oHi = Math.max(...objs);
    const good = (v) => { if (typeof v !== "number" || oLo === oHi) return 0.5; const p = (v - oLo) / (oHi - oLo); return s.objective.goal === "maximize" ? p : 1 - p; };
    let lines = 0;
    for (const t of rows) {
      const pts = [];
      axes.forEach((axis, i) => {
        const v = i === names.length ? t.objective : t.params[axis];
        if (v === null || v === undefined) return;
        pts.push(x(i).toFixed(1) + "," + y(scales[i].pos(v)).toFixed(1));
      });
      const g = good(t.objective), hue = Math.round(g * 220);
      const line = svg("polyline", { class: "series", points: pts.join(" "), stroke: `hsl(${hue}, 70%, 45%)`,
        "stroke-dasharray": t.state === "canceled" ? "4 3" : "none" });
      line.append(svg("title", {}, t.name + ": " + names.map((n) => n + "=" + fmt(t.params[n])).join(", ") +
        " → " + (t.objective === null ? "—" : fmt(t.objective))));
      root.append(line); lines++;
    }
    axes.forEach((axis, i) => {
      const sc = scales[i];
      const g = svg("g", { class: "pc-axis", "data-axis": axis, "data-scale": sc.cats ? "choice" : sc.log ? "log" : "linear" });
      g.append(svg("line", { class: "axis", x1: x(i), x2: x(i), y1: T, y2: H - B }));
      const title = svg("text", { class: "axis-title", x: x(i), y: T - (i % 2 ? 24 : 10),
        "text-anchor": i === 0 ? "start" : "middle" }, short(axis, 14) + (sc.log ? " (log)" : ""));
      title.append(svg("title", {}, axis + (sc.log ? ", log scale" : "")));
      g.append(title);
      const ticks = sc.cats ? [[sc.cats[0], 0], [sc.cats[sc.cats.length - 1], 1]] : sc.ticks.map((v) => [fmt(v), sc.pos(v)]);
      for (const [label, p] of ticks) {
        g.append(svg("line", { class: "axis", x1: x(i) - 3, x2: x(i) + 3, y1: y(p), y2: y(p) }));
        g.append(svg("text", { class: "tick", x: x(i) + 4, y: y(p) + 4 }, short(String(label), 11)));
      }
      root.append(g);
    });
    root.setAttribute("data-lines", lines);
    return root;
  }
  function table(s) {
    const names = Object.keys(s.search_space);
    const body = document.querySelector("#trials tbody");
    if (!s.trials.length) return;
    body.replaceChildren(...s.trials.map((t) => by.el("tr", {},
      by.el("td", { class: "num", text: t.index }),
      by.el("td", { class: "name" }, t.name ? by.el("a", { href: jobs + encodeURIComponent(t.name), text: t.name }) : ""),
      ...names.map((n) => by.el("td", { class: "num", text: fmt(t.params[n]) })),
      by.el("td", {}, by.el("span", { class: "pill state-" + t.state, text: t.state })),
      by.el("td", { class: "num", text: t.objective === null ? "" : fmt(t.objective) }),
      by.el("td", { class: "reason", text: t.stopped_by || t.message || "" }))));
  }
  let state = root.dataset.state, finals = 0;
  async function poll() {
    const s = await by.json(api);
    state = s.state;
    const pill = document.getElementById("sweep-state");
    pill.textContent = s.state; pill.className = "pill state-" + s.state;
    document.getElementById("sweep-progress").textContent = s.trials_created + " / " + s.limits.max_total_trials;
    document.getElementById("sweep-best").textContent = s.best ? s.best.name + ": " + fmt(s.best.objective) : "—";
    document.getElementById("sweep-message").textContent = s.message || "—";
    table(s);
    document.getElementById("objective-chart").replaceChildren(...objectiveChart(s));
    const box = document.getElementById("parallel");
    box.replaceChildren(by.el("div", { class: "scrollx" }, parallel(s, box.clientWidth)));
  }
  const tick = async () => {
    try { await poll(); } catch (e) { /* the next tick retries */ }
    if (TERMINAL.includes(state) && ++finals > 1) return;
    setTimeout(tick, 2000);
  };
  tick();
})();
