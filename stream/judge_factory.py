"""Build the configured judge from settings (the one place that knows all backends)."""

from __future__ import annotations

from scorers.judges.base import Judge
from stream.settings import JudgeSettings, SettingsError


def judge_from_settings(settings: JudgeSettings, cache_dir) -> Judge:
    """Return the judge ``settings.backend`` names, or raise `SettingsError` saying what is missing."""
    if settings.backend == "recorded":
        from scorers.judges.recorded import RecordedJudge

        if settings.recorded_answers is None:
            raise SettingsError("judge.backend=recorded needs judge.recorded_answers (CONVOWATCH_JUDGE__RECORDED_ANSWERS)")
        return RecordedJudge.from_tsv(settings.recorded_answers)

    if settings.backend == "openai":
        from scorers.judges.openai_http import OpenAIJudge

        if settings.base_url is None or settings.model is None:
            missing = [name for name in ("base_url", "model") if getattr(settings, name) is None]
            raise SettingsError(
                "judge.backend=openai needs " + ", ".join(f"judge.{m} (CONVOWATCH_JUDGE__{m.upper()})" for m in missing)
            )
        return OpenAIJudge(
            base_url=settings.base_url,
            api_key=settings.api_key.get_secret_value() if settings.api_key else None,
            model=settings.model,
            questions_per_call=settings.questions_per_call,
            answer_format=settings.answer_format,
            top_logprobs=settings.top_logprobs,
            max_concurrency=settings.max_concurrency,
            max_calls_per_conversation=settings.max_calls_per_conversation,
            max_retries=settings.max_retries,
            backoff_initial_s=settings.backoff_initial_s,
            backoff_max_s=settings.backoff_max_s,
            timeout_s=settings.timeout_s,
            max_transcript_chars=settings.max_transcript_chars,
            prompt_reuse=settings.prompt_reuse,
        )

    from scorers.judges.local import LocalJudge

    return LocalJudge(
        model_path=settings.local_model,
        cache_dir=cache_dir,
        max_transcript_chars=settings.max_transcript_chars,
    )
