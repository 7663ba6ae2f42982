"""certs_howto.md, run: every block marked `<!-- test: NAME -->` is executed as written.

Only three things are swapped, the same for every block (see `adapt`): the real provider
host becomes a loopback fake provider with its own CA (mitmproxy is told to trust that
CA, as it trusts the real provider's public one), port 8080 becomes a free port, and
HOME is a temporary folder, so `~/.mitmproxy` is a CA made for this test. Clients are
real: curl, the openai SDK, Node's fetch, a Java HttpURLConnection.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest


from interception import (
    APP_ANTHROPIC,
    anthropic_stream,
    APP_BOTO,
    BEDROCK_MODEL,
    invoke_body,
    HOWTO,
    howto_blocks,
    APP_JAVA,
    APP_JS,
    APP_PY,
    REPO,
    Mitmdump,
    Provider,
    Route,
    issue_cert,
    make_ca,
    needs_curl,
    openai_chat_stream,
)
import upstream

DOC = HOWTO
WORDS = ["Tapped ", "through ", "the ", "proxy", "."]
BODY = openai_chat_stream(WORDS)
ANTHROPIC_BODY = anthropic_stream(WORDS)
MODELS = b'{"object":"list","data":[{"id":"gpt-test-1","object":"model"}]}'
INVOKE = invoke_body()
INVOKE_PATH = f"/model/{BEDROCK_MODEL}/invoke-with-response-stream"


BLOCKS = howto_blocks()


def block(name: str) -> str:
    assert name in BLOCKS, f"certs_howto.md lost its tested block {name!r}"
    return BLOCKS[name]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A fake provider (TLS, own CA) and a temporary home for mitmproxy's CA."""
    root = tmp_path_factory.mktemp("certs")
    home = root / "home"
    home.mkdir()
    ca = make_ca(root, "fake-provider")
    cert = issue_cert(ca, ["localhost", "127.0.0.1"], root)
    routes = {
        "/v1/chat/completions": Route(BODY),
        "/v1/models": Route(MODELS, content_type="application/json"),
        "/v1/messages": Route(ANTHROPIC_BODY),
        INVOKE_PATH: Route(INVOKE, content_type="application/vnd.amazon.eventstream"),
    }
    with Provider(routes, certfile=cert) as provider:
        yield {"root": root, "home": home, "provider": provider, "provider_ca": ca[0]}


def environment(world, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower() and not k.startswith("SSL_")}
    env.update(
        HOME=str(world["home"]),
        PATH=f"{REPO / '.venv' / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}",
        OPENAI_API_KEY="sk-howto-test",
        ANTHROPIC_API_KEY="sk-ant-howto-test",
    )
    env.update(extra)
    return env


def adapt(command: str, world, ports: int | dict[str, int]) -> str:
    """The doc's command for this test's world (the three swaps of the module docstring)."""
    upstream = f"localhost:{world['provider'].port}"
    command = command.replace("api.openai.com", upstream).replace("api.anthropic.com", upstream)
    for doc_port, port in ({"8080": ports} if isinstance(ports, int) else ports).items():
        command = command.replace(doc_port, str(port))
    return command


def free_ports(count: int) -> dict[str, int]:
    """Free loopback ports for the doc's 8080, 8081, ... (for blocks that name several)."""
    return {str(8080 + i): port for i, port in enumerate(upstream.free_ports(count))}


def start_proxy(
    name: str, world, tmp_path: Path, ports: dict[str, int] | None = None, *, provider: tuple[str, str, Path] | None = None
) -> tuple[Mitmdump, Path]:
    """Run a doc block that starts mitmdump, on a free port, recording under tmp_path.
    ``provider``: (the doc's host, the fake provider's host:port, its CA) for another provider."""
    recordings = tmp_path / "recordings"
    trusted = provider[2] if provider else world["provider_ca"]
    extra = [
        "--listen-host", "127.0.0.1", "--listen-port", "0",
        "--set", f"ssl_verify_upstream_trusted_ca={trusted}",
        "--set", f"streamtap_dir={recordings}",
    ]
    command = adapt(block(name), world, ports or 0).strip()
    if provider:
        command = command.replace(provider[0], provider[1])
    argv = ["bash", "-c", f'exec {command} "$@"', "mitmdump"]
    proxy = Mitmdump(*extra, confdir=world["home"] / ".mitmproxy", argv=argv, env=environment(world))
    proxy.doc_ports = ports or {"8080": proxy.port}
    return proxy, recordings


