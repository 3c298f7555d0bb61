"""The OpenAI-compatible HTTP judge against a real llama-cpp-python server running Gemma 3 270M.

Gemma 3 270M is a *base* model: its answers to rubric questions carry no
signal. These tests check plumbing (requests, logprob reading, answer-line
walking, errors, retries, concurrency), never answer quality.

Faults the real server cannot be made to produce on demand (rate limits,
outages, slow replies, an unknown-model 404, a reply without logprobs,
adversarial multi-question replies: swapped, duplicated, missing or garbage
lines and JSON keys, an OpenAI-shaped usage with cached tokens) come from
`ScriptedServer`, a real HTTP server on 127.0.0.1 that the test scripts; each
such test says so. Everything else goes to the real server, sometimes
through a transparent forwarding `ScriptedServer` so the test can see the raw
reply the judge received.
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from openai.types.chat.chat_completion_token_logprob import TopLogprob

from scorers.conversation import Conversation, render_transcript
from scorers.datasets.llm_rubric import load_real_conversations
from scorers.judges.answer_format import (
    answer_grammar,
    answer_json_schema,
    json_schema_response_format,
    read_answer_json,
    read_answer_lines,
    sequence_grammar,
)
from scorers.judges.base import (
    Answer,
    JudgeAuthError,
    JudgeError,
    Judgement,
    JudgeModelNotFound,
    JudgeReplyError,
    JudgeUnavailable,
)
from scorers.judges.openai_http import RESET_PROMPT, OpenAIJudge, option_probabilities
from scorers.judges.prompt import multi_question_prompt, numbered_order, prefix, single_question_prompt
from scorers.learning.score_cache import judge_identity
from scorers.questions import Question, likert_question
from tests.data_paths import LLM_RUBRIC
from tests.servers import LlamaServer, Received, Reply, ScriptedServer, forward, free_port

CONVERSATION = Conversation.from_messages(
    "reverse-list",
    [
        {"role": "user", "content": "How do I reverse a list in Python?"},
        {"role": "assistant", "content": "Use my_list.reverse() to reverse it in place, or my_list[::-1] for a reversed copy."},
    ],
)
OTHER_CONVERSATION = Conversation.from_messages(
    "greeting", [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello! How can I help?"}]
)
REAL_CONVERSATION_ID = "65c76b8ef174b289770375a3"
QUESTIONS = (
    likert_question("answers", "The assistant answers the user's question."),
    likert_question("rude", "The assistant is rude."),
    likert_question("code", "The assistant gives a working code example."),
)
# Gemma 270M base does not follow the multi-line reply format on its own (it echoes the
# instructions), so multi-question tests constrain its output with a llama.cpp GBNF grammar,
# sent through the judge's `extra_body` as a deployment with a weak local model would.
# The logprobs llama.cpp returns are the model's unconstrained distribution.
# repeat_penalty=1 turns off llama.cpp's default penalty (1.1), so the sampled digit is the argmax.
MULTI_LINE_OPTIONS = {
    "grammar": "root ::= " + " ".join(f'"{i}: " [1-5] "\\n"' for i in range(1, len(QUESTIONS) + 1)),
    "repeat_penalty": 1.0,
}
FAST_BACKOFF = dict(backoff_initial_s=0.01, backoff_max_s=0.05)
OPENAI_404_MODEL = {  # the body api.openai.com sends for an unknown model
    "error": {
        "message": "The model `no-such-model` does not exist or you do not have access to it.",
        "type": "invalid_request_error",
        "param": None,
        "code": "model_not_found",
    }
}
OPENAI_429 = {
    "error": {"message": "Rate limit reached for requests", "type": "requests", "param": None, "code": "rate_limit_exceeded"}
}
OPENAI_503 = {
    "error": {"message": "The server is overloaded or not ready yet.", "type": "server_error", "param": None, "code": None}
}


def _json(status: int, body: dict[str, Any], delay_s: float = 0.0) -> Reply:
    return Reply(status, json.dumps(body).encode(), delay_s=delay_s)


def _upstream(server: LlamaServer) -> str:
    return server.url.removesuffix("/v1")


def _judge(url: str, server: LlamaServer, **kw: Any) -> OpenAIJudge:
    # A long timeout: a loaded 2-core host can take a minute for a one-pass call on the real server (not a timed test).
    params: dict[str, Any] = dict(base_url=url, model=server.model, api_key=server.api_key, max_retries=0, timeout_s=300)
    params.update(kw)
    return OpenAIJudge(**params)


def _expected(top: list[dict[str, Any]], keys: tuple[str, ...], pad: str | None = None) -> list[float]:
    """Test-side reading of option probabilities from raw JSON top_logprobs."""
    return [sum(math.exp(t["logprob"]) for t in top if t["token"].strip(pad) == k) for k in keys]


def _raw_chat(server: LlamaServer, prompt: str, **fields: Any) -> bytes:
    body = {"model": server.model, "messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": 1}
    body.update(fields)
    request = urllib.request.Request(
        f"{server.url}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {server.api_key}"},
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        return response.read()


@pytest.fixture(autouse=True)
def _server_alive(request: pytest.FixtureRequest) -> Iterator[None]:
    """Tests using the real server fail with its log tail if it has died."""
    server = request.getfixturevalue("llama_server") if "llama_server" in request.fixturenames else None
    if server is not None:
        server.assert_alive()
    yield
    if server is not None:
        server.assert_alive()


@pytest.fixture(scope="module")
def recorded_reply(llama_server: LlamaServer) -> bytes:
    """A real single-question reply with logprobs, recorded from the llama server."""
    prompt = single_question_prompt(render_transcript(CONVERSATION), QUESTIONS[0])
    return _raw_chat(llama_server, prompt, logprobs=True, top_logprobs=20)


# ---------------------------------------------------------------- the real server


@pytest.mark.slow
def test_single_question_mode_reads_the_first_token_distribution(
    llama_server: LlamaServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with ScriptedServer(lambda i, r: forward(_upstream(llama_server), r)) as proxy:
        judge = _judge(proxy.url + "/v1", llama_server, questions_per_call=1, max_concurrency=2)
        judgement = judge.judge(CONVERSATION, QUESTIONS[:2])

    assert set(judgement.answers) == {"answers", "rude"}
    assert judgement.provenance.calls == 2 and len(proxy.received) == 2
    assert judgement.provenance.prompt_tokens > 0
    assert judgement.provenance.completion_tokens == 2  # max_tokens=1: only the answer token is generated
    assert judgement.provenance.model == llama_server.model and judgement.provenance.latency_s > 0
    for index, request in enumerate(proxy.received):
        sent = json.loads(request.body)
        assert sent["logprobs"] is True and sent["top_logprobs"] == 20 and sent["temperature"] == 0
        question = next(q for q in QUESTIONS if q.text in sent["messages"][0]["content"])
        raw = json.loads(proxy.replies[index].body)
        top = raw["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
        answer = judgement.answers[question.id]
        assert len(answer.probabilities) == question.n_options
        assert all(0.0 <= p <= 1.0 for p in answer.probabilities)
        assert answer.covered_mass <= 1.0 + 1e-6
        assert answer.probabilities == pytest.approx(_expected(top, question.option_keys), abs=1e-12)
    # The prompt ends in "Answer: " with options 1-5: some digit is among the top-20 somewhere.
    assert max(a.covered_mass for a in judgement.answers.values()) > 0
    assert llama_server.api_key not in caplog.text and llama_server.api_key not in repr(judge)


@pytest.mark.slow
def test_multi_question_mode_reads_each_answer_line(llama_server: LlamaServer) -> None:
    with ScriptedServer(lambda i, r: forward(_upstream(llama_server), r)) as proxy:
        judge = _judge(proxy.url + "/v1", llama_server, questions_per_call=len(QUESTIONS), extra_body=MULTI_LINE_OPTIONS)
        judgement = judge.judge(CONVERSATION, QUESTIONS)

    assert judgement.provenance.calls == 1 and len(proxy.received) == 1
    assert judgement.provenance.prompt_tokens > 0 and judgement.provenance.completion_tokens > 0
    content = json.loads(proxy.replies[0].body)["choices"][0]["logprobs"]["content"]
    reply = "".join(t["token"] for t in content)
    assert re.fullmatch(r"1: [1-5]\n2: [1-5]\n3: [1-5]\n", reply), reply
    # Independent walk: an answer token is one that follows "<n>: " at a line start.
    answer_tokens, text = [], ""
    for token in content:
        if re.search(r"(^|\n)\d+: $", text):
            answer_tokens.append(token)
        text += token["token"]
    assert len(answer_tokens) == len(QUESTIONS)
    for question, token in zip(QUESTIONS, answer_tokens):
        answer = judgement.answers[question.id]
        assert len(answer.probabilities) == question.n_options
        assert all(0.0 <= p <= 1.0 for p in answer.probabilities) and answer.covered_mass <= 1.0 + 1e-6
        assert answer.probabilities == pytest.approx(_expected(token["top_logprobs"], question.option_keys), abs=1e-12)
        # At temperature 0 the grammar picks the most likely allowed digit: it must be the argmax option.
        printed = token["token"].strip()
        assert question.option_keys[max(range(question.n_options), key=answer.probabilities.__getitem__)] == printed
        assert answer.covered_mass > 0


@pytest.mark.slow
def test_bad_api_key_is_an_auth_error_not_retried_and_not_leaked(
    llama_server: LlamaServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    wrong_key = "wrong-" + llama_server.api_key[::-1]
    with ScriptedServer(lambda i, r: forward(_upstream(llama_server), r)) as proxy:
        judge = _judge(proxy.url + "/v1", llama_server, api_key=wrong_key, max_retries=3, **FAST_BACKOFF)
        with pytest.raises(JudgeAuthError) as err:
            judge.judge(CONVERSATION, QUESTIONS[:1])
    assert len(proxy.received) == 1  # the real server answered 401: not retried
    assert proxy.replies[0].status == 401
    assert wrong_key not in str(err.value) and wrong_key not in caplog.text and wrong_key not in repr(judge)


@pytest.mark.slow
def test_llama_server_ignores_the_model_name(llama_server: LlamaServer) -> None:
    """Documents why the unknown-model test below needs a double: llama_cpp.server answers with its
    default model whatever model is named (llama_cpp/server/model.py, LlamaProxy.__call__)."""
    judge = _judge(llama_server.url, llama_server, model="no-such-model")
    judgement = judge.judge(CONVERSATION, QUESTIONS[:1])
    assert judgement.provenance.calls == 1


# ---------------------------------------------------------------- scripted faults


@pytest.mark.parametrize("status", [401, 400, 503])
def test_a_server_that_echoes_the_key_does_not_put_it_in_errors_or_logs(status: int, caplog: pytest.LogCaptureFixture) -> None:
    """Double: a server that copies the Authorization header, and a terminal escape, into its error body (no real
    server here does). Error messages become ``unscored_reason`` in ClickHouse: the key must not get there."""
    caplog.set_level(logging.DEBUG)
    key = "sk-test-" + "0123456789abcdef" * 2

    def echo(i: int, r: Received) -> Reply:
        said = f"bad request from {r.headers.get('authorization', '')} \x1b]0;pwned\x07" + "x" * 1000
        return _json(status, {"error": {"message": said, "type": "invalid_request_error", "code": None}})

    with ScriptedServer(echo) as fake:
        judge = OpenAIJudge(base_url=fake.url + "/v1", model="m", api_key=key, max_retries=1, **FAST_BACKOFF)
        with pytest.raises(JudgeError) as err:
            judge.judge(CONVERSATION, QUESTIONS[:1])
    assert key in fake.received[0].headers["authorization"]  # the server did get (and echo) it
    message = str(err.value)
    assert key not in message and key not in caplog.text and "\x1b" not in message and "\x07" not in message
    assert len(message) < 600
    if status == 401:
        assert isinstance(err.value, JudgeAuthError) and "bad request" not in message
    else:
        assert "[api key]" in message


def test_unknown_model_is_model_not_found_not_retried() -> None:
    """Double: a server returning OpenAI's real 404 body, since llama_cpp.server cannot produce it."""
    with ScriptedServer(lambda i, r: _json(404, OPENAI_404_MODEL)) as fake:
        judge = OpenAIJudge(base_url=fake.url + "/v1", model="no-such-model", api_key="k", max_retries=3, **FAST_BACKOFF)
        with pytest.raises(JudgeModelNotFound, match="no-such-model"):
            judge.judge(CONVERSATION, QUESTIONS[:1])
    assert len(fake.received) == 1


