"""An OpenAI-compatible judge endpoint that answers from recorded answer distributions, and can be made to fail.

The fault suite needs a judge whose outages are real (the worker's HTTP judge
sees a refused connection, 5xx replies, replies slower than its timeout) and
whose answers are the recorded GPT-3.5 ones, for conversations renamed at will
(a 1,000-conversation replay is built from the 223 real LLM-Rubric ones). So
answers are looked up by the *prompt*: every single-question prompt the judge
can send (the same `scorers.judges.prompt` text the `OpenAIJudge` builds) for
every recorded conversation and question, whatever the conversation is called.
A prompt it does not know gets HTTP 400 with the reason, so a test cannot pass
on answers the server made up.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

from scorers.conversation import Conversation, render_transcript
from scorers.judges.prompt import single_question_prompt
from scorers.questions import Question

Mode = Literal["answer", "refuse", "error", "slow"]


class RecordedJudgeServer:
    """``/v1/chat/completions`` on 127.0.0.1:``port``; `set_mode` switches between answering and failing.

    ``refuse`` closes the listening socket (clients get connection refused),
    ``error`` replies 503, ``slow`` answers after ``slow_s`` seconds.
    """

    def __init__(
        self,
        port: int,
        conversations: Iterable[Conversation],
        questions: Iterable[Question],
        table: Mapping[tuple[str, str], tuple[float, ...]],
        max_transcript_chars: int,
        slow_s: float = 10.0,
    ) -> None:
        self.port, self.slow_s = port, slow_s
        questions = list(questions)
        self.answers: dict[str, tuple[Question, tuple[float, ...]]] = {}
        for conversation in conversations:
            transcript = render_transcript(conversation, max_chars=max_transcript_chars)
            for q in questions:
                probs = table.get((conversation.id, q.id))
                if probs is not None:
                    self.answers[single_question_prompt(transcript, q)] = (q, probs[: q.n_options])
        self.mode: Mode = "answer"
        self.requests: dict[str, int] = {}
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None

    # ------------------------------------------------------------ lifecycle

    def __enter__(self) -> RecordedJudgeServer:
        self._listen()
        return self

    def __exit__(self, *exc: object) -> None:
        self._close()

    def set_mode(self, mode: Mode) -> None:
        """Answer, or fail in one of the ways a judge server fails."""
        with self._lock:
            self.mode = mode
        if mode == "refuse":
            self._close()
        elif self._httpd is None:
            self._listen()

    def _listen(self) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, reply = server._reply(body)
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the judge gave up waiting (a slow reply): what a real server sees too

            def log_message(self, *args: object) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._httpd.serve_forever, daemon=True, name="recorded-judge").start()

    def _close(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    # ------------------------------------------------------------ replies

    def _count(self, what: str) -> None:
        with self._lock:
            self.requests[what] = self.requests.get(what, 0) + 1

    def _reply(self, body: bytes) -> tuple[int, dict[str, Any]]:
        mode = self.mode
        if mode == "error":
            self._count("error")
            return 503, {"error": {"message": "the judge is overloaded (fault suite)"}}
        if mode == "slow":
            self._count("slow")
            time.sleep(self.slow_s)
        try:
            request = json.loads(body)
        except ValueError:  # a torn request: a worker killed (-9) while it sent it
            self._count("torn")
            return 400, {"error": {"message": "the request body is not JSON"}}
        prompt = request["messages"][-1]["content"]
        known = self.answers.get(prompt)
        if known is None:
            self._count("unknown")
            return 400, {"error": {"message": "no recorded answer for this prompt"}}
        self._count("answered")
        question, probs = known
        return 200, _completion(question, probs, int(request.get("top_logprobs") or 20))


def _completion(question: Question, probs: tuple[float, ...], top_k: int) -> dict[str, Any]:
    """A chat completion whose first token carries the recorded distribution as its top logprobs."""
    ranked = sorted(((p, key) for key, p in zip(question.option_keys, probs) if p > 0), reverse=True)[:top_k]
    top = [{"token": key, "logprob": math.log(p), "bytes": None} for p, key in ranked]
    return {
        "id": "recorded",
        "object": "chat.completion",
        "created": 0,
        "model": "recorded",
        "choices": [
            {
                "index": 0,
                "finish_reason": "length",
                "message": {"role": "assistant", "content": top[0]["token"]},
                "logprobs": {"content": [{**top[0], "top_logprobs": top}]},
            }
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": 1, "total_tokens": 1},
    }
