"""A judge behind any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, llama.cpp server, ...).

Answer distributions come from token log-probabilities, not from the reply
text: the request asks for ``logprobs=True, top_logprobs=k`` at temperature 0,
and an option's probability is read at the *answer position*.

Option matching. An option's probability is the sum of ``exp(logprob)`` over
the top-k entries at the answer position whose token text, stripped of
whitespace (and of quotes in JSON replies), equals the option key; so ``"1"``
and ``" 1"`` both count for key ``"1"`` (distinct tokens are disjoint events,
so the sum is a probability). Options absent from the top-k get 0 and nothing
is renormalised: the mass the options failed to cover stays visible
(`Answer.covered_mass`). Every returned alternative is used, even past k
(llama.cpp appends the sampled token). A key must be one token for the model;
a key its tokenizer splits (e.g. ``"10"`` into ``"1"``, ``"0"``) cannot be
read at one position (in a JSON reply it is unreadable and asked alone; in a
line it would be credited to whichever key matches its first token).

Modes. ``questions_per_call=1`` asks each question in its own call
(`single_question_prompt`; ``max_tokens=1``; the answer position is the first
generated token). ``questions_per_call=n>1`` asks batches of n questions per
call (`multi_question_prompt`; all questions of a conversation in one call
when n is at least their number); batches of one conversation run in
parallel threads. How the reply is asked for and held to its form is
``answer_format`` (`scorers.judges.answer_format` builds the constraints and
finds each answer's position in the returned tokens):

* ``"lines"`` (default): one line ``<i>: <answer>`` per question, unconstrained;
* ``"grammar"``: the same lines, held to exactly that form by a llama.cpp GBNF
  grammar built from the batch's questions (request field ``grammar``);
* ``"sequence"``: only the answers, one option key per question in order, held
  to that by a grammar: one generated token per answer (the cheapest reply);
* ``"json_schema"``: one JSON object ``{"<i>": "<answer>"}``, held to a schema
  built from the questions by an OpenAI structured-outputs ``response_format``.

Constraints act on sampling only: the logprobs llama.cpp returns stay the
model's own distribution. ``extra_body`` merges into every request and wins
over the built constraint (e.g. llama-cpp-python's server rejects the OpenAI
``json_schema`` shape and needs ``{"response_format": {"type": "json_object",
"schema": answer_json_schema(questions)}}``; vLLM takes ``guided_json``).

Never mis-assigned, never lost: an answer is taken only from the line or key
carrying its question's number, never from its place in the reply. A question
whose answer cannot be read (missing, its number twice, empty, not one token at
a token boundary, no top_logprobs at its position) is asked again alone with
the single-question prompt; a reply that cannot be read at all falls back for
every question. The transcript comes first in every prompt, so server-side
prompt caches (llama.cpp slot reuse, vLLM prefix caching, OpenAI prompt
caching) serve the repeated prefix. The count is
``Judgement.extra["fallback_questions"]``, and the fallback calls are in
``Provenance.calls`` and its token counts. Cached prompt tokens the server
reports (``usage.prompt_tokens_details.cached_tokens``; OpenAI and vLLM do,
llama-cpp-python's server does not) are summed into
``Provenance.cached_prompt_tokens``, 0 when none are reported.

Prompt reuse (``prompt_reuse``). A server that keeps the last prompt's KV
cache (llama.cpp) evaluates only the part of a new prompt past the prefix it
shares with the last one, and the result differs in the last decimals with
where that split falls: the same question about the same conversation gets
slightly different probabilities depending on what was asked before.
``"any"`` (default) lets it reuse whatever it has. ``"none"`` makes every
answer a function of its prompt alone: before each question the judge sends a
one-token *reset* request (a fixed prompt, so the server's state is the same
before every question), and requests go one at a time across all threads of
this judge; it costs a full prompt evaluation per question, like a server
without a cache. ``"within_conversation"`` resets once per conversation and
asks its questions in order, one at a time, so the prefix is reused within a
conversation but never across. The mode is ``Judgement.extra["prompt_reuse"]``
and part of the answer cache's judge identity; reset requests are counted in
``extra["reset_calls"]``, not in the provenance's calls and tokens.
docs/judge-cost.md has the measured jitter of each mode.

Failures. 429, 408, 5xx, timeouts and connection errors are retried with
exponential backoff and full jitter (delay before retry r is uniform in
``[0, min(backoff_max_s, backoff_initial_s * 2**r)]``), at most
``max_retries`` times, then `JudgeUnavailable`. The openai client's own
retries are disabled so this is the only policy. Not retried: 401/403
(`JudgeAuthError`), 404 or a ``model_not_found`` error code
(`JudgeModelNotFound`), other 4xx (`JudgeError`), and unusable replies
(`JudgeReplyError`): at temperature 0 the same request yields the same reply,
so retrying a malformed one would only spend another call (the loop is
`scorers.openai_chat.ChatEndpoint`, shared with `OpenAIGenerator`). One semaphore per
judge instance caps requests in flight across all threads using it. The API
key is handed to the client and never put in messages, logs or ``repr``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from openai.types.chat import ChatCompletion
from openai.types.chat.chat_completion_token_logprob import ChatCompletionTokenLogprob, TopLogprob

from scorers.conversation import Conversation, render_transcript
from scorers.judges.answer_format import ANSWER_FORMATS, AnswerFormat, answer_padding, constraint_fields, read_reply
from scorers.judges.base import (
    Answer,
    JudgeAuthError,
    JudgeError,
    Judgement,
    JudgeModelNotFound,
    JudgeReplyError,
    JudgeUnavailable,
    Provenance,
    reply_errors_as_judge_errors,
)
from scorers.judges.prompt import (
    MULTI_PROMPT_VERSION,
    PROMPT_VERSION,
    ReplyForm,
    multi_question_prompt,
    numbered_order,
    single_question_prompt,
)
from scorers.openai_chat import ChatEndpoint, ChatErrors, require, server_detail
from scorers.questions import Question

log = logging.getLogger(__name__)

JUDGE_NAME = "openai"
PromptReuse = Literal["any", "within_conversation", "none"]
PROMPT_REUSE: tuple[PromptReuse, ...] = ("any", "within_conversation", "none")
RESET_PROMPT = "Reply with one word."  # the fixed prompt of reset requests (module docstring, "Prompt reuse")
MAX_TOP_LOGPROBS = 20  # the OpenAI API's limit
SINGLE_MAX_TOKENS = 1
# A line "12: 3\n" is ~5 tokens, a JSON member ' "12": "3",' ~7, a sequence answer 1; the slack lets a model
# add a few stray tokens.
TOKENS_PER_ANSWER = 10
MULTI_EXTRA_TOKENS = 8
_ERRORS = ChatErrors(
    role="judge",
    unavailable=JudgeUnavailable,
    auth=JudgeAuthError,
    model_not_found=JudgeModelNotFound,
    rejected=JudgeError,
    reply=JudgeReplyError,
)
_REPLY_FORMS: dict[AnswerFormat, ReplyForm] = {"json_schema": "json", "sequence": "sequence"}  # the others: "lines"
_Reading = tuple[tuple[Answer, ...], tuple[Question, ...]]  # answers read, questions to ask again alone


@dataclass(frozen=True)
class _BatchResult:
    answers: tuple[Answer, ...]
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int
    attempts: int
    unread: tuple[Question, ...] = ()  # questions whose answer could not be read: asked again alone
    resets: int = 0  # reset requests sent before it (prompt_reuse="none")


def option_probabilities(top: Sequence[TopLogprob], option_keys: Sequence[str], pad: str | None = None) -> tuple[float, ...]:
    """Probability of each option key among the top-k alternatives at one position (module docstring rule);
    ``pad``: the characters stripped from a token before matching (None: whitespace)."""
    index = {key: i for i, key in enumerate(option_keys)}
    mass = [0.0] * len(option_keys)
    for alt in top:
        i = index.get(alt.token.strip(pad))
        if i is not None:
            mass[i] += math.exp(alt.logprob)
    return tuple(mass)


def _token_count(value: object) -> int:
    """A token count from a reply's usage: a non-negative int (a bool, float, string or negative number: ValueError)."""
    if type(value) is not int or value < 0:
        raise ValueError(f"usage token count must be a non-negative integer, got {value!r}")
    return value