@pytest.mark.slow
def test_transient_errors_are_retried_until_the_real_server_answers(llama_server: LlamaServer) -> None:
    """Double for the faults only: a 429 then a 503 (OpenAI's bodies), then requests go to the real server."""
    faults = [_json(429, OPENAI_429), _json(503, OPENAI_503)]

    def respond(index: int, request: Received) -> Reply:
        return faults[index] if index < len(faults) else forward(_upstream(llama_server), request)

    with ScriptedServer(respond) as proxy:
        judge = _judge(proxy.url + "/v1", llama_server, max_retries=2, **FAST_BACKOFF)
        judgement = judge.judge(CONVERSATION, QUESTIONS[:1])
    assert len(proxy.received) == 3
    assert judgement.extra["attempts"] == "3" and judgement.provenance.calls == 1
    assert len(judgement.answers["answers"].probabilities) == 5


@pytest.mark.parametrize("max_retries", [0, 2])
def test_persistent_outage_gives_up_after_max_retries(max_retries: int) -> None:
    """Double: a server that always answers 503, which a real server does only when broken."""
    with ScriptedServer(lambda i, r: _json(503, OPENAI_503)) as fake:
        judge = OpenAIJudge(base_url=fake.url + "/v1", model="m", max_retries=max_retries, **FAST_BACKOFF)
        with pytest.raises(JudgeUnavailable, match="503") as err:
            judge.judge(CONVERSATION, QUESTIONS[:1])
    assert len(fake.received) == max_retries + 1
    assert err.value.transient


