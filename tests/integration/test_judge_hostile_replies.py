"""Nothing a judge returns can crash the scorer (issue 54, item 2).

The OpenAI-compatible judge reads real HTTP replies through the openai client from a `ScriptedServer`: a stand-in for
a judge server gone wrong (a proxy, a buggy model server), a fault no real judge produces on demand. Every reply of the
wrong shape — wrong types, missing keys, a body that is not JSON, JSON that is a list — must leave the judge as a
`JudgeError` (on the code before the change, AttributeError/TypeError escaped and crash-looped the worker). The
recorded judge is fed tables of the wrong shape the same way.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scorers.conversation import Conversation
from scorers.judges.base import MAX_REPLY_ERROR_DETAIL_CHARS, JudgeError, JudgeReplyError
from scorers.judges.openai_http import OpenAIJudge
from scorers.judges.recorded import RecordedJudge
from scorers.questions import likert_question
from tests.servers import Reply, ScriptedServer

CONVERSATION = Conversation.from_messages(
    "c1", [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello! How can I help?"}]
)
QUESTION = likert_question("helpful", "The assistant is helpful.")
API_KEY = "sk-hostile-test-key-0123456789"
GOOD_REPLY: dict[str, Any] = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "finish_reason": "stop",
            "message": {"role": "assistant", "content": "4"},
            "logprobs": {
                "content": [
                    {
                        "token": "4",
                        "logprob": -0.1,
                        "bytes": None,
                        "top_logprobs": [{"token": "4", "logprob": -0.1, "bytes": None}, {"token": "3", "logprob": -2.5}],
                    }
                ]
            },
        }
    ],
    "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11},
}


def _set(path: tuple[Any, ...], value: Any) -> bytes:
    reply = copy.deepcopy(GOOD_REPLY)
    node = reply
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return json.dumps(reply).encode()


def _drop(path: tuple[Any, ...]) -> bytes:
    reply = copy.deepcopy(GOOD_REPLY)
    node = reply
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return json.dumps(reply).encode()


LOGPROB = ("choices", 0, "logprobs", "content", 0)
TOP = (*LOGPROB, "top_logprobs", 0)
HOSTILE_BODIES = {
    "choices are ints": _set(("choices",), [1, 2]),
    "choices is a string": _set(("choices",), "abc"),
    "choices is an object": _set(("choices",), {"0": 1}),
    "logprobs is a string": _set(("choices", 0, "logprobs"), "x"),
    "logprobs content is a dict": _set(("choices", 0, "logprobs", "content"), {"a": 1}),
    "content item is an int": _set(("choices", 0, "logprobs", "content"), [7]),
    "top logprobs is a string": _set((*LOGPROB, "top_logprobs"), "abc"),
    "top logprobs items are ints": _set((*LOGPROB, "top_logprobs"), [1, 2]),
    "string logprob": _set((*TOP, "logprob"), "high"),
    "null logprob": _set((*TOP, "logprob"), None),
    "huge logprob": _set((*TOP, "logprob"), 1e6),
    "nan-like logprob": json.dumps(GOOD_REPLY).replace("-0.1,", "NaN,", 1).encode(),
    "token is an int": _set((*TOP, "token"), 4),
    "token missing": _drop((*TOP, "token")),
    "logprob missing": _drop((*TOP, "logprob")),
    "top logprobs missing": _drop((*LOGPROB, "top_logprobs")),
    "usage is a string": _set(("usage",), "lots"),
    "usage tokens are strings": _set(("usage", "prompt_tokens"), "ten"),
    "usage tokens negative": _set(("usage", "completion_tokens"), -5),
    "not JSON": b"<html>502 Bad Gateway</html>",
    "JSON list": b"[1, 2, 3]",
    "JSON string": b'"hello"',
    "JSON null": b"null",
    "empty body": b"",
    "key echoed in an unusable reply": _set(("choices",), [API_KEY, "\x1b[31m" + "x" * 5000]),
}


def _judge(url: str) -> OpenAIJudge:
    return OpenAIJudge(base_url=url + "/v1", model="m", api_key=API_KEY, max_retries=0, timeout_s=10)


def _outcome(body: bytes) -> Exception | None:
    """What the judge raises for one reply ``body`` (None: it read an answer)."""
    with ScriptedServer(lambda i, r: Reply(200, body, {"Content-Type": "application/json"})) as server:
        judge = _judge(server.url)
        try:
            judge.judge(CONVERSATION, [QUESTION])
        except Exception as e:  # the test is which exceptions come out
            return e
        finally:
            judge.close()
    return None


def test_the_good_reply_is_read() -> None:
    """The reply the hostile ones are made from is a valid one: the judge reads it."""
    assert _outcome(json.dumps(GOOD_REPLY).encode()) is None


@pytest.mark.parametrize("body", HOSTILE_BODIES.values(), ids=list(HOSTILE_BODIES))
def test_a_reply_of_the_wrong_shape_is_a_judge_error(body: bytes) -> None:
    """Only a JudgeError leaves the judge, its message bounded, printable and without the API key."""
    error = _outcome(body)
    if error is None:  # a shape the client and judge can still read (e.g. a usage it tolerates) is fine
        return
    assert isinstance(error, JudgeError), f"{type(error).__name__} escaped: {error}"
    message = str(error)
    assert API_KEY not in message
    assert message.isprintable()
    assert len(message) < MAX_REPLY_ERROR_DETAIL_CHARS + 200


def test_the_shapes_of_the_issue_are_reply_errors() -> None:
    """The two replies that crash-looped the worker (issue 54) are read as JudgeReplyError, not answers."""
    for name in ("choices are ints", "string logprob", "JSON list", "not JSON"):
        assert isinstance(_outcome(HOSTILE_BODIES[name]), JudgeReplyError), name


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=6,
)
PATHS = st.sampled_from(
    [
        ("choices",),
        ("choices", 0),
        ("choices", 0, "logprobs"),
        ("choices", 0, "logprobs", "content"),
        LOGPROB,
        (*LOGPROB, "top_logprobs"),
        TOP,
        (*TOP, "token"),
        (*TOP, "logprob"),
        ("usage",),
        ("usage", "prompt_tokens"),
    ]
)


def test_any_value_anywhere_in_the_reply_gives_an_answer_or_a_judge_error() -> None:
    """Property: any JSON value put at any place of the reply gives an answer or a JudgeError, nothing else (one
    server for all examples)."""
    bodies: list[bytes] = []
    with ScriptedServer(lambda i, r: Reply(200, bodies[-1], {"Content-Type": "application/json"})) as server:
        judge = _judge(server.url)

        @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
        @given(path=PATHS, value=JSON_VALUES)
        def check(path: tuple[Any, ...], value: Any) -> None:
            bodies.append(_set(path, value))
            try:
                judge.judge(CONVERSATION, [QUESTION])
            except JudgeError:
                pass

        try:
            check()
        finally:
            judge.close()


@pytest.mark.parametrize(
    "table",
    [
        {("c1", "helpful"): "not probabilities"},
        {("c1", "helpful"): (0.5, "x", 0.1, 0.1, 0.1)},
        {("c1", "helpful"): None},
        {("c1", "helpful"): 3},
    ],
)
def test_a_recorded_table_of_the_wrong_shape_is_a_judge_error(table: dict[Any, Any]) -> None:
    """The recorded judge's table read wrong (a hand-made table) is a JudgeError too."""
    with pytest.raises(JudgeError):
        RecordedJudge(table).judge(CONVERSATION, [QUESTION])
