#!/usr/bin/env python3
"""bench/gpu/<gpu>.json: the GPU check's numbers as one table of named rows
(issue 17's format), written from gpu_check's --json summary and the served
benchmark's JSON (bench/gpu_served.py), and rendered as markdown for
bench/RESULTS.md.

    python3 bench/gpu_json.py write --gpu-check GC.json --served SERVED.json [--served ...]
        [--gpu "NVIDIA H200"] [--commit C] [--date D] --out bench/gpu     # -> bench/gpu/h200.json
    python3 bench/gpu_json.py render [--brief] bench/gpu/h200.json      # markdown on stdout
    python3 bench/gpu_json.py check bench/gpu/h200.json                 # schema; exit 1 if broken
    python3 bench/gpu_json.py resume TRY1.json [TRY2.json ...]          # check.sh: how to resume gpu_check
    python3 bench/gpu_json.py merge TRY1.json [TRY2.json ...] --out GC.json   # the tries as one summary

gpu_check runs in sections (tests/gpu/check_sections.h) and rewrites its JSON before and after
every step, so a process that dies (a kernel fault that breaks the CUDA context, a hang stopped by
its watchdog, a fatal exit) leaves a JSON with "sections": {"running": STEP, "complete": false}.
`resume` reads the JSON of every try so far and prints the arguments of the next try (skip what is
done and the step that died; the ops section restarts after its row that died; "roofline" runs
again in each try, part 3 needs it), or exits 1 when the last try completed and 2 when it cannot
go on (no JSON, or a death outside any step). `merge` folds the tries into one summary: parts
summed, rows in order, "sections": {"done", "skipped", "died": [STEP of each try that died],
"complete"}; `write` turns "died" into the row gpu_check_sections_died.

Format: {"gpu", "commit", "date", "rows": [{"name", "value", "unit", "fraction_of_roofline"}]};
a row may add "source" (what it was computed from) and "note" (for the table), and, when value is
null, must add "reason" (why it was not measured). Names are [a-z0-9_]+ and unique. Every name of REQUIRED (the rows
issues 17, 18 and 19 ask for) is present, null with a reason when this run did not measure it.

Rows from gpu_check (its bench row names are parsed, so a row another change adds there is
named without an edit here):
  "<label> decode batch <B> (ctx <C>)" -> decode_<label>_b<B>_ctx<C'>_{tok_s,ms,fraction}, C' = C
      or Nk when C is a multiple of 1024 (32768 -> 32k); at ctx 512 also decode_<label>_b<B>_*; the
      label is every word before "decode" (a precision, and what differs: "fp8 native",
      "moe30b pdl off" -> decode_moe30b_pdl_off_b1_*);
  "<prec> prefill <S> x <L> tokens" -> prefill_<prec>_<S>x<L>_{tok_s,ms,fraction};
  "<fmt> gemv n=1 [<R> x <C>]" -> gemv_<fmt>_<R>x<C>_{gbs,fraction} (fraction of copy bandwidth);
      at N > 1 tokens "<fmt> gemv[ mma] n=<N> [<R> x <C>]" -> gemv_<fmt>[_mma]_n<N>_<R>x<C>_{gbs,fraction};
  any other name: its slug, with _tok_s / _ms / _fraction;
  "named_rows": [{"name", "value", "unit", "fraction_of_roofline"}] in its JSON: copied as they
      are (a measurement with no tok/s shape, e.g. kl_bf16_fp8_mean);
  roofline_copy_gbs, roofline_gemm_bf16_tflops, gpu_check_ops_failed, gpu_check_models_failed.
Rows from the served benchmark, per configuration c<C>_<P>x<O>[_rl_fields] and precision (and the
run's --tag after it: served_bf16_sync_... for check.sh --served-sync, async scheduling off):
  served_<prec>_<cfg>_{tok_s, steady_tok_s, ttft_p50_ms, ttft_p99_ms, itl_p50_ms, itl_p99_ms,
  step_ms, forward_ms (the server's engine step and the backend's forward in it), host_share,
  device_busy_share (the device's time on its steps / the window: 1 - it is the device's wait for the host)};
  served_<prec>_c<Cmax>_host_share and _device_busy_share are the first shape's at the largest
  concurrency, RL fields off. fraction_of_roofline of a served tok/s row: the decode roofline
  at batch C and the mean context P + O/2 (weights + KV bytes read per step over gpu_check's
  copy bandwidth: roofline tok/s = C * bw / (W + C * (P + O/2) * kv_bytes_per_token)), of an
  ITL p50 row at C = 1: that roofline's step time / ITL.
"""
import argparse
import datetime
import json
import math
import os
import re
import subprocess
import sys