@pytest.mark.slow
def test_slow_server_times_out_is_retried_then_unavailable(recorded_reply: bytes) -> None:
    """Double: a server that holds a real recorded reply longer than the judge's timeout."""
    with ScriptedServer(lambda i, r: Reply(200, recorded_reply, delay_s=1.5)) as slow:
        judge = OpenAIJudge(base_url=slow.url + "/v1", model="m", timeout_s=0.3, max_retries=1, **FAST_BACKOFF)
        with pytest.raises(JudgeUnavailable, match="timed out"):
            judge.judge(CONVERSATION, QUESTIONS[:1])
        assert len(slow.received) == 2


def test_refused_connection_is_unavailable() -> None:
    """Real fault: nothing listens on the port."""
    judge = OpenAIJudge(base_url=f"http://127.0.0.1:{free_port()}/v1", model="m", max_retries=1, **FAST_BACKOFF)
    with pytest.raises(JudgeUnavailable, match="connection error"):
        judge.judge(CONVERSATION, QUESTIONS[:1])


@pytest.mark.slow
def test_concurrency_limit_is_shared_by_all_calls_of_one_judge(recorded_reply: bytes) -> None:
    """Double: a server replaying a real recorded reply slowly, so overlapping requests are visible."""
    questions = [likert_question(f"q{i}", f"Statement {i}.") for i in range(4)]
    with ScriptedServer(lambda i, r: Reply(200, recorded_reply, delay_s=0.2)) as fake:
        judge = OpenAIJudge(base_url=fake.url + "/v1", model="m", max_concurrency=2, max_retries=0)
        results: dict[str, Any] = {}

        def run(conversation: Conversation) -> None:
            results[conversation.id] = judge.judge(conversation, questions)

        threads = [threading.Thread(target=run, args=(c,)) for c in (CONVERSATION, OTHER_CONVERSATION)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(fake.received) == 8
    assert fake.max_in_flight == 2  # a limit per judge() call would let the two conversations reach 4
    assert all(len(j.answers) == 4 and j.provenance.calls == 4 for j in results.values())


@pytest.mark.slow
def test_reply_without_logprobs_is_a_reply_error_not_retried(llama_server: LlamaServer) -> None:
    """Double: replays a real llama.cpp reply made without logprobs, as a server that ignores the
    logprobs request would send it (llama.cpp itself always honours the request)."""
    prompt = single_question_prompt(render_transcript(CONVERSATION), QUESTIONS[0])
    bare = _raw_chat(llama_server, prompt)
    assert json.loads(bare)["choices"][0].get("logprobs") is None
    with ScriptedServer(lambda i, r: Reply(200, bare)) as fake:
        judge = OpenAIJudge(base_url=fake.url + "/v1", model="m", max_retries=3, **FAST_BACKOFF)
        with pytest.raises(JudgeReplyError, match="without token logprobs"):
            judge.judge(CONVERSATION, QUESTIONS[:1])
    assert len(fake.received) == 1


# ---------------------------------------------------------------- pure reading rules


def test_option_tokens_with_and_without_leading_space_are_summed() -> None:
    top = [
        TopLogprob(token="1", logprob=math.log(0.2)),
        TopLogprob(token=" 1", logprob=math.log(0.1)),
        TopLogprob(token="2", logprob=math.log(0.3)),
        TopLogprob(token="You", logprob=math.log(0.4)),
    ]
    assert option_probabilities(top, ("1", "2", "3")) == pytest.approx((0.3, 0.3, 0.0))


@pytest.mark.parametrize(
    "tokens, expected",
    [
        (["1", ":", " ", "4", "\n", "2", ":", " ", "1", "\n"], {1: 3, 2: 8}),  # Gemma / llama.cpp style
        (["1", ":", " 4", "\n", "2", ":", " 1"], {1: 2, 2: 6}),  # GPT style: the space rides on the digit
        (
            ["Sure", ".\n", "2", ": ", "5", "\n", "1", ":", " 3", "\n", "7", ":", " 1"],
            {2: 4, 1: 8},
        ),  # by number; 7 is out of range
    ],
)
def test_answer_lines_are_found_by_walking_the_reply_tokens(tokens: list[str], expected: dict[int, int]) -> None:
    reading = read_answer_lines(tokens, len(expected))
    assert reading.positions == expected and reading.unreadable == {}


@pytest.mark.parametrize(
    "tokens, reason",
    [
        (["1", ":", " 4", "\n"], "no answer"),
        (["1", ":", " 4", "\n", "2", ":", "\n"], "its answer is empty"),
        (["1", ":", " 4", "\n", "2", ":3", "\n"], "its answer is not one token starting at a token boundary"),
        (["1", ":", " 4", "\n", "2", ":", " 1", "\n", "2", ":", " 2"], "its number appears more than once"),
    ],
)
def test_an_unreadable_answer_line_says_why(tokens: list[str], reason: str) -> None:
    reading = read_answer_lines(tokens, 2)
    assert reading.positions == {1: 2} and reading.unreadable == {2: reason}


@pytest.mark.parametrize(
    "field, value",
    [
        ("questions_per_call", 0),
        ("top_logprobs", 21),
        ("max_concurrency", 0),
        ("max_retries", -1),
        ("timeout_s", 0),
        ("base_url", "localhost:8000"),
    ],
)
def test_bad_parameters_name_the_field(field: str, value: object) -> None:
    params: dict[str, Any] = dict(base_url="http://127.0.0.1:1/v1", model="m")
    params[field] = value
    with pytest.raises(ValueError, match=field):
        OpenAIJudge(**params)


def test_read_answer_lines_keeps_what_it_can_and_says_why_not() -> None:
    tokens = ["3", ":", " 2", "\n", "1", ":", " 4", "\n", "1", ":", " 5", "\n", "4", ":", "\n"]
    reading = read_answer_lines(tokens, 4)
    assert reading.positions == {3: 2}
    assert reading.unreadable == {1: "its number appears more than once", 2: "no answer", 4: "its answer is empty"}


# ---------------------------------------------------------------- reading JSON replies


def _json_tokens(members: list[tuple[str, str]], style: str) -> list[str]:
    """The tokens of a flat JSON reply as a tokenizer splits it: ``openai`` (o200k-like) or ``llama`` (Gemma via llama.cpp)."""
    tokens = ["{"] if style == "llama" else []
    for i, (key, value) in enumerate(members):
        if style == "openai":
            tokens += ['{"' if i == 0 else '","', key, '":"', value]
        else:
            tokens += [" ", '"'] if i == 0 else [' "']
            tokens += [key, '":', ' "', value, '",' if i < len(members) - 1 else '"']
    return tokens + (['"}'] if style == "openai" else ["}"])


@pytest.mark.parametrize("style", ["openai", "llama"])
def test_json_answers_are_found_by_key_in_any_order(style: str) -> None:
    tokens = _json_tokens([("2", "5"), ("1", "3"), ("7", "1"), ("note", "4")], style)
    reading = read_answer_json(tokens, 2)
    assert reading.unreadable == {}
    assert {n: tokens[i] for n, i in reading.positions.items()} == {1: "3", 2: "5"}
    assert tokens.index("5") == reading.positions[2]  # the answer token itself, not a quote next to it


def test_a_json_answer_may_carry_its_quotes_and_spaces_in_its_token() -> None:
    tokens = ["{", '"1":', ' "a"', ",", '"2":', ' "b', '"}']
    assert read_answer_json(tokens, 2).positions == {1: 2, 2: 5}


@pytest.mark.parametrize(
    "tokens, unreadable",
    [
        (['{"', "1", '":"', "4", '"}'], {2: "no answer"}),
        (['{"', "1", '":"', "4", '","', "2", '":"', "1", '","', "2", '":"', "3", '"}'], {2: "its number appears more than once"}),
        (['{"', "1", '":"', "4", '","', "2", '":"', '"}'], {2: "its answer is empty"}),
        (
            ['{"', "1", '":"', "4", '","', "2", '":"', "1", "0", '"}'],
            {2: "its answer is not one token starting at a token boundary"},
        ),
        (['{"', "1", '":"', "4", '","', "2", '":"4', '"}'], {2: "its answer is not one token starting at a token boundary"}),
        (['{"', "1", '":"', "4", '","', "2", '":"'], {2: "no answer"}),  # truncated: what came before is kept
        (['{"', "1", '":"', "4", '","', "2", '":', "{", '"a":', "1", "}}"], {2: "no answer"}),  # not a flat object
        (['{"', "1", '":"', "4", '","', "2", '":"', "\\x", '"}'], {2: "no answer"}),  # an invalid escape stops reading
        (['{"', "1", '":', "4", ',"', "2", '":"', "1", "\n", '"}'], {2: "no answer"}),  # a raw newline in a string, too
    ],
)
def test_an_unreadable_json_answer_says_why_and_the_rest_is_kept(tokens: list[str], unreadable: dict[int, str]) -> None:
    reading = read_answer_json(tokens, 2)
    assert reading.positions == {1: 3} and reading.unreadable == unreadable


@pytest.mark.parametrize("text", ["I cannot say.", "1: 4\n2: 1\n", '["4", "1"]', '"1": "4", "2": "1"'])
def test_a_reply_that_is_not_a_json_object_reads_nothing(text: str) -> None:
    reading = read_answer_json(list(text), 2)
    assert reading.positions == {} and set(reading.unreadable) == {1, 2}


def test_quoted_option_tokens_count_for_their_key_in_json_replies() -> None:
    top = [
        TopLogprob(token='"4', logprob=math.log(0.5)),
        TopLogprob(token=" 4", logprob=math.log(0.1)),
        TopLogprob(token='"5"', logprob=math.log(0.2)),
        TopLogprob(token='":', logprob=math.log(0.2)),
    ]
    assert option_probabilities(top, ("4", "5"), pad=' \t\r\n"') == pytest.approx((0.6, 0.2))
    assert option_probabilities(top, ("4", "5")) == pytest.approx((0.1, 0.0))  # lines: whitespace only


# ---------------------------------------------------------------- constraints built from the questions


def test_the_grammar_admits_exactly_one_line_per_question_with_its_options() -> None:
    odd = Question(id="q8", text="Turns?", option_keys=("1", "2", "3"), option_labels=("few", "many", "ok"))
    grammar = answer_grammar([QUESTIONS[0], odd])
    assert grammar == 'root ::= "1: " ("1" | "2" | "3" | "4" | "5") "\\n" "2: " ("1" | "2" | "3") "\\n"'


def test_the_json_schema_requires_one_enum_property_per_question_and_nothing_else() -> None:
    odd = Question(id="q8", text="Turns?", option_keys=("a", "b"), option_labels=("few", "many"))
    schema = answer_json_schema([QUESTIONS[0], odd])
    assert schema == {
        "type": "object",
        "properties": {"1": {"type": "string", "enum": ["1", "2", "3", "4", "5"]}, "2": {"type": "string", "enum": ["a", "b"]}},
        "required": ["1", "2"],
        "additionalProperties": False,
    }
    assert json_schema_response_format([odd]) == {
        "type": "json_schema",
        "json_schema": {"name": "answers", "strict": True, "schema": answer_json_schema([odd])},
    }


@pytest.mark.parametrize(
    "answer_format, explicit, field, expected",
    [
        ("grammar", {}, "grammar", answer_grammar(QUESTIONS)),
        ("grammar", {"grammar": "root ::= [1-5]"}, "grammar", "root ::= [1-5]"),
        ("json_schema", {}, "response_format", json_schema_response_format(QUESTIONS)),
        ("json_schema", {"response_format": {"type": "json_object"}}, "response_format", {"type": "json_object"}),
        ("lines", {}, "grammar", None),
    ],
)
def test_the_constraint_is_sent_with_the_multi_question_call_and_an_explicit_extra_body_wins(
    answer_format: str, explicit: dict[str, Any], field: str, expected: Any
) -> None:
    """Double: a scripted server that records the request (any reply will do: every question falls back)."""
    with ScriptedServer(lambda i, r: Reply(200, SINGLE_ANSWER)) as server:
        judge = OpenAIJudge(
            base_url=server.url + "/v1",
            model="m",
            questions_per_call=len(QUESTIONS),
            max_retries=0,
            answer_format=answer_format,
            extra_body=explicit,
        )  # type: ignore[arg-type]
        judge.judge(CONVERSATION, QUESTIONS)
    first, *alone = [json.loads(r.body) for r in server.received]
    assert first.get(field) == expected
    assert len(alone) == len(QUESTIONS) and all(
        a.get(field) == explicit.get(field) for a in alone
    )  # built constraints: one-pass only
    replies_in_json = "Reply with one JSON object" in first["messages"][0]["content"]
    assert replies_in_json == (answer_format == "json_schema")


def test_the_single_and_the_multi_question_prompts_share_the_transcript_prefix() -> None:
    transcript = render_transcript(CONVERSATION)
    start = prefix(transcript)
    assert single_question_prompt(transcript, QUESTIONS[0]).startswith(start)
    for reply in ("lines", "json"):
        multi = multi_question_prompt(transcript, QUESTIONS, reply)  # type: ignore[arg-type]
        assert multi.startswith(start) and transcript not in multi[len(start) :]  # the questions come after it, once


def test_the_single_question_prompt_is_unchanged() -> None:
    """The score cache keys on PROMPT_VERSION: the single-question prompt text must not drift under it."""
    q = likert_question("q", "The assistant is polite.")
    assert single_question_prompt("User: hi\nAssistant: hello", q) == (
        "You are given a conversation between a user and an intelligent assistant. Your job is to evaluate the "
        "quality of the conversation based on a criterion. Read the conversation, then answer the question by "
        "selecting only one of the choices.\n\nConversation:\nUser: hi\nAssistant: hello\n\n"
        f"Question: {q.prompt_block()}\n\nOnly print '1', '2', '3', '4' or '5'.\nAnswer: "
    )


def test_the_multi_question_prompt_states_a_shared_stem_and_its_options_once() -> None:
    """Compact: 20 Likert rubrics cost their assertions plus a few characters each, not 20 copies of the scale."""
    transcript = render_transcript(CONVERSATION)
    rubrics = [likert_question(f"r{i}", f"The assistant does thing number {i}.") for i in range(20)]
    multi = multi_question_prompt(transcript, rubrics)
    body = multi[len(prefix(transcript)) :]
    assert body.count("Strongly disagree") == 1 and body.count(rubrics[0].stem) == 1
    for number, q in enumerate(rubrics, start=1):
        assert f"\n{number}. {q.item}\n" in body
    fixed = len(multi_question_prompt(transcript, rubrics[:1])) - len(prefix(transcript)) - len(rubrics[0].item)
    per_question = (len(body) - fixed - sum(len(q.item) for q in rubrics)) / (len(rubrics) - 1)
    assert per_question < 6  # "\n12. " and the reply instruction's longer count


def test_questions_are_numbered_grouped_by_stem_and_the_judge_reads_them_in_that_order() -> None:
    scale = Question("scale", "How well does the assistant explain?", ("a", "b"), ("badly", "well"))
    mixed = (QUESTIONS[0], scale, QUESTIONS[1])
    assert numbered_order(mixed) == (QUESTIONS[0], QUESTIONS[1], scale)
    with pytest.raises(ValueError, match="numbered_order"):
        multi_question_prompt("User: hi", mixed)
    prompt = multi_question_prompt("User: hi", numbered_order(mixed))
    assert "3. How well does the assistant explain?\nOptions: a = badly, b = well." in prompt
    reply = _completion(_line(1, "5", {"5": 0.6}) + _line(2, "1", {"1": 0.9}) + _line(3, "b", {"b": 0.8}))
    with ScriptedServer(lambda i, r: Reply(200, reply)) as server:
        judge = OpenAIJudge(base_url=server.url + "/v1", model="m", questions_per_call=3, max_retries=0)
        answers = judge.judge(CONVERSATION, mixed).answers
    assert len(server.received) == 1
    assert answers["answers"].probabilities == pytest.approx((0, 0, 0, 0, 0.6))
    assert answers["rude"].probabilities == pytest.approx((0.9, 0, 0, 0, 0))
    assert answers["scale"].probabilities == pytest.approx((0, 0.8))


# ---------------------------------------------------------------- one pass, fallback, cached tokens


def _completion(tokens: list[tuple[str, dict[str, float]]], prompt_tokens: int = 100, cached: int | None = None) -> bytes:
    """An OpenAI-shaped chat completion whose reply is ``tokens`` (text, {alternative: probability})."""
    content = [
        {
            "token": text,
            "logprob": math.log(max(top.get(text, 0.5), 1e-9)),
            "bytes": None,
            "top_logprobs": [{"token": k, "logprob": math.log(p), "bytes": None} for k, p in top.items()],
        }
        for text, top in tokens
    ]
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": len(tokens),
        "total_tokens": prompt_tokens + len(tokens),
    }
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    body = {
        "id": "x",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "logprobs": {"content": content},
                "message": {"role": "assistant", "content": "".join(t for t, _ in tokens)},
            }
        ],
        "usage": usage,
    }
    return json.dumps(body).encode()


