"""A judge that echoes the API key in its error bodies, encoded or cut, does not get it stored or logged.

`ScriptedServer` (a real HTTP server on 127.0.0.1) stands in for a hostile or broken upstream: no real judge server
here echoes the key, so the test scripts one that does, in the forms found in issue 54 (a 500 with the
``Authorization`` header base64-encoded, a 400 with most of the key) and others (URL-safe base64 without padding,
hex). The real `OpenAIJudge` asks it under the real `ConversationScorer`; the unscored record (what goes to the scores
topic and ClickHouse's ``unscored_reason``) and every log line at DEBUG (openai, httpx, the scorer's own retries) are
searched for any `FRAGMENT_CHARS`-character run of the key and of its encodings.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Callable

import pytest

from scorers.judges.openai_http import OpenAIJudge
from scorers.rubrics import RubricSet
from scorers.secret_scrub import FRAGMENT_CHARS
from stream.metrics import ServiceMetrics
from stream.records import ClosedConversation
from stream.scoring import ConversationScorer
from tests.servers import Received, Reply, ScriptedServer
from tests.unit.test_scoring import closed_conversations as closed_conversations
from tests.unit.test_scoring import conversation as conversation
from tests.unit.test_scoring import fast_retries
from tests.unit.test_scoring import judge as judge
from tests.unit.test_scoring import rubric_set as rubric_set
from tests.unit.test_scoring import unfitted as unfitted

KEY = "sk-proj-7fQ2mZ9xLw4Tb8NcR1vYk6HdJ3sGp0Ae"


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


ECHOES: dict[str, tuple[int, Callable[[str], str]]] = {
    "500 base64 of the header": (500, lambda auth: f"upstream rejected header {_b64('Authorization: ' + auth)}"),
    "400 most of the key": (400, lambda auth: f"invalid key {auth.removeprefix('Bearer ')[2:-3]}..."),
    "503 urlsafe base64, no padding": (
        503,
        lambda auth: "trace " + base64.urlsafe_b64encode(auth.encode()).decode().rstrip("="),
    ),
    "502 hex": (502, lambda auth: "dump " + auth.encode().hex()),
}


def _forms_of_the_key() -> list[str]:
    """The key and the parts of its echoed encodings that the key alone determines."""
    return [
        KEY,
        _b64("Authorization: Bearer " + KEY)[32:-4],
        base64.urlsafe_b64encode(f"Bearer {KEY}".encode()).decode()[12:-4],
        KEY.encode().hex(),
    ]


def _leaked(text: str) -> list[str]:
    fragments = {f[i : i + FRAGMENT_CHARS] for f in _forms_of_the_key() for i in range(len(f) - FRAGMENT_CHARS + 1)}
    return sorted(f for f in fragments if f in text)


@pytest.mark.parametrize("echo", list(ECHOES))
def test_a_key_echoed_encoded_or_cut_reaches_neither_the_record_nor_the_logs(
    echo: str,
    rubric_set: RubricSet,
    conversation: ClosedConversation,
    caplog: pytest.LogCaptureFixture,
) -> None:
    status, body_of = ECHOES[echo]
    caplog.set_level(logging.DEBUG)

    def hostile(i: int, r: Received) -> Reply:
        said = body_of(r.headers.get("authorization", ""))
        body = {"error": {"message": said, "type": "server_error" if status >= 500 else "invalid_request_error"}}
        return Reply(status, json.dumps(body).encode())

    with ScriptedServer(hostile) as upstream:
        judge = OpenAIJudge(
            base_url=upstream.url + "/v1", model="m", api_key=KEY, max_retries=1, backoff_initial_s=0.01, backoff_max_s=0.02
        )
        scorer = ConversationScorer(judge, rubric_set, None, fast_retries(max_attempts=2), ServiceMetrics())
        record = asyncio.run(scorer.score(conversation))
        judge.close()
    assert upstream.received, (record.status, record.unscored_reason)
    assert KEY in upstream.received[0].headers["authorization"]
    sent = upstream.replies[0].body.decode()
    assert _leaked(sent), "the upstream did echo the key"
    assert record.status == "unscored"
    reason = record.unscored_reason
    assert _leaked(reason) == [] and _leaked(record.to_json().decode()) == []
    assert caplog.text and _leaked(caplog.text) == []
    assert f"HTTP {status}" in reason and "sha256 " in reason and "[api key]" in reason, reason
