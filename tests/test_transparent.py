"""Transparent interception: an app that knows nothing of proxies is tapped anyway.

Three hosts in network namespaces, addresses from the documentation ranges only:

    client 192.0.2.2  --veth--  192.0.2.1 gateway 198.51.100.1  --veth--  198.51.100.2 provider
                                (iptables REDIRECT :443 -> :8080,
                                 mitmdump --mode transparent -s addon/tap.py)

The client calls ``https://198.51.100.2/...`` by address with no proxy settings; it
trusts mitmproxy's CA (certs_howto.md, section 2). The redirect sends its HTTPS to
mitmdump, which reads the original destination back (SO_ORIGINAL_DST; it only can in the
namespace where the REDIRECT happened) and connects on to the provider, whose own CA it
is told to trust.

Each variant runs a block of certs_howto.md section 3 as written, with the gateway's
interface for ``eth1``: ``gateway-iptables`` and ``gateway-nft`` on the gateway, and
``same-host`` on the client itself (mitmdump and the OUTPUT rules in the client's
namespace, the existing group ``nogroup`` for ``mitmproxy``, so no group is added).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest


from interception import (
    APP_PY,
    howto_commands,
    MITMDUMP,
    PYTHON,
    REPO,
    TAP,
    Mitmdump,
    issue_cert,
    make_ca,
    needs_curl,
    openai_chat_stream,
)

pytestmark = [pytest.mark.netns, pytest.mark.slow]

CLIENT, GATEWAY_IN, GATEWAY_OUT, PROVIDER = "192.0.2.2", "192.0.2.1", "198.51.100.1", "198.51.100.2"
WORDS = ["Nobody ", "told ", "me ", "about ", "a ", "proxy", "."]
BODY = openai_chat_stream(WORDS, model="gpt-transparent-1")


def sh(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30)


def must(*cmd: str) -> None:
    result = sh(*cmd)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {result.stderr.strip()}")


class Hosts:
    """client / gateway / provider namespaces joined by two veth pairs; removed by close()."""

    def __init__(self, variant: int) -> None:
        tag = f"{os.getpid() % 100000}{variant}"
        self.client, self.gateway, self.provider = f"stc{tag}", f"stg{tag}", f"stp{tag}"
        self.names: list[str] = []
        self.processes: list[subprocess.Popen] = []

    def build(self) -> None:
        c, g, p = self.client, self.gateway, self.provider
        for ns in (c, g, p):
            must("ip", "netns", "add", ns)
            self.names.append(ns)
            must("ip", "-n", ns, "link", "set", "lo", "up")
        must("ip", "link", "add", "c0", "netns", c, "type", "veth", "peer", "name", "g0", "netns", g)
        must("ip", "link", "add", "p0", "netns", p, "type", "veth", "peer", "name", "g1", "netns", g)
        for ns, dev, addr in ((c, "c0", CLIENT), (g, "g0", GATEWAY_IN), (g, "g1", GATEWAY_OUT), (p, "p0", PROVIDER)):
            must("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            must("ip", "-n", ns, "link", "set", dev, "up")
        must("ip", "-n", c, "route", "add", "default", "via", GATEWAY_IN)
        must("ip", "-n", p, "route", "add", "default", "via", GATEWAY_OUT)
        must("ip", "netns", "exec", g, "sysctl", "-qw", "net.ipv4.ip_forward=1")

    def run_commands(self, ns: str, commands: list[str]) -> None:
        """Shell commands from the doc, in ``ns``; sudo is a no-op (the test runs as root)."""
        script = 'sudo() { "$@"; }\n' + "\n".join(commands)
        result = subprocess.run(
            self.exec_argv(ns, "bash", "-euo", "pipefail", "-c", script), capture_output=True, text=True, timeout=30
        )
        if result.returncode != 0:
            raise RuntimeError(f"{script}\n{result.stderr.strip()}")

    def exec_argv(self, ns: str, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", ns, *argv]

    def start(self, ns: str, *argv: str, ready: str) -> subprocess.Popen:
        proc = subprocess.Popen(
            self.exec_argv(ns, *argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO
        )
        self.processes.append(proc)
        assert proc.stdout is not None
        seen = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            if ready in line:
                return proc
        raise RuntimeError(f"{' '.join(argv)} did not become ready:\n{''.join(seen)}")

    def close(self) -> None:
        for proc in self.processes:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for ns in reversed(self.names):
            sh("ip", "netns", "del", ns)  # takes its veth ends along


def namespaces_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "iptables"):
        if not shutil.which(tool):
            return f"{tool} is not installed (scripts/system-deps.sh installs it as root)"
    probe = f"stprobe{os.getpid() % 100000}"
    result = sh("ip", "netns", "add", probe)
    if result.returncode != 0:
        return f"`ip netns add` is not permitted here: {result.stderr.strip()}"
    sh("ip", "netns", "del", probe)
    return None


VARIANTS = ["gateway-iptables", "gateway-nft", "same-host"]


def doc_recipe(variant: str) -> tuple[list[str], list[str], list[str]]:
    """(shell commands, mitmdump arguments, wrapper before mitmdump) of the doc block."""
    commands, mitmdump, wrapper = [], [], []
    for command in howto_commands(variant):
        command = command.replace("eth1", "g0").replace("--gid-owner mitmproxy", "--gid-owner nogroup")
        if "groupadd" in command:
            continue  # nogroup exists already
        words = shlex.split(command)
        if "mitmdump" in words:
            at = words.index("mitmdump")
            mitmdump = words[at + 1 :]
            if words[:at] == ["sudo", "-g", "mitmproxy"]:
                # `sudo -g GROUP` for root, without sudo: same uid, that group only
                wrapper = ["setpriv", "--regid", "nogroup", "--clear-groups"]
            else:
                assert not words[:at], f"unexpected wrapper {words[:at]} in {variant!r}"
            continue
        commands.append(command)
    assert mitmdump[:2] == ["-s", "addon/tap.py"], mitmdump
    return commands, mitmdump[2:], wrapper


@pytest.fixture(scope="module", params=VARIANTS)
def network(request, tmp_path_factory):
    if reason := namespaces_unavailable():
        pytest.skip(reason)
    variant = request.param
    if "nft" in variant and not shutil.which("nft"):
        pytest.skip("nft is not installed")
    root = tmp_path_factory.mktemp(variant)
    hosts = Hosts(VARIANTS.index(variant))
    try:
        try:
            hosts.build()
        except RuntimeError as exc:
            pytest.skip(f"cannot build namespaced hosts here: {exc}")
        commands, mitmdump_args, wrapper = doc_recipe(variant)
        tapping = hosts.client if variant == "same-host" else hosts.gateway
        hosts.run_commands(tapping, commands)
        provider_ca = make_ca(root, "fake-provider")
        cert = issue_cert(provider_ca, [PROVIDER], root)
        body_file = root / "body.sse"
        body_file.write_bytes(BODY)
        hosts.start(
            hosts.provider, str(PYTHON), str(REPO / "tests" / "interception.py"), "serve",
            "--host", PROVIDER, "--port", "443", "--cert", str(cert), "--body", str(body_file),
            ready="serving on",
        )
        confdir = root / "mitmproxy"
        recordings = root / "recordings"
        argv = [
            "ip", "netns", "exec", tapping, *wrapper, str(MITMDUMP), "--set", f"confdir={confdir}",
            "-s", str(TAP), "--set", f"streamtap_dir={recordings}",
        ]
        proxy = Mitmdump(
            *mitmdump_args, "--listen-port", "8080",
            "--set", f"ssl_verify_upstream_trusted_ca={provider_ca[0]}",
            confdir=confdir, argv=argv,
        )
        hosts.processes.append(proxy.proc)
        yield {"hosts": hosts, "proxy": proxy, "root": root, "recordings": recordings, "provider_ca": provider_ca[0]}
    finally:
        hosts.close()


def client_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower() and not k.startswith("SSL_")}
    env.update(extra)
    return env


def curl(network, ca: Path) -> subprocess.CompletedProcess:
    hosts = network["hosts"]
    return subprocess.run(
        hosts.exec_argv(
            hosts.client, "curl", "-sS", "--no-buffer", "--max-time", "20", "--cacert", str(ca),
            f"https://{PROVIDER}/v1/chat/completions", "-H", "content-type: application/json",
            "-H", "authorization: Bearer sk-transparent-secret",
            "-d", '{"model":"gpt-transparent-1","stream":true,"messages":[{"role":"user","content":"hi"}]}',
        ),
        capture_output=True, timeout=30, env=client_env(),
    )


def recordings_of(network, body: bytes) -> list:
    from streamtap.recording import read_recording

    # The recording is finished as the flow ends, just after the client got it all. Its end line
    # is written before the .partial file is renamed, so only renamed files are read.
    deadline = time.monotonic() + 5
    while True:
        finished = sorted(p for p in network["recordings"].glob("*.jsonl") if not p.name.endswith(".partial.jsonl"))
        found = [read_recording(p) for p in finished]
        matching = [r for r in found if r.body == body and r.end is not None]
        if matching or time.monotonic() > deadline:
            return matching
        time.sleep(0.1)


@needs_curl
def test_curl_by_address_is_tapped_transparently(network):
    ca = network["proxy"].ca_cert
    result = curl(network, ca)
    assert result.returncode == 0, f"{result.stderr.decode()}\nmitmdump:\n{network['proxy'].output}"
    assert result.stdout == BODY
    # mitmdump saw the flow with its original destination (its line is logged as the flow ends,
    # which may come after curl has read the last byte)
    deadline = time.monotonic() + 10
    while not (PROVIDER in network["proxy"].output and "/v1/chat/completions" in network["proxy"].output):
        assert time.monotonic() < deadline, network["proxy"].output
        time.sleep(0.05)
    recorded = recordings_of(network, BODY)
    assert recorded, f"no complete recording of the body\n{network['proxy'].output}"
    assert recorded[0].verdict["kind"] == "complete", recorded[0].verdict
    assert "sk-transparent-secret" not in recorded[0].path.read_text()


@needs_curl
def test_the_client_really_meets_mitmproxy_not_the_provider(network):
    """Trusting only the provider's CA, the client must now fail: the certificate it is
    shown comes from mitmproxy, so the redirect is real, not a direct connection."""
    result = curl(network, network["provider_ca"])
    assert result.returncode == 60, result.stderr.decode()


def test_openai_sdk_by_address_is_tapped_transparently(network):
    hosts, root = network["hosts"], network["root"]
    app = root / "app.py"
    app.write_text(APP_PY)
    env = client_env(
        OPENAI_BASE_URL=f"https://{PROVIDER}/v1",
        OPENAI_API_KEY="sk-transparent-secret",
        SSL_CERT_FILE=str(network["proxy"].ca_cert),
    )
    result = subprocess.run(
        hosts.exec_argv(hosts.client, str(PYTHON), str(app)), capture_output=True, timeout=60, env=env
    )
    assert result.returncode == 0, f"{result.stderr.decode()}\nmitmdump:\n{network['proxy'].output}"
    assert result.stdout == BODY
    assert json.loads(result.stderr.decode().strip().splitlines()[-1])["text"] == "".join(WORDS)
    assert len(recordings_of(network, BODY)) >= 2, network["proxy"].output