def _line(number: int | str, answer: str, top: dict[str, float]) -> list[tuple[str, dict[str, float]]]:
    return [(str(number), {}), (":", {}), (" " + answer, top), ("\n", {})]


def _json_reply(members: list[tuple[str, str, dict[str, float]]]) -> list[tuple[str, dict[str, float]]]:
    """A JSON reply ``{"<key>": "<answer>", ...}`` tokenized OpenAI-style, ``top`` at each answer token."""
    tokens: list[tuple[str, dict[str, float]]] = []
    for i, (key, answer, top) in enumerate(members):
        tokens += [('{"' if i == 0 else '","', {}), (key, {}), ('":"', {}), (answer, top)]
    return tokens + [('"}', {})]


MULTI_MARKER = "Answer every numbered question"  # only the multi-question prompt says it
SINGLE_ANSWER = _completion([("4", {"4": 0.7, "5": 0.2})], prompt_tokens=80, cached=60)
FALLBACK = (0, 0, 0, 0.7, 0.2)  # what every question asked alone gets from the double


def _run(multi: bytes, answer_format: str = "lines") -> tuple[Judgement, ScriptedServer]:
    """Double: the multi-question reply is scripted (a real server cannot be made to send adversarial replies on
    demand); every single-question fallback gets a fixed answer."""
    server = ScriptedServer(lambda i, r: Reply(200, multi if MULTI_MARKER.encode() in r.body else SINGLE_ANSWER))
    with server:
        judge = OpenAIJudge(
            base_url=server.url + "/v1", model="m", questions_per_call=len(QUESTIONS), max_retries=0, answer_format=answer_format
        )  # type: ignore[arg-type]
        judgement = judge.judge(CONVERSATION, QUESTIONS)
    return judgement, server


