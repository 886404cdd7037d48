// batchyard portal: helpers shared by every page (no third-party code).
"use strict";
const by = {
  csrf() { const m = document.querySelector('meta[name="csrf-token"]'); return m ? m.content : ""; },
  async json(url) {
    const r = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (r.status === 401) { location.href = "/login?next=" + encodeURIComponent(location.pathname); throw new Error("signed out"); }
    if (!r.ok) throw new Error(url + ": " + r.status);
    return r.json();
  },
  // Build an element; text is always set as text, never parsed as HTML.
  el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "text") node.textContent = String(v); else node.setAttribute(k, String(v));
    }
    for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return node;
  },
  duration(s) {
    if (s === null || s === undefined) return "—";
    const t = Math.floor(s), h = Math.floor(t / 3600), m = Math.floor((t % 3600) / 60), sec = t % 60;
    if (h) return h + "h " + String(m).padStart(2, "0") + "m";
    return m ? m + "m " + String(sec).padStart(2, "0") + "s" : s.toFixed(1) + "s";
  },
  // One time format everywhere (the server renders the same one in <time data-ts>).
  stamp(t) {
    if (!t) return "—";
    const d = new Date(t * 1000), p = (n) => String(n).padStart(2, "0");
    return d.getFullYear() + "-" + p(d.getMonth() + 1) + "-" + p(d.getDate()) + " " +
      p(d.getHours()) + ":" + p(d.getMinutes()) + ":" + p(d.getSeconds());
  },
  time(t) { return t ? by.el("time", { "data-ts": t, text: by.stamp(t) }) : document.createTextNode("—"); },
  path(...parts) { return "/" + parts.map((p, i) => (i % 2 ? encodeURIComponent(p) : p)).join("/"); },
  jobUrl(ws, exp, name) { return by.path("ws", ws, "exp", exp, "jobs", name); },
  expUrl(ws, exp) { return by.path("ws", ws, "exp", exp); },
  pill(state) { return by.el("span", { class: "pill state-" + state, text: state }); },
  // State counts as chips; a zero is shown in neutral grey, not in the state's colour.
  counts(box, counts) {
    box.replaceChildren(...Object.entries(counts).map(([st, n]) => by.el("span",
      { class: "count state-" + st + (n ? "" : " zero"), "data-count": st }, by.el("b", { text: n }), " " + st)));
  },
  bytes(n) {
    if (n === null || n === undefined) return "—";
    const u = ["B", "KB", "MB", "GB", "TB"]; let i = 0;
    while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
    return n.toFixed(n < 10 && i ? 1 : 0) + " " + u[i];
  },
  bar(percent, label) {
    const p = Math.max(0, Math.min(100, Number(percent) || 0));
    const fill = by.el("span"); fill.style.width = p.toFixed(1) + "%";
    return by.el("div", { class: "bar", title: label }, fill, by.el("em", { text: label }));
  },
  // CPU / memory / GPU cells of a node from the launcher's utilisation sample.
  utilCells(u) {
    if (!u) return [by.el("span", { class: "muted", text: "—" }), by.el("span", { class: "muted", text: "—" }), by.el("span", { class: "muted", text: "—" })];
    const cpu = by.el("div", {}, by.bar(u.cpu_percent, Math.round(u.cpu_percent) + "% host"),
      by.el("small", { text: "job " + (u.job_cpu_cores || 0).toFixed(2) + " cores" }));
    const mem = by.el("div", {}, by.bar(u.mem_percent, Math.round(u.mem_percent) + "% of " + by.bytes(u.mem_total_bytes)),
      by.el("small", { text: "job " + by.bytes(u.job_rss_bytes) }));
    const gpus = by.el("div");
    if (!u.gpus || !u.gpus.length) gpus.append(by.el("span", { class: "muted", text: "no GPU" }));
    for (const g of u.gpus || []) {
      gpus.append(by.bar(g.util_percent, "GPU" + g.index + " " + Math.round(g.util_percent) + "%"),
        by.el("small", { text: g.mem_used_mb + " / " + g.mem_total_mb + " MiB" }));
    }
    return [cpu, mem, gpus];
  },
};
window.by = by;
document.addEventListener("DOMContentLoaded", () => {
  for (const s of document.querySelectorAll("select[data-autosubmit]")) s.addEventListener("change", () => s.form.submit());
  for (const t of document.querySelectorAll("time[data-ts]")) t.textContent = by.stamp(Number(t.dataset.ts));
});
// Delegated, so rows a live list adds later ask too.
document.addEventListener("submit", (e) => {
  const f = e.target;
  if (f instanceof HTMLFormElement && f.dataset.confirm && !window.confirm(f.dataset.confirm)) e.preventDefault();
});
