"""The figures of one bench/fleet_sim.py run, from what the coordinator and the simulated
agents recorded (every sample carries its wall-clock time; a phase is a time window)."""

from __future__ import annotations

from typing import Any


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Window:
    def __init__(self, span: tuple[float, float]) -> None:
        self.start, self.end = span

    @property
    def seconds(self) -> float:
        return max(1e-9, self.end - self.start)

    def pick(self, ends: list[float], values: list[float]) -> list[float]:
        return [v for t, v in zip(ends, values, strict=True) if self.start <= t <= self.end]

    def rate(self, samples: list[tuple[float, ...]], index: int) -> float:
        """Growth per second of column ``index`` of the samples over the window."""
        inside = [s for s in samples if self.start <= s[0] <= self.end]
        if len(inside) < 2:
            return float("nan")
        return (inside[-1][index] - inside[0][index]) / (inside[-1][0] - inside[0][0])

    def mean(self, samples: list[tuple[float, ...]], index: int) -> float:
        inside = [s[index] for s in samples if self.start <= s[0] <= self.end]
        return sum(inside) / len(inside) if inside else float("nan")


def _merge(agents: list[dict[str, Any]]) -> dict[str, Any]:
    lat: dict[str, tuple[list[float], list[float]]] = {}
    hb: tuple[list[float], list[float]] = ([], [])
    gaps: dict[str, float] = {}
    lost: set[str] = set()
    errors: dict[str, int] = {}
    messages: dict[str, int] = {}
    runs: list[dict[str, Any]] = []
    cpu = 0.0
    for a in agents:
        for kind, (ends, rtts) in (a.get("lat") or {}).items():
            e, r = lat.setdefault(kind, ([], []))
            e.extend(ends)
            r.extend(rtts)
        hb[0].extend((a.get("hb_excess") or [[], []])[0])
        hb[1].extend((a.get("hb_excess") or [[], []])[1])
        gaps.update(a.get("hb_gap_max") or {})
        lost.update(a.get("lost") or [])
        for k, v in (a.get("errors") or {}).items():
            errors[k] = errors.get(k, 0) + v
        for k, v in (a.get("messages") or {}).items():
            messages[k] = messages.get(k, 0) + v
        runs.extend(a.get("runs") or [])
        cpu += float(a.get("cpu_s") or 0.0)
    return {"lat": lat, "hb": hb, "gaps": gaps, "lost": lost, "errors": errors,
            "messages": messages, "runs": runs, "cpu": cpu}


