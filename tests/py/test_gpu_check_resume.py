"""tests/gpu/check.sh getting through a GPU check that dies part-way, on the CPU.

gpu_check runs in sections (tests/gpu/check_sections.h) and rewrites its JSON before and after
every step; check.sh resumes a try that died in a fresh process after the step that died
(bench/gpu_json.py resume) and merges the tries (gpu_json.py merge). Here gpu_check-sm90 is
tests/gpu/fake_gpu_check.c: the same walker, watchdog, context check, command line and JSON over a
small table, with deaths planted through FAKE_DIE (crash = SIGABRT, exit = exit(1), hang = the
watchdog's stop, broken = a broken device context after the step, fail = a failed check). Its
numbers are made up; what is checked is which steps ran, which rows survived and what the
bench/gpu/<gpu>.json rows say about the deaths."""
import json
import os
import subprocess
import sys

import pytest

from conftest import BUILD, ROOT

sys.path.insert(0, os.path.join(ROOT, "bench"))
import gpu_json  # noqa: E402

FAKE = os.path.join(BUILD, "fake_gpu_check")
CHECK = os.path.join(ROOT, "tests", "gpu", "check.sh")


def run_check(tmp_path, die="", env_extra=None, args=()):
    pre = tmp_path / "prebuilt"
    pre.mkdir()
    assert os.path.exists(FAKE), f"{FAKE} missing: the build makes it (CMakeLists.txt, fake_gpu_check)"
    for name in ("gpu_check-sm90", "sampler-sm90"):  # sampler-sm90 only has to exist: parts 0 and 4 are skipped
        os.symlink(FAKE, pre / name)
    out, js = tmp_path / "out", tmp_path / "json"
    env = dict(os.environ, SM="90", SAMPLER_GPU_PREBUILT=str(pre), OUT=str(out), GPU_JSON_OUT=str(js),
               FAKE_LIMIT_S="2", FAKE_DIE=die, SAMPLER_COMMIT="test")
    env.update(env_extra or {})
    r = subprocess.run(["bash", CHECK, "--skip-smoke", "--skip-served", *args], capture_output=True, text=True,
                       timeout=120, cwd=ROOT, env=env)
    gc = json.loads((out / "gpu_check.json").read_text())
    doc = json.loads((js / "sm-90.json").read_text())
    assert gpu_json.check(doc) == [], gpu_json.check(doc)
    assert sorted(os.listdir(out)) == ["gpu_check.json", "gpu_check.log", "gpu_table.md", "sm-90.json"], \
        os.listdir(out)  # the tries' JSON are merged away: $OUT brings back 8 files at most
    rows = {x["name"]: x for x in doc["rows"]}
    return r, gc, rows