REQUIRED = {
    # issue 17
    "served_bf16_c1_1000x1000_tok_s": "the served benchmark did not run (check.sh --skip-served, or it failed)",
    "served_bf16_c256_1000x1000_tok_s": "the served benchmark did not run (check.sh --skip-served, or it failed)",
    "served_bf16_c256_1000x1000_rl_fields_tok_s": "the served benchmark did not run (check.sh --skip-served, "
                                                  "or it failed)",
    "served_bf16_c256_host_share": "the served benchmark did not run (check.sh --skip-served, or it failed)",
    "decode_bf16_b1_tok_s": "gpu_check's bench did not run (--skip-bench, or too little device memory)",
    # issue 18
    "prefill_bf16_4x1024_fraction": "gpu_check's bench did not run",
    "decode_bf16_b128_ctx512_fraction": "gpu_check's bench did not run",
    "decode_bf16_b1_fraction": "gpu_check's bench did not run",
    "decode_bf16_b8_ctx32k_fraction": "gpu_check's bench did not run, or the device had too little free memory "
                                      "for 8 x 32k positions of BF16 KV (38.7 GiB)",
    "decode_moe30b_b1_fraction": "gpu_check's bench did not run (its MoE rows: tests/gpu/bench_moe.h)",
    "decode_moe30b_b64_fraction": "gpu_check's bench did not run (its MoE rows: tests/gpu/bench_moe.h)",
    # issue 19
    "served_fp8_c256_1000x1000_tok_s": "the served benchmark ran at bf16 only (check.sh --served-fp8 adds it)",
    "decode_fp8_b1_tok_s": "gpu_check's bench did not run",
    "kl_bf16_fp8_mean": "gpu_check's kl_fp8 section did not run (tests/gpu/bench_native.h)",
}

NAME_RE = re.compile(r"^[a-z0-9_]+$")


def slug(s):
    return re.sub(r"[^a-z0-9]+", "_", s.lower()).strip("_")


def ctx_label(c):
    return f"{c // 1024}k" if c >= 1024 and c % 1024 == 0 else str(c)


def gpu_slug(name):
    """'NVIDIA H200' -> 'h200' (the file name)."""
    s = slug(re.sub(r"(?i)\bnvidia\b", "", name or "")) or "unknown"
    return s.replace("_", "-")


def fnum(x):
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


class Rows:
    def __init__(self):
        self.rows = {}

    def add(self, name, value, unit, frac=None, source=None, reason=None, note=None):
        assert NAME_RE.match(name), name
        r = {"name": name, "value": fnum(value), "unit": unit, "fraction_of_roofline": fnum(frac)}
        if source:
            r["source"] = source
        if note:
            r["note"] = note
        if r["value"] is None:
            r["reason"] = reason or "not measured"
        if name not in self.rows or self.rows[name]["value"] is None:
            self.rows[name] = r


def died_steps(gc):
    return list((gc or {}).get("sections", {}).get("died", []))


