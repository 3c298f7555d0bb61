"""`convowatch learn` and `convowatch data uss` on real data with real judges, run as real subprocesses."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest

from scorers.conversation import restore_control_tokens
from scorers.datasets.labelled import load_labelled_jsonl, write_labelled_jsonl
from scorers.datasets.uss import read_uss, uss_labelled
from scorers.judges.prompt import PROMPT_VERSION
from scorers.learning.pool import RubricPool, seed_pool
from scorers.rubrics import RubricSet
from tests import servers
from tests.data_paths import LLM_RUBRIC, SHARED_DATA
from tests.infra import convowatch

REAL_ANSWERS = LLM_RUBRIC / "gpt-3.5-turbo-16k_real_evaluations_FIXED.tsv"
MWOZ = SHARED_DATA / "uss" / "MWOZ.txt"


def recorded() -> dict[str, str]:
    return {"CONVOWATCH_JUDGE__BACKEND": "recorded", "CONVOWATCH_JUDGE__RECORDED_ANSWERS": str(REAL_ANSWERS)}


def error_line(r: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert lines, "no error message"
    return lines[-1]


@pytest.fixture(scope="module")
def llm_rubric_files(tmp_path_factory) -> tuple[Path, Path]:
    """The real LLM-Rubric conversations as labelled JSONL, and Q1-Q8 as an unfitted rubric set (by the CLI's converter)."""
    out = tmp_path_factory.mktemp("llm-rubric")
    labelled, candidates = out / "real.jsonl", out / "q1-q8.json"
    r = convowatch(
        "data",
        "llm-rubric",
        "--data-dir",
        LLM_RUBRIC,
        "--split",
        "real",
        "--labelled-out",
        labelled,
        "--rubric-set-out",
        candidates,
    )
    assert r.returncode == 0, r.stderr
    return labelled, candidates


@pytest.fixture(scope="module")
def domain(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("domain") / "domain.md"
    path.write_text(
        "A research assistant answers questions about papers, citing the references it was given.\n"
        "Success: the user's question is answered correctly and the claims are supported by citations.\n"
    )
    return path


# ---------------------------------------------------------------------------- success


def test_learn_from_real_labels_with_the_recorded_judge(tmp_path, llm_rubric_files, domain):
    labelled, candidates = llm_rubric_files
    out, report_dir = tmp_path / "rubricset.json", tmp_path / "report"
    r = convowatch(
        "learn",
        "--data",
        labelled,
        "--domain",
        domain,
        "--candidates",
        candidates,
        "--out",
        out,
        "--n-sat",
        "3",
        "--n-dsat",
        "0",
        "--precision",
        "0.75",
        "--cache",
        tmp_path / "scores.sqlite",
        "--report-dir",
        report_dir,
        env=recorded(),
    )
    assert r.returncode == 0, r.stderr
    rubric_set = RubricSet.load(out)
    assert len(rubric_set.rubrics) == 3 and rubric_set.precision == 0.75
    meta = rubric_set.metadata
    assert meta["selection"]["method"] == "greedy" and meta["judge"].startswith(
        "recorded|gpt-3.5-turbo-16k_real_evaluations_FIXED|"
    )
    assert meta["prompt_versions"]["judge"] == PROMPT_VERSION and len(meta["training_data_hash"]) == 16
    assert len(meta["pool"]["hash"]) == 16 and meta["pool"]["size"] == 8 and len(meta["domain_sha256"]) == 16
    assert f"wrote {out} (version {rubric_set.version})" in r.stdout
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("judge: 0 calls in 223 requests") and "1784 asked" in last  # the recorded judge reports 0 calls
    assert "rating" in r.stderr  # progress
    report = json.loads((report_dir / "report.json").read_text())
    assert [s["id"] for s in report["selected"]] == [x.id for x in rubric_set.rubrics]
    assert (report_dir / "precision_curves.png").stat().st_size > 20_000

    again = convowatch(
        "learn",
        "--data",
        labelled,
        "--domain",
        domain,
        "--candidates",
        candidates,
        "--out",
        tmp_path / "again.json",
        "--n-sat",
        "3",
        "--n-dsat",
        "0",
        "--precision",
        "0.75",
        "--cache",
        tmp_path / "scores.sqlite",
        env=recorded(),
    )
    assert again.returncode == 0, again.stderr
    assert "1784 answers from the cache, 0 asked" in again.stdout.strip().splitlines()[-1]
    assert RubricSet.load(tmp_path / "again.json").version == rubric_set.version


def _seed_pool_head(per_polarity: int) -> RubricPool:
    """The first ``per_polarity`` SAT and DSAT rubrics of the shipped seed pool."""
    full = seed_pool()
    sat = [j for j, x in enumerate(full.rubrics) if x.polarity.value == "sat"][:per_polarity]
    dsat = [j for j, x in enumerate(full.rubrics) if x.polarity.value == "dsat"][:per_polarity]
    return full.subset(sat + dsat)


def _learn_one_per_polarity(
    train: Path, domain: Path, pool_file: Path, out: Path, cache: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """`convowatch learn` of one SAT and one DSAT rubric from ``pool_file``, 2 folds, answers cached in ``cache``."""
    return convowatch(
        "learn", "--data", train, "--domain", domain, "--pool", "generated", "--pool-file", pool_file, "--out", out,
        "--n-sat", "1", "--n-dsat", "1", "--folds", "2", "--cache", cache, env=env,
    )  # fmt: skip


def test_uss_to_rubric_set_that_the_cli_scores_with(tmp_path, domain):
    """USS -> labelled JSONL (2+2 train, 2+2 test) -> learn (2 seed rubrics, packaged Gemma judge) -> `rubrics evaluate` uses the set."""
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    r = convowatch(
        "data", "uss", "--file", MWOZ, "--labelled-out", train, "--n-per-class", "4", "--seed", "3", "--split-out-test", test
    )
    assert r.returncode == 0, r.stderr
    pool_file = tmp_path / "pool.json"
    _seed_pool_head(1).save(pool_file)
    local = {"CONVOWATCH_JUDGE__BACKEND": "local", "CONVOWATCH_CACHE_DIR": str(servers.cache_dir())}
    out = tmp_path / "uss-rubricset.json"
    r = _learn_one_per_polarity(train, domain, pool_file, out, tmp_path / "scores.sqlite", local)
    assert r.returncode == 0, r.stderr
    rubric_set = RubricSet.load(out)
    assert {x.polarity.value for x in rubric_set.rubrics} == {"sat", "dsat"}
    assert rubric_set.metadata["pool_kind"] == "generated" and rubric_set.metadata["training_file"] == "train.jsonl"
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("judge: ") and "in 4 requests" in last and "0 answers from the cache, 8 asked" in last
    r = convowatch("rubrics", "evaluate", "--rubric-set", out, "--labelled", test, "--json", env=local)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["rubric_set"] == rubric_set.version and got["n"] == 4 and got["n_positive"] == 2


def _keep_first_turns(path: Path, n: int) -> None:
    """Cut every labelled conversation in ``path`` to its first ``n`` turns: Gemma on a 2-core CPU reads a whole
    MultiWOZ dialogue in tens of seconds, and these tests check what is asked, not what is answered."""
    items = load_labelled_jsonl(path)
    write_labelled_jsonl(
        path,
        [dataclasses.replace(i, conversation=dataclasses.replace(i.conversation, turns=i.conversation.turns[:n])) for i in items],
    )


def _judge_behind(proxy: servers.ScriptedServer, llama_server: servers.LlamaServer, cache: Path) -> dict[str, str]:
    """Settings of an OpenAI-compatible judge (and generator) that is ``llama_server`` reached through ``proxy``."""
    return {
        "CONVOWATCH_JUDGE__BACKEND": "openai",
        "CONVOWATCH_JUDGE__BASE_URL": proxy.url + "/v1",
        "CONVOWATCH_JUDGE__MODEL": llama_server.model,
        "CONVOWATCH_JUDGE__API_KEY": str(llama_server.api_key),
        "CONVOWATCH_JUDGE__TIMEOUT_S": "300",
        "CONVOWATCH_CACHE_DIR": str(cache),
    }


def test_learn_and_evaluate_ask_all_questions_of_a_conversation_in_one_call(tmp_path, domain, llama_server):
    """judge.questions_per_call reaches `learn` and `rubrics evaluate`: one request per conversation to the real llama
    server (Gemma 270M, answers held by the sequence grammar), every question of the pool or set in it."""
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    r = convowatch(
        "data", "uss", "--file", MWOZ, "--labelled-out", train, "--n-per-class", "4", "--seed", "5", "--split-out-test", test
    )
    assert r.returncode == 0, r.stderr
    _keep_first_turns(train, 2)
    _keep_first_turns(test, 2)
    pool = _seed_pool_head(2)
    pool_file = tmp_path / "pool.json"
    pool.save(pool_file)
    out = tmp_path / "set.json"
    with servers.ScriptedServer(lambda i, req: servers.forward(llama_server.url.removesuffix("/v1"), req)) as proxy:
        one_pass = {
            **_judge_behind(proxy, llama_server, tmp_path / "cache"),
            "CONVOWATCH_JUDGE__QUESTIONS_PER_CALL": "100",
            "CONVOWATCH_JUDGE__ANSWER_FORMAT": "sequence",
        }
        r = _learn_one_per_polarity(train, domain, pool_file, out, tmp_path / "scores.sqlite", one_pass)
        assert r.returncode == 0, r.stderr
        learn_report = r.stdout.strip().splitlines()[-1]
        learn_requests = [json.loads(q.body) for q in proxy.received if q.path.endswith("/chat/completions")]
        r = convowatch("rubrics", "evaluate", "--rubric-set", out, "--labelled", test, "--json", env=one_pass)
        assert r.returncode == 0, r.stderr
        evaluate_requests = [json.loads(q.body) for q in proxy.received if q.path.endswith("/chat/completions")][
            len(learn_requests) :
        ]
    rubric_set = RubricSet.load(out)
    n_train, n_test = len(load_labelled_jsonl(train)), len(load_labelled_jsonl(test))
    assert len(learn_requests) == n_train and len(evaluate_requests) == n_test
    assert f"in {n_train} requests" in learn_report, learn_report
    prompts = [body["messages"][-1]["content"] for body in learn_requests + evaluate_requests]
    assert all("Answer every numbered question" in p for p in prompts)  # the multi-question prompt, not one question
    for body in learn_requests:
        assert all(rubric.text in body["messages"][-1]["content"] for rubric in pool.rubrics)
    for body in evaluate_requests:
        assert all(rubric.text in body["messages"][-1]["content"] for rubric in rubric_set.rubrics)
    got = json.loads(r.stdout)
    assert got["rubric_set"] == rubric_set.version and got["n"] == n_test


def test_offline_commands_show_models_only_redacted_text(tmp_path, domain, llama_server):
    """With redaction.kinds, what `learn` sends its rubric generator and its judge, and what `rubrics evaluate` sends
    its judge, holds placeholders instead of the e-mail address and card number planted into every conversation (the
    real llama server on Gemma 270M behind a forwarding proxy that keeps the requests; it caps the generator's replies
    at 8 tokens, so rubric writing takes seconds, not minutes: only what the generator is sent is checked)."""
    train = tmp_path / "train.jsonl"
    r = convowatch("data", "uss", "--file", MWOZ, "--labelled-out", train, "--n-per-class", "2", "--seed", "5")
    assert r.returncode == 0, r.stderr
    _keep_first_turns(train, 2)
    email, card = "jane.doe@example.com", "4111 1111 1111 1111"
    planted = []
    for item in load_labelled_jsonl(train):
        first, *rest = item.conversation.turns
        turns = (dataclasses.replace(first, text=f"{first.text} Mail {email}, card {card}."), *rest)
        planted.append(dataclasses.replace(item, conversation=dataclasses.replace(item.conversation, turns=turns)))
    write_labelled_jsonl(train, planted)
    pool = _seed_pool_head(1)
    pool_file, out = tmp_path / "pool.json", tmp_path / "set.json"
    pool.save(pool_file)

    def short_generations(_: int, request: servers.Received) -> servers.Reply:
        body = json.loads(request.body or b"{}")
        if "messages" in body and not body.get("logprobs"):  # the generator's (the judge asks for log-probabilities)
            body["max_tokens"] = min(body.get("max_tokens", 8), 8)
            request = dataclasses.replace(request, body=json.dumps(body).encode())
        return servers.forward(llama_server.url.removesuffix("/v1"), request)

    with servers.ScriptedServer(short_generations) as proxy:
        env = {**_judge_behind(proxy, llama_server, tmp_path / "cache"), "CONVOWATCH_REDACTION__KINDS": '["email", "card"]'}
        generate = ("learn", "--data", train, "--domain", domain, "--pool", "generated", "--out", tmp_path / "g.json")
        r = convowatch(*generate, "--pool-out", tmp_path / "generated.json", "--folds", "2", env=env)
        assert "generating rubrics" in r.stderr, r.stderr
        r = _learn_one_per_polarity(train, domain, pool_file, out, tmp_path / "scores.sqlite", env)
        assert r.returncode == 0, r.stderr
        r = convowatch("rubrics", "evaluate", "--rubric-set", out, "--labelled", train, "--json", env=env)
        assert r.returncode == 0, r.stderr
    # What the models read, control-token breaks taken out (placeholders like [EMAIL] carry one after the "[").
    prompts = [
        restore_control_tokens(json.dumps(json.loads(q.body)["messages"], ensure_ascii=False))
        for q in proxy.received
        if q.path.endswith("/chat/completions")
    ]
    assert prompts and not [p for p in prompts if email in p or card in p]
    judged = [p for p in prompts if any(rubric.text in p for rubric in pool.rubrics)]
    generated = [p for p in prompts if p not in judged and "[EMAIL]" in p]
    assert generated, "the generator was not sent the conversations"
    assert len(judged) >= 2 * len(planted) and all("[EMAIL]" in p and "[CARD]" in p for p in judged)


def test_data_uss_labels_by_mean_overall_and_reports_the_middle(tmp_path):
    out = tmp_path / "all.jsonl"
    r = convowatch("data", "uss", "--file", MWOZ, "--labelled-out", out)
    assert r.returncode == 0, r.stderr
    labelled, middle = uss_labelled(read_uss(MWOZ))
    items = load_labelled_jsonl(out)
    assert [i.conversation.id for i in items] == [i.conversation.id for i in labelled]
    assert [i.positive for i in items] == [i.positive for i in labelled]
    assert f"{len(middle)} in between (not written)" in r.stderr
    sampled = tmp_path / "sampled.jsonl"
    r = convowatch("data", "uss", "--file", MWOZ, "--labelled-out", sampled, "--n-per-class", "7")
    assert r.returncode == 0, r.stderr
    items = load_labelled_jsonl(sampled)
    assert sum(i.positive for i in items) == 7 and len(items) == 14


# ---------------------------------------------------------------------------- errors: one line, exit 2


def test_malformed_labelled_data(tmp_path, domain):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"conversation_id": "a", "label": "positive", "turns": [{"role": "user", "text": "hi"}]}\n{not json\n')
    r = convowatch("learn", "--data", bad, "--domain", domain, "--out", tmp_path / "o.json", env=recorded())
    assert error_line(r) == f"convowatch: error: {bad}:2: not valid JSON: Expecting property name enclosed in double quotes"
    bad.write_text('{"conversation_id": "a", "label": "maybe", "turns": []}\n')
    r = convowatch("learn", "--data", bad, "--domain", domain, "--out", tmp_path / "o.json", env=recorded())
    assert error_line(r).startswith(f"convowatch: error: {bad}:1: label must be 'positive' or 'negative'")


def test_empty_class(tmp_path, llm_rubric_files, domain):
    labelled, _ = llm_rubric_files
    positives = tmp_path / "positives.jsonl"
    positives.write_text("".join(line + "\n" for line in labelled.read_text().splitlines() if '"label": "positive"' in line))
    r = convowatch("learn", "--data", positives, "--domain", domain, "--out", tmp_path / "o.json", env=recorded())
    assert (
        error_line(r)
        == f"convowatch: error: {positives}: no negative conversations (150 positive, 0 negative); learning needs both classes"
    )
    assert not (tmp_path / "o.json").exists()


def test_fewer_examples_per_class_than_folds(tmp_path, llm_rubric_files, domain):
    labelled, _ = llm_rubric_files
    lines = labelled.read_text().splitlines()
    few = tmp_path / "few.jsonl"
    few.write_text("\n".join([x for x in lines if '"positive"' in x][:6] + [x for x in lines if '"negative"' in x][:3]) + "\n")
    r = convowatch("learn", "--data", few, "--domain", domain, "--out", tmp_path / "o.json", env=recorded())
    assert "6 positive and 3 negative conversations; every class needs at least folds=5" in error_line(r)


def test_missing_or_empty_domain_file(tmp_path, llm_rubric_files):
    labelled, _ = llm_rubric_files
    r = convowatch("learn", "--data", labelled, "--domain", tmp_path / "nope.md", "--out", tmp_path / "o.json", env=recorded())
    line = error_line(r)
    assert "--domain" in line and "nope.md" in line and "does not exist" in line
    empty = tmp_path / "empty.md"
    empty.write_text("  \n")
    r = convowatch("learn", "--data", labelled, "--domain", empty, "--out", tmp_path / "o.json", env=recorded())
    assert (
        error_line(r)
        == f"convowatch: error: {empty}: the domain description is empty (say what the assistant is for and what success means)"
    )


def test_generator_unreachable(tmp_path, llm_rubric_files, domain):
    labelled, _ = llm_rubric_files
    url = f"http://127.0.0.1:{servers.free_port()}/v1"  # nothing listens there
    r = convowatch(
        "learn",
        "--data",
        labelled,
        "--domain",
        domain,
        "--out",
        tmp_path / "o.json",
        "--pool",
        "generated",
        "--generator-base-url",
        url,
        "--generator-model",
        "qwen",
        env={**recorded(), "CONVOWATCH_JUDGE__MAX_RETRIES": "0"},
    )
    line = error_line(r)
    assert line.startswith(
        f"convowatch: error: cannot use the generator: generator 'qwen' at {url} still failing after 1 attempt(s): connection error"
    )


def test_a_generated_pool_needs_a_generator(tmp_path, llm_rubric_files, domain):
    labelled, _ = llm_rubric_files
    r = convowatch(
        "learn", "--data", labelled, "--domain", domain, "--out", tmp_path / "o.json", "--pool", "both", env=recorded()
    )
    assert "a generated pool needs a generator" in error_line(r)


def test_malformed_uss_file(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("USER\thello\t\t3,4\nSYSTEM\thi\t\t\nUSER\tOVERALL\t\t3,x\n")
    r = convowatch("data", "uss", "--file", bad, "--labelled-out", tmp_path / "o.jsonl")
    assert error_line(r) == f"convowatch: error: {bad}:3: ratings '3,x' are not comma-separated integers"
