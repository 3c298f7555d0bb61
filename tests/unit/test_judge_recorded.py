"""The recorded judge replays GPT-3.5's real answer distributions from the LLM-Rubric release."""

import pytest

from scorers.conversation import Conversation, Turn
from scorers.judges import RecordedJudge, UnknownConversation, load_answer_table
from scorers.judges.base import Answer, JudgeReplyError
from scorers.judges.recorded import AnswerTableError
from scorers.questions import Question, load_questions
from tests.data_paths import LLM_RUBRIC as DATA

REAL_TSV = DATA / "gpt-3.5-turbo-16k_real_evaluations_FIXED.tsv"


@pytest.fixture(scope="module")
def judge() -> RecordedJudge:
    return RecordedJudge.from_tsv(REAL_TSV)


@pytest.fixture(scope="module")
def questions() -> dict[str, Question]:
    return load_questions(DATA / "questions.json")


def _conv(cid: str) -> Conversation:
    return Conversation(cid, (Turn("user", "hello"),))


def test_replays_the_file_values(judge, questions):
    got = judge.judge(_conv("65ca24fff174b28977037c42"), [questions["Q0"], questions["Q8"]])
    assert got.answers["Q0"].probabilities == pytest.approx(
        (0.0005776092695876, 0.0391112894058126, 0.2687755532877596, 0.6915355480368401)
    )
    # Q8 has three options; the file's fourth (always 0) column is dropped.
    assert len(got.answers["Q8"].probabilities) == 3
    assert got.provenance.model == REAL_TSV.stem


def test_every_real_conversation_has_all_nine_questions(judge, questions):
    ids = {cid for cid, _ in judge.table}
    assert len(ids) == 223
    for cid in ids:
        got = judge.judge(_conv(cid), list(questions.values()))
        assert set(got.answers) == set(questions)


def test_unknown_conversation_is_a_clear_error(judge, questions):
    with pytest.raises(UnknownConversation, match="no-such-id"):
        judge.judge(_conv("no-such-id"), [questions["Q0"]])


def test_unknown_question_is_a_clear_error(judge):
    q = Question("Q99", "?", ("1", "2"), ("a", "b"))
    with pytest.raises(UnknownConversation, match="Q99"):
        judge.judge(_conv("65ca24fff174b28977037c42"), [q])


def test_mass_beyond_the_question_options_is_refused(judge):
    two_option_q0 = Question("Q0", "?", ("1", "2"), ("a", "b"))
    with pytest.raises(JudgeReplyError, match="beyond"):
        judge.judge(_conv("65ca24fff174b28977037c42"), [two_option_q0])


@pytest.mark.parametrize(
    "content, message",
    [
        ("text_id\tcriterion\n", "answerN_prob"),
        ("text_id\tcriterion\tanswer1_prob\nc\tQ0\tabc\n", ":2: answer probabilities must be numbers"),
        ("text_id\tcriterion\tanswer1_prob\nc\tQ0\t-0.5\n", ":2: probabilities must be finite"),
        ("text_id\tcriterion\tanswer1_prob\nc\tQ0\t0.5\nc\tQ0\t0.5\n", ":3: duplicate"),
        ("text_id\tcriterion\tanswer1_prob\n", "no rows"),
    ],
)
def test_malformed_tables_are_refused_with_line(tmp_path, content, message):
    path = tmp_path / "bad.tsv"
    path.write_text(content)
    with pytest.raises(AnswerTableError, match=message):
        load_answer_table(path)


def test_answer_keeps_uncovered_mass_and_refuses_impossible_values():
    a = Answer("Q", (0.2, 0.3))
    assert a.covered_mass == pytest.approx(0.5)
    assert a.expected_value([1, 2]) == pytest.approx((0.2 * 1 + 0.3 * 2) / 0.5)
    with pytest.raises(JudgeReplyError):
        Answer("Q", (0.7, 0.6))
    with pytest.raises(JudgeReplyError):
        Answer("Q", (float("nan"), 0.1))
    with pytest.raises(JudgeReplyError, match="no probability mass"):
        Answer("Q", (0.0, 0.0)).expected_value([1, 2])