def gpu_check_rows(R, gc):
    src = "gpu_check"
    R.add("gpu_check_ops_failed", gc["parts"]["ops"]["failed"], "checks", source=src)
    R.add("gpu_check_models_failed", gc["parts"]["models"]["failed"], "checks", source=src)
    if "bench" in gc["parts"]:
        R.add("gpu_check_bench_failed", gc["parts"]["bench"]["failed"], "checks", source=src)
    if "sections" in gc:
        died = died_steps(gc)
        R.add("gpu_check_sections_died", len(died), "steps",
              source=src + (": check.sh resumed after each; gpu_check.log says how" if died else
                            ": every section ran to its end"),
              note="died in " + ", ".join(died) if died else None)
    if not gc.get("bench_ran"):
        return
    R.add("roofline_copy_gbs", gc["copy_gbs"], "GB/s", source=src + ": device-to-device cudaMemcpy, read + write")
    R.add("roofline_gemm_bf16_tflops", gc["gemm_tflops"], "TFLOP/s", source=src + ": cuBLAS 8192^3 BF16, f32 acc")
    for row in gc.get("rows", []):
        name = row["name"]
        m = re.match(r"^(.+?) decode batch (\d+)(?: \(ctx (\d+)\))?$", name)
        p = re.match(r"^(\S+) prefill (\d+) x (\d+) tokens$", name)
        if m:
            prec, b, ctx = slug(m.group(1)), int(m.group(2)), int(m.group(3) or 512)
            keys = [f"decode_{prec}_b{b}_ctx{ctx_label(ctx)}"] + ([f"decode_{prec}_b{b}"] if ctx == 512 else [])
        elif p:
            keys = [f"prefill_{slug(p.group(1))}_{p.group(2)}x{p.group(3)}"]
        else:
            keys = [slug(name)]
        for k in keys:
            R.add(k + "_tok_s", row["tok_s"], "tok/s", row["fraction"], source=f"{src}: {name}")
            R.add(k + "_ms", row["ms"], "ms/step", row["fraction"], source=f"{src}: {name}")
            R.add(k + "_fraction", row["fraction"], "fraction", row["fraction"],
                  source=f"{src}: {name}, roofline {row['roof_tok_s']:.1f} tok/s")
    for g in gc.get("gemv", []):
        m = re.match(r"^(\S+) gemv( mma)? n=(\d+) \[(\d+) x (\d+)\]$", g["name"])
        tag = (m.group(2) or "").strip() + ("" if m.group(3) == "1" else f" n{m.group(3)}") if m else ""
        k = f"gemv_{slug(m.group(1) + ' ' + tag if tag else m.group(1))}_{m.group(4)}x{m.group(5)}" if m else slug(g["name"])
        R.add(k + "_gbs", g["gbs"], "GB/s", g["fraction"], source=f"{src}: {g['name']}")
        R.add(k + "_fraction", g["fraction"], "fraction", g["fraction"], source=f"{src}: {g['name']}, of copy bandwidth")
    for r in gc.get("named_rows", []):
        R.add(r["name"], r.get("value"), r.get("unit", ""), r.get("fraction_of_roofline"), source=src,
              reason=r.get("reason"))


def decode_roofline(mc, batch, ctx, bw_gbs, kv_elem):
    """(tok/s, step s) of a decode step at this batch and mean context, from the bytes it must read."""
    H, I, L, V = mc["hidden_size"], mc["intermediate_size"], mc["num_hidden_layers"], mc["vocab_size"]
    hd = mc.get("head_dim") or H // mc["num_attention_heads"]
    qd, kvd = mc["num_attention_heads"] * hd, mc["num_key_value_heads"] * hd
    mat = L * (qd * H + 2 * kvd * H + H * qd + 3 * I * H) + V * H  # + lm_head (tied or not, read once)
    w_bytes = 2.0 * mat
    kv_tok = 2.0 * L * kvd * kv_elem
    step = (w_bytes + batch * ctx * kv_tok) / (bw_gbs * 1e9)
    return batch / step, step


