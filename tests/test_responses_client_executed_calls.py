"""Responses items the app runs and answers, though they carry no function name: a local shell call, a
shell call, a computer call, an apply_patch call, a tool search the client runs, and an MCP approval
request. The turn waits on the app as for a function call: a tool call under the id the app answers with
(the call_id; the item id for an approval request), and the stop reason ``tool_use``. A tool search the
server ran, and a shell call in OpenAI's hosted container, stay server tools.

Such an item done under another call_id than it was added with is two calls in one slot (which id is the
app to answer?), and any item done under another item id is another item: the openai SDK refuses both
("Completed output item identity changed"), so both are corrupt, unless the stream's ids rotate (GitHub
Copilot rewrites every id on every event)."""

from __future__ import annotations

import orjson
import pytest
from conftest import shared_path
from provider_streams import chunk_lines, frame_responses
from test_verdict_responses_identity import sdk_final

from streamtap.providers import BlockKind, Dialect, StreamSession, VerdictKind, analyze_bytes

R = Dialect.OPENAI_RESPONSES
# the field of each item type that holds what the app runs
INPUT_FIELD = {"local_shell_call": "action", "shell_call": "action", "computer_call": "action",
               "apply_patch_call": "operation", "tool_search_call": "arguments", "mcp_approval_request": "arguments"}


def ev(kind: str, **fields) -> bytes:
    return f"event: {kind}\ndata: {orjson.dumps({'type': kind, **fields}).decode()}\n\n".encode()


def response(status: str, output: list | None, response_id: str = "resp_A") -> dict:
    return {"id": response_id, "object": "response", "status": status, "model": "gpt", "output": output}


def one_item(added: dict, done: dict, final: list | None = None) -> bytes:
    return (ev("response.created", response=response("in_progress", []))
            + ev("response.output_item.added", output_index=0, item=added)
            + ev("response.output_item.done", output_index=0, item=done)
            + ev("response.completed", response=response("completed", [done] if final is None else final)))




def sdk_client_calls(final) -> list[tuple]:
    """(the id the app answers with, the item's tool name or else its type, its input) of each item the SDK hands the app to run or answer."""
    calls = []
    for item in final.output:
        raw = item.to_dict()
        if item.type not in INPUT_FIELD or raw.get("execution") == "server":
            continue
        if item.type == "shell_call" and (raw.get("environment") or {}).get("type") == "container_reference":
            continue
        value = raw[INPUT_FIELD[item.type]]
        answered_by = raw["id"] if item.type == "mcp_approval_request" else raw["call_id"]
        calls.append((answered_by, raw.get("name") or item.type, orjson.loads(value) if isinstance(value, str) else value))
    return calls


def capture(name: str) -> bytes:
    return frame_responses(chunk_lines(shared_path("fixtures", "vercel-ai", "openai", "responses", name)))


# real captures whose last item the app must run or answer (and one its recorders wrote: the delete patch)
CLIENT_CAPTURES = ["openai-local-shell-tool.1.chunks.txt", "openai-apply-patch-tool.1.chunks.txt",
                   "openai-mcp-tool-approval.1.chunks.txt", "synthetic/openai-apply-patch-tool-delete.1.chunks.txt"]


@pytest.mark.parametrize("name", CLIENT_CAPTURES)
def test_real_captures_of_items_the_app_runs_wait_on_the_app(name):
    body = capture(name)
    analysis = analyze_bytes(body, R)
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
    assert analysis.turn.stop_reason == "tool_use"
    calls = analysis.turn.tool_calls()
    assert [(c.id, c.name, c.arguments) for c in calls] == sdk_client_calls(sdk_final(body))
    assert calls and all(c.closed and c.extra["item_id"] for c in calls)
    again = analyze_bytes(body, R, chunk_size=7)  # small network reads give the same turn
    assert again.turn.to_dict() == analysis.turn.to_dict()


def test_a_real_local_shell_call_is_answered_by_its_call_id_with_its_finished_action():
    calls = analyze_bytes(capture("openai-local-shell-tool.1.chunks.txt"), R).turn.tool_calls()
    [call] = calls
    assert call.id == "call_h3nm8hUG0KO9tVNuRACkL1ri"
    assert call.extra["item_id"].startswith("lsh_")
    assert call.arguments == {"type": "exec", "command": ["ls", "-a", "~"], "env": {}}
    assert orjson.loads(call.arguments_raw) == call.arguments
    assert call.extra["item"]["status"] == "completed" and "action" not in call.extra["item"]


def test_a_real_mcp_approval_request_is_answered_by_its_item_id_and_named_as_its_tool():
    """It was named mcp_approval_request, its item type, though the item names the tool the app approves."""
    turn = analyze_bytes(capture("openai-mcp-tool-approval.1.chunks.txt"), R).turn
    [call] = turn.tool_calls()
    assert call.id.startswith("mcpr_") and call.name == "create_short_url"
    assert call.arguments["url"] == "https://ai-sdk.dev/"
    assert call.extra["item"]["name"] == "create_short_url" and call.extra["item"]["server_label"] == "zip1"
    assert [b.kind for b in turn.blocks] == [BlockKind.SERVER_TOOL, BlockKind.TOOL_CALL]  # the tool list stays a server block