def run_client(name: str, world, proxy: Mitmdump, cwd: Path, *, prelude: str = "", **env: str):
    script = prelude + adapt(block(name), world, proxy.doc_ports)
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd, env=environment(world, **env), capture_output=True, timeout=60,
    )
    assert result.returncode == 0, (
        f"block {name!r} failed ({result.returncode}):\n{script}\n"
        f"stderr: {result.stderr.decode(errors='replace')}\nmitmdump:\n{proxy.output}"
    )
    return result


def assert_recorded(recordings: Path, body: bytes, proxy: Mitmdump) -> None:
    """The Tap wrote a recording of exactly these bytes, judged complete."""
    from streamtap.recording import read_recording

    # The worker writes the end line when its flow's end reaches it; on a loaded machine its start
    # alone can take longer than mitmdump's stop waits for it, so wait for the finished recording
    # first (a finished recording's name loses its .partial), then stop to settle the rest.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        finished = [p for p in recordings.glob("*.jsonl") if not p.name.endswith(".partial.jsonl")]
        if any(read_recording(p).body == body for p in finished):
            break
        time.sleep(0.1)
    proxy.stop()
    found = [read_recording(p) for p in sorted(recordings.glob("*.jsonl"))]
    matching = [r for r in found if r.body == body]
    assert matching, f"no recording of the {len(body)}-byte body in {recordings}: {[r.path.name for r in found]}\n{proxy.output}"
    assert matching[0].verdict and matching[0].verdict["kind"] == "complete", matching[0].verdict


def served_stream(world) -> bytes:
    return [s for s in world["provider"].served if s.path.endswith("/chat/completions")][-1].sent


# --- section 1: reverse mode ----------------------------------------------------------------


def test_reverse_mode_with_a_base_url_needs_no_certificate(world, tmp_path):
    proxy, recordings = start_proxy("reverse-proxy", world, tmp_path)
    try:
        (tmp_path / "app.py").write_text(APP_PY)
        result = run_client("reverse-openai-env", world, proxy, tmp_path)
        assert result.stdout == BODY == served_stream(world)
        assert json.loads(result.stderr.decode().strip().splitlines()[-1])["text"] == "".join(WORDS)
        assert_recorded(recordings, BODY, proxy)
    finally:
        proxy.stop()


def test_one_mitmdump_in_front_of_two_providers(world, tmp_path):
    """Two reverse modes in one mitmdump; the anthropic SDK found by ANTHROPIC_BASE_URL."""
    proxy, recordings = start_proxy("reverse-two-providers", world, tmp_path, free_ports(2))
    try:
        (tmp_path / "app.py").write_text(APP_ANTHROPIC)
        result = run_client("reverse-anthropic-env", world, proxy, tmp_path)
        assert json.loads(result.stdout) == {"text": "".join(WORDS), "stop_reason": "end_turn"}
        served = [s for s in world["provider"].served if s.path == "/v1/messages"][-1]
        assert served.sent == ANTHROPIC_BODY
        assert_recorded(recordings, ANTHROPIC_BODY, proxy)
    finally:
        proxy.stop()


@pytest.mark.skipif(not shutil.which("node"), reason="node is not installed")
def test_reverse_mode_over_tls_for_node(world, tmp_path):
    proxy, recordings = start_proxy("reverse-proxy", world, tmp_path)
    try:
        (tmp_path / "app.js").write_text(APP_JS)
        result = run_client("reverse-node-tls", world, proxy, tmp_path)
        assert result.stdout == BODY == served_stream(world)
        assert_recorded(recordings, BODY, proxy)
    finally:
        proxy.stop()


