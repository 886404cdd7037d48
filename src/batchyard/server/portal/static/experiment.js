// Experiment page: one metric overlaid across the experiment's runs, refreshed while open.
"use strict";
(() => {
  const box = document.getElementById("overlay");
  if (!box || !box.dataset.metric) { if (box) box.textContent = "no metrics logged in this experiment yet"; return; }
  async function load() {
    const data = await by.json(box.dataset.api + "?name=" + encodeURIComponent(box.dataset.metric));
    const series = Object.entries(data.series).filter(([, p]) => p.length).map(([name, points]) => ({ name, points }));
    box.replaceChildren(byChart.draw(series, { width: 900, height: 300, title: data.metric }), byChart.legend(series));
  }
  const tick = async () => { try { await load(); } catch (e) { /* retry */ } setTimeout(tick, 3000); };
  tick();
})();