class OpenAIJudge:
    """Answers questions through an OpenAI-compatible ``/chat/completions`` endpoint with logprobs."""

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str | None = None,
        questions_per_call: int = 1,
        top_logprobs: int = 20,
        max_concurrency: int = 4,
        max_calls_per_conversation: int | None = None,
        max_retries: int = 5,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        timeout_s: float = 60.0,
        max_transcript_chars: int | None = 24_000,
        extra_body: Mapping[str, Any] | None = None,
        answer_format: AnswerFormat = "lines",
        name: str = JUDGE_NAME,
        rng: random.Random | None = None,
        prompt_reuse: PromptReuse = "any",
    ) -> None:
        """``answer_format`` says how multi-question replies are asked for and constrained (module docstring:
        ``"lines"``, ``"grammar"``, ``"json_schema"``); ``extra_body`` adds server-specific JSON fields to every
        request and wins over the constraint fields of ``answer_format`` (e.g. vLLM's ``guided_regex``);
        ``rng`` seeds the backoff jitter."""
        self.endpoint = ChatEndpoint(
            base_url=base_url,
            model=model,
            errors=_ERRORS,
            log=log,
            api_key=api_key,
            timeout_s=timeout_s,
            max_retries=max_retries,
            backoff_initial_s=backoff_initial_s,
            backoff_max_s=backoff_max_s,
            rng=rng,
        )
        self._api_key = api_key or ""  # removed from what a reply's error message quotes (`_scrub`)
        require(questions_per_call >= 1, "questions_per_call", questions_per_call, ">= 1")
        require(answer_format in ANSWER_FORMATS, "answer_format", answer_format, f"one of {ANSWER_FORMATS}")
        require(1 <= top_logprobs <= MAX_TOP_LOGPROBS, "top_logprobs", top_logprobs, f"in 1..{MAX_TOP_LOGPROBS}")
        require(max_concurrency >= 1, "max_concurrency", max_concurrency, ">= 1")
        per_conversation = max_concurrency if max_calls_per_conversation is None else max_calls_per_conversation
        require(per_conversation >= 1, "max_calls_per_conversation", max_calls_per_conversation, ">= 1")
        # Of the max_concurrency calls in flight, one conversation's take at most this many: a conversation whose
        # answers are slow cannot hold every slot and stop the conversations scored beside it (issue 54).
        self.max_calls_per_conversation = min(per_conversation, max_concurrency)
        require(prompt_reuse in PROMPT_REUSE, "prompt_reuse", prompt_reuse, f"one of {PROMPT_REUSE}")
        self.prompt_reuse = prompt_reuse
        self._in_order = threading.Lock()  # held around a conversation's or a question's requests when reuse is limited
        self.name = name
        self.base_url = base_url
        self.model = model
        self.questions_per_call = questions_per_call
        self.top_logprobs = top_logprobs
        self.max_concurrency = max_concurrency
        self.max_transcript_chars = max_transcript_chars
        self.extra_body = dict(extra_body or {})
        self.answer_format = answer_format
        self._slots = threading.BoundedSemaphore(max_concurrency)

    def __repr__(self) -> str:
        return (
            f"OpenAIJudge(base_url={self.base_url!r}, model={self.model!r}, "
            f"questions_per_call={self.questions_per_call}, max_concurrency={self.max_concurrency})"
        )

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self.endpoint.close()

    def __enter__(self) -> OpenAIJudge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def judge(self, conversation: Conversation, questions: Sequence[Question]) -> Judgement:
        """Answer every question about ``conversation``; raise a `JudgeError` on failure."""
        questions = tuple(questions)
        ids = [q.id for q in questions]
        if len(set(ids)) != len(ids):
            raise ValueError(f"question ids must be unique, got {ids}")
        transcript = render_transcript(conversation, max_chars=self.max_transcript_chars)
        size = self.questions_per_call
        batches = [questions[i : i + size] for i in range(0, len(questions), size)]
        started = time.perf_counter()
        resets = 0
        with self._in_order if self.prompt_reuse != "any" else contextlib.nullcontext():
            if self.prompt_reuse == "within_conversation":
                resets += self._reset()
            results = self._run_batches(transcript, batches)
            unread = tuple(q for r in results for q in r.unread)
            if unread:  # asked again one by one: same transcript prefix, so server prompt caches apply
                log.info("judge %s: %d answer(s) unreadable in a multi-question reply, asked alone", self.model, len(unread))
                results += self._run_batches(transcript, [(q,) for q in unread], single=True)
        resets += sum(r.resets for r in results)
        latency = time.perf_counter() - started
        return Judgement(
            conversation_id=conversation.id,
            answers={a.question_id: a for r in results for a in r.answers},
            provenance=Provenance(
                judge=self.name,
                model=self.model,
                latency_s=latency,
                prompt_tokens=sum(r.prompt_tokens for r in results),
                completion_tokens=sum(r.completion_tokens for r in results),
                calls=len(results),
                cached_prompt_tokens=sum(r.cached_prompt_tokens for r in results),
            ),
            extra={
                "prompt_version": PROMPT_VERSION if size == 1 else f"{PROMPT_VERSION}+{MULTI_PROMPT_VERSION}",
                "questions_per_call": str(size),
                "answer_format": self.answer_format,
                "attempts": str(sum(r.attempts for r in results)),
                "fallback_questions": str(len(unread)),
                "prompt_reuse": self.prompt_reuse,
                "reset_calls": str(resets),
            },
        )

    def _run_batches(self, transcript: str, batches: Sequence[tuple[Question, ...]], single: bool = False) -> list[_BatchResult]:
        if len(batches) <= 1 or self.prompt_reuse != "any":  # limited reuse: in order, one at a time
            return [self._ask(transcript, b, single) for b in batches]
        workers = min(self.max_calls_per_conversation, len(batches))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="openai-judge") as pool:
            futures = [pool.submit(self._ask, transcript, b, single) for b in batches]
            try:
                return [f.result() for f in futures]
            except BaseException:
                for f in futures:
                    f.cancel()
                raise

    def _ask(self, transcript: str, batch: tuple[Question, ...], single: bool = False) -> _BatchResult:
        """One call. ``single`` (or ``questions_per_call == 1``): the single-question prompt, answer at token 0."""
        single = single or self.questions_per_call == 1
        if single:
            prompt, max_tokens, extra_body = single_question_prompt(transcript, batch[0]), SINGLE_MAX_TOKENS, self.extra_body
        else:
            # Batches of one judge always use the multi-question prompt, even a short last batch,
            # so a question's prompt format depends on the configuration only.
            reply = _REPLY_FORMS.get(self.answer_format, "lines")
            batch = numbered_order(batch)  # the prompt, the constraint and the reading all number them this way
            prompt = multi_question_prompt(transcript, batch, reply)
            max_tokens = TOKENS_PER_ANSWER * len(batch) + MULTI_EXTRA_TOKENS
            extra_body = {**constraint_fields(self.answer_format, batch), **self.extra_body}
        # The boundary of issue 54: whatever shape the reply has, only a JudgeError leaves (`reply_errors_as_judge_errors`).
        with reply_errors_as_judge_errors(f"judge {self.model!r} at {self.base_url}", self._scrub):
            resets = self._reset() if self.prompt_reuse == "none" else 0
            completion, attempts = self._complete(prompt, max_tokens, extra_body)
            content = self._token_logprobs(completion)
            answers, unread = self._single_answer(content, batch[0]) if single else self._multi_answers(content, batch)
            usage = completion.usage
            details = getattr(usage, "prompt_tokens_details", None) if usage else None
            return _BatchResult(
                answers=answers,
                prompt_tokens=_token_count(usage.prompt_tokens if usage else 0),
                completion_tokens=_token_count(usage.completion_tokens if usage else 0),
                cached_prompt_tokens=_token_count(getattr(details, "cached_tokens", None) or 0),
                attempts=attempts,
                unread=unread,
                resets=resets,
            )

    def _single_answer(self, content: Sequence[ChatCompletionTokenLogprob], question: Question) -> _Reading:
        """The first token's distribution; without top_logprobs there is nothing to fall back to: an error."""
        top = content[0].top_logprobs
        if not top:
            raise JudgeReplyError(
                f"judge {self.model!r} returned no top_logprobs at the answer to {question.id!r}; "
                "the endpoint must support top_logprobs"
            )
        return (Answer(question_id=question.id, probabilities=option_probabilities(top, question.option_keys)),), ()

    def _multi_answers(self, content: Sequence[ChatCompletionTokenLogprob], batch: Sequence[Question]) -> _Reading:
        """The answers readable by their number, and the questions to ask again alone."""
        reading = read_reply(self.answer_format, [t.token for t in content], batch)
        if reading.unreadable:
            log.debug("judge %s: unreadable answers %s", self.model, reading.unreadable)
        positions = reading.positions
        pad = answer_padding(self.answer_format)
        answers, unread = [], []
        for number, q in enumerate(batch, start=1):
            pos = positions.get(number)
            top = content[pos].top_logprobs if pos is not None else None
            if top:
                answers.append(Answer(question_id=q.id, probabilities=option_probabilities(top, q.option_keys, pad)))
            else:
                unread.append(q)
        return tuple(answers), tuple(unread)

    def _token_logprobs(self, completion: ChatCompletion) -> list[ChatCompletionTokenLogprob]:
        if not completion.choices:
            raise JudgeReplyError(f"judge {self.model!r} replied with no choices")
        logprobs = completion.choices[0].logprobs
        content = logprobs.content if logprobs is not None else None
        if not content:
            raise JudgeReplyError(
                f"judge {self.model!r} replied without token logprobs; the endpoint must support logprobs=True with top_logprobs"
            )
        return list(content)

    def _scrub(self, text: str) -> str:
        """``text`` (from a reply) fit for an error message: `server_detail` with this judge's API key."""
        return server_detail(text, self._api_key)

    def _reset(self) -> int:
        """The reset request of limited prompt reuse (module docstring): one token of a fixed prompt. Returns 1."""
        with reply_errors_as_judge_errors(f"judge {self.model!r} at {self.base_url}", self._scrub):
            self.endpoint.complete({"messages": [{"role": "user", "content": RESET_PROMPT}], "temperature": 0, "max_tokens": 1})
        return 1

    def _complete(self, prompt: str, max_tokens: int, extra_body: Mapping[str, Any]) -> tuple[ChatCompletion, int]:
        """One chat completion under the retry policy; returns it and the number of attempts."""
        return self.endpoint.complete(
            {
                "messages": [{"role": "user", "content": prompt}],
                "temperature": 0,
                "max_tokens": max_tokens,
                "logprobs": True,
                "top_logprobs": self.top_logprobs,
                "extra_body": dict(extra_body) or None,
            },
            slots=self._slots,
        )