def test_node_without_the_ca_is_refused(world, tmp_path):
    """The counter-check: the block above works because of NODE_EXTRA_CA_CERTS."""
    if not shutil.which("node"):
        pytest.skip("node is not installed")
    proxy, _ = start_proxy("reverse-proxy", world, tmp_path)
    try:
        (tmp_path / "app.js").write_text(APP_JS)
        script = adapt(block("reverse-node-tls"), world, proxy.port).replace("NODE_EXTRA_CA_CERTS=", "IGNORED=")
        result = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=environment(world), capture_output=True, timeout=60)
        assert result.returncode != 0 and result.stdout == b""
    finally:
        proxy.stop()


# --- section 2: explicit proxy ----------------------------------------------------------------


def js_block(name: str) -> str:
    """A JavaScript block marked tested: an app's client set-up, used as written."""
    blocks = dict(re.findall(r"<!-- test: (\S+) -->\n```js\n(.*?)```", DOC.read_text(), re.S))
    assert name in blocks, f"certs_howto.md lost its tested block {name!r}"
    return blocks[name]




@pytest.fixture
def explicit_proxy(world, tmp_path):
    proxy, recordings = start_proxy("explicit-proxy", world, tmp_path)
    yield proxy, recordings
    proxy.stop()


@needs_curl
def test_curl_through_the_explicit_proxy(world, explicit_proxy, tmp_path):
    proxy, recordings = explicit_proxy
    result = run_client("explicit-curl", world, proxy, tmp_path)
    assert result.stdout == BODY == served_stream(world)
    assert_recorded(recordings, BODY, proxy)


@needs_curl
def test_curl_refuses_the_proxy_without_its_ca(world, explicit_proxy, tmp_path):
    """Counter-check: trusting another CA (the provider's own), curl must reject mitmproxy's
    certificate (exit 60), so the block above passes because of the CA it names."""
    proxy, _ = explicit_proxy
    script = adapt(block("explicit-curl"), world, proxy.port).replace(
        "~/.mitmproxy/mitmproxy-ca-cert.pem", str(world["provider_ca"])
    )
    result = subprocess.run(["bash", "-c", script], env=environment(world), capture_output=True, timeout=30)
    assert result.returncode == 60, result.stderr


def test_openai_sdk_through_the_explicit_proxy(world, explicit_proxy, tmp_path):
    proxy, recordings = explicit_proxy
    (tmp_path / "app.py").write_text(APP_PY)
    # The SDK's default base URL is the real provider; the fake one stands in for it.
    base_url = f"https://localhost:{world['provider'].port}/v1"
    result = run_client("explicit-python", world, proxy, tmp_path, OPENAI_BASE_URL=base_url)
    assert result.stdout == BODY == served_stream(world)
    assert json.loads(result.stderr.decode().strip().splitlines()[-1])["text"] == "".join(WORDS)
    assert_recorded(recordings, BODY, proxy)
    proxy.stop()
    # The request really went through the proxy (HTTPS_PROXY honoured): mitmdump logged it.
    assert "/v1/chat/completions" in proxy.output


def chunks_of(body: bytes) -> list:
    """The model events inside an InvokeModel event-stream, decoded by botocore's parser."""
    import base64

    from botocore.eventstream import EventStreamBuffer

    buffer = EventStreamBuffer()
    buffer.add_data(body)
    return [json.loads(base64.b64decode(json.loads(m.payload)["bytes"])) for m in buffer]


def served_invoke(world):
    return [s for s in world["provider"].served if s.path == INVOKE_PATH][-1]


def test_boto3_bedrock_through_the_explicit_proxy_keeps_sigv4_intact(world, explicit_proxy, tmp_path):
    """Section 2's Python block with boto3: HTTPS_PROXY and AWS_CA_BUNDLE are honoured, and
    the provider sees the Host the request was signed for (what AWS checks)."""
    proxy, recordings = explicit_proxy
    (tmp_path / "app.py").write_text(APP_BOTO)
    endpoint = f"https://localhost:{world['provider'].port}"
    result = run_client("explicit-python", world, proxy, tmp_path, BEDROCK_ENDPOINT=endpoint)
    assert json.loads(result.stdout) == chunks_of(INVOKE)
    served = served_invoke(world)
    assert served.sent == INVOKE
    assert "host" in served.headers["authorization"].split("SignedHeaders=")[1].split(",")[0].split(";")
    assert served.headers["host"] == f"localhost:{world['provider'].port}"  # as signed
    assert_recorded(recordings, INVOKE, proxy)
    proxy.stop()
    assert f"POST https://localhost:{world['provider'].port}/model/" in proxy.output  # via the proxy