def served_rows(R, sv, bw_gbs):
    prec = slug(sv.get("precision") or "bf16") + ("_" + slug(sv["tag"]) if sv.get("tag") else "")
    mc, kv_elem = sv.get("model_config"), sv.get("kv_elem_bytes")  # of the --kv-cache-dtype it ran with
    src = f"bench/gpu_served.py ({sv.get('mode')}, {sv.get('model')}, KV {sv.get('kv_cache_dtype')})"
    big = max(sv.get("concurrency") or [0]) if sv.get("concurrency") else None
    first_shape = (sv.get("shapes") or [None])[0]
    for c in sv.get("configs", []):
        base = f"served_{prec}_{c['name']}"
        if c.get("server_died") is not None:  # its window's numbers are partial: none of them is a row
            dead = (f"the server died during this configuration (exit {c['server_died']}; served.log has the end of "
                    f"its log); gpu_served.py restarted it for the rest")
            for k, u in (("tok_s", "tok/s"), ("steady_tok_s", "tok/s"), ("ttft_p50_ms", "ms"), ("ttft_p99_ms", "ms"),
                         ("itl_p50_ms", "ms"), ("itl_p99_ms", "ms"), ("step_ms", "ms/step"),
                         ("forward_ms", "ms/step"), ("host_share", "fraction"), ("device_busy_share", "fraction")):
                R.add(f"{base}_{k}", None, u, None, src, dead)
            continue
        roof = None
        if mc and bw_gbs and kv_elem:
            roof = decode_roofline(mc, c["concurrency"], c["prompt"] + c["output"] / 2, bw_gbs, kv_elem)
        why = (f"no token in the {c['window_s']:.0f} s window ({c['n_errors']} client errors: "
               f"{'; '.join(c['errors'][:2])})")
        s = (f"{src}: window {c['window_s']:.0f} s, {c['requests_completed']}/{c['requests_sent']} requests done, "
             f"{c['requests_cut']} cut, {c['n_errors']} errors")
        tok = c["tok_s"] if c["tokens"] else None
        R.add(base + "_tok_s", tok, "tok/s", tok / roof[0] if roof and tok else None, s, why)
        st = c["steady_tok_s"] if c["tokens"] else None
        R.add(base + "_steady_tok_s", st, "tok/s", st / roof[0] if roof and st else None,
              s + "; second half of the window", why)
        for k in ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99"):
            v = c.get(k + "_s")
            frac = None
            if k == "itl_p50" and c["concurrency"] == 1 and roof and v:
                frac = roof[1] / v
            R.add(f"{base}_{k}_ms", None if v is None else 1e3 * v, "ms", frac, s, why)
        sv_ = c.get("server") or {}
        R.add(base + "_step_ms", sv_.get("ms_per_step"), "ms/step", None,
              s + "; the server's engine step (sampler_step_seconds_total / steps)",
              "the server's step counters did not move")
        R.add(base + "_forward_ms", sv_.get("forward_ms_per_step"), "ms/step", None,
              s + "; the backend's forward per step (the model step inside the server)",
              "the server's step counters did not move")
        hs = sv_.get("host_share")
        R.add(base + "_host_share", hs, "fraction", None,
              s + "; 1 - (forward + device_sample) / (step + control), /metrics sampler_step_*_seconds_total",
              "the server's step counters did not move")
        db = sv_.get("device_busy_share")
        no_db = "the server did not measure its device's time (sampler_device_step_seconds_total: the CPU)"
        R.add(base + "_device_busy_share", db, "fraction", None,
              s + "; the device's time on its steps (CUDA events, first op to sampled results) / the window", no_db)
        if f"{c['prompt']}x{c['output']}" == first_shape and c["concurrency"] == big and not c["rl"]:
            R.add(f"served_{prec}_c{big}_host_share", hs, "fraction", None, s + f"; of {c['name']}",
                  "the server's step counters did not move")
            R.add(f"served_{prec}_c{big}_device_busy_share", db, "fraction", None, s + f"; of {c['name']}", no_db)
    for nr in sv.get("not_run", []):
        R.add(f"served_{prec}_{nr['name']}_tok_s", None, "tok/s", None, src, nr["reason"])
    if sv.get("error") and not sv.get("configs"):
        R.add(f"served_{prec}_c256_1000x1000_tok_s", None, "tok/s", None, src, "served bench failed: " + sv["error"])


def build(gc, served, gpu, commit, date):
    R = Rows()
    bw = None
    if gc:
        gpu_check_rows(R, gc)
        bw = gc.get("copy_gbs") if gc.get("bench_ran") else None
        gpu = gpu or gc.get("gpu")
    for sv in served:
        served_rows(R, sv, bw)
        gpu = gpu or sv.get("gpu")
    died = died_steps(gc)
    for name, reason in REQUIRED.items():
        if died and not name.startswith("served_"):
            reason = f"not measured: gpu_check died in {', '.join(died)} (gpu_check.log); else: {reason}"
        unit = ("tok/s" if name.endswith("_tok_s") else "fraction" if name.endswith(("_fraction", "_share"))
                else "nats" if name.startswith("kl_") else "")
        R.add(name, None, unit, None, reason=reason)
    return {"gpu": gpu or "unknown", "commit": commit, "date": date, "rows": list(R.rows.values())}


