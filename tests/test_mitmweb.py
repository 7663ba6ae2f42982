"""streamtap in a real mitmweb: verdicts as flow comments, the contentviews picked by name
through mitmweb's HTTP API, a cut flow's body kept, the streamtap.* commands, and a
headless Chromium that loads mitmweb's UI (screenshots in the test's tmp directory)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

import provider_streams as streams
from streamtap.mitm.contentview import VIEWS
from upstream import CHAT, MITMDUMP, Mitmdump, Script, Upstream, curl, free_port, free_ports

MITMWEB = MITMDUMP.with_name("mitmweb")
PASSWORD = "streamtap-test"
COLUMNS = ("tls", "icon", "path", "method", "status", "size", "time", "comment")
WHOLE = streams.openai_chat(["The ", "whole ", "answer."])
CUT_AT = 300  # bytes of the body the upstream sends before it closes the connection
CUT = streams.openai_chat(["A ", "cut ", "answer ", "that ", "never ", "ends ", "properly."])


class Mitmweb(Mitmdump):
    """``mitmweb -s addon/tap.py`` in reverse mode, its UI on a free loopback port."""

    def __init__(self, upstream_url: str, workdir: Path, options: dict[str, str]) -> None:
        super().__init__(upstream_url, workdir, options={"web_password": PASSWORD, **options})
        self.args[0] = str(MITMWEB)
        self.args += ["--web-host", "127.0.0.1", "--web-port", "0", "--no-web-open-browser"]
        for column in COLUMNS:  # the comment column shows the verdicts in the flow list
            self.args += ["--set", f"web_columns={column}"]
        self.pick_ports()

    def pick_ports(self) -> None:
        self.port, self.web_port = free_ports(2)  # picked together, so never the same port
        self.set_arg("--listen-port", self.port)
        self.set_arg("--web-port", self.web_port)

    def ready_lines(self) -> list[str]:
        # the web server binds after the proxy port, as mitmweb's running hook starts
        return [*super().ready_lines(), f"Web server listening at {self.web_url}/"]

    @property
    def web_url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"


@pytest.fixture(scope="module")
def web(tmp_path_factory):
    """A mitmweb that has carried one whole and one cut streamed answer."""
    if not MITMWEB.exists():
        pytest.skip(f"{MITMWEB} is missing")
    workdir = tmp_path_factory.mktemp("mitmweb")
    with Upstream() as up:
        up.add("whole", Script(WHOLE, chunk_size=40))
        up.add("cut", Script(CUT, chunk_size=40, cut_at=CUT_AT))
        with Mitmweb(up.url, workdir, {"store_streamed_bodies": "true"}) as proxy:
            api = httpx.Client(base_url=proxy.web_url, headers={"Authorization": f"Bearer {PASSWORD}"}, timeout=10)
            assert curl(f"{proxy.url}/s/whole{CHAT}", max_time=20).stdout == WHOLE
            assert curl(f"{proxy.url}/s/cut{CHAT}", max_time=20).stdout == CUT[:CUT_AT]
            proxy.wait_log("streamtap: openai-chat", count=2)
            flows = wait_for_flows(api, 2)
            yield proxy, api, flows
            api.close()


def wait_for_flows(api: httpx.Client, count: int, timeout: float = 15) -> dict[str, dict]:
    """The flows mitmweb lists, by script name, once ``count`` of them carry a comment."""
    deadline = time.monotonic() + timeout
    while True:
        listed = api.get("/flows").json()
        by_name = {f["request"]["path"].split("/")[2]: f for f in listed if f.get("comment")}
        if len(by_name) >= count or time.monotonic() > deadline:
            return by_name
        time.sleep(0.1)


def test_every_tapped_flow_shows_its_verdict_as_its_comment(web):
    _, _, flows = web
    assert flows["whole"]["comment"].startswith("streamtap: complete: ")
    assert not flows["whole"]["marked"]
    assert flows["cut"]["comment"].startswith("streamtap: truncated: ")
    assert flows["cut"]["comment"].endswith("[upstream_reset]")
    assert flows["cut"]["marked"]  # mitmweb sends the emoji for MARK (":warning:")


@pytest.mark.parametrize("view", [v.name for v in VIEWS])
def test_each_contentview_is_served_by_name(web, view):
    _, api, flows = web
    # mitmweb's UI asks for the view as encodeURIComponent(name): parentheses stay as they are
    name = quote(view, safe="()!*'")
    response = api.get(f"/flows/{flows['whole']['id']}/response/content/{name}.json")
    assert response.status_code == 200, (view, response.status_code)
    assert response.json()["view_name"] == view


def test_the_sse_view_shows_the_events_of_a_whole_flow(web):
    _, api, flows = web
    shown = api.get(f"/flows/{flows['whole']['id']}/response/content/auto.json").json()
    assert shown["view_name"] == "LLM stream SSE"
    assert shown["text"].startswith(f"# {WHOLE.count(b'data: ')} events, {len(WHOLE)} bytes")


def test_a_cut_flow_shows_the_body_it_got(web):
    _, api, flows = web
    body = api.get(f"/flows/{flows['cut']['id']}/response/content.data")
    assert body.status_code == 200 and body.content == CUT[:CUT_AT]
    shown = api.get(f"/flows/{flows['cut']['id']}/response/content/auto.json").json()
    assert shown["view_name"] == "LLM stream SSE"
    assert "the body ends inside a frame" in shown["text"]


def call(api: httpx.Client, command: str, *arguments: str):
    """POST /commands/<command> as mitmweb's UI does: its XSRF cookie echoed in a header."""
    token = "0123456789abcdef"
    api.cookies.set("_mitmproxy_xsrf", token)
    answer = api.post(f"/commands/{command}", json={"arguments": list(arguments)}, headers={"X-XSRFToken": token})
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_the_commands_are_listed_and_answer(web):
    _, api, flows = web
    listed = api.get("/commands").json()
    assert {"streamtap.verdict", "streamtap.recording"} <= set(listed)
    assert listed["streamtap.verdict"]["parameters"][0]["type"] == "flow[]"
    verdicts = call(api, "streamtap.verdict", "~u /s/cut/")
    assert [v.split(":")[0] for v in verdicts["value"]] == ["truncated"], verdicts
    both = call(api, "streamtap.verdict", "@all")["value"]
    assert sorted(v.split(":")[0] for v in both) == ["complete", "truncated"]
    paths = call(api, "streamtap.recording", "~u /s/whole/")["value"]
    assert len(paths) == 1 and Path(paths[0]).is_file() and "_complete_" in paths[0]
    assert json.loads(Path(paths[0]).read_text().splitlines()[0])["request"]["url"].endswith("/s/whole" + CHAT)


