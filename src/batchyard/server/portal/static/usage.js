// Usage page: GPU- and CPU-hours per period, one series per team (or user, workspace...).
"use strict";
(() => {
  const box = document.getElementById("usage-charts");
  const data = JSON.parse(document.getElementById("usage-data").textContent);
  if (!box) return;
  const width = Math.max(280, Math.min(1100, Math.round(box.clientWidth || 900)));
  const titles = { gpu_hours: "GPU-hours per " + data.unit, cpu_hours: "CPU-hours per " + data.unit };
  for (const [kind, title] of Object.entries(titles)) {
    const chart = by.el("div", { class: "chart", "data-kind": kind });
    chart.append(byChart.panel(title, data.series[kind] || [], { key: "usage-" + kind, width,
      height: width < 600 ? 220 : 260, xTitle: data.unit + "s from now (0: the last " + data.unit + ")", yTitle: title, showStep: false }));
    box.append(chart);
  }
})();