def test_reverse_mode_rewrites_the_host_that_sigv4_signed(world, tmp_path):
    """The doc's warning, shown: with endpoint_url pointing at reverse mode, boto3 signs
    for 127.0.0.1:PORT but the provider receives its own host, so AWS would reject it."""
    proxy, _ = start_proxy("reverse-proxy", world, tmp_path)
    try:
        (tmp_path / "app.py").write_text(APP_BOTO)
        env = environment(world, BEDROCK_ENDPOINT=f"http://127.0.0.1:{proxy.port}")
        result = subprocess.run(
            [str(REPO / ".venv" / "bin" / "python"), "app.py"], cwd=tmp_path, env=env, capture_output=True, timeout=60
        )
        assert result.returncode == 0, result.stderr.decode()
        served = served_invoke(world)
        assert served.headers["host"] == f"localhost:{world['provider'].port}"
        assert served.headers["host"] != f"127.0.0.1:{proxy.port}"  # what boto3 signed
    finally:
        proxy.stop()


@pytest.mark.skipif(not (shutil.which("java") and shutil.which("keytool")), reason="java/keytool not installed")
def test_java_truststore_and_proxy_properties(world, explicit_proxy, tmp_path):
    proxy, recordings = explicit_proxy
    (tmp_path / "App.java").write_text(APP_JAVA)
    base_url = f"https://localhost:{world['provider'].port}/v1"
    # `-jar app.jar` stands for the user's app; the JDK runs a single source file directly.
    # Java bypasses the proxy for localhost by default; the real provider is not local.
    BLOCKS["explicit-java-run"] = block("explicit-java").replace("-jar app.jar", "App.java")
    result = run_client(
        "explicit-java-run", world, proxy, tmp_path,
        OPENAI_BASE_URL=base_url, JAVA_TOOL_OPTIONS="-Dhttp.nonProxyHosts=",
    )
    assert result.stdout == BODY == served_stream(world)
    assert_recorded(recordings, BODY, proxy)


@needs_curl
def test_os_store_in_a_private_mount_namespace(world, explicit_proxy, tmp_path):
    """`update-ca-certificates` for real, on a private copy of the store (never the machine's)."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("update-ca-certificates"):
        pytest.skip("needs root, unshare and update-ca-certificates to try the OS store privately")
    proxy, _ = explicit_proxy
    private = tmp_path / "store"
    prelude = f"""
