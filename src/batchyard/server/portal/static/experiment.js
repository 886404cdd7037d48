// Experiment page: one metric overlaid across the experiment's runs, refreshed while open.
"use strict";
(() => {
  const box = document.getElementById("overlay");
  if (!box || !box.dataset.metric) { if (box) box.textContent = "no metrics logged in this experiment yet"; return; }
  let last = "";
  async function load() {
    const data = await by.json(box.dataset.api + "?name=" + encodeURIComponent(box.dataset.metric));
    const seen = JSON.stringify(data);
    if (seen === last) return;  // unchanged: keep the chart (and what the pointer shows)
    last = seen;
    const series = Object.entries(data.series).filter(([, p]) => p.length).map(([name, points]) => ({ name, points }));
    const width = Math.max(280, Math.min(1100, Math.round(box.clientWidth || 900)));
    box.replaceChildren(byChart.panel(data.metric, series, { width, height: width < 600 ? 240 : 300, key: data.metric, showStep: false }));
  }
  const tick = async () => { try { await load(); } catch (e) { /* retry */ } setTimeout(tick, 3000); };
  tick();
})();
