"""The package works installed from a wheel, far from the checkout.

One test builds the wheel from a clean copy of the sources (a stale ``build/`` in the
checkout could slip files into it), installs it into a fresh venv in a temporary folder
(dependencies from pip's cache or index, by this interpreter's pip), and then, with the working directory outside
the checkout: ``streamtap addon`` names the script inside the venv, mitmdump and mitmweb
list the streamtap_ options from it (and from mitm/tap.py loaded directly), a real
mitmdump from the venv records a streamed answer, and ``streamtap demo`` passes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import provider_streams as streams
from streamtap.recording import check_recording
from upstream import CHAT, REPO, Mitmdump, Script, Upstream, curl, find_recording

STREAMTAP_OPTIONS = {"streamtap_dir", "streamtap_filter", "streamtap_fsync", "streamtap_replay", "streamtap_fault"}
LEFT_OUT = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis", "live", "*.so")


# PYTHONDONTWRITEBYTECODE goes too: the venv is installed without compiling (pip's compile of every
# module of every dependency took ~15 s), so the first run caches the bytecode of what it imports.
LEFT_OUT_ENV = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONDONTWRITEBYTECODE")


def _run(argv: list, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in LEFT_OUT_ENV}
    return subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, f"{result.args} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A fresh venv outside the checkout with only the built wheel (and its dependencies) installed."""
    base = tmp_path_factory.mktemp("installed")
    source = base / "source"
    shutil.copytree(REPO, source, ignore=LEFT_OUT)
    wheels = base / "wheels"
    _ok(_run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", wheels, source], base))
    (wheel,) = wheels.glob("streamtap-*.whl")
    with zipfile.ZipFile(wheel) as contents:  # the C source is compiled into it, not shipped in it
        assert not [name for name in contents.namelist() if name.endswith(".c")], contents.namelist()
        # the licence its metadata names travels with it, and every module it imports is declared
        assert [name for name in contents.namelist() if name.endswith(".dist-info/licenses/LICENSE")], contents.namelist()
        metadata = contents.read(next(name for name in contents.namelist() if name.endswith(".dist-info/METADATA"))).decode()
        assert "Requires-Dist: brotli" in metadata, metadata
    env_dir = base / "venv"
    # pip installs from outside the venv (--python): the venv needs no pip of its own, which saves
    # unpacking one into it
    _ok(_run([sys.executable, "-m", "venv", "--without-pip", env_dir], base))
    install = [sys.executable, "-m", "pip", "--python", env_dir / "bin" / "python", "install", "-q", "--no-compile", wheel]
    _ok(_run(install, base, timeout=300))
    shutil.rmtree(source)  # nothing may lean on the sources once installed
    return env_dir


@pytest.mark.slow
def test_installed_wheel_runs_the_addon_and_the_demo(venv, tmp_path):
    bin_dir = venv / "bin"
    outside = tmp_path / "elsewhere"
    outside.mkdir()

    script = Path(_ok(_run([bin_dir / "streamtap", "addon"], outside)).strip())
    assert script.is_absolute() and script.is_file(), script
    assert script.is_relative_to(venv) and not script.is_relative_to(REPO), script

    # mitmproxy puts a script's folder on sys.path for good: the script's holds no module to shadow a user's
    assert [p.name for p in script.parent.iterdir() if p.name != "__pycache__"] == [script.name], list(script.parent.iterdir())
    for tool, path in (("mitmdump", script), ("mitmweb", script), ("mitmdump", script.parent.parent / "tap.py")):
        listed = _ok(_run([bin_dir / tool, "-s", path, "--options"], outside, timeout=60))
        names = {line.split(":")[0] for line in listed.splitlines() if line.startswith("streamtap_")}
        assert STREAMTAP_OPTIONS <= names, (tool, path, sorted(names))

    # the wheel carries the compiled loops of the decoders and of the recording writer, built from the C sources
    for module in ("streamtap.wire._accel", "streamtap.recording._lines"):
        where = _ok(_run([bin_dir / "python", "-c", f"import {module} as m; print(m.__file__)"], outside))
        assert Path(where.strip()).is_relative_to(venv), (module, where)

    with Upstream() as upstream:
        proxy = Mitmdump(upstream.url, tmp_path / "proxy", script=script)
        proxy.args[0] = str(bin_dir / "mitmdump")
        with proxy:
            body = streams.openai_chat(["Paris ", "is ", "sunny."])
            upstream.add("installed", Script(body, chunk_size=30))
            out = curl(f"{proxy.url}/s/installed{CHAT}")
            assert out.returncode == 0 and out.stdout == body, out.stderr
            recording = find_recording(proxy.record_dir, "installed")
    assert recording.verdict["kind"] == "complete", recording.verdict
    assert recording.body == body and check_recording(recording) == []

    demo = _run([bin_dir / "streamtap", "demo", "--dir", tmp_path / "demo"], outside)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "demo: OK" in demo.stdout
    assert len(list((tmp_path / "demo").glob("*.jsonl"))) == 4


def _wheel_names(source: Path, out: Path) -> set[str]:
    _ok(_run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", out, source], source))
    (wheel,) = out.glob("streamtap-*.whl")
    with zipfile.ZipFile(wheel) as contents:
        return set(contents.namelist())


def test_a_module_deleted_since_an_earlier_build_is_not_in_the_next_wheel(tmp_path):
    """The README's `pip wheel /path/to/streamtap`, run twice in one checkout: setuptools reuses
    its `build/`, which must not keep what the sources no longer have."""
    source = tmp_path / "source"
    shutil.copytree(REPO, source, ignore=LEFT_OUT)
    old = source / "addon" / "streamtap" / "old_module.py"
    old.write_text("GONE = False\n")
    assert "streamtap/old_module.py" in _wheel_names(source, tmp_path / "first")
    old.unlink()
    names = _wheel_names(source, tmp_path / "second")
    assert "streamtap/old_module.py" not in names
    assert "streamtap/wire/accel.py" in names  # the rest is still there


def test_the_sdist_leaves_out_the_taps_own_recordings(tmp_path):
    """`recordings/live/` is where the tap writes by default: captured prompts and answers, never packed."""
    source = tmp_path / "source"
    shutil.copytree(REPO, source, ignore=LEFT_OUT)
    live = source / "recordings" / "live"
    live.mkdir()
    (live / "20260101T000000.000Z_openai-chat_complete_0123456789ab.jsonl").write_text('{"type":"header"}\n')
    backend = tmp_path / "backend"  # the build backend pyproject.toml names, as a build frontend installs it
    _ok(_run([sys.executable, "-m", "pip", "install", "-q", "--target", backend, "setuptools>=77"], tmp_path, timeout=300))
    build = "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))"
    env = {k: v for k, v in os.environ.items() if k not in LEFT_OUT_ENV}
    made = subprocess.run([sys.executable, "-c", build, tmp_path / "sdist"], cwd=source, capture_output=True, text=True,
                          timeout=120, env={**env, "PYTHONPATH": str(backend)})
    _ok(made)
    with tarfile.open(tmp_path / "sdist" / made.stdout.strip().splitlines()[-1]) as sdist:
        recordings = sorted(name.split("/", 1)[1] for name in sdist.getnames() if "/recordings/" in name)
    assert recordings and not [name for name in recordings if "live" in name], recordings
    assert sorted(p.relative_to(REPO).as_posix() for p in (REPO / "recordings").glob("*.jsonl")) == recordings


@pytest.mark.parametrize("how, loops, lines", [
    ("", "compiled C", "compiled C"),
    ("import os; os.environ['STREAMTAP_PURE_PYTHON'] = '1'; ", "Python, STREAMTAP_PURE_PYTHON is set", "Python, STREAMTAP_PURE_PYTHON is set"),
    ("import sys; sys.modules['streamtap.wire._accel'] = None; ", "Python, the C build is missing", "compiled C"),
    ("import sys; sys.modules['streamtap.recording._lines'] = None; ", "compiled C", "Python, the C build is missing"),
])
def test_version_says_which_decoder_loops_run(how, loops, lines):
    """pip says nothing of a failed C build but with -v: `streamtap --version` says it instead."""
    script = how + "import sys; from streamtap.cli import main; sys.argv = ['streamtap', '--version']; main()"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    from streamtap import __version__
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"streamtap {__version__} (decoder loops: {loops}; frame lines: {lines})"
