"""Sentence embeddings (packaged all-MiniLM-L6-v2) and semantic de-duplication, on real sentences.

`test_similarity_cut_separates_the_measured_pairs` re-runs the measurement the
cut in `scorers.learning.embeddings` was chosen on (the pairs below); if the model, the
pooling or the cut changes, it fails and the cut must be measured again.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from scorers.learning.embeddings import (
    EMBEDDING_DIM,
    SIMILARITY_CUT,
    EmbeddingModelError,
    SentenceEmbedder,
    deduplicate,
    deduplicate_vectors,
    packaged_model_dir,
)

PARAPHRASE_PAIRS = [
    ("The assistant gives a working code fix.", "The assistant provides a code fix that works."),
    ("The assistant repeats generic advice.", "The assistant keeps giving the same general suggestions."),
    ("The assistant answers the user's question directly.", "The assistant responds directly to what the user asked."),
    ("The user thanks the assistant.", "The user expresses gratitude to the assistant."),
    ("The assistant asks a clarifying question.", "The assistant asks the user to clarify the request."),
    ("The assistant ignores the user's request.", "The assistant disregards what the user asked for."),
    ("The assistant gives incorrect information.", "The assistant provides wrong information."),
    ("The assistant books the restaurant the user wants.", "The assistant makes the restaurant reservation the user asked for."),
    ("The user has to repeat the request several times.", "The user must restate the request multiple times."),
    ("The assistant contradicts its earlier statement.", "The assistant says something that conflicts with what it said before."),
    ("The assistant gives an overly long answer.", "The assistant's answer is much longer than necessary."),
    ("The assistant is rude to the user.", "The assistant treats the user impolitely."),
    ("The assistant confirms the booking details.", "The assistant confirms the details of the reservation."),
    ("The assistant provides the requested phone number.", "The assistant gives the user the phone number they asked for."),
    ("The assistant fails to find a matching train.", "The assistant cannot find a train that matches."),
    ("The user gets the information they need.", "The user obtains the information they were looking for."),
]
# Same polarity, same topic, different claims: what de-duplication must keep apart.
DISTINCT_PAIRS = [
    ("The assistant gives incorrect information.", "The assistant ignores the user's request."),
    ("The assistant repeats generic advice.", "The assistant gives an overly long answer."),
    ("The assistant answers the user's question directly.", "The assistant offers useful alternatives."),
    ("The user thanks the assistant.", "The user gets the information they need."),
    ("The assistant asks a clarifying question.", "The assistant confirms the booking details."),
    ("The assistant books the restaurant the user wants.", "The assistant recommends a restaurant in the requested area."),
    ("The user has to repeat the request several times.", "The user changes the request halfway through."),
    ("The assistant contradicts its earlier statement.", "The assistant gives incorrect information."),
    ("The assistant is rude to the user.", "The assistant ignores the user's request."),
    ("The assistant provides the requested phone number.", "The assistant provides the opening hours of the venue."),
    ("The assistant fails to find a matching train.", "The assistant books the wrong train."),
    ("The assistant provides a reference number for the booking.", "The assistant provides the address of the hotel."),
    ("The assistant asks for information the user already gave.", "The assistant asks too many questions."),
    ("The assistant gives a working code fix.", "The assistant explains the cause of the error."),
    ("The assistant ends the conversation politely.", "The assistant greets the user warmly."),
    ("The assistant misunderstands the user's request.", "The assistant provides wrong information."),
]
# Opposite claims (different polarity): never compared by de-duplication, measured for context.
OPPOSITE_PAIRS = [
    ("The assistant gives a working code fix.", "The assistant gives a code fix that does not work."),
    ("The assistant gives an overly long answer.", "The assistant gives a concise answer."),
    ("The user thanks the assistant.", "The user complains about the assistant."),
    ("The assistant is rude to the user.", "The assistant shows empathy for the user's problem."),
]


@pytest.fixture(scope="module")
def embedder() -> SentenceEmbedder:
    return SentenceEmbedder()


def _pair_cosines(embedder: SentenceEmbedder, pairs: list[tuple[str, str]]) -> np.ndarray:
    a = embedder.encode([p[0] for p in pairs])
    b = embedder.encode([p[1] for p in pairs])
    return (a.astype(np.float64) * b).sum(axis=1)


def test_embeddings_are_unit_length_384_d_and_deterministic(embedder: SentenceEmbedder) -> None:
    texts = ["The assistant gives a working code fix.", "The user thanks the assistant.", ""]
    vectors = embedder.encode(texts)
    assert vectors.shape == (3, EMBEDDING_DIM) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(vectors, embedder.encode(texts))
    assert embedder.encode([]).shape == (0, EMBEDDING_DIM)


def test_batching_does_not_change_embeddings() -> None:
    """Padding inside a batch must not leak into the mean pooling."""
    texts = ["Short.", "The assistant asks for information the user already gave several turns earlier."]
    one_by_one = SentenceEmbedder(batch_size=1).encode(texts)
    together = SentenceEmbedder(batch_size=8).encode(texts)
    np.testing.assert_allclose(one_by_one, together, atol=1e-5)


def test_embeddings_equal_the_sentence_transformers_reference(embedder: SentenceEmbedder) -> None:
    """The packaged model's own pipeline (sentence-transformers: Transformer, mean Pooling, Normalize)."""
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(packaged_model_dir()), device="cpu")
    texts = [a for a, _ in PARAPHRASE_PAIRS[:6]] + ["Hello"]
    expected = reference.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
    np.testing.assert_allclose(embedder.encode(texts), expected, atol=1e-5)