sudo() {{ "$@"; }}
mkdir -p {private}/anchors
cp -a /etc/ssl/certs {private}/certs
cp /etc/ca-certificates.conf {private}/ca-certificates.conf
mount --bind {private}/anchors /usr/local/share/ca-certificates
mount --bind {private}/certs /etc/ssl/certs
mount --bind {private}/ca-certificates.conf /etc/ca-certificates.conf
# before: the store does not know mitmproxy's CA, so curl must refuse
if curl -s --proxy http://127.0.0.1:8080 https://api.openai.com/v1/models; then echo TRUSTED-TOO-EARLY; exit 9; fi
"""
    prelude = adapt(prelude, world, proxy.port)
    script = prelude + adapt(block("os-store"), world, proxy.port)
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "bash", "-euo", "pipefail", "-c", script],
        env=environment(world), capture_output=True, timeout=120,
    )
    if result.returncode != 0 and b"unshare failed" in result.stderr:
        pytest.skip(f"mount namespaces not permitted: {result.stderr.decode().strip()}")
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    assert result.stdout.endswith(MODELS)
    # the machine's own store is untouched
    assert not Path("/usr/local/share/ca-certificates/mitmproxy.crt").exists()


# --- section 3 ------------------------------------------------------------------------------


def test_wireguard_mode_starts_and_writes_a_client_config(world, tmp_path):
    """`--mode wireguard` as in the doc: the server starts, prints a client config, keeps its keys.

    No WireGuard client runs here (no wg tools, no tunnel device), so only mitmproxy's side
    of the recipe is exercised.
    """
    text = DOC.read_text()
    assert "mitmdump -s addon/tap.py --mode wireguard" in text
    conf = world["home"] / ".mitmproxy" / "wireguard.conf"
    argv = ["bash", "-c", 'exec mitmdump -s addon/tap.py --mode wireguard@0 "$@"', "mitmdump"]
    proxy = Mitmdump(confdir=world["home"] / ".mitmproxy", argv=argv, env=environment(world))
    try:
        assert "WireGuard server listening" in proxy.output
        assert "[Peer]" in proxy.output and "PublicKey" in proxy.output
        keys = json.loads(conf.read_text())
        assert keys["client_key"] in proxy.output  # the printed client config uses the kept key
    finally:
        proxy.stop()


# --- Node: the AWS SDK for Bedrock, and fetch after Connection: close ------------------------

NODE_BEDROCK_PACKAGES = ("@aws-sdk/client-bedrock-runtime", "https-proxy-agent")
BEDROCK_HOST = "bedrock-runtime.us-east-1.amazonaws.com"

# what the app does with the client the doc's block builds: stream a Bedrock answer, print its chunks
BEDROCK_CALL_JS = """
const { InvokeModelWithResponseStreamCommand } = require("@aws-sdk/client-bedrock-runtime");
(async () => {
  const response = await client.send(new InvokeModelWithResponseStreamCommand({
    modelId: "anthropic.claude-v2", contentType: "application/json",
    body: JSON.stringify({ anthropic_version: "bedrock-2023-05-31", max_tokens: 64, messages: [] }),
  }));
  const chunks = [];
  for await (const event of response.body) chunks.push(JSON.parse(Buffer.from(event.chunk.bytes).toString()));
  console.log(JSON.stringify(chunks));
})().catch((err) => { console.error(String(err)); process.exit(1); });
"""


@pytest.fixture(scope="module")
def node_aws_sdk() -> Path:
    """node_modules with the Bedrock client and https-proxy-agent: installed once from the npm
    registry into a cache folder, or the tests skip saying why."""
    if not (shutil.which("node") and shutil.which("npm")):
        pytest.skip("node and npm are not installed")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "streamtap-tests" / "node-bedrock"
    modules = cache / "node_modules"
    if not all((modules / name / "package.json").is_file() for name in NODE_BEDROCK_PACKAGES):
        cache.mkdir(parents=True, exist_ok=True)
        try:
            result = subprocess.run(
                ["npm", "install", "--no-save", "--no-audit", "--no-fund", "--prefix", str(cache), *NODE_BEDROCK_PACKAGES],
                capture_output=True, text=True, timeout=240,
            )
        except subprocess.TimeoutExpired:
            pytest.skip("npm install of the AWS SDK timed out (no network?)")
        if result.returncode != 0:
            reason = (result.stderr.strip().splitlines() or ["?"])[-1]
            pytest.skip(f"npm could not install {' '.join(NODE_BEDROCK_PACKAGES)} (no network?): {reason}")
    return modules


def node_app(tmp_path: Path, modules: Path, client_js: str) -> None:
    (tmp_path / "app.js").write_text(client_js + BEDROCK_CALL_JS)
    if not (tmp_path / "node_modules").exists():
        (tmp_path / "node_modules").symlink_to(modules)


AWS_TEST_KEYS = {"AWS_ACCESS_KEY_ID": "AKIDSTREAMTAPTEST", "AWS_SECRET_ACCESS_KEY": "streamtap-test-secret"}


def test_node_bedrock_through_the_explicit_proxy_with_the_http1_handler(world, explicit_proxy, tmp_path, node_aws_sdk):
    """The doc's client, pointed at the fake provider where it would reach AWS: through the
    proxy (HTTPS_PROXY, mitmproxy's CA), signed for the host it reaches, recorded complete."""
    proxy, recordings = explicit_proxy
    provider = f"https://localhost:{world['provider'].port}"
    client = js_block("node-bedrock-proxy-client").replace('region: "us-east-1",', f'region: "us-east-1", endpoint: "{provider}",')
    node_app(tmp_path, node_aws_sdk, client)
    result = run_client("node-bedrock-proxy", world, proxy, tmp_path, **AWS_TEST_KEYS)
    assert json.loads(result.stdout) == chunks_of(INVOKE)
    served = served_invoke(world)
    assert served.sent == INVOKE
    assert served.headers["host"] == f"localhost:{world['provider'].port}"  # the host it signed
    assert "host" in served.headers["authorization"].split("SignedHeaders=")[1].split(",")[0].split(";")
    assert_recorded(recordings, INVOKE, proxy)
    assert f"POST https://localhost:{world['provider'].port}/model/" in proxy.output  # via the proxy


def run_node_bedrock_over_h2(world, tmp_path, node_aws_sdk, script: upstream.Script):
    """The doc's reverse-mode client with the SDK's default HTTP/2 handler, through the
    ``https://`` reverse mode, in front of a provider that speaks HTTP/2 (as AWS does).
    Returns the chunks the app printed and the flow's recording."""
    from streamtap.recording import read_recording

    with upstream.H2Upstream() as h2:
        h2.add("", script)
        certificate = Path(h2._tmp.name) / "cert.pem"
        proxy, recordings = start_proxy("reverse-bedrock", world, tmp_path, provider=(BEDROCK_HOST, f"localhost:{h2.port}", certificate))
        try:
            node_app(tmp_path, node_aws_sdk, js_block("node-bedrock-reverse-client"))
            result = run_client("node-bedrock-reverse", world, proxy, tmp_path, **AWS_TEST_KEYS)
            assert h2.served[""][-1].path == INVOKE_PATH
        finally:
            proxy.stop()  # settles the recording
    (recording,) = [read_recording(p) for p in recordings.glob("*.jsonl")]
    assert recording.header["request"]["http_version"] == "HTTP/2.0"  # the app spoke HTTP/2
    return json.loads(result.stdout), recording


def test_node_bedrock_https_reverse_mode_speaks_http2(world, tmp_path, node_aws_sdk):
    """The race the doc warns of: the SDK's GOAWAY right after the response headers can
    end the connection in mitmproxy before the whole body is relayed. Either way the app
    exits 0; streamtap calls only the whole answer complete."""
    chunks, recording = run_node_bedrock_over_h2(
        world, tmp_path, node_aws_sdk, upstream.Script(INVOKE, content_type="application/vnd.amazon.eventstream")
    )
    if chunks == chunks_of(INVOKE):
        assert recording.body == INVOKE
        assert recording.verdict["kind"] == "complete", recording.verdict
    else:
        assert chunks == chunks_of(INVOKE)[: len(chunks)] and len(recording.body) < len(INVOKE)
        assert recording.verdict["kind"] == "truncated", recording.verdict


def test_node_bedrock_over_http2_loses_a_body_that_comes_after_the_sdks_goaway(world, tmp_path, node_aws_sdk):
    """The doc's warning, made certain: the provider sends its headers, then waits before the
    body. The SDK's GOAWAY arrives in between, mitmproxy ends the connection, and the app
    prints an empty answer without an error. streamtap's recording says truncated."""
    slow = upstream.Script(INVOKE, content_type="application/vnd.amazon.eventstream", chunks=[b"", INVOKE], gap=0.5)
    chunks, recording = run_node_bedrock_over_h2(world, tmp_path, node_aws_sdk, slow)
    assert chunks == [] and recording.body == b""
    assert recording.verdict["kind"] == "truncated", recording.verdict


def test_node_bedrock_http2_cannot_reach_a_plain_http_reverse_proxy(world, tmp_path, node_aws_sdk):
    """The doc's warning, shown: the default handler over http:// fails; the HTTP/1.1 handler
    gets through the same proxy (to a provider that speaks only HTTP/1.1, over https:// too)."""
    provider = (BEDROCK_HOST, f"localhost:{world['provider'].port}", world["provider_ca"])
    proxy, recordings = start_proxy("reverse-bedrock", world, tmp_path, provider=provider)
    try:
        env = environment(world, **AWS_TEST_KEYS, NODE_EXTRA_CA_CERTS=str(world["home"] / ".mitmproxy" / "mitmproxy-ca-cert.pem"))
        node_app(tmp_path, node_aws_sdk, js_block("node-bedrock-reverse-client"))
        failed = subprocess.run(["node", "app.js"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                                env={**env, "BEDROCK_ENDPOINT": f"http://127.0.0.1:{proxy.port}"})
        assert failed.returncode != 0 and "http2 request did not get a response" in failed.stderr, failed.stderr
        http1 = js_block("node-bedrock-reverse-client").replace(
            "endpoint: process.env.BEDROCK_ENDPOINT", "endpoint: process.env.BEDROCK_ENDPOINT, requestHandler: new NodeHttpHandler()"
        )
        for scheme, host in (("http", "127.0.0.1"), ("https", "localhost")):
            node_app(tmp_path, node_aws_sdk, 'const { NodeHttpHandler } = require("@smithy/node-http-handler");\n' + http1)
            result = subprocess.run(["node", "app.js"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                                    env={**env, "BEDROCK_ENDPOINT": f"{scheme}://{host}:{proxy.port}"})
            assert result.returncode == 0, result.stderr
            assert json.loads(result.stdout) == chunks_of(INVOKE)
    finally:
        proxy.stop()


FETCH_APP_JS = """
(async () => {
  const response = await fetch(process.env.OPENAI_BASE_URL + "/chat/completions", {
    method: "POST", headers: {"content-type": "application/json"}, body: JSON.stringify({stream: true, messages: []}),
  });
  process.stdout.write(Buffer.from(await response.arrayBuffer()));
})().catch((err) => { console.error(String(err)); process.exit(1); });
"""


@pytest.mark.skipif(not shutil.which("node"), reason="node is not installed")
@pytest.mark.parametrize("style", ["fin", "reset"])
def test_node_fetch_takes_a_cut_body_as_whole_after_connection_close(tmp_path, style):
    """The doc's note: through mitmdump, a body cut mid-answer raises in Node's fetch, unless
    the response said Connection: close; then fetch returns the partial body without an error.
    streamtap judges both truncated."""
    (tmp_path / "app.js").write_text(FETCH_APP_JS)
    body = openai_chat_stream(WORDS * 4)
    cut = len(body) // 2
    with upstream.Upstream() as fake, upstream.Mitmdump(fake.url, tmp_path / "proxy") as proxy:
        got = {}
        for name, headers in (("keep", []), ("close", [("connection", "close")])):
            fake.add(name, upstream.Script(body, chunk_size=40, cut_at=cut, cut_style=style, headers=headers))
            env = {**os.environ, "OPENAI_BASE_URL": f"{proxy.url}/s/{name}/v1"}
            got[name] = subprocess.run(["node", "app.js"], cwd=tmp_path, env=env, capture_output=True, timeout=60)
            assert upstream.find_recording(proxy.record_dir, name).verdict["kind"] == "truncated"
    assert got["keep"].returncode == 1 and b"terminated" in got["keep"].stderr, got["keep"]
    assert got["close"].returncode == 0, got["close"].stderr
    assert got["close"].stdout == body[:cut]  # the partial answer, taken as whole


def test_every_block_marked_tested_is_run_by_a_test():
    """A block marked *(tested)* in the doc that no test runs would be a false promise."""
    here = {"reverse-proxy", "reverse-openai-env", "reverse-two-providers", "reverse-anthropic-env", "reverse-node-tls", "explicit-proxy", "explicit-curl",
            "explicit-python", "explicit-java", "os-store", "node-bedrock-proxy", "reverse-bedrock", "node-bedrock-reverse"}
    js_here = {"node-bedrock-proxy-client", "node-bedrock-reverse-client"}
    for name in js_here:
        js_block(name)
    in_test_transparent = {"gateway-iptables", "gateway-nft", "same-host"}
    assert set(howto_blocks()) == here | in_test_transparent
    text = (REPO / "tests" / "test_transparent.py").read_text()
    assert all(f'"{name}"' in text for name in in_test_transparent)
    assert DOC.read_text().count("*(tested)*\n<!-- test: ") == len(here | in_test_transparent | js_here)
