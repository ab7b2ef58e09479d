"""Load on loopback (bounded): 200 concurrent streaming completions on the
bundled model, every one checked by bench/load.py's contract (well-formed
SSE ending with [DONE], the streamed token ids add up to max_tokens, usage
right, finish_reason length); and a full waiting queue, where the requests
over --max-waiting are the documented 503 and all the others complete.
The 1,000-request run is bench/load.py (numbers in bench/RESULTS.md)."""
import os
import sys
import threading

from conftest import ROOT
from server_fixture import ADMIN, Server, metrics, wait_idle, wait_until

sys.path.insert(0, os.path.join(ROOT, "bench"))
import load  # noqa: E402  bench/load.py

AUTH = {"Authorization": "Bearer " + ADMIN}
PROMPT = [9707, 11, 1879, 0, 785, 3974, 13876, 38835]


def test_200_concurrent_streams():
    s = Server()
    try:
        m = load.run_load("127.0.0.1", s.port, 200, 4, PROMPT)
        load.report(m)
        assert m["errors"] == [], m["errors"][:5]
        assert m["accepted"] == 200 and m["rejected"] == 0
        assert m["tokens"] == 200 * 4
        after, _ = wait_idle(s)
        assert after['sampler_http_requests_total{status="200"}'] >= 200
        assert after['sampler_sequences_finished_total{finish_reason="length"}'] == 200
    finally:
        assert s.stop() == 0


def test_full_queue_rejects_with_503_and_the_rest_complete():
    """Paused engine: submissions wait, so of 120 requests exactly --max-waiting
    (50) are queued and the other 70 get 503; after resume every queued one
    completes."""
    s = Server("--max-waiting", "50")
    try:
        st, r = s.request("POST", "/pause?mode=keep", {}, headers=AUTH)
        assert st == 200 and r["is_paused"]
        out = {}
        t = threading.Thread(target=lambda: out.update(m=load.run_load("127.0.0.1", s.port, 120, 3, PROMPT)))
        t.start()
        seen = {}

        def all_answered_or_queued():
            m = seen["m"] = metrics(s)
            return m["sampler_num_requests_waiting"] == 50 and m['sampler_http_requests_total{status="503"}'] == 70
        wait_until(all_answered_or_queued, lambda: f"50 queued and 70 refused ({seen.get('m')})")
        st, r = s.request("POST", "/resume", {}, headers=AUTH)
        assert st == 200 and not r["is_paused"]
        t.join(120)
        m = out["m"]
        load.report(m)
        assert m["errors"] == [], m["errors"][:5]
        assert m["accepted"] == 50 and m["rejected"] == 70
        wait_idle(s)
    finally:
        assert s.stop() == 0


def test_client_reads_chunked_and_rejects_broken_streams():
    """The checker itself: a stream cut before [DONE] is an error, not a pass."""
    r = load.Result()
    r.status, r.tokens, r.finish, r.usage, r.done = 200, 4, "length", \
        {"prompt_tokens": 8, "completion_tokens": 4, "total_tokens": 12}, False
    assert load.check(r, 4, 8) == "error" and "[DONE]" in r.error
    r.error, r.done = None, True
    assert load.check(r, 4, 8) == "ok"
    r.tokens = 3
    assert load.check(r, 4, 8) == "error"
    bad = load.Result()
    bad.status, bad.body = 503, b"overloaded"
    assert load.check(bad, 4, 8) == "error"