def check(doc):
    """Problems with doc's schema, as a list of strings (empty: fine)."""
    bad = []
    if not isinstance(doc, dict) or set(doc) != {"gpu", "commit", "date", "rows"}:
        return [f"top level must be exactly gpu, commit, date, rows: {sorted(doc) if isinstance(doc, dict) else doc}"]
    for k in ("gpu", "commit", "date"):
        if not isinstance(doc[k], str) or not doc[k]:
            bad.append(f"{k} must be a non-empty string")
    seen = set()
    for r in doc["rows"] if isinstance(doc["rows"], list) else []:
        n = r.get("name")
        if not isinstance(n, str) or not NAME_RE.match(n):
            bad.append(f"bad row name {n!r}")
            continue
        if n in seen:
            bad.append(f"duplicate row {n}")
        seen.add(n)
        if not {"name", "value", "unit", "fraction_of_roofline"} <= set(r):
            bad.append(f"{n}: missing keys {sorted({'name', 'value', 'unit', 'fraction_of_roofline'} - set(r))}")
            continue
        for k in ("value", "fraction_of_roofline"):
            v = r[k]
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
                bad.append(f"{n}: {k} must be a finite number or null, not {v!r}")
        if not isinstance(r["unit"], str):
            bad.append(f"{n}: unit must be a string")
        if r["value"] is None and not (isinstance(r.get("reason"), str) and r["reason"]):
            bad.append(f"{n}: null value without a reason")
    if not isinstance(doc["rows"], list):
        bad.append("rows must be a list")
    for n in REQUIRED:
        if n not in seen:
            bad.append(f"required row {n} missing")
    return bad


def merge_tries(docs):
    """One gpu_check summary from the JSON of each try of a resumed run, in order (None: a try that
    wrote none)."""
    docs = [d for d in docs if d]
    if not docs:
        return None
    out = {k: docs[0].get(k) for k in ("gpu", "sm", "sms", "mem_gib")}
    parts = {}
    for d in docs:
        for p, c in d.get("parts", {}).items():
            q = parts.setdefault(p, {"passed": 0, "failed": 0})
            q["passed"] += c["passed"]
            q["failed"] += c["failed"]
    out["parts"] = parts
    ran = [d for d in docs if d.get("bench_ran")]
    out["bench_ran"] = bool(ran)
    out["copy_gbs"] = ran[0]["copy_gbs"] if ran else 0
    out["gemm_tflops"] = ran[0]["gemm_tflops"] if ran else 0
    for k in ("rows", "gemv", "ops", "named_rows"):
        out[k] = [r for d in docs for r in d.get(k, [])]
    done, skipped, died = [], [], []
    for d in docs:
        sec = d.get("sections", {})
        done += [n for n in sec.get("done", []) if n not in done]
        skipped += [n for n in sec.get("skipped", []) if n not in skipped]
        if not sec.get("complete"):
            died.append(sec.get("running") or "(between steps)")
    out["sections"] = {"done": done, "skipped": [n for n in skipped if n not in done and n not in died],
                       "died": died, "complete": bool(docs[-1].get("sections", {}).get("complete"))}
    out["tries"] = len(docs)
    return out


def resume_args(docs):
    """(status, args, message) for the next try of gpu_check after these tries' JSON (None: a try
    that wrote none). status 0: run again with args; 1: the last try completed; 2: cannot go on."""
    if not docs or docs[-1] is None:
        return 2, [], "the last try wrote no JSON (it died before its first step)"
    last = docs[-1].get("sections")
    if last is None:
        return 2, [], "the JSON has no sections (a gpu_check older than check_sections.h)"
    if last.get("complete"):
        return 1, [], "complete"
    if not last.get("running"):
        return 2, [], "the last try died between steps"
    # every earlier try died in a step too (else the resume had stopped there): merge's lists are the runs'
    sec = merge_tries(docs)["sections"]
    done, died, ops_from = sec["done"], sec["died"], 0
    skip = [n for n in done if n != "roofline" or "roofline" in died]
    for step in died:
        m = re.match(r"^ops@(\d+)$", step)
        if m:
            ops_from = max(ops_from, int(m.group(1)) + 1)
        elif step not in skip:
            skip.append(step)
    args = (["--skip-sections", ",".join(skip)] if skip else []) + (["--ops-from", str(ops_from)]
                                                                     if ops_from and "ops" not in skip else [])
    return 0, args, f"gpu_check died in {last['running']} (try {len(docs)}); the next try: {' '.join(args)}"