def test_a_real_search_the_server_ran_stays_a_server_tool_before_the_function_call():
    analysis = analyze_bytes(capture("openai-tool-search.1.chunks.txt"), R)
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
    assert analysis.turn.stop_reason == "tool_use"
    kinds = [(b.kind, b.name) for b in analysis.turn.blocks]
    assert kinds == [(BlockKind.SERVER_TOOL, "tool_search_call"), (BlockKind.SERVER_TOOL, "tool_search_output"),
                     (BlockKind.TOOL_CALL, "get_weather")]
    assert analysis.turn.blocks[0].id.startswith("tsc_") and analysis.turn.blocks[0].extra["item"]["execution"] == "server"
    assert [c.id for c in analysis.turn.tool_calls()] == ["call_pddfxhfOx4gY56zn4vIIEbFp"]


def test_the_real_client_tool_search_whose_call_id_changes_by_its_done_is_corrupt_and_names_both_ids():
    """OpenAI sent call_NHis... in output_item.added and call_RWTI... in output_item.done and the final
    response: the SDK refuses the stream, and an app reading the events cannot tell which id to answer."""
    body = capture("openai-client-tool-search.1.chunks.txt")
    final = sdk_final(body)
    assert isinstance(final, RuntimeError) and "identity changed" in str(final)
    verdict = analyze_bytes(body, R).verdict
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert "call_id call_NHis2zQiYcIaO6pf9nb5q1wY" in verdict.reason
    assert "response.output_item.done gives call_RWTIIVfxsJW9fecsg6fy23Dy" in verdict.reason
    assert "two calls in one slot" in verdict.reason


# constructed items, as added (in progress) and done (finished)
ITEMS = {
    "local_shell_call": ({"action": {"type": "exec", "command": [], "env": {}}},
                         {"action": {"type": "exec", "command": ["ls"], "env": {}}}),
    "shell_call": ({"action": {"commands": []}, "environment": {"type": "local"}},
                   {"action": {"commands": ["uname -a"]}, "environment": {"type": "local"}}),
    "computer_call": ({"action": {"type": "screenshot"}, "pending_safety_checks": []},
                      {"action": {"type": "click", "button": "left", "x": 1, "y": 2}, "pending_safety_checks": []}),
    "apply_patch_call": ({"operation": {"type": "create_file", "path": "a.md", "diff": ""}},
                         {"operation": {"type": "create_file", "path": "a.md", "diff": "+hi\n"}}),
    "tool_search_call": ({"arguments": {}, "execution": "client"}, {"arguments": {"goal": "weather"}, "execution": "client"}),
}


def item(kind: str, stage: int, status: str, **fields) -> dict:
    return {"id": f"{kind[:3]}_1", "type": kind, "status": status, "call_id": "call_1", **ITEMS[kind][stage], **fields}


def approval(**fields) -> dict:
    return {"id": "mcpr_1", "type": "mcp_approval_request", "name": "create_short_url", "server_label": "zip1",
            "arguments": '{"url":"https://example.com/"}', **fields}


@pytest.mark.parametrize("kind", sorted(ITEMS))
def test_each_item_the_app_runs_is_a_tool_call_under_its_call_id(kind):
    done = item(kind, 1, "completed")
    analysis = analyze_bytes(one_item(item(kind, 0, "in_progress"), done), R)
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
    assert analysis.turn.stop_reason == "tool_use"
    [call] = analysis.turn.tool_calls()
    assert (call.id, call.name, call.arguments, call.extra["item_id"]) == ("call_1", kind, ITEMS[kind][1][INPUT_FIELD[kind]],
                                                                         done["id"])


def test_an_mcp_approval_request_is_a_tool_call_under_its_item_id():
    analysis = analyze_bytes(one_item(approval(), approval()), R)
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
    assert analysis.turn.stop_reason == "tool_use"
    [call] = analysis.turn.tool_calls()
    assert (call.id, call.name, call.arguments) == ("mcpr_1", "create_short_url", {"url": "https://example.com/"})


@pytest.mark.parametrize("added, done", [
    (item("tool_search_call", 0, "in_progress", execution="server", call_id=None),
     item("tool_search_call", 1, "completed", execution="server", call_id=None)),
    (item("shell_call", 0, "in_progress", environment={"type": "container_reference", "container_id": "cntr_1"}),
     item("shell_call", 1, "completed", environment={"type": "container_reference", "container_id": "cntr_1"})),
], ids=["tool_search_call-server", "shell_call-hosted-container"])
def test_items_the_server_runs_stay_server_tools(added, done):
    analysis = analyze_bytes(one_item(added, done), R)
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
    assert analysis.turn.stop_reason == "end_turn"
    assert [b.kind for b in analysis.turn.blocks] == [BlockKind.SERVER_TOOL]
    assert analysis.turn.blocks[0].extra["item"] == done