# --- the proxies' start-up (the fixture above once got an empty reply from a mitmweb whose port was taken) ---


def squat(port: int) -> socket.socket:
    """Another process's listener on a port the proxy picked but has not bound yet."""
    return socket.create_server(("127.0.0.1", port))


def test_a_web_port_taken_before_mitmweb_binds_it_is_replaced(tmp_path):
    if not MITMWEB.exists():
        pytest.skip(f"{MITMWEB} is missing")
    with Upstream() as up:
        up.add("whole", Script(WHOLE, chunk_size=40))
        proxy = Mitmweb(up.url, tmp_path, {})
        taken = proxy.web_port
        with squat(taken), proxy:
            assert proxy.web_port != taken
            assert curl(f"{proxy.url}/s/whole{CHAT}", max_time=20).stdout == WHOLE
            flows = httpx.get(f"{proxy.web_url}/flows", headers={"Authorization": f"Bearer {PASSWORD}"}, timeout=10)
            assert flows.status_code == 200


def test_a_proxy_port_taken_before_mitmdump_binds_it_is_replaced(tmp_path):
    with Upstream() as up:
        up.add("whole", Script(WHOLE, chunk_size=40))
        proxy = Mitmdump(up.url, tmp_path)
        taken = proxy.port
        with squat(taken), proxy:
            assert proxy.port != taken  # not the squatter's listener answering the readiness probe
            assert curl(f"{proxy.url}/s/whole{CHAT}", max_time=20).stdout == WHOLE
            assert proxy.process.poll() is None


# --- a real browser ----------------------------------------------------------------------

CHROMIUM = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser")) if p), None)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install -y chromium); the browser check is skipped"
)


def chromium(url: str, profile: Path, *extra: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
         f"--user-data-dir={profile}", "--virtual-time-budget=8000", "--window-size=1400,900", *extra, url],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


