"""Who is to blame when nodes of a gang cannot reach each other (server/services/preflight.py):
node reports as launchers send them, the verdict out."""

from __future__ import annotations

from typing import Any

from batchyard.server.services.preflight import verdict

TIMEOUT = {"ok": False, "error": "timeout 2 s"}


def reports(names: list[str], broken: set[tuple[int, int]],
            gpu_bad: dict[int, str] | None = None) -> list[dict[str, Any]]:
    """Every node dials every peer; (a, b) in ``broken``: a could not reach b."""
    out = []
    for a, name in enumerate(names):
        links = []
        for b in range(len(names)):
            if b == a:
                continue
            link: dict[str, Any] = {"peer": names[b], "peer_rank": b,
                                    "addr": f"10.0.0.{b + 1}:900{b}"}
            if (a, b) in broken:
                link.update(TIMEOUT)
            else:
                link.update(ok=True, connect_ms=0.2)
                if a < b:
                    link.update(latency_us=30.0 + a, bandwidth_MBps=1000.0 - 10 * b)
            links.append(link)
        report: dict[str, Any] = {"node": name, "node_rank": a, "links": links, "took_s": 0.3}
        if gpu_bad is not None:
            report["gpu"] = ({"ok": False, "message": gpu_bad[a]} if a in gpu_bad
                             else {"ok": True, "message": "no GPUs"})
        out.append(report)
    return out


def test_all_reach_passes_with_figures() -> None:
    names = ["box1", "box2", "box3"]
    found = verdict(names, reports(names, set()))
    assert found["ok"] is True and found["blamed"] == {}
    assert found["message"] == ("pre-flight passed on 3 nodes in 0.3 s (network: 3 pair(s) "
                                "measured, latency 30-31 us, bandwidth 980-990 MB/s)")


def test_node_that_fails_with_every_peer_is_blamed() -> None:
    names = ["box1", "box2", "box3"]
    broken = {(0, 2), (1, 2), (2, 0), (2, 1)}
    found = verdict(names, reports(names, broken))
    assert found["ok"] is False and list(found["blamed"]) == ["box3"]
    assert found["blamed"]["box3"] == (
        "cannot reach 10.0.0.3:9002 from box1, box2 (timeout 2 s); box3 cannot reach "
        "box1 (10.0.0.1:9000), box2 (10.0.0.2:9001) (timeout 2 s)")
    assert found["message"].startswith("pre-flight: node box3 unusable: cannot reach "
                                       "10.0.0.3:9002 from box1, box2 (timeout 2 s)")


def test_inbound_only_failure_blames_the_unreachable_node() -> None:
    names = ["box1", "box2", "box3", "box4"]
    found = verdict(names, reports(names, {(0, 3), (1, 3), (2, 3)}))
    assert found["blamed"] == {"box4": "cannot reach 10.0.0.4:9003 from box1, box2, box3 "
                                       "(timeout 2 s)"}


def test_two_isolated_nodes_of_five_are_both_blamed() -> None:
    names = [f"n{i}" for i in range(5)]
    broken = {(a, b) for a in range(5) for b in range(5) if a != b and (a in (1, 3)
                                                                       or b in (1, 3))}
    assert sorted(verdict(names, reports(names, broken))["blamed"]) == ["n1", "n3"]


def test_two_nodes_one_unreachable_at_its_address() -> None:
    """host2 dials host1 fine, but nothing reaches host2's published address."""
    names = ["host1", "host2"]
    found = verdict(names, reports(names, {(0, 1)}))
    assert found["blamed"] == {"host2": "cannot reach 10.0.0.2:9001 from host1 (timeout 2 s)"}


def test_two_nodes_cut_both_ways_is_not_guessed() -> None:
    names = ["host1", "host2"]
    found = verdict(names, reports(names, {(0, 1), (1, 0)}))
    assert found["ok"] is False and found["blamed"] == {}
    assert found["message"] == (
        "pre-flight: nodes of the gang cannot reach each other (host1 -> host2: timeout 2 s; "
        "host2 -> host1: timeout 2 s), and the links do not tell which node is at fault: "
        "none is marked unusable")


def test_one_broken_pair_of_three_is_not_guessed() -> None:
    names = ["a", "b", "c"]
    found = verdict(names, reports(names, {(0, 1), (1, 0)}))
    assert found["ok"] is False and found["blamed"] == {}


def test_even_split_is_not_guessed() -> None:
    names = ["a", "b", "c", "d"]
    broken = {(x, y) for x in range(4) for y in range(4) if (x < 2) != (y < 2)}
    assert verdict(names, reports(names, broken))["blamed"] == {}


def test_unhealthy_gpu_is_blamed_and_healthy_ones_noted() -> None:
    names = ["g1", "g2"]
    found = verdict(names, reports(names, set(), gpu_bad={1: "GPU 0 (H100): 2 uncorrectable "
                                                            "ECC error(s)"}))
    assert found["blamed"] == {"g2": "unhealthy GPU: GPU 0 (H100): 2 uncorrectable ECC "
                                     "error(s)"}
    ok = verdict(names, reports(names, set(), gpu_bad={}))
    assert ok["ok"] is True and ok["message"].endswith("gpu: g1: no GPUs, g2: no GPUs)")


def test_bandwidth_failure_on_a_connected_link_counts_as_broken() -> None:
    names = ["a", "b", "c"]
    rep = reports(names, set())
    for link in rep[0]["links"] + rep[1]["links"]:
        if link["peer"] == "c":
            link.update(ok=False, error="bandwidth probe failed: timeout 5 s")
    found = verdict(names, rep)
    assert list(found["blamed"]) == ["c"]
    assert "bandwidth probe failed: timeout 5 s" in found["blamed"]["c"]


def test_gpu_only_preflight_has_no_network_part() -> None:
    names = ["g1", "g2"]
    rep = [{"node": n, "node_rank": i, "gpu": {"ok": True, "message": "no GPUs"}, "took_s": 0.01}
           for i, n in enumerate(names)]
    found = verdict(names, rep)
    assert found == {"ok": True, "blamed": {}, "message": "pre-flight passed on 2 nodes in "
                     "0.01 s (gpu: g1: no GPUs, g2: no GPUs)"}