def test_an_item_the_app_runs_that_comes_only_with_the_terminal_event_is_still_a_tool_call():
    done = item("local_shell_call", 1, "completed")
    body = (ev("response.created", response=response("in_progress", []))
            + ev("response.completed", response=response("completed", [done])))
    analysis = analyze_bytes(body, R)
    assert analysis.turn.stop_reason == "tool_use"
    assert [(c.id, c.arguments, c.closed) for c in analysis.turn.tool_calls()] == [("call_1", done["action"], True)]


@pytest.mark.parametrize("kind", sorted(ITEMS))
def test_an_item_the_app_runs_whose_call_id_changes_by_its_done_is_corrupt(kind):
    body = one_item(item(kind, 0, "in_progress"), item(kind, 1, "completed", call_id="call_OTHER"))
    assert isinstance(sdk_final(body), RuntimeError)  # the SDK refuses it
    verdict = analyze_bytes(body, R).verdict
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert "added with call_id call_1" in verdict.reason and "gives call_OTHER" in verdict.reason, verdict


def test_an_item_the_app_runs_whose_call_id_changes_only_in_the_final_response_is_corrupt():
    done = item("apply_patch_call", 1, "completed")
    body = one_item(item("apply_patch_call", 0, "in_progress"), done, final=[{**done, "call_id": "call_OTHER"}])
    verdict = analyze_bytes(body, R).verdict
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert "the final response gives call_OTHER" in verdict.reason, verdict


def test_a_tool_search_that_changes_who_runs_it_is_corrupt():
    body = one_item(item("tool_search_call", 0, "in_progress"), item("tool_search_call", 1, "completed", execution="server"))
    verdict = analyze_bytes(body, R).verdict
    assert verdict.kind is VerdictKind.CORRUPT and "added with execution client" in verdict.reason, verdict


MESSAGE = {"id": "msg_1", "type": "message", "status": "completed", "role": "assistant",
           "content": [{"type": "output_text", "text": "Paris.", "annotations": []}]}


def message_stream(done_id: str, in_progress: str = "resp_A", completed: str = "resp_A") -> bytes:
    """A message streamed as msg_1 (its deltas too) whose output_item.done and final response name ``done_id``;
    the response ids of the .in_progress and .completed events are given (rotating ones are new on every event)."""
    where = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    part = MESSAGE["content"][0]
    done = {**MESSAGE, "id": done_id}
    return (ev("response.created", response=response("in_progress", []))
            + ev("response.in_progress", response=response("in_progress", [], in_progress))
            + ev("response.output_item.added", output_index=0, item={**MESSAGE, "status": "in_progress", "content": []})
            + ev("response.content_part.added", **where, part={**part, "text": ""})
            + ev("response.output_text.delta", **where, delta="Paris.")
            + ev("response.output_text.done", **where, text="Paris.")
            + ev("response.content_part.done", **where, part=part)
            + ev("response.output_item.done", output_index=0, item=done)
            + ev("response.completed", response=response("completed", [done], completed)))


def test_an_item_done_under_another_id_is_corrupt_as_the_sdk_refuses_it():
    assert analyze_bytes(message_stream("msg_1"), R).verdict.kind is VerdictKind.COMPLETE
    body = message_stream("msg_2")
    final = sdk_final(body)
    assert isinstance(final, RuntimeError) and "identity changed" in str(final)
    verdict = analyze_bytes(body, R).verdict
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert "added with id msg_1 and response.output_item.done gives msg_2" in verdict.reason, verdict
    assert verdict.seq == 7  # the output_item.done


def test_an_item_done_under_another_id_in_a_stream_whose_ids_rotate_stays_complete():
    """GitHub Copilot rewrites every id on every event: there a new id at the done is no second item."""
    analysis = analyze_bytes(message_stream("msg_2", in_progress="resp_B", completed="resp_C"), R)
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
    assert analysis.turn.text() == "Paris."


def test_an_item_done_under_an_id_seen_before_is_another_answers_even_where_ids_rotate():
    body = message_stream("resp_B", in_progress="resp_B", completed="resp_C")  # the id the response had a moment ago
    verdict = analyze_bytes(body, R).verdict
    assert verdict.kind is VerdictKind.CORRUPT and "was seen before" in verdict.reason, verdict


def test_the_real_copilot_capture_whose_ids_rotate_stays_complete():
    analysis = analyze_bytes(capture("github-copilot-id-rotation.1.chunks.txt"), R)
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
    assert analysis.turn.stop_reason == "end_turn"


def test_an_input_beyond_the_arguments_cap_is_not_kept_and_the_turn_cannot_be_vouched_for():
    done = item("apply_patch_call", 1, "completed", operation={"type": "create_file", "path": "a.md", "diff": "+x\n" * 100})
    body = one_item(item("apply_patch_call", 0, "in_progress"), done)
    session = StreamSession(R, "sse", arguments_cap=64)
    session.feed(body)
    analysis = session.close()
    [call] = analysis.turn.tool_calls()
    assert call.arguments is None and len(call.arguments_raw) == 64
    assert analysis.verdict.kind is VerdictKind.UNKNOWN and "not parsed" in analysis.verdict.reason, analysis.verdict
    assert "operation" not in call.extra["item"]  # the input is held once, under the cap
