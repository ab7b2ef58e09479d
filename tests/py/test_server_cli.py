"""--help documents every flag sampler-cpu accepts, and accepts every flag it
documents; bad flag values are start-up errors that say what to fix."""
import os
import re
import subprocess

from conftest import BUILD, ROOT


def test_help_lists_every_flag(sampler_bin):
    src = open(os.path.join(ROOT, "server/flags.c")).read()
    handled = set(re.findall(r'\.name = "(--[a-z0-9-]+)"', src))
    out = subprocess.run([sampler_bin, "--help"], capture_output=True, text=True, timeout=60).stdout
    documented = set(re.findall(r"^\s+(?:-h, )?(--[a-z0-9-]+)", out, re.M))
    assert handled and handled == documented, (handled ^ documented)


def test_bad_flags_are_clear_errors(sampler_bin):
    for args, words in ((["--port", "70000"], "--port"), (["--logprobs-mode", "odd"], "--logprobs-mode"),
                        (["--bogus", "1"], "--bogus"), (["--precision", "int4"], "--precision"),
                        (["--weight-version", "3"], "--model-fingerprint")):
        r = subprocess.run([sampler_bin] + args, capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and words in r.stderr, (args, r.stderr)


def test_port_in_use_is_a_clear_error():
    """A second sampler on a taken port fails at start-up instead of sharing it."""
    from server_fixture import Server
    s = Server()
    try:
        r = subprocess.run([os.environ.get("SAMPLER_BIN", os.path.join(BUILD, "sampler-cpu")), "--port",
                            str(s.port), "--kv-mem-mb", "64"], capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "port" in r.stderr, r.stderr
    finally:
        s.stop()
