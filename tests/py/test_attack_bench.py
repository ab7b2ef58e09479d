"""Smoke test of bench/attack.py (the reliability issue's attack mixes): its
--smoke run (a few requests of each kind, small bodies) works and writes
well-formed JSON with every field. It does not check the bar (latency ratios
and RSS are numbers for bench/RESULTS.md, not test assertions): the exit
status may be 0 (bar met) or 1 (bar not met), never a crash."""
import json
import os
import subprocess
import sys

from conftest import ROOT

SCRIPT = os.path.join(ROOT, "bench", "attack.py")
MIXES = ["uploads", "masks", "plogprobs", "slowloris", "bombs"]
NORMAL_KEYS = {"count", "ok", "failed", "failures", "p50_s", "p99_s", "max_s", "wall_s", "five_xx"}
ATTACK_KEYS = {"name", "sent", "statuses", "errors", "bytes_sent", "bytes_received", "by_kind", "wall_s", "five_xx",
               "closed_by_server", "closed_after_s_p50", "closed_after_s_max"}
BAR_KEYS = {"all_normal_answered", "p99_within_factor", "rss_under_bound", "no_5xx", "alive", "pass"}


def num(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def check_normal(n):
    assert NORMAL_KEYS <= set(n), set(n)
    assert n["count"] > 0 and n["ok"] + n["failed"] == n["count"]
    assert sum(n["failures"].values()) == n["failed"]
    assert all(num(n[k]) for k in ("p50_s", "p99_s", "max_s", "wall_s", "five_xx"))
    if n["ok"]:
        assert 0 < n["p50_s"] <= n["p99_s"] <= n["max_s"]


def test_attack_smoke(sampler_bin, tmp_path):
    out = tmp_path / "attack.json"
    # the timeout bounds a hung script only; nothing here depends on how long it took
    r = subprocess.run([sys.executable, SCRIPT, "--smoke", "--bin", sampler_bin, "--json", str(out)],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode in (0, 1), r.stdout + r.stderr
    assert "bar:" in r.stdout and "Traceback" not in r.stderr, r.stdout + r.stderr
    d = json.loads(out.read_text())

    for k in ("mode", "sizes", "server", "latency_factor", "idle", "rss_idle_mb", "max_rss_mb", "max_rss_formula",
              "mixes", "rss_guard_mb", "guard_killed", "died", "died_returncode", "exit_code_after_sigterm", "rss", "wall_s", "normal_failed",
              "five_xx", "bar"):
        assert k in d, k
    assert d["mode"] == "smoke"
    check_normal(d["idle"])
    assert num(d["idle"]["rss_peak_mb"]) and d["idle"]["rss_peak_mb"] > 0
    assert num(d["rss_idle_mb"]) and d["rss_idle_mb"] > 0
    assert d["max_rss_mb"] == round(d["rss_idle_mb"] + 256, 1)  # the documented default

    assert [m["name"] for m in d["mixes"]] == MIXES
    assert set(d["mixes"][0]["attack"]["by_kind"]) == {"/admin/v1/weights/delta", "/v1/completions"}
    assert set(d["mixes"][4]["attack"]["by_kind"]) == {"flat [{},...]", "deep [[[...]]]"}
    for m in d["mixes"]:
        assert {"name", "normal", "attack", "p50_ratio", "p99_ratio", "rss_peak_mb", "rss_end_mb", "idle_after",
                "alive"} <= set(m), set(m)
        check_normal(m["normal"])
        a = m["attack"]
        assert ATTACK_KEYS <= set(a), set(a)
        assert a["name"] == m["name"] and a["sent"] > 0
        # every request or connection the attack started has exactly one recorded outcome
        assert sum(a["statuses"].values()) + a["errors"].get("still open at the time cap", 0) == a["sent"], a
        assert all(k == "none" or (k.isdigit() and 100 <= int(k) <= 599) for k in a["statuses"])
        assert a["bytes_sent"] > 0 and a["bytes_received"] >= 0
        for per in a["by_kind"].values():  # a breakdown of some of the statuses, never more
            assert all(v <= a["statuses"].get(k, 0) for k, v in per.items())
        assert a["five_xx"] == sum(v for k, v in a["statuses"].items() if k.isdigit() and int(k) >= 500)
        assert num(m["rss_peak_mb"]) and isinstance(m["alive"], bool)
        if m["alive"]:
            assert num(m["p99_ratio"]) and m["p99_ratio"] > 0

    rs = d["rss"]
    assert rs["every_s"] == 0.5 and len(rs["samples"]) >= 2
    ts = [t for t, _ in rs["samples"]]
    assert ts == sorted(ts)
    phase_peaks = [d["idle"]["rss_peak_mb"]] + [m["rss_peak_mb"] for m in d["mixes"]]
    assert rs["peak_mb"] == max([v for _, v in rs["samples"]] + phase_peaks)
    assert rs["final_mb"] == rs["samples"][-1][1]

    assert set(d["bar"]) == BAR_KEYS and all(isinstance(v, bool) for v in d["bar"].values())
    assert d["bar"]["pass"] == all(v for k, v in d["bar"].items() if k != "pass")
    assert (r.returncode == 0) == d["bar"]["pass"]
    assert isinstance(d["died"], bool) and isinstance(d["guard_killed"], bool)
    if not d["died"]:
        assert d["exit_code_after_sigterm"] == 0 or not d["bar"]["alive"]