def _asked_alone(server: ScriptedServer) -> list[str]:
    """Ids of the questions the judge asked in single-question calls."""
    prompts = [json.loads(r.body)["messages"][0]["content"] for r in server.received]
    alone = [p for p in prompts if MULTI_MARKER not in p]
    return sorted(q.id for q in QUESTIONS for p in alone if q.text in p)


def test_a_sequence_reply_assigns_token_i_to_question_i() -> None:
    judgement, server = _run(_completion([("4", {"4": 0.7}), ("2", {"2": 0.6, "1": 0.1}), ("5", {"5": 0.9})]), "sequence")
    ids = [q.id for q in QUESTIONS]
    assert judgement.answers[ids[0]].probabilities == pytest.approx((0, 0, 0, 0.7, 0))
    assert judgement.answers[ids[1]].probabilities == pytest.approx((0.1, 0.6, 0, 0, 0))
    assert judgement.answers[ids[2]].probabilities == pytest.approx((0, 0, 0, 0, 0.9))
    assert len(server.received) == 1 and judgement.extra["fallback_questions"] == "0"
    assert json.loads(server.received[0].body)["grammar"] == sequence_grammar(QUESTIONS)


@pytest.mark.parametrize(
    "reply, read",
    [
        ([("42", {"42": 0.9}), ("5", {"5": 0.9})], 0),  # one token holding two answers: nothing after it can be placed
        ([("4", {"4": 0.9}), ("x", {"x": 0.9}), ("5", {"5": 0.9})], 1),  # not an option key: the rest is out of step
        ([("4", {"4": 0.9}), ("2", {"2": 0.9})], 2),  # too short: the missing answer is asked alone
        ([("Sure", {}), (",", {}), (" 4", {" 4": 0.9})], 0),  # a server that ignored the grammar
        ([(" 4", {" 4": 0.9}), ("2", {"2": 0.9}), ("5", {"5": 0.9})], 0),  # padding is not an option key here
    ],
)
def test_a_broken_sequence_reply_is_never_shifted_onto_other_questions(
    reply: list[tuple[str, dict[str, float]]], read: int
) -> None:
    judgement, server = _run(_completion(reply), "sequence")
    ids = [q.id for q in QUESTIONS]
    assert sorted(_asked_alone(server)) == sorted(ids[read:])
    for qid in ids[:read]:
        assert judgement.answers[qid].probabilities == pytest.approx((0, 0, 0, 0.9, 0) if qid == ids[0] else (0, 0.9, 0, 0, 0))
    for qid in ids[read:]:
        assert judgement.answers[qid].probabilities == pytest.approx(FALLBACK)
    assert judgement.extra["fallback_questions"] == str(len(ids) - read)


