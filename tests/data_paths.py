"""Where the shared, human-labelled data lives: ``../shared/data`` beside the checkout."""

from pathlib import Path

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
LLM_RUBRIC = SHARED_DATA / "llm-rubric"
ABC_EVAL = SHARED_DATA / "abc-eval"