def test_clean_run_is_one_try(tmp_path):
    r, gc, rows = run_check(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert gc["tries"] == 1 and gc["sections"]["died"] == [] and gc["sections"]["complete"]
    assert gc["sections"]["done"] == ["ops", "sampling", "models_bf16", "roofline", "decode", "prefill", "moe"]
    assert gc["parts"]["ops"] == {"passed": 7, "failed": 0}  # 6 rows + the sampling section
    assert rows["gpu_check_sections_died"]["value"] == 0
    assert rows["decode_bf16_b1_tok_s"]["value"] == 10 and rows["decode_moe30b_b1_fraction"]["value"] == 0.125
    assert rows["prefill_bf16_4x1024_fraction"]["value"] == 0.25


def test_each_kind_of_death_costs_only_its_step(tmp_path):
    r, gc, rows = run_check(tmp_path, "ops@2:crash,sampling:broken,decode:hang,moe:exit")
    assert r.returncode == 1, r.stdout + r.stderr
    log = (tmp_path / "out" / "gpu_check.log").read_text()
    assert "decode ran past its limit of 2 s" in log and "device context is broken after sampling" in log
    assert gc["tries"] == 5 and gc["sections"]["complete"]
    assert gc["sections"]["died"] == ["ops@2", "sampling", "decode", "moe"]
    # ops rows 0, 1 (try 1) and 3..5 (try 2, --ops-from 3); row 2 died; sampling counted before its death
    assert gc["parts"]["ops"]["passed"] == 5
    assert "models_bf16" in gc["sections"]["done"] and "prefill" in gc["sections"]["done"]
    assert rows["prefill_bf16_4x1024_tok_s"]["value"] == 1000  # measured after two deaths
    assert rows["roofline_copy_gbs"]["value"] == 1000
    assert rows["decode_bf16_b1_tok_s"]["value"] is None and "died in ops@2, sampling, decode, moe" in \
        rows["decode_bf16_b1_tok_s"]["reason"]
    assert rows["decode_moe30b_b1_fraction"]["value"] is None
    died = rows["gpu_check_sections_died"]
    assert died["value"] == 4 and died["note"] == "died in ops@2, sampling, decode, moe"
    table = (tmp_path / "out" / "gpu_table.md").read_text()
    assert "| `gpu_check_sections_died` | 4 | steps | - | died in ops@2, sampling, decode, moe |" in table


def test_a_dead_roofline_is_not_run_again(tmp_path):
    r, gc, rows = run_check(tmp_path, "roofline:crash")
    assert r.returncode == 1
    assert gc["tries"] == 2 and gc["sections"]["died"] == ["roofline"]
    assert "--skip-sections ops,sampling,models_bf16,roofline" in (tmp_path / "out" / "gpu_check.log").read_text()
    assert "roofline_copy_gbs" not in rows
    assert rows["decode_bf16_b1_tok_s"]["value"] is None  # no roofline: the bench sections measure nothing


def test_tries_are_capped(tmp_path):
    r, gc, rows = run_check(tmp_path, "ops@0:crash,ops@1:crash,ops@2:crash", {"GPU_CHECK_TRIES": "2"})
    assert r.returncode == 1
    assert "not resumed: 2 tries" in r.stdout
    assert gc["tries"] == 2 and gc["sections"]["died"] == ["ops@0", "ops@1"] and not gc["sections"]["complete"]
    assert rows["gpu_check_sections_died"]["value"] == 2


def test_a_failed_check_is_not_a_death(tmp_path):
    r, gc, rows = run_check(tmp_path, "ops@4:fail")
    assert r.returncode == 1
    assert gc["tries"] == 1 and gc["sections"]["died"] == []
    assert gc["parts"]["ops"] == {"passed": 6, "failed": 1}
    assert rows["gpu_check_ops_failed"]["value"] == 1 and rows["gpu_check_sections_died"]["value"] == 0


def test_skip_bench_is_kept_across_tries(tmp_path):
    r, gc, rows = run_check(tmp_path, "models_bf16:crash", args=("--skip-bench",))
    assert r.returncode == 1
    assert gc["sections"]["died"] == ["models_bf16"]
    assert gc["sections"]["skipped"] == ["roofline", "decode", "prefill", "moe"]
    assert not gc["bench_ran"] and rows["decode_bf16_b1_tok_s"]["value"] is None


def test_a_second_run_completes_the_first(tmp_path):
    """A second device call (--skip-gpu-check, as for the served fp8 run the first had no time for)
    takes the first call's gpu_check.json through PREVIOUS_RESULTS, so its <gpu>.json has every row;
    without it those rows are null, and a PREVIOUS_RESULTS that is not a folder fails the run."""
    (tmp_path / "first").mkdir()
    r1, _, rows1 = run_check(tmp_path / "first")
    assert r1.returncode == 0 and rows1["decode_bf16_b1_tok_s"]["value"] == 10
    first_out = tmp_path / "first" / "out"
    pre = tmp_path / "first" / "prebuilt"

    def second(name, previous, args=("--skip-served",)):
        out, js = tmp_path / name / "out", tmp_path / name / "json"
        env = dict(os.environ, SM="90", SAMPLER_GPU_PREBUILT=str(pre), OUT=str(out), GPU_JSON_OUT=str(js),
                   SAMPLER_COMMIT="test", FAKE_DIE="ops@1:crash")  # a gpu_check run would show the death
        if previous is not None:
            env["PREVIOUS_RESULTS"] = str(previous)
        r = subprocess.run(["bash", CHECK, "--skip-smoke", "--skip-gpu-check", *args], capture_output=True,
                           text=True, timeout=120, cwd=ROOT, env=env)
        doc = json.loads((js / "sm-90.json").read_text())
        assert gpu_json.check(doc) == [], gpu_json.check(doc)
        assert "gpu_check.json" not in os.listdir(out) and "gpu_check skipped" in r.stdout
        return r, {x["name"]: x for x in doc["rows"]}

    r, rows = second("alone", None)
    assert r.returncode == 0 and rows["decode_bf16_b1_tok_s"]["value"] is None
    r, rows = second("with", first_out)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "takes gpu_check.json from" in r.stdout
    assert rows["decode_bf16_b1_tok_s"]["value"] == 10 and rows["gpu_check_sections_died"]["value"] == 0
    assert rows["prefill_bf16_4x1024_fraction"]["value"] == 0.25
    r, _ = second("missing", tmp_path / "nowhere")
    assert r.returncode == 1 and "is not a folder" in r.stdout
    # part 4 without its bf16 configurations and nothing else asked for: it starts no server
    r, rows = second("nobf16", first_out, ("--skip-served-bf16",))
    assert r.returncode == 0 and "bf16 served configurations skipped" in r.stdout, r.stdout + r.stderr
    assert not [f for f in os.listdir(tmp_path / "nobf16" / "out") if f.startswith("served_")]
    assert rows["served_bf16_c256_1000x1000_tok_s"]["value"] is None


@pytest.mark.parametrize("docs,status", [
    ([], 2),
    ([None], 2),
    ([{"sections": {"done": ["ops"], "running": None, "complete": False}}], 2),
    ([{"sections": {"done": ["ops"], "running": None, "complete": True}}], 1),
])
def test_resume_stops_where_it_cannot_go_on(docs, status):
    assert gpu_json.resume_args(docs)[0] == status


def test_resume_arguments():
    t1 = {"sections": {"done": ["ops", "roofline", "gemv"], "running": "attn_decode", "complete": False}}
    st, args, _ = gpu_json.resume_args([t1])
    assert st == 0 and args == ["--skip-sections", "ops,gemv,attn_decode"]  # roofline again: part 3 needs it
    t2 = {"sections": {"done": ["roofline"], "running": "ops@7", "complete": False}}
    st, args, _ = gpu_json.resume_args([t2])
    assert st == 0 and args == ["--ops-from", "8"]
    t3 = {"sections": {"done": [], "running": "roofline", "complete": False}}
    assert gpu_json.resume_args([t1, t3])[1] == ["--skip-sections", "ops,roofline,gemv,attn_decode"]