def test_paraphrases_are_close_and_unrelated_sentences_far(embedder: SentenceEmbedder) -> None:
    vectors = embedder.encode(
        [
            "The assistant gives incorrect information.",
            "The assistant provides wrong information.",
            "The train to Cambridge leaves at 9 am.",
        ]
    )
    sims = vectors.astype(np.float64) @ vectors.T.astype(np.float64)
    assert sims[0, 1] > 0.9
    assert sims[0, 2] < 0.2 and sims[1, 2] < 0.2


def test_similarity_cut_separates_the_measured_pairs(embedder: SentenceEmbedder) -> None:
    """The measurement of the module docstring: no distinct same-polarity claims merge, most paraphrases do."""
    paraphrases = _pair_cosines(embedder, PARAPHRASE_PAIRS)
    distinct = _pair_cosines(embedder, DISTINCT_PAIRS)
    opposite = _pair_cosines(embedder, OPPOSITE_PAIRS)
    assert distinct.max() < SIMILARITY_CUT, f"distinct claims merged: {distinct.round(3)}"
    assert (paraphrases >= SIMILARITY_CUT).sum() >= 14, f"paraphrases missed: {paraphrases.round(3)}"
    assert np.median(paraphrases) - np.median(distinct) > 0.15
    # Why de-duplication compares one polarity only: a claim and its opposite embed as close as paraphrases.
    assert opposite.max() > SIMILARITY_CUT


def test_deduplicate_keeps_the_first_of_each_paraphrase_group(embedder: SentenceEmbedder) -> None:
    texts = [
        "The assistant gives incorrect information.",  # 0 kept
        "The assistant ignores the user's request.",  # 1 kept
        "The assistant provides wrong information.",  # 2 paraphrase of 0
        "The assistant asks a clarifying question.",  # 3 kept
        "The assistant disregards what the user asked for.",  # 4 paraphrase of 1
        "The assistant asks the user to clarify the request.",  # 5 paraphrase of 3
        "The assistant contradicts its earlier statement.",  # 6 kept
        "The assistant gives incorrect information.",  # 7 exact copy of 0
    ]
    assert deduplicate(texts, embedder) == [0, 1, 3, 6]
    # Order decides which member of a group survives: reversed, the later phrasings are kept.
    reversed_texts = list(reversed(texts))
    assert [reversed_texts[i] for i in deduplicate(reversed_texts, embedder)] == [
        "The assistant gives incorrect information.",
        "The assistant contradicts its earlier statement.",
        "The assistant asks the user to clarify the request.",
        "The assistant disregards what the user asked for.",
    ]


def test_deduplicate_against_already_kept_texts(embedder: SentenceEmbedder) -> None:
    pool = ["The assistant provides wrong information.", "The user has to repeat the request several times."]
    new = [
        "The assistant gives incorrect information.",
        "The user must restate the request multiple times.",
        "The assistant is rude to the user.",
    ]
    assert deduplicate(new, embedder, already_kept=pool) == [2]
    assert deduplicate([], embedder, already_kept=pool) == []


def test_threshold_bounds_what_is_merged(embedder: SentenceEmbedder) -> None:
    texts = ["The assistant books the restaurant the user wants.", "The assistant recommends a restaurant in the requested area."]
    assert deduplicate(texts, embedder) == [0, 1]  # distinct claims (cosine ~0.70) survive the default cut
    assert deduplicate(texts, embedder, threshold=0.5) == [0]
    assert deduplicate(texts, embedder, threshold=1.0) == [0, 1]
    with pytest.raises(ValueError, match="threshold"):
        deduplicate(texts, embedder, threshold=1.5)


def test_deduplicate_vectors_is_greedy_in_order() -> None:
    e = np.eye(3)
    near0 = np.array([0.95, np.sqrt(1 - 0.95**2), 0.0])
    vectors = np.stack([e[0], near0, e[2], e[0]])
    assert deduplicate_vectors(vectors, 0.9) == [0, 2]
    assert deduplicate_vectors(vectors, 0.96) == [0, 1, 2]
    assert deduplicate_vectors(vectors, 0.9, already_kept=np.stack([e[2]])) == [0]


def test_bad_model_directory_and_bad_texts_are_clear_errors(embedder: SentenceEmbedder, tmp_path: Path) -> None:
    with pytest.raises(EmbeddingModelError, match="no config.json"):
        SentenceEmbedder(tmp_path)
    with pytest.raises(TypeError, match=r"texts\[1\]"):
        embedder.encode(["ok", 3])  # type: ignore[list-item]
