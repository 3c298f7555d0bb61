"""Prompts of rubric learning, in one versioned place (`rubric_learning`).

The judge's prompts live in `scorers.judges.prompt`.
"""

from scorers.prompts.rubric_learning import (
    EXTRACTION_PROMPT,
    PROMPT_VERSIONS,
    SUMMARISATION_PROMPT,
    extraction_prompt,
    summarisation_prompt,
)

__all__ = ["EXTRACTION_PROMPT", "PROMPT_VERSIONS", "SUMMARISATION_PROMPT", "extraction_prompt", "summarisation_prompt"]