@needs_chromium
def test_mitmweb_in_chromium_lists_the_verdicts_and_shows_the_stream(web, tmp_path):
    proxy, _, flows = web
    page = f"{proxy.web_url}/?token={PASSWORD}"
    dom = chromium(page, tmp_path / "profile", "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "streamtap: truncated" in dom.stdout and "streamtap: complete" in dom.stdout, dom.stdout[-3000:]
    shots = {}
    for name, url in {
        "flow-list": page,
        "cut-flow-response": f"{page}#/flows/{flows['cut']['id']}/response",
        "whole-flow-response": f"{page}#/flows/{flows['whole']['id']}/response",
    }.items():
        shot = tmp_path / f"{name}.png"
        result = chromium(url, tmp_path / "profile", f"--screenshot={shot}")
        assert result.returncode == 0 and shot.stat().st_size > 10_000, result.stderr[-2000:]
        shots[name] = shot
    view = chromium(f"{page}#/flows/{flows['cut']['id']}/response", tmp_path / "profile", "--dump-dom")
    assert "LLM stream SSE" in view.stdout and "the body ends inside a frame" in view.stdout, view.stdout[-3000:]
    print("screenshots:", *shots.values())


class DevTools:
    """A headless Chromium driven over the devtools protocol (tornado, which mitmproxy brings, speaks its websocket)."""

    def __init__(self, profile: Path) -> None:
        self.port = free_port()
        self.process = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
             f"--user-data-dir={profile}", f"--remote-debugging-port={self.port}", "--window-size=1400,900", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while True:
            try:
                pages = httpx.get(f"http://127.0.0.1:{self.port}/json/list", timeout=2).json()
                self.ws_url = next(p["webSocketDebuggerUrl"] for p in pages if p["type"] == "page")
                break
            except (httpx.HTTPError, StopIteration, ValueError):
                if time.monotonic() > deadline:
                    self.close()
                    raise
                time.sleep(0.2)

    async def run(self, steps):
        from tornado.websocket import websocket_connect

        conn = await websocket_connect(self.ws_url, max_message_size=64 * 1024 * 1024)
        counter = iter(range(1, 1_000_000))

        async def send(method: str, **params):
            ident = next(counter)
            await conn.write_message(json.dumps({"id": ident, "method": method, "params": params}))
            while True:
                message = json.loads(await conn.read_message())
                if message.get("id") == ident:
                    assert "error" not in message, message
                    return message["result"]

        async def js(expression: str):
            result = await send("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
            assert "exceptionDetails" not in result, result
            return result["result"].get("value")

        try:
            return await steps(send, js)
        finally:
            conn.close()

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)


PICK_VIEW = """
(async (name) => {
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  const links = () => [...document.querySelectorAll("a")];
  for (let i = 0; i < 100 && !links().some((a) => a.textContent.includes("View:")); i++) await sleep(100);
  links().find((a) => a.textContent.includes("View:")).click();
  for (let i = 0; i < 50 && !links().some((a) => a.textContent.trim() === name); i++) await sleep(100);
  links().find((a) => a.textContent.trim() === name).click();
  for (let i = 0; i < 50; i++) {
    await sleep(100);
    const pane = document.querySelector(".contentview");
    if (pane && pane.innerText.includes("View: " + name) && !pane.innerText.includes("Loading")) break;
  }
  return document.querySelector(".contentview").innerText;
})
"""


@needs_chromium
def test_a_contentview_picked_by_name_in_chromium(web, tmp_path):
    """The user's way: open the cut flow's response, pick the view in its 'View:' menu."""
    import asyncio
    import base64

    proxy, _, flows = web
    browser = DevTools(tmp_path / "profile")
    shown = {}

    async def steps(send, js):
        await send("Page.enable")
        await send("Page.navigate", url=f"{proxy.web_url}/?token={PASSWORD}#/flows/{flows['cut']['id']}/response")
        for view in VIEWS:
            name = view.name.lower()  # the menu lists the names in lower case
            shown[name] = await js(f"{PICK_VIEW}({json.dumps(name)})")
            shot = await send("Page.captureScreenshot", format="png")
            (tmp_path / f"picked-{name.replace(' ', '-')}.png").write_bytes(base64.b64decode(shot["data"]))

    try:
        asyncio.run(browser.run(steps))
    finally:
        browser.close()
    for name, text in shown.items():
        assert f"View: {name}" in text and "404" not in text and "Error" not in text, (name, text)
    sse = shown["llm stream sse"]
    assert f"# 1 event, {CUT_AT} bytes, 1 framing problem" in sse, sse
    assert f"# 0 values, {CUT_AT} bytes" in shown["llm stream ndjson"], shown  # an SSE body is no NDJSON
    print("screenshots:", *sorted(tmp_path.glob("picked-*.png")))