def test_swapped_lines_are_assigned_by_number_not_by_order() -> None:
    multi = _completion(_line(3, "1", {"1": 0.9}) + _line(1, "5", {"5": 0.6}) + _line(2, "2", {"2": 0.3}))
    judgement, server = _run(multi)
    answers, ids = judgement.answers, [q.id for q in QUESTIONS]
    assert answers[ids[0]].probabilities == pytest.approx((0, 0, 0, 0, 0.6))
    assert answers[ids[1]].probabilities == pytest.approx((0, 0.3, 0, 0, 0))
    assert answers[ids[2]].probabilities == pytest.approx((0.9, 0, 0, 0, 0))
    assert len(server.received) == 1 and judgement.extra["fallback_questions"] == "0"


def test_garbage_lines_and_numbers_out_of_range_are_ignored() -> None:
    multi = _completion(
        [("Sure", {}), (",", {}), (" here", {}), (":\n", {})]
        + _line(0, "5", {"5": 1.0})
        + _line(2, "2", {"2": 0.3})
        + _line("note", "1", {"1": 1.0})
        + _line(4, "1", {"1": 1.0})
        + _line(1, "5", {"5": 0.6})
        + _line(3, "1", {"1": 0.9})
        + _line(12, "3", {"3": 1.0})
        + [("Thanks", {}), ("!", {})]
    )
    judgement, server = _run(multi)
    ids = [q.id for q in QUESTIONS]
    assert [judgement.answers[i].probabilities for i in ids] == [
        pytest.approx((0, 0, 0, 0, 0.6)),
        pytest.approx((0, 0.3, 0, 0, 0)),
        pytest.approx((0.9, 0, 0, 0, 0)),
    ]
    assert len(server.received) == 1 and judgement.extra["fallback_questions"] == "0"


def test_a_missing_or_duplicated_line_falls_back_alone_and_the_rest_is_kept() -> None:
    multi = _completion(
        _line(1, "2", {"2": 0.8}) + _line(1, "3", {"3": 0.8}) + _line(3, "4", {"4": 0.5}) + _line(9, "1", {"1": 1.0})
    )
    judgement, server = _run(multi)
    ids = [q.id for q in QUESTIONS]
    assert judgement.answers[ids[2]].probabilities == pytest.approx((0, 0, 0, 0.5, 0))  # kept from the one pass
    for qid in ids[:2]:  # 1 appeared twice, 2 never: both asked alone
        assert judgement.answers[qid].probabilities == pytest.approx(FALLBACK)
    assert _asked_alone(server) == sorted(ids[:2])
    assert judgement.extra["fallback_questions"] == "2"
    assert judgement.provenance.calls == 3
    assert judgement.provenance.prompt_tokens == 100 + 2 * 80 and judgement.provenance.completion_tokens == 16 + 2
    assert judgement.provenance.cached_prompt_tokens == 120  # two fallbacks reporting 60 cached tokens each