def fmt_value(r):
    v, u = r["value"], r["unit"]
    if v is None:
        return "-"
    if u == "fraction":
        return f"{100 * v:.1f}%"
    if isinstance(v, int) or u == "checks":
        return f"{int(v):,}"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}"


def brief_row(name):
    """The rows the brief table keeps: the issues' rows, gpu_check's counts, throughput, fractions and
    host shares."""
    return name in REQUIRED or name.startswith("gpu_check_") or \
        name.endswith(("_tok_s", "_fraction", "_host_share", "_device_busy_share", "_itl_p50_ms")) and \
        not name.endswith("_steady_tok_s") and not re.match(r"^decode_.*_ctx512_", name)


def render(doc, brief=False):
    out = [f"GPU: {doc['gpu']}, commit {doc['commit']}, {doc['date']} (bench/gpu_json.py render"
           f"{' --brief' if brief else ''})", "",
           "| row | value | unit | fraction of roofline | note |", "|---|---:|---|---:|---|"]
    for r in doc["rows"]:
        if brief and not brief_row(r["name"]):
            continue
        f = r["fraction_of_roofline"]
        note = r.get("reason", "") if r["value"] is None else r.get("note", "")
        out.append(f"| `{r['name']}` | {fmt_value(r)} | {r['unit']} | {'-' if f is None else f'{100 * f:.1f}%'} | "
                   f"{note.replace('|', '/')} |")
    return "\n".join(out) + "\n"


def git_commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("--gpu-check", help="gpu_check --json output")
    w.add_argument("--served", action="append", default=[], help="bench/gpu_served.py --json output (repeatable)")
    w.add_argument("--gpu", default="")
    w.add_argument("--commit", default="")
    w.add_argument("--date", default="")
    w.add_argument("--out", required=True, help="a folder (file named after the GPU) or a .json path")
    rp = sub.add_parser("render")
    rp.add_argument("file")
    rp.add_argument("--brief", action="store_true", help="only the issues' rows, throughput, fractions, host shares")
    sub.add_parser("check").add_argument("file")
    rs = sub.add_parser("resume")
    rs.add_argument("tries", nargs="+", help="gpu_check --json of each try so far, in order")
    mg = sub.add_parser("merge")
    mg.add_argument("tries", nargs="+")
    mg.add_argument("--out", required=True)
    a = ap.parse_args()
    if a.cmd in ("resume", "merge"):
        docs = []
        for p in a.tries:
            try:
                with open(p) as f:
                    docs.append(json.load(f))
            except (OSError, ValueError):
                docs.append(None)
        if a.cmd == "resume":
            st, args, msg = resume_args(docs)
            print(msg, file=sys.stderr)
            print(" ".join(args))
            return st
        doc = merge_tries(docs)
        if doc is None:
            print("gpu_json merge: no try wrote a JSON", file=sys.stderr)
            return 1
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
        return 0
    if a.cmd == "write":
        def load(p):
            try:
                with open(p) as f:
                    return json.load(f)
            except (OSError, ValueError) as e:
                print(f"gpu_json: {p}: {e}; its rows are written as not measured", file=sys.stderr)
                return None
        gc = load(a.gpu_check) if a.gpu_check else None
        served = [d for d in (load(p) for p in a.served) if d]
        doc = build(gc, served, a.gpu, a.commit or git_commit(),
                    a.date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
        bad = check(doc)
        if bad:
            print("gpu_json: " + "; ".join(bad), file=sys.stderr)
            return 1
        path = a.out if a.out.endswith(".json") else os.path.join(a.out, gpu_slug(doc["gpu"]) + ".json")
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
        print(path)
        return 0
    with open(a.file) as f:
        doc = json.load(f)
    if a.cmd == "render":
        sys.stdout.write(render(doc, a.brief))
        return 0
    bad = check(doc)
    for b in bad:
        print("gpu_json check:", b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