def summarize(raw: dict[str, Any], window: type[Window] = Window) -> dict[str, Any]:
    n = raw["agents"]
    m = _merge(raw.get("agents_out") or [])
    samples = raw.get("samples") or []
    row: dict[str, Any] = {"agents": n, "db": raw["db"], "workers": raw["workers"],
                           "join_s": round(raw.get("join_s", float("nan")), 1),
                           "load": [raw.get("load_start"), raw.get("load_idle"),
                                    raw.get("load_busy")]}
    empty = window(raw["idle_empty"])
    rss_empty = empty.mean(samples, 2)
    for phase in ("idle", "busy"):
        if phase not in raw:
            continue
        w = window(raw[phase])
        hb = w.pick(*m["hb"])
        beats = w.pick(*m["lat"].get("heartbeat", ([], [])))
        row[f"{phase}_heartbeats_per_s"] = round(len(beats) / w.seconds, 1)
        row[f"{phase}_hb_per_s"] = round(len(hb) / w.seconds, 1)
        row[f"{phase}_hb_p50_ms"] = round(pct(hb, 0.5) * 1000, 1)
        row[f"{phase}_hb_p99_ms"] = round(pct(hb, 0.99) * 1000, 1)
        row[f"{phase}_hb_max_ms"] = round(max(hb, default=float("nan")) * 1000, 1)
        row[f"{phase}_server_cores"] = round(w.rate(samples, 1), 3)
        row[f"{phase}_pg_cores"] = round(w.rate(samples, 3), 3)
        rss = w.mean(samples, 2)
        row[f"{phase}_rss_mb"] = round(rss / 2**20, 1)
        row[f"{phase}_rss_kb_per_agent"] = round((rss - rss_empty) / 1024 / n, 1)
        row[f"{phase}_cpu_ms_per_agent_s"] = round(
            (w.rate(samples, 1) - empty.rate(samples, 1)) * 1000 / n, 3)
        if phase == "idle" and beats:  # all the idle server does is heartbeats
            row["idle_cpu_ms_per_heartbeat"] = round(
                (w.rate(samples, 1) + max(0.0, w.rate(samples, 3))) * 1000
                / (len(beats) / w.seconds), 2)
    row["hb_longest_silence_s"] = round(max(m["gaps"].values(), default=float("nan")), 2)
    row["lost_false"] = max(len(m["lost"]), int((raw.get("nodes_end") or {}).get("lost", 0)))
    row["nodes_end"] = raw.get("nodes_end")
    row["jobs_end"] = raw.get("jobs_end")
    if "busy" in raw:
        w = window(raw["busy"])
        subs = [s for s in raw["submits"] if w.start <= s[0] <= w.end]
        ok = [s[1] for s in subs if s[3] == 201]
        row["submits"] = len(subs)
        row["submit_rate_target"] = round(raw["rate"], 2)
        row["submit_errors"] = len(subs) - len(ok)
        row["submit_p50_ms"] = round(pct(ok, 0.5) * 1000, 1)
        row["submit_p99_ms"] = round(pct(ok, 0.99) * 1000, 1)
        sent = {s[2]: s[0] for s in subs if s[3] == 201}
        by_job: dict[str, list[dict[str, Any]]] = {}
        for r in m["runs"]:
            if r.get("job") in sent:
                by_job.setdefault(r["job"], []).append(r)
        sched, running = [], []
        for job, recs in by_job.items():
            ranks = {r["rank"] for r in recs}
            if len(ranks) < max(r["rank"] for r in recs) + 1:
                continue
            sched.append(max(r["wanted"] for r in recs) - sent[job])
            if all("running" in r for r in recs):
                running.append(max(r["running"] for r in recs) - sent[job])
        row["jobs_placed"] = len(sched)
        row["sched_p50_ms"] = round(pct(sched, 0.5) * 1000, 1)
        row["sched_p99_ms"] = round(pct(sched, 0.99) * 1000, 1)
        row["running_p50_ms"] = round(pct(running, 0.5) * 1000, 1)
        row["running_p99_ms"] = round(pct(running, 0.99) * 1000, 1)
        lags = [lag for t, lag in raw["log_lags"] if w.start <= t <= w.end]
        row["log_lines_followed"] = len(lags)
        row["log_p50_ms"] = round(pct(lags, 0.5) * 1000, 1)
        row["log_p99_ms"] = round(pct(lags, 0.99) * 1000, 1)
        calls = {}
        for kind, (ends, rtts) in m["lat"].items():
            got = w.pick(ends, rtts)
            if kind in ("heartbeat", "control", "rendezvous_wait"):
                calls[kind] = {"per_s": round(len(got) / w.seconds, 1)}
                continue
            calls[kind] = {"per_s": round(len(got) / w.seconds, 1),
                           "p50_ms": round(pct(got, 0.5) * 1000, 1),
                           "p99_ms": round(pct(got, 0.99) * 1000, 1)}
        row["calls"] = calls
        total = sum(c["per_s"] for c in calls.values())
        busy_cpu = row.get("busy_server_cores", float("nan")) + max(
            0.0, row.get("busy_pg_cores", 0.0) or 0.0)
        row["busy_calls_per_s"] = round(total, 1)
        row["busy_cpu_ms_per_call"] = round(busy_cpu * 1000 / total, 2) if total else None
    row["errors"] = m["errors"]
    row["error_messages"] = dict(sorted(m["messages"].items(), key=lambda kv: -kv[1])[:5])
    row["sim_cpu_s"] = round(m["cpu"], 1)
    return row


COLUMNS = (("agents", "N", "{}"), ("db", "db", "{}"), ("workers", "w", "{}"),
           ("join_s", "join s", "{}"), ("idle_hb_p99_ms", "idle hb p99", "{}"),
           ("idle_server_cores", "idle cores", "{}"), ("idle_rss_kb_per_agent", "KB/agent", "{}"),
           ("busy_hb_p99_ms", "busy hb p99", "{}"), ("hb_longest_silence_s", "silence s", "{}"),
           ("lost_false", "lost", "{}"), ("submit_p99_ms", "submit p99", "{}"),
           ("sched_p50_ms", "sched p50", "{}"), ("sched_p99_ms", "sched p99", "{}"),
           ("log_p50_ms", "log p50", "{}"), ("log_p99_ms", "log p99", "{}"),
           ("busy_server_cores", "busy cores", "{}"), ("busy_pg_cores", "pg cores", "{}"))


def print_table(rows: list[dict[str, Any]], header: bool = True) -> None:
    widths = [max(len(title), 6) for _, title, _ in COLUMNS]
    if header:
        print("  ".join(t.rjust(w) for (_, t, _), w in zip(COLUMNS, widths, strict=True)))
    for row in rows:
        cells = [fmt.format(row.get(key, "-")) for key, _, fmt in COLUMNS]
        print("  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))
              + f"   load {row['load']}")
        calls = row.get("calls") or {}
        if calls:
            print("      node channel, busy: " + ", ".join(
                f"{k} {v['per_s']}/s" + (f" p99 {v['p99_ms']} ms" if "p99_ms" in v else "")
                for k, v in sorted(calls.items())))
        print(f"      CPU ms (server + PostgreSQL): per idle heartbeat "
              f"{row.get('idle_cpu_ms_per_heartbeat')}, per busy call "
              f"{row.get('busy_cpu_ms_per_call')} ({row.get('busy_calls_per_s')} calls/s)")
        if row.get("errors"):
            print(f"      errors {row['errors']}  {row.get('error_messages')}")
        print(f"      nodes at end {row.get('nodes_end')}  jobs {row.get('jobs_end')}  "
              f"placed {row.get('jobs_placed')} of {row.get('submits')} submitted in the "
              f"window; simulator CPU {row.get('sim_cpu_s')} s")