def test_an_answer_without_top_logprobs_falls_back_alone() -> None:
    multi = _completion(_line(1, "2", {"2": 0.8}) + _line(2, "3", {}) + _line(3, "4", {"4": 0.5}))
    judgement, server = _run(multi)
    assert _asked_alone(server) == [QUESTIONS[1].id]
    assert judgement.answers[QUESTIONS[1].id].probabilities == pytest.approx(FALLBACK)
    assert judgement.answers[QUESTIONS[0].id].probabilities == pytest.approx((0, 0.8, 0, 0, 0))


@pytest.mark.parametrize("answer_format", ["lines", "grammar", "json_schema"])
def test_a_reply_that_cannot_be_read_at_all_falls_back_for_every_question(answer_format: str) -> None:
    judgement, server = _run(_completion([("I", {}), (" cannot", {}), (" say", {})]), answer_format)
    assert len(server.received) == 1 + len(QUESTIONS)
    assert _asked_alone(server) == sorted(q.id for q in QUESTIONS)
    assert all(judgement.answers[q.id].probabilities == pytest.approx(FALLBACK) for q in QUESTIONS)
    assert judgement.extra["fallback_questions"] == str(len(QUESTIONS))


def test_an_answer_glued_to_its_number_is_not_read_at_the_wrong_token() -> None:
    multi = _completion([("1", {}), (":5", {"5": 0.9}), ("\n", {})] + _line(2, "1", {"1": 0.4}) + _line(3, "1", {"1": 0.4}))
    judgement, server = _run(multi)
    assert judgement.answers[QUESTIONS[0].id].probabilities == pytest.approx(FALLBACK)
    assert judgement.extra["fallback_questions"] == "1"


def test_json_keys_in_another_order_are_assigned_by_key_and_an_extra_key_is_ignored() -> None:
    multi = _completion(
        _json_reply(
            [
                ("3", "1", {"1": 0.9}),
                ("extra", "2", {"2": 1.0}),
                ("1", "5", {"5": 0.6}),
                ("4", "2", {"2": 1.0}),
                ("2", "2", {"2": 0.3, '"3': 0.1}),
            ]
        )
    )
    judgement, server = _run(multi, "json_schema")
    ids = [q.id for q in QUESTIONS]
    assert [judgement.answers[i].probabilities for i in ids] == [
        pytest.approx((0, 0, 0, 0, 0.6)),
        pytest.approx((0, 0.3, 0.1, 0, 0)),
        pytest.approx((0.9, 0, 0, 0, 0)),
    ]
    assert len(server.received) == 1 and judgement.extra["fallback_questions"] == "0"
    assert judgement.extra["answer_format"] == "json_schema"


def test_a_missing_json_key_falls_back_alone_and_the_rest_is_kept() -> None:
    multi = _completion(_json_reply([("1", "5", {"5": 0.6}), ("3", "1", {"1": 0.9})]))
    judgement, server = _run(multi, "json_schema")
    assert _asked_alone(server) == [QUESTIONS[1].id]
    assert judgement.answers[QUESTIONS[1].id].probabilities == pytest.approx(FALLBACK)
    assert judgement.answers[QUESTIONS[2].id].probabilities == pytest.approx((0.9, 0, 0, 0, 0))
    assert judgement.extra["fallback_questions"] == "1" and judgement.provenance.calls == 2


@pytest.mark.parametrize("cached, expected", [(None, 0), (0, 0), (300, 300)])
def test_cached_prompt_tokens_are_read_from_the_usage_details(cached: int | None, expected: int) -> None:
    """Double: an OpenAI-shaped usage body with ``prompt_tokens_details.cached_tokens`` (llama-cpp-python's
    server never reports it, see the real-server test below)."""
    multi = _completion(
        _line(1, "5", {"5": 0.6}) + _line(2, "2", {"2": 0.3}) + _line(3, "1", {"1": 0.9}), prompt_tokens=400, cached=cached
    )
    judgement, _ = _run(multi)
    assert judgement.provenance.cached_prompt_tokens == expected and judgement.provenance.prompt_tokens == 400


def _reply_tokens(reply: Reply) -> list[dict[str, Any]]:
    return list(json.loads(reply.body)["choices"][0]["logprobs"]["content"])


def _assert_distribution(answer: Answer, question: Question) -> None:
    assert len(answer.probabilities) == question.n_options
    assert all(0.0 <= p <= 1.0 for p in answer.probabilities) and 0.0 < answer.covered_mass <= 1.0 + 1e-6


@pytest.fixture(scope="module")
def real_conversation() -> Conversation:
    """A real LLM-Rubric conversation (7 turns, 2.8k characters: ~680 tokens for Gemma, near the corpus median)."""
    return load_real_conversations(LLM_RUBRIC / "real_data.json")[REAL_CONVERSATION_ID]


@pytest.mark.slow
@pytest.mark.parametrize(
    "answer_format, grammar, form",
    [
        ("grammar", answer_grammar, r"1: [1-5]\n2: [1-5]\n3: [1-5]\n"),
        ("sequence", sequence_grammar, r"[1-5][1-5][1-5]"),
    ],
)
def test_constrained_modes_answer_every_question_in_one_call_on_the_real_server(
    llama_server: LlamaServer, real_conversation: Conversation, answer_format: str, grammar: Any, form: str
) -> None:
    with ScriptedServer(lambda i, r: forward(_upstream(llama_server), r)) as proxy:
        judge = _judge(
            proxy.url + "/v1",
            llama_server,
            questions_per_call=len(QUESTIONS),
            answer_format=answer_format,
            extra_body={"repeat_penalty": 1.0},
        )
        one_pass = judge.judge(real_conversation, QUESTIONS)
        alone = _judge(proxy.url + "/v1", llama_server).judge(real_conversation, QUESTIONS)
    assert one_pass.provenance.calls == 1 and one_pass.extra["fallback_questions"] == "0"
    assert json.loads(proxy.received[0].body)["grammar"] == grammar(QUESTIONS)
    reply = "".join(t["token"] for t in _reply_tokens(proxy.replies[0]))
    assert re.fullmatch(form, reply), reply
    # Same structure as asking each question alone. Gemma 270M is a base model: its distributions move with
    # the prompt around them (measured on this conversation: total variation 0.8 on average between the two
    # modes' renormalised answers), so only the structure is compared, not the values or the labels.
    for q in QUESTIONS:
        _assert_distribution(one_pass.answers[q.id], q)
        _assert_distribution(alone.answers[q.id], q)
    # The cost goal: every question in one pass for < 1.5x the prompt tokens of one single-question call.
    one_call = alone.provenance.prompt_tokens / alone.provenance.calls
    assert one_pass.provenance.prompt_tokens < 1.5 * one_call, (one_pass.provenance.prompt_tokens, one_call)


