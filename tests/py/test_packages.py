"""The one package list (.ci/packages.txt) against what the build asks for: every pkg-config module
in CMakeLists.txt's pkg_check_modules calls is provided by a [build] package (dpkg -S on its .pc
file) and its shared library by a [runtime] one, and .ci/deps and every docker/Dockerfile.* install
from the list (CI has no Docker, so this is what keeps `docker build` from stopping at configure).
Nothing is skipped: CI installs these packages with .ci/deps before the tests run."""
import fnmatch
import glob
import os
import re
import subprocess

import pytest

from conftest import ROOT

LIST = os.path.join(ROOT, ".ci", "packages.txt")
HELPER = os.path.join(ROOT, ".ci", "packages")
DOCKERFILES = sorted(p for p in glob.glob(os.path.join(ROOT, "docker", "Dockerfile.*"))
                     if not p.endswith(".dockerignore"))
# pkg_check_modules(<PREFIX> [options] <module>...): the options are not modules
PKG_OPTIONS = {"REQUIRED", "QUIET", "NO_CMAKE_PATH", "NO_CMAKE_ENVIRONMENT_PATH", "IMPORTED_TARGET",
               "GLOBAL"}


def sections():
    """section name -> list of packages, parsed independently of .ci/packages."""
    out, cur = {}, None
    with open(LIST) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            m = re.fullmatch(r"\[(\w+)\]", line)
            if m:
                cur = out.setdefault(m.group(1), [])
            else:
                assert cur is not None, f"{LIST}: package {line!r} before any [section]"
                assert re.fullmatch(r"[a-z0-9][a-z0-9+.-]+", line), f"{LIST}: bad package {line!r}"
                cur.append(line)
    return out


def cmake_modules():
    """Every module named in a pkg_check_modules call of CMakeLists.txt (version specs dropped)."""
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        text = "".join(line.split("#", 1)[0] + "\n" for line in f)
    mods = []
    for args in re.findall(r"pkg_check_modules\s*\(([^)]*)\)", text):
        words = args.split()[1:]  # the first is the variable prefix
        mods += [re.split(r"[<>=]", w)[0] for w in words if w not in PKG_OPTIONS]
    return mods


def run(*cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


def owner(path):
    """The package that installed `path` (dpkg -S), architecture suffix dropped."""
    out = run("dpkg", "-S", path)
    return out.split(":", 1)[0].split(",")[0].strip()


def test_list_parses_and_helper_agrees():
    s = sections()
    for name in ("build", "test", "runtime"):
        assert s.get(name), f"{LIST}: section [{name}] missing or empty"
        assert run("sh", HELPER, name).split() == s[name]
    assert run("sh", HELPER, "build", "test").split() == s["build"] + s["test"]
    bad = subprocess.run(["sh", HELPER, "no_such_section"], capture_output=True, text=True)
    assert bad.returncode != 0 and "no_such_section" in bad.stderr


def test_cmake_modules_found():
    mods = cmake_modules()
    # the modules CMakeLists.txt named when this test was written; more may come, none may vanish unseen
    for m in ("libmicrohttpd", "jansson", "libzstd", "libxxhash", "libpcre2-8", "libutf8proc",
              "libcrypto", "libcurl"):
        assert m in mods, f"parser missed {m}: {mods}"


@pytest.mark.parametrize("module", cmake_modules())
def test_module_dev_package_on_build_list(module):
    pc = run("pkg-config", "--path", module)
    pkg = owner(pc)
    assert pkg in sections()["build"], \
        f"pkg-config module {module} ({pc}) comes from {pkg}, which [build] of {LIST} lacks"


def runtime_stem(pkg):
    """libssl3 -> libssl, libpcre2-8-0 -> libpcre2-8-, libutf8proc2 -> libutf8proc: the name without
    the soname version and the t64 suffix, which differ between Debian 12 here and Ubuntu 24.04."""
    return re.sub(r"\d+(t64)?$", "", pkg)


@pytest.mark.parametrize("module", cmake_modules())
def test_module_shared_library_on_runtime_list(module):
    dev = owner(run("pkg-config", "--path", module))
    # the -dev package's lib*.so link (a .pc's libdir can be wrong: Debian's libzstd.pc says /usr/lib)
    files = run("dpkg", "-L", dev).split("\n")
    libs = [w[2:] for w in run("pkg-config", "--libs-only-l", module).split()]
    assert libs, f"{module}: pkg-config names no library"
    runtime = sections()["runtime"]
    for lib in libs:
        links = [f for f in files if f.endswith(f"/lib{lib}.so")]
        assert links, f"{module}: {dev} installs no lib{lib}.so"
        so = os.path.realpath(links[0])
        assert os.path.exists(so), f"{module}: {links[0]} points nowhere"
        stem = runtime_stem(owner(so))
        assert any(re.fullmatch(re.escape(stem) + r"\d+(t64)?", p) for p in runtime), \
            f"{module}: lib{lib} comes from {owner(so)}; [runtime] of {LIST} has no {stem}N[t64]"


def test_ci_deps_installs_from_list():
    with open(os.path.join(ROOT, ".ci", "deps")) as f:
        text = f.read()
    assert re.search(r"apt-get install[^\n]*\$\(\"\$\(dirname \"\$0\"\)/packages\" build test\)", text)
    named = {p for s in sections().values() for p in s}
    code = "".join(line.split("#", 1)[0] for line in text.splitlines(True))
    assert not [p for p in named if re.search(rf"(?<![\w-]){re.escape(p)}(?![\w-])", code)], \
        ".ci/deps names packages itself; they belong in .ci/packages.txt"


def stages(path):
    """The Dockerfile's stages: lists of instructions (continuation lines joined), split at FROM."""
    with open(path) as f:
        text = re.sub(r"\\\n", " ", f.read())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            out.append([])
        if out:
            out[-1].append(line)
    return out


@pytest.mark.parametrize("path", DOCKERFILES, ids=os.path.basename)
def test_dockerfile_installs_from_list(path):
    assert len(DOCKERFILES) >= 4
    st = stages(path)
    assert len(st) == 2, f"{path}: expected a build and a runtime stage"
    named = {p for s in sections().values() for p in s}
    for stage, section in zip(st, ("build", "runtime")):
        copy = [i for i in stage if i.startswith("COPY ") and ".ci/packages.txt" in i]
        assert copy and ".ci/packages " in copy[0] + " ", f"{path}: stage {section} copies no list"
        installs = [i for i in stage if "apt-get install" in i]
        assert len(installs) == 1, f"{path}: stage {section}: {installs}"
        assert f"$(sh /tmp/ci/packages {section})" in installs[0], \
            f"{path}: stage {section} does not install section [{section}] of the list"
        inline = [w for w in installs[0].split() if w in named]
        assert not inline, f"{path}: stage {section} names packages itself: {inline}"
    health = [i for i in st[1] if i.startswith("HEALTHCHECK")]
    assert health and "curl" in health[0] and "curl" in sections()["runtime"]


@pytest.mark.parametrize("path", DOCKERFILES, ids=os.path.basename)
def test_dockerignore_keeps_list(path):
    ignore = path + ".dockerignore"
    with open(ignore) as f:
        pats = [l.strip() for l in f if l.strip() and not l.startswith("#")]
    for p in (".ci/packages.txt", ".ci/packages"):
        parts = p.split("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        hit = [pat for pat in pats if not pat.startswith("!")
               for pre in prefixes if fnmatch.fnmatch(pre, pat.lstrip("/"))]
        assert not hit, f"{ignore}: {hit} keeps {p} out of the build context"