@pytest.mark.slow
def test_llama_cpp_python_reports_no_cached_prompt_tokens(llama_server: LlamaServer) -> None:
    """llama-cpp-python reuses the longest common prompt prefix of consecutive calls but reports only
    prompt/completion/total tokens: cached_prompt_tokens stays 0 (OpenAI-shaped details are tested above)."""
    with ScriptedServer(lambda i, r: forward(_upstream(llama_server), r)) as proxy:
        judgement = _judge(proxy.url + "/v1", llama_server, max_concurrency=1).judge(CONVERSATION, QUESTIONS[:2])
    usages = [json.loads(r.body)["usage"] for r in proxy.replies.values()]
    assert len(usages) == 2 and all(set(u) == {"prompt_tokens", "completion_tokens", "total_tokens"} for u in usages)
    assert judgement.provenance.cached_prompt_tokens == 0


@pytest.mark.slow
def test_json_mode_reads_each_answer_by_its_key_on_the_real_server(llama_server: LlamaServer) -> None:
    """llama-cpp-python takes a schema as ``{"type": "json_object", "schema": ...}``, sent through ``extra_body``."""
    schema_format = {"type": "json_object", "schema": answer_json_schema(QUESTIONS)}
    with ScriptedServer(lambda i, r: forward(_upstream(llama_server), r)) as proxy:
        judge = _judge(
            proxy.url + "/v1",
            llama_server,
            questions_per_call=len(QUESTIONS),
            answer_format="json_schema",
            extra_body={"repeat_penalty": 1.0, "response_format": schema_format},
        )
        judgement = judge.judge(CONVERSATION, QUESTIONS)
    assert judgement.provenance.calls == 1 and judgement.extra["fallback_questions"] == "0"
    assert json.loads(proxy.received[0].body)["response_format"] == schema_format
    content = _reply_tokens(proxy.replies[0])
    reply = json.loads("".join(t["token"] for t in content))
    assert set(reply) == {"1", "2", "3"}
    # Independent walk: the answer token is the first token after '"<i>":' that holds more than quotes and spaces.
    for number, q in enumerate(QUESTIONS, start=1):
        text, after_key = "", None
        for index, token in enumerate(content):
            if after_key is None and re.search(rf'"{number}"\s*:\s*"?$', text + token["token"]):
                after_key = index
            elif after_key is not None and token["token"].strip(' "'):
                break
            text += token["token"]
        assert token["token"].strip(' "') == reply[str(number)]
        _assert_distribution(judgement.answers[q.id], q)
        assert judgement.answers[q.id].probabilities == pytest.approx(
            _expected(token["top_logprobs"], q.option_keys, ' "'), abs=1e-12
        )


@pytest.mark.slow
def test_llama_cpp_python_rejects_the_openai_json_schema_shape(llama_server: LlamaServer) -> None:
    """Measured: llama-cpp-python's request model admits only response_format types "text" and "json_object" and
    answers the OpenAI ``json_schema`` shape with a 500, which the judge treats as an outage."""
    judge = _judge(llama_server.url, llama_server, questions_per_call=len(QUESTIONS), answer_format="json_schema")
    with pytest.raises(JudgeUnavailable, match="500"):
        judge.judge(CONVERSATION, QUESTIONS)


# ---------------------------------------------------------------- prompt reuse (judge.prompt_reuse)


def _kinds(proxy: ScriptedServer) -> list[str]:
    """Each request in arrival order: "reset" or the id of the question it asks."""
    out = []
    for request in proxy.received:
        content = json.loads(request.body)["messages"][0]["content"]
        out.append("reset" if content == RESET_PROMPT else next(q.id for q in QUESTIONS if q.text in content))
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("any", ["answers", "rude", "code"]),
        ("within_conversation", ["reset", "answers", "rude", "code"]),
        ("none", ["reset", "answers", "reset", "rude", "reset", "code"]),
    ],
)
def test_limited_prompt_reuse_resets_the_server_and_asks_one_question_at_a_time(
    llama_server: LlamaServer, mode: str, expected: list[str]
) -> None:
    with ScriptedServer(lambda i, r: forward(_upstream(llama_server), r)) as proxy:
        judge = _judge(proxy.url + "/v1", llama_server, max_concurrency=3, prompt_reuse=mode)
        judgement = judge.judge(CONVERSATION, QUESTIONS)
        kinds = _kinds(proxy)
        if mode == "any":
            assert sorted(kinds) == sorted(expected)  # concurrent: any order
        else:
            assert kinds == expected and proxy.max_in_flight == 1
    assert judgement.extra["prompt_reuse"] == mode and judgement.extra["reset_calls"] == str(expected.count("reset"))
    assert judgement.provenance.calls == len(QUESTIONS)  # resets are not judge calls
    assert judge_identity(judge).endswith("" if mode == "any" else f"|reuse={mode}")


@pytest.mark.slow
def test_without_prompt_reuse_an_answer_does_not_depend_on_what_was_asked_before(llama_server: LlamaServer) -> None:
    """The same question about the same conversation, once after another conversation and once after another
    question of its own: with prompt_reuse="none" the probabilities are identical to the last bit. (Gemma 270M
    happens to give identical answers here with reuse too; the jitter reuse causes is measured on the Qwen judge
    by bench/judge_jitter.py.)"""
    judge = _judge(llama_server.url, llama_server, max_concurrency=1, prompt_reuse="none")
    judge.judge(OTHER_CONVERSATION, QUESTIONS[:1])
    first = judge.judge(CONVERSATION, QUESTIONS[:1]).answers[QUESTIONS[0].id]
    judge.judge(CONVERSATION, QUESTIONS[1:2])
    second = judge.judge(CONVERSATION, QUESTIONS[:1]).answers[QUESTIONS[0].id]
    assert first.probabilities == second.probabilities


def test_an_unknown_prompt_reuse_is_refused() -> None:
    with pytest.raises(ValueError, match="prompt_reuse"):
        OpenAIJudge(base_url="http://127.0.0.1:9/v1", model="m", prompt_reuse="sometimes")  # type: ignore[arg-type]
