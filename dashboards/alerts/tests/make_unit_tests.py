"""Writes ``convowatch.rules.test.yml`` and ``convowatch.agreement.test.yml``: promtool unit tests whose
expectations come from a model of the rules.

Run from the repository root: ``python dashboards/alerts/tests/make_unit_tests.py``
(``--check`` exits 1 if the committed file differs).

Each scenario is a set of counters given as per-minute increments. The model
here re-implements each alert's arithmetic on those increments (the 1/π-weighted
rates and their sampling variance included: a judged conversation with
inclusion probability π adds 1/π to the weight counters and (1-π)/π² to the
sampling-variance ones) (sums over the
minutes ``(t - w, t]``, which is what ``rate``/``increase`` give on samples
aligned with the window), evaluates it every minute like Prometheus with
``for: 10m``, and asserts which alerts fire when; the expected alerts and the
numbers in their descriptions are written from the model, never copied from
promtool's output. The model knows the production `AlertWindows` defaults only.
"""

from __future__ import annotations

import functools
import itertools
import math
import sys
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

OUT = Path(__file__).with_name("convowatch.rules.test.yml")
AGREEMENT_OUT = Path(__file__).with_name("convowatch.agreement.test.yml")
SHORT, BASE, DAY, FOR, STALL, LOST = 10, 360, 1440, 10, 15, 60  # minutes
Z, LIFT, UNCERTAIN_LIFT = 3.0, 0.05, 0.15
MIN_CONVERSATIONS, JUDGE_RATIO, JUDGE_MIN, DL_RATIO, DL_MIN = 50, 0.10, 20, 0.05, 200
BUDGET_WAIT_SHARE = 0.5

Increments = list[float]  # increments[i - 1] = increase during minute i (value 0 at minute 0)
Alert = dict[str, Any]
Key = TypeVar("Key")  # what names a series in a scenario: a product, a judge, (product, behaviour)


# --- promtool notation and YAML text -------------------------------------------------------------


def _num(x: float) -> str:
    return f"{round(x, 6):g}"


def notation(increments: Increments) -> str:
    """promtool's ``a+bxn`` segments for a counter at 0 at minute 0 that grows by ``increments``."""
    parts, value, start = [], 0.0, 1
    while start <= len(increments):
        step, end = increments[start - 1], start
        while end < len(increments) and increments[end] == step:
            end += 1
        if start == 1:
            parts.append(f"0+{_num(step)}x{end}")
            value = step * end
        else:
            first = value + step
            parts.append(f"{_num(first)}+{_num(step)}x{end - start}")
            value = first + step * (end - start)
        start = end + 1
    return " ".join(parts)


def series(metric: str, increments: Increments, **labels: str) -> str:
    inner = ", ".join(f'{k}="{v}"' for k, v in {"job": "convowatch", "instance": "worker-1:9464", **labels}.items())
    return f"      - series: '{metric}{{{inner}}}'\n        values: '{notation(increments)}'\n"


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def alert_test(t: int, alertname: str, alerts: list[Alert], comment: str) -> str:
    out = f"      # {comment}\n      - eval_time: {t}m\n        alertname: {alertname}\n"
    if not alerts:
        return out + "        exp_alerts: []\n"
    out += "        exp_alerts:\n"
    for a in alerts:
        out += "          - exp_labels:\n" + "".join(f"              {k}: {v}\n" for k, v in a["labels"].items())
        out += "            exp_annotations:\n"
        out += "".join(f"              {k}: {_quoted(a[k])}\n" for k in ("summary", "description", "runbook_url"))
    return out


def header(name: str, comments: list[str], interval: str = "1m") -> str:
    return (
        f"  - name: {_quoted(name)}\n"
        + "".join(f"    # {c}\n" for c in comments)
        + f"    interval: {interval}\n    input_series:\n"
    )


# --- the model ------------------------------------------------------------------------------------


_CUMULATIVE: dict[int, tuple[Increments, list[float]]] = {}  # id -> (the list itself, so the id stays its own; cumulative sums)


def window(increments: Increments | None, t: int, width: int, offset: int = 0) -> float:
    """Increase over the minutes (t - offset - width, t - offset]: the counter's value at the end minus at the start."""
    if not increments:
        return 0.0
    cached = _CUMULATIVE.get(id(increments))
    if cached is None or cached[0] is not increments:
        cached = _CUMULATIVE[id(increments)] = (increments, [0.0, *itertools.accumulate(increments)])
    values = cached[1]
    end = t - offset
    return values[end] - values[max(0, end - width)]


def states(condition: Callable[[int], bool], since: int, until: int) -> dict[int, str]:
    """The alert's state at every minute from ``since`` to ``until``."""
    out, active = {}, None
    for u in range(since, until + 1):
        active = (u if active is None else active) if condition(u) else None
        out[u] = "inactive" if active is None else "firing" if u - active >= FOR else "pending"
    return out


def state_at(condition: Callable[[int], bool], t: int, since: int) -> str:
    """The alert's state at minute ``t`` ("firing", "pending" or "inactive"), evaluating every minute from ``since``."""
    active = None
    for u in range(since, t + 1):
        active = (u if active is None else active) if condition(u) else None
    if active is None:
        return "inactive"
    return "firing" if t - active >= FOR else "pending"


def pct(x: float) -> str:
    """Prometheus' humanizePercentage."""
    return f"{x * 100:.4g}%"


def count(x: float) -> str:
    return f"{x:.0f}"


# --- dissatisfaction spike, against the baseline and against yesterday ----------------------------

M1 = 1500
TODAY = [(1461, 1500)]


def _bursty(
    conversations: Sequence[float],
    p: tuple[float, float],
    p2: tuple[float, float],
    bursts: list[tuple[int, int]],
    pi: float = 1.0,
) -> dict[str, Any]:
    """Per minute, for ``conversations`` closing of which a share ``pi`` is judged (weight 1/pi each): the weight
    (= conversations), the weighted sums of P(dsat) and P(dsat)^2, and the sampling-variance sums
    (1-pi)/pi^2 * P^k over the judged ones; (calm, burst) means of P and P^2 per conversation."""
    in_burst = [any(s <= i <= e for s, e in bursts) for i in range(1, len(conversations) + 1)]
    spread = (1 - pi) / pi  # judged (c * pi) times (1 - pi) / pi^2
    return {
        "n": conversations,
        "dsat": [c * p[b] for c, b in zip(conversations, in_burst)],
        "sq": [c * p2[b] for c, b in zip(conversations, in_burst)],
        "s0": [c * spread for c in conversations],
        "s1": [c * spread * p[b] for c, b in zip(conversations, in_burst)],
        "s2": [c * spread * p2[b] for c, b in zip(conversations, in_burst)],
    }


PRODUCTS = {
    "shop": _bursty([10] * M1, (0.1, 0.5), (0.03, 0.3), TODAY),  # on two workers, 5 conversations a minute each
    "daily": _bursty([10] * M1, (0.1, 0.5), (0.03, 0.3), [(21, 60)] + TODAY),
    "small": _bursty([2] * M1, (0.1, 0.5), (0.03, 0.3), TODAY),
    "calm": _bursty([10] * M1, (0.1, 0.5), (0.03, 0.3), []),
    "blip": _bursty([100] * M1, (0.1, 0.5), (0.03, 0.3), [(1461, 1462)]),
    "grown": _bursty([2] * 1200 + [10] * 300, (0.1, 0.5), (0.03, 0.3), TODAY),
    "edge": _bursty([100] * M1, (0.1, 0.14), (0.03, 0.14 * 0.14 + 0.02), TODAY),
    "noisy": _bursty([10] * M1, (0.1, 0.17), (0.1, 0.17), TODAY),
    "noisier": _bursty([10] * M1, (0.1, 0.25), (0.1, 0.25), TODAY),
    "full": _bursty([100] * M1, (0.1, 0.17), (0.1, 0.17), TODAY),
    "sampled": _bursty([100] * M1, (0.1, 0.17), (0.1, 0.17), TODAY, pi=0.1),
}
WORKERS = {"shop": 2}


def sampling_variance(s: dict[str, Any], t: int, offset: int = 0) -> float:
    """Sampling variance of the short window's weighted rate R: sum (1-pi)/pi^2 (P - R)^2 / (sum 1/pi)^2."""
    n = window(s["n"], t, SHORT, offset)
    r = window(s["dsat"], t, SHORT, offset) / n
    s0, s1, s2 = (window(s[k], t, SHORT, offset) for k in ("s0", "s1", "s2"))
    return max(s2 - 2 * r * s1 + r * r * s0, 0) / n**2


def spike(name: str, t: int) -> tuple[bool, dict[str, float]]:
    s = PRODUCTS[name]
    n, nb = window(s["n"], t, SHORT), window(s["n"], t, BASE)
    p, pb = window(s["dsat"], t, SHORT) / n, window(s["dsat"], t, BASE) / nb
    var = max(window(s["sq"], t, BASE) / nb - pb**2, 0)
    threshold = pb + max(LIFT, Z * math.sqrt(var / n + sampling_variance(s, t)))
    return p > threshold and n >= MIN_CONVERSATIONS, {"P": p, "N": n, "B": pb}


def above_yesterday(name: str, t: int) -> tuple[bool, dict[str, float]]:
    s = PRODUCTS[name]
    n, ny = window(s["n"], t, SHORT), window(s["n"], t, SHORT, DAY)
    if ny == 0:
        return False, {}
    p, py = window(s["dsat"], t, SHORT) / n, window(s["dsat"], t, SHORT, DAY) / ny
    var = max(window(s["sq"], t, SHORT, DAY) / ny - py**2, 0)
    threshold = py + max(LIFT, Z * math.sqrt(var * (1 / n + 1 / ny) + sampling_variance(s, t) + sampling_variance(s, t, DAY)))
    return p > threshold and n >= MIN_CONVERSATIONS and ny >= MIN_CONVERSATIONS, {"P": p, "N": n, "B": py, "Y": ny}


def _fires(condition: Callable[[Key, int], tuple[bool, dict[str, float]]], name: Key, t: int) -> bool:
    """Whether ``condition`` holds for ``name`` at minute ``t``; bound with partial for states and state_at in loops."""
    return condition(name, t)[0]


def _state(kind: Callable[[str, int], tuple[bool, dict[str, float]]], name: str, t: int) -> str:
    return state_at(lambda u: kind(name, u)[0], t, DAY + 20 if kind is above_yesterday else 400)


def _spike_alert(name: str, t: int) -> Alert:
    v = spike(name, t)[1]
    return {
        "labels": {"severity": "page", "product": name, "model_version": "v1"},
        "summary": f"Dissatisfaction spike on {name} v1",
        "description": f"Calibrated dissatisfaction rate over the last 10m: {pct(v['P'])} over {count(v['N'])} conversations, "
        f"significantly above its 6h baseline of {pct(v['B'])} (threshold: baseline + max(5 points, 3 standard errors), for 10m).",
        "runbook_url": "docs/runbooks.md#convowatchdissatisfactionspike",
    }


def _yesterday_alert(name: str, t: int) -> Alert:
    v = above_yesterday(name, t)[1]
    return {
        "labels": {"severity": "ticket", "product": name, "model_version": "v1"},
        "summary": f"Dissatisfaction above yesterday on {name} v1",
        "description": f"Calibrated dissatisfaction rate over the last 10m: {pct(v['P'])} over {count(v['N'])} conversations; "
        f"the same window 1d ago: {pct(v['B'])} over {count(v['Y'])} conversations "
        "(threshold: that + max(5 points, 3 standard errors of the difference), for 10m).",
        "runbook_url": "docs/runbooks.md#convowatchdissatisfactionaboveyesterday",
    }


def dissatisfaction_tests() -> str:
    out = [
        header(
            "dissatisfaction spike, against the 6h baseline and against yesterday",
            [
                "Minutes 0-1500 (25 h). Per minute: conversations and the sum of their calibrated P(dsat) and P(dsat)^2.",
                "Calm: mean P 0.1 (mean P^2 0.03). Burst (minutes 1461-1500, i.e. 1d + 21m onwards): mean P 0.5 (mean P^2 0.3).",
                "  shop   10/min on two workers, burst today                  -> both alerts fire",
                "  daily  10/min, the same burst yesterday (minutes 21-60)    -> baseline alert only: yesterday was as bad",
                "  small   2/min, burst today: the rate spikes, n = 20 < 50   -> nothing (low volume)",
                "  calm   10/min, no burst                                    -> nothing",
                "  blip  100/min, a 2-minute burst: true for 8m < for (10m)   -> pending, never firing",
                "  grown   2/min until minute 1200, then 10/min, burst today  -> baseline alert; yesterday had n = 20 < 50",
                "  edge  100/min, mean P 0.1 -> 0.14 today: 4 points < min_lift (5), though 8 standard errors -> nothing",
                "  noisy  10/min, every P 0 or 1, 0.1 -> 0.17: 7 points > min_lift but < 3 standard errors -> nothing",
                "  noisier 10/min, every P 0 or 1, 0.1 -> 0.25: above 3 standard errors  -> both alerts fire",
                "  full   100/min all judged, every P 0 or 1, 0.1 -> 0.17: n = 1000 makes 7 points significant -> both alerts fire",
                "  sampled the same 100/min, 10 % judged (weight 10): the same rates and n = sum of weights = 1000, but the",
                "         sampling variance widens the threshold past 0.17          -> nothing",
                "Counters are the 1/pi-weighted ones (pi = 1: the plain sums) and the sampling-variance sums (0 when pi = 1).",
            ],
        )
    ]
    metrics = {
        "n": "convowatch_calibrated_weight_total",
        "dsat": "convowatch_calibrated_dissatisfaction_probability_weighted_total",
        "sq": "convowatch_calibrated_dissatisfaction_probability_squared_weighted_total",
        "s0": "convowatch_calibrated_sampling_variance_total",
        "s1": "convowatch_calibrated_dissatisfaction_probability_sampling_variance_total",
        "s2": "convowatch_calibrated_dissatisfaction_probability_squared_sampling_variance_total",
    }
    for name, s in PRODUCTS.items():
        workers = WORKERS.get(name, 1)
        for k in range(workers):
            for key, metric in metrics.items():
                out.append(
                    series(
                        metric, [x / workers for x in s[key]], instance=f"worker-{k + 1}:9464", product=name, model_version="v1"
                    )
                )

    out.append("    alert_rule_test:\n")
    for kind, alertname in (
        (spike, "ConvowatchDissatisfactionSpike"),
        (above_yesterday, "ConvowatchDissatisfactionAboveYesterday"),
    ):
        assert all(_state(kind, p, 1455) == "inactive" for p in PRODUCTS), alertname
        out.append(alert_test(1455, alertname, [], "before the burst: calm everywhere"))
    for t in (1475, 1490):
        later = ["noisier", "full"] if t == 1490 else []
        firing = [p for p in PRODUCTS if _state(spike, p, t) == "firing"]
        assert firing == ["shop", "daily", "grown", *later], (t, firing)
        out.append(
            alert_test(
                t,
                "ConvowatchDissatisfactionSpike",
                [_spike_alert(p, t) for p in firing],
                "shop, daily, grown fire (and noisier and full, which cross later); small (n < 50), calm, "
                "blip (burst shorter than for), edge, noisy, sampled (sampling error) do not",
            )
        )
        firing = [p for p in PRODUCTS if _state(above_yesterday, p, t) == "firing"]
        assert firing == ["shop", *later], (t, firing)
        out.append(
            alert_test(
                t,
                "ConvowatchDissatisfactionAboveYesterday",
                [_yesterday_alert(p, t) for p in firing],
                "shop (and noisier and full, which cross later): daily was as bad yesterday, grown had too few "
                "conversations yesterday, sampled's sampling error is too wide",
            )
        )

    assert _state(spike, "blip", 1466) == "pending" and _state(spike, "blip", 1475) == "inactive"
    for name in ("small", "calm", "blip", "edge", "noisy", "sampled"):
        for kind in (spike, above_yesterday):
            assert "firing" not in states(partial(_fires, kind, name), DAY + 20, M1).values(), (name, kind.__name__)
    small, sampled = PRODUCTS["small"], PRODUCTS["sampled"]
    # sampled and full differ only in their sampling: the same rate and n, but only sampled's threshold is widened
    assert math.isclose(spike("sampled", 1490)[1]["P"], spike("full", 1490)[1]["P"])
    assert spike("full", 1490)[0] and not spike("sampled", 1490)[0]
    out += [
        "    promql_expr_test:\n",
        "      # blip's 2-minute burst met the condition (pending) but not for 10m, so it never fired (1475 above)\n",
        '      - expr: ALERTS{alertname="ConvowatchDissatisfactionSpike", product="blip"}\n        eval_time: 1466m\n        exp_samples:\n',
        '          - labels: \'ALERTS{alertname="ConvowatchDissatisfactionSpike", alertstate="pending", product="blip", '
        'model_version="v1", severity="page"}\'\n            value: 1\n',
        "      # over the last hour, none of the quiet products ever fired (blip was pending for 8 minutes only)\n",
        '      - expr: max_over_time(ALERTS{alertname=~"ConvowatchDissatisfaction.*", alertstate="firing", '
        'product=~"small|calm|blip|edge|noisy|sampled"}[1h])\n        eval_time: 1500m\n        exp_samples: []\n',
        "      # small's rate did spike; only its volume kept it from alerting\n",
        '      - expr: convowatch:calibrated_dsat_rate:ratio_rate10m{product="small"}\n        eval_time: 1490m\n        exp_samples:\n',
        '          - labels: \'convowatch:calibrated_dsat_rate:ratio_rate10m{product="small", model_version="v1"}\'\n'
        f"            value: {_num(window(small['dsat'], 1490, SHORT) / window(small['n'], 1490, SHORT))}\n",
        '      - expr: convowatch:calibrated_weight:increase10m{product="small"}\n        eval_time: 1490m\n        exp_samples:\n',
        '          - labels: \'convowatch:calibrated_weight:increase10m{product="small", model_version="v1"}\'\n'
        f"            value: {_num(window(small['n'], 1490, SHORT))}\n",
        "      # sampled: the weights stand for all 1000 conversations of the window; the sampling variance is what keeps it quiet\n",
        '      - expr: convowatch:calibrated_weight:increase10m{product="sampled"}\n        eval_time: 1490m\n        exp_samples:\n',
        '          - labels: \'convowatch:calibrated_weight:increase10m{product="sampled", model_version="v1"}\'\n'
        f"            value: {_num(window(sampled['n'], 1490, SHORT))}\n",
        '      - expr: convowatch:calibrated_dsat_sampling_variance:increase10m{product="sampled"}\n        eval_time: 1490m\n'
        "        exp_samples:\n",
        '          - labels: \'convowatch:calibrated_dsat_sampling_variance:increase10m{product="sampled", model_version="v1"}\'\n'
        f"            value: {sampling_variance(sampled, 1490):.10g}\n",  # small: keep the significant digits
    ]
    return "".join(out)


# --- uncertain surge and judge errors -----------------------------------------------------------

M2 = 400
M3 = 120


def seg(n: int, parts: list[tuple[int, int, float]]) -> Increments:
    """Increments for minutes 1..n: ``v`` per minute from ``s`` to ``e`` for each (s, e, v), 0 elsewhere."""
    out = [0.0] * n
    for s, e, v in parts:
        for i in range(s, e + 1):
            out[i - 1] = v
    return out


SCORED = {  # conversations per minute by label: the sum of 1/pi over the judged ones
    "shop": {
        "uncertain": seg(M2, [(1, 360, 2), (361, 400, 8)]),
        "sat": seg(M2, [(1, 360, 6), (361, 400, 1)]),
        "dsat": seg(M2, [(1, 360, 2), (361, 400, 1)]),
    },
    "small": {"uncertain": seg(M2, [(361, 400, 2)]), "sat": seg(M2, [(1, 360, 2)])},
    "calm": {"uncertain": seg(M2, [(1, 400, 3)]), "sat": seg(M2, [(1, 400, 5)]), "dsat": seg(M2, [(1, 400, 2)])},
    "dense": {"uncertain": seg(M2, [(1, 360, 30), (361, 400, 50)]), "sat": seg(M2, [(1, 360, 70), (361, 400, 50)])},
    "sampled": {"uncertain": seg(M2, [(1, 360, 30), (361, 400, 50)]), "sat": seg(M2, [(1, 360, 70), (361, 400, 50)])},
}
SCORED_PI = {"sampled": 0.05}  # inclusion probability per product (1 elsewhere)


def _spread(name: str, increments: Increments) -> Increments:
    """Sampling-variance sums (1-pi)/pi^2 per judged conversation of weights ``increments``: weight * (1-pi)/pi."""
    pi = SCORED_PI.get(name, 1.0)
    return [x * (1 - pi) / pi for x in increments]


Judges = dict[str, dict[str, Any]]  # judge -> {"ok": successful judgements per minute or None, "errors": {type: per minute}}
JUDGES: Judges = {
    "openai:flaky": {
        "ok": seg(M2, [(1, 400, 10)]),
        "errors": {"JudgeTimeout": seg(M2, [(361, 400, 2)]), "JudgeUnavailable": seg(M2, [(361, 400, 3)])},
    },
    "openai:down": {"ok": None, "errors": {"JudgeUnavailable": seg(M2, [(1, 400, 5)])}},
    "openai:rare": {"ok": None, "errors": {"JudgeUnavailable": seg(M2, [(1, 400, 1)])}},
    "openai:healthy": {"ok": seg(M2, [(1, 400, 10)]), "errors": {"JudgeTimeout": seg(M2, [])}},
}
QUIET_JUDGES: Judges = {
    "openai:rare": {"ok": None, "errors": {"JudgeUnavailable": seg(M3, [(1, M3, 1)])}},
    "openai:healthy": {"ok": seg(M3, [(1, M3, 10)]), "errors": {"JudgeTimeout": seg(M3, [])}},
    "openai:noisy": {"ok": seg(M3, [(1, M3, 10)]), "errors": {"JudgeTimeout": seg(M3, [(1, M3, 1)])}},
}


def uncertain(name: str, t: int) -> tuple[bool, dict[str, float]]:
    labels = SCORED[name]
    n, nb = sum(window(a, t, SHORT) for a in labels.values()), sum(window(a, t, BASE) for a in labels.values())
    p, pb = window(labels["uncertain"], t, SHORT) / n, window(labels["uncertain"], t, BASE) / nb
    b_uncertain = window(_spread(name, labels["uncertain"]), t, SHORT)
    b_others = sum(window(_spread(name, a), t, SHORT) for label, a in labels.items() if label != "uncertain")
    sampling_var = ((1 - p) ** 2 * b_uncertain + p**2 * b_others) / n**2
    threshold = pb + max(UNCERTAIN_LIFT, Z * math.sqrt(pb * (1 - pb) / n + sampling_var))
    return p > threshold and n >= MIN_CONVERSATIONS, {"P": p, "N": n, "B": pb}


def _uncertain_alert(name: str, t: int) -> Alert:
    v = uncertain(name, t)[1]
    return {
        "labels": {"severity": "ticket", "product": name, "model_version": "v1"},
        "summary": f"Uncertain share surging on {name} v1 (judge drift?)",
        "description": f"Share of scored conversations labelled uncertain over the last 10m: {pct(v['P'])} of {count(v['N'])}, "
        f"against {pct(v['B'])} over 6h (threshold: baseline + max(15 points, 3 standard errors), for 10m). "
        "The judge may have stopped separating conversations.",
        "runbook_url": "docs/runbooks.md#convowatchuncertainsurge",
    }


def judge(judges: Judges, name: str, t: int) -> tuple[bool, dict[str, float]]:
    errors = sum(window(a, t, SHORT) for a in judges[name]["errors"].values())
    attempts = errors + window(judges[name]["ok"], t, SHORT)
    ratio = errors / attempts if attempts else 0.0
    return ratio > JUDGE_RATIO and attempts >= JUDGE_MIN, {"P": ratio, "N": attempts}


def _judge_series(judges: Judges) -> list[str]:
    out = []
    for name, j in judges.items():
        if j["ok"]:
            out.append(series("convowatch_judge_latency_seconds_count", j["ok"], judge=name))
        for error, increments in j["errors"].items():
            out.append(series("convowatch_judge_errors_total", increments, judge=name, error=error))
    return out


def _judge_alert(name: str, t: int) -> Alert:
    v = judge(JUDGES, name, t)[1]
    return {
        "labels": {"severity": "ticket", "judge": name},
        "summary": f"Judge {name} is failing",
        "description": f"{pct(v['P'])} of {count(v['N'])} judge attempts failed over the last 10m (threshold 10%, for 10m). "
        "Failed attempts are retried; conversations that run out of attempts are stored unscored.",
        "runbook_url": "docs/runbooks.md#convowatchjudgeerrors",
    }


def uncertain_and_judge_tests() -> str:
    out = [
        header(
            "uncertain surge (judge drift) and judge errors",
            [
                "Minutes 0-400. Scored conversations per minute and label:",
                "  shop  10/min, uncertain 2 -> 8 from minute 361          -> fires",
                "  small  2/min, all sat -> all uncertain: n = 20 < 50      -> nothing (low volume)",
                "  calm  10/min, 30 % uncertain throughout                  -> nothing",
                "  dense 100/min all judged, uncertain 30 % -> 50 % from minute 361  -> fires",
                "  sampled the same 100/min, 5 % judged (weight 20): the same shares, widened by sampling error -> nothing",
                "Judges: successful judgements (latency _count) and errors by type per minute:",
                "  openai:flaky    10 ok; 5 errors (2 timeouts + 3 unavailable) from 361 -> fires (33 %)",
                "  openai:down     never succeeds (no latency series), 5 errors    -> fires (100 %)",
                "  openai:rare     never succeeds, 1 error: 10 attempts < 20        -> nothing (low volume)",
                "  openai:healthy  10 ok, an error series that never grows          -> nothing",
            ],
        )
    ]
    for name, labels in SCORED.items():
        for label, increments in labels.items():
            out.append(
                series("convowatch_conversations_scored_weight_total", increments, label=label, product=name, model_version="v1")
            )
            out.append(
                series(
                    "convowatch_conversations_scored_sampling_variance_total",
                    _spread(name, increments),
                    label=label,
                    product=name,
                    model_version="v1",
                )
            )
    out += _judge_series(JUDGES)

    out.append("    alert_rule_test:\n")
    assert not any(uncertain(n, 360)[0] for n in SCORED)
    out.append(alert_test(360, "ConvowatchUncertainSurge", [], "before the surge"))
    states = {n: state_at(partial(_fires, uncertain, n), 390, 360) for n in SCORED}
    assert [n for n, s in states.items() if s == "firing"] == ["shop", "dense"], states
    assert math.isclose(uncertain("dense", 390)[1]["P"], uncertain("sampled", 390)[1]["P"])
    out.append(
        alert_test(
            390,
            "ConvowatchUncertainSurge",
            [_uncertain_alert(n, 390) for n in ("shop", "dense")],
            "shop and dense fire; small (n < 50), calm and sampled (sampling error) do not",
        )
    )
    for t, expected, comment in (
        (360, ["openai:down"], "before flaky fails: only the judge that never succeeds"),
        (390, ["openai:flaky", "openai:down"], "flaky and down fire; rare (10 attempts < 20) and healthy do not"),
    ):
        states = {n: state_at(partial(_fires, partial(judge, JUDGES), n), t, SHORT + 1) for n in JUDGES}
        firing = [n for n, s in states.items() if s == "firing"]
        assert firing == expected, states
        out.append(alert_test(t, "ConvowatchJudgeErrors", [_judge_alert(n, t) for n in firing], comment))
    return "".join(out)


def quiet_judge_tests() -> str:
    out = [
        header(
            "judge errors: nothing fires below the ratio or the minimum attempts",
            [
                "  openai:rare     never succeeds, 1 error per minute: 10 attempts < 20",
                "  openai:healthy  10 ok per minute, no errors",
                "  openai:noisy    10 ok and 1 error per minute: 9.1 % < 10 %",
            ],
        )
    ]
    out += _judge_series(QUIET_JUDGES)
    for n in QUIET_JUDGES:
        assert state_at(partial(_fires, partial(judge, QUIET_JUDGES), n), 100, SHORT + 1) == "inactive", n
    out += ["    alert_rule_test:\n", alert_test(100, "ConvowatchJudgeErrors", [], "none of them")]
    return "".join(out)


# --- behaviour rise ------------------------------------------------------------------------------

M4 = 420
BEHAVIOUR_BURST = 381  # the burst runs from this minute to M4
BEHAVIOUR_LIFT, BEHAVIOUR_MIN_TURNS = 0.05, 200
TURNS = 5  # assistant turns per conversation
# (product, behaviour) -> (hits of each conversation closing in a calm minute, in a burst minute, inclusion probability)
BEHAVIOURS: dict[tuple[str, str], tuple[list[int], list[int], float]] = {
    ("shop", "ignore"): ([1] + [0] * 9, [2, 2, 2, 1, 1, 1, 0, 0, 0, 0], 1.0),
    ("shop", "follow_up"): ([1] + [0] * 9, [2, 2, 2, 1, 1, 1, 0, 0, 0, 0], 1.0),
    ("shop", "redundant"): ([1] + [0] * 9, [1] + [0] * 9, 1.0),
    ("small", "ignore"): ([0, 0], [2, 1], 1.0),
    ("spread", "ignore"): ([1] * 5 + [0] * 5, [2, 2, 2, 1, 1, 1, 1, 0, 0, 0], 1.0),
    ("clustered", "ignore"): ([TURNS] + [0] * 9, [TURNS, TURNS] + [0] * 8, 1.0),
    ("sampled", "ignore"): ([1] * 5 + [0] * 5, [2, 2, 2, 1, 1, 1, 1, 0, 0, 0], 0.1),
}
ERROR_BEHAVIOURS = {"ignore": 1, "redundant": 1, "follow_up": 0}  # convowatch_behaviour_error


def behaviour_counters(product: str, behaviour: str) -> dict[str, Increments]:
    """Per-minute increments of the behaviour counters for conversations closing with the given hits (a share pi of
    them judged, weight 1/pi each): turns and hits weighted by 1/pi, and the variance sums t^2, h*t, h^2 over the
    judged conversations times 1/pi^2 (in expectation: the sums over all conversations over pi)."""
    calm, burst, pi = BEHAVIOURS[(product, behaviour)]
    minutes = [burst if i >= BEHAVIOUR_BURST else calm for i in range(1, M4 + 1)]
    return {
        "turns": [TURNS * len(hits) for hits in minutes],
        "hits": [sum(hits) for hits in minutes],
        "tt": [TURNS * TURNS * len(hits) / pi for hits in minutes],
        "ht": [TURNS * sum(hits) / pi for hits in minutes],
        "hh": [sum(h * h for h in hits) / pi for hits in minutes],
    }


def _rate_and_variance(c: dict[str, Increments], t: int, width: int, offset: int = 0) -> tuple[float, float, float]:
    turns = window(c["turns"], t, width, offset)
    r = window(c["hits"], t, width, offset) / turns
    tt, ht, hh = (window(c[k], t, width, offset) for k in ("tt", "ht", "hh"))
    return r, max(hh - 2 * r * ht + r * r * tt, 0) / turns**2, turns


def behaviour_rise(key: tuple[str, str], t: int) -> tuple[bool, dict[str, float]]:
    c = behaviour_counters(*key)
    p, var, n = _rate_and_variance(c, t, SHORT)
    pb, var_base, _ = _rate_and_variance(c, t, BASE, offset=SHORT)
    threshold = pb + max(BEHAVIOUR_LIFT, Z * math.sqrt(var + var_base))
    return ERROR_BEHAVIOURS[key[1]] == 1 and p > threshold and n >= BEHAVIOUR_MIN_TURNS, {"P": p, "N": n, "B": pb}


def _behaviour_alert(key: tuple[str, str], t: int) -> Alert:
    (product, behaviour), v = key, behaviour_rise(key, t)[1]
    return {
        "labels": {"severity": "ticket", "behaviour": behaviour, "product": product, "model_version": "v1"},
        "summary": f"Behaviour {behaviour} rising on {product} v1",
        "description": f"Share of assistant turns showing {behaviour} over the last 10m: {pct(v['P'])} of {count(v['N'])} "
        f"turns, significantly above the 6h before it: {pct(v['B'])} (threshold: that + max(5 points, 3 standard errors "
        "of the difference, conversations as clusters), for 10m).",
        "runbook_url": "docs/runbooks.md#convowatchbehaviourrise",
    }


def behaviour_tests() -> str:
    out = [
        header(
            "behaviour rise: a behaviour's rate per assistant turn against the 6h before the short window",
            [
                f"Conversations of {TURNS} assistant turns; per minute, the hits of each conversation (calm, then burst from",
                f"minute {BEHAVIOUR_BURST}); rates are hits / turns:",
                "  shop/ignore      10/min, 2 % -> 18 %                                   -> fires",
                "  shop/follow_up   the same rise, but follow_up is not an error behaviour -> nothing",
                "  shop/redundant   2 % throughout                                         -> nothing",
                "  small/ignore      2/min, 0 % -> 30 %: 100 turns in 10m < 200           -> nothing (low volume)",
                "  spread/ignore    10/min, 10 % -> 20 %, hits spread over conversations   -> fires",
                "  clustered/ignore 10/min, 10 % -> 20 %, every turn of 1 then 2 conversations a minute: the turns of a",
                "                   conversation are one cluster, so 20 % is within 3 standard errors -> nothing",
                "  sampled/ignore   spread's conversations, 10 % judged (weight 10): sampling error -> nothing",
            ],
        )
    ]
    metrics = {
        "turns": "convowatch_behaviour_turns_weight_total",
        "tt": "convowatch_behaviour_turns_squared_variance_total",
        "hits": "convowatch_behaviour_hits_weight_total",
        "ht": "convowatch_behaviour_hits_turns_variance_total",
        "hh": "convowatch_behaviour_hits_squared_variance_total",
    }
    for behaviour, error in ERROR_BEHAVIOURS.items():
        out.append(
            f"      - series: 'convowatch_behaviour_error{{behaviour=\"{behaviour}\"}}'\n        values: '{error}+0x{M4}'\n"
        )
    turns_written = set()
    for product, behaviour in BEHAVIOURS:
        c = behaviour_counters(product, behaviour)
        for key, metric in metrics.items():
            if key in ("turns", "tt"):  # one series per product: every behaviour is judged on the same turns
                if product in turns_written:
                    continue
                out.append(series(metric, c[key], product=product, model_version="v1"))
            else:
                out.append(series(metric, c[key], behaviour=behaviour, product=product, model_version="v1"))
        turns_written.add(product)

    out.append("    alert_rule_test:\n")
    for t, expected, comment in (
        (BEHAVIOUR_BURST - 1, [], "before the burst"),
        (390, [], "shop and spread are above their thresholds since minutes 384 and 386: pending"),
        (M4, [("shop", "ignore"), ("spread", "ignore")], "shop and spread fire; the rest do not (see above)"),
    ):
        firing = [k for k in BEHAVIOURS if state_at(partial(_fires, behaviour_rise, k), t, SHORT + BASE) == "firing"]
        assert firing == expected, (t, firing)
        out.append(alert_test(t, "ConvowatchBehaviourRise", [_behaviour_alert(k, t) for k in firing], comment))
    assert state_at(partial(_fires, behaviour_rise, ("spread", "ignore")), 390, SHORT + BASE) == "pending"
    # follow_up rose exactly as shop/ignore did; clustered rose 10 points, as spread did, and only its clusters keep it quiet
    assert behaviour_rise(("shop", "follow_up"), M4)[1] == behaviour_rise(("shop", "ignore"), M4)[1]
    assert math.isclose(behaviour_rise(("clustered", "ignore"), M4)[1]["P"], behaviour_rise(("spread", "ignore"), M4)[1]["P"])
    return "".join(out)


# --- agreement with the users --------------------------------------------------------------------

# Its windows are days, so these tests have a file of their own, with hourly samples and rule evaluations (8 days of
# minutes would load too many samples): the model's unit here is the hour, and `for: 10m` means "held at two
# evaluations in a row".
A_SHORT, A_BASE = 24, 7 * 24  # hours: agreement_short 1d, agreement_baseline 7d (the week before the last day)
A_MIN_CONVERSATIONS, A_MIN_DROP = 50, 0.10
DROP = A_BASE  # the drop starts after the first week, when the baseline window is full
H5 = DROP + A_SHORT
PAIRS = ("dsat/negative", "sat/positive", "dsat/positive", "sat/negative")
# product -> (rated conversations with a confident label per hour, agreement before the drop, after it)
AGREEMENT = {
    "shop": (6, 0.8, 0.5),
    "small": (1.2, 0.8, 0.3),
    "steady": (6, 0.8, 0.8),
    "slight": (24, 0.8, 0.72),
}


@functools.cache  # `window` caches sums by the lists' identity: build them once
def agreement_counters(product: str) -> dict[str, Increments]:
    """Per-hour increments of convowatch_user_feedback_conversations_total by "label/feedback": agreeing pairs split
    evenly between the two kinds, disagreeing ones too; uncertain labels and conflicting feedback on top (excluded)."""
    rated, before, after = AGREEMENT[product]
    share = [after if h > DROP else before for h in range(1, H5 + 1)]
    return {
        "dsat/negative": [rated * a / 2 for a in share],
        "sat/positive": [rated * a / 2 for a in share],
        "dsat/positive": [rated * (1 - a) / 2 for a in share],
        "sat/negative": [rated * (1 - a) / 2 for a in share],
        "uncertain/negative": [rated / 2] * H5,
        "dsat/conflict": [rated / 2] * H5,
    }


def agreement_drop(product: str, h: int) -> tuple[bool, dict[str, float]]:
    """The alert's condition at hour ``h``, and the numbers its description shows."""
    c = agreement_counters(product)

    def share_and_n(width: int, offset: int = 0) -> tuple[float, float]:
        n = sum(window(c[k], h, width, offset) for k in PAIRS)
        return (window(c[PAIRS[0]], h, width, offset) + window(c[PAIRS[1]], h, width, offset)) / n, n

    p, n = share_and_n(A_SHORT)
    pb, m = share_and_n(A_BASE, offset=A_SHORT)
    threshold = pb - max(A_MIN_DROP, Z * math.sqrt(pb * (1 - pb) * (1 / n + 1 / m)))
    fires = p < threshold and n >= A_MIN_CONVERSATIONS and m >= A_MIN_CONVERSATIONS
    return fires, {"P": p, "N": n, "B": pb, "M": m}


def _agreement_alert(product: str, h: int) -> Alert:
    v = agreement_drop(product, h)[1]
    return {
        "labels": {"severity": "ticket", "scorer_version": "s1", "product": product, "model_version": "v1"},
        "summary": f"Scorer s1 agrees less with the users of {product} v1",
        "description": f"The scorer's label matched the users' feedback on {pct(v['P'])} of {count(v['N'])} rated "
        f"conversations over the last 1d, against {pct(v['B'])} of {count(v['M'])} over the 7d before it (threshold: that "
        "- max(10 points, 3 standard errors of the difference), for 10m). The judge may have drifted, the product "
        "changed, or a prompt broke.",
        "runbook_url": "docs/runbooks.md#convowatchuseragreementdrop",
    }


def agreement_tests() -> str:
    out = [
        header(
            "user agreement drop: the scorer's agreement with user feedback over 1d against the 7d before it",
            [
                "Rated conversations with a confident label per hour, and the share where the label matches the",
                f"feedback, before and after hour {DROP} (uncertain labels and conflicting feedback come on top, excluded):",
                "  shop    6/h, 80 % -> 50 %                                 -> fires",
                "  small   1.2/h, 80 % -> 30 %: 29 a day < 50                -> nothing (low volume)",
                "  steady  6/h, 80 % throughout                              -> nothing",
                "  slight  24/h, 80 % -> 72 %: significant, but < 10 points  -> nothing",
            ],
            interval="1h",
        )
    ]
    for product in AGREEMENT:
        for pair, increments in agreement_counters(product).items():
            label, feedback = pair.split("/")
            out.append(
                series(
                    "convowatch_user_feedback_conversations_total",
                    increments,
                    scorer_version="s1",
                    label=label,
                    feedback=feedback,
                    product=product,
                    model_version="v1",
                )
            )
    out.append("    alert_rule_test:\n")
    for h, expected, comment in (
        (DROP, [], "the last hour before the drop"),
        (H5, ["shop"], "a day after the drop: shop fires (below its threshold for hours); the rest do not (see above)"),
    ):
        firing = [k for k in AGREEMENT if agreement_drop(k, h)[0] and agreement_drop(k, h - 1)[0]]  # held for > 10m
        assert firing == expected, (h, firing)
        out.append(alert_test(h * 60, "ConvowatchUserAgreementDrop", [_agreement_alert(k, h) for k in firing], comment))
    # slight's fall is significant (3 standard errors of the difference), only the 10-point minimum keeps it quiet
    v = agreement_drop("slight", H5)[1]
    assert v["B"] - v["P"] > Z * math.sqrt(v["B"] * (1 - v["B"]) * (1 / v["N"] + 1 / v["M"]))
    return "".join(out)


# --- pipeline stalled and dead letters ----------------------------------------------------------


def _stall_test(
    name: str,
    comments: list[str],
    closed: Increments,
    scored: Increments | None,
    unscored: Increments | None,
    checks: list[tuple[int, bool, str]],
    unsampled: Increments | None = None,
) -> str:
    out = [
        header(name, comments),
        series("convowatch_events_total", seg(M3, [(1, M3, 30)]), type="turn", outcome="accepted"),
        series("convowatch_events_total", closed, type="end", outcome="closed"),
    ]
    if scored is not None:
        out.append(series("convowatch_conversations_scored_total", scored, label="sat", product="shop", model_version="v1"))
    if unscored is not None:
        out.append(
            series(
                "convowatch_conversations_unscored_total", unscored, reason="JudgeUnavailable", product="shop", model_version="v1"
            )
        )
    if unsampled is not None:
        out.append(
            series(
                "convowatch_conversations_sampled_total",
                unsampled,
                decision="unsampled",
                reason="rate",
                product="shop",
                model_version="v1",
            )
        )

    def stalled(t: int) -> bool:
        finished = window(scored, t, STALL) + window(unscored, t, STALL) + window(unsampled, t, STALL)
        return window(closed, t, STALL) > 0 and finished == 0

    out.append("    alert_rule_test:\n")
    for t, firing, comment in checks:
        assert (state_at(stalled, t, STALL) == "firing") == firing, (name, t)
        alerts = (
            [
                {
                    "labels": {"severity": "page"},
                    "summary": "convowatch pipeline stalled: conversations close but none is scored",
                    "description": f"{count(window(closed, t, STALL))} conversations closed over the last 15m and none was scored, "
                    "stored unscored or left unsampled (for 10m). Quality monitoring is blind until scoring resumes.",
                    "runbook_url": "docs/runbooks.md#convowatchpipelinestalled",
                }
            ]
            if firing
            else []
        )
        out.append(alert_test(t, "ConvowatchPipelineStalled", alerts, comment))
    return "".join(out)


def stall_tests() -> str:
    closing = seg(M3, [(1, M3, 10)])
    return "".join(
        [
            _stall_test(
                "pipeline stalled: scoring stops at minute 60 while conversations keep closing",
                [
                    "10 conversations close per minute; scored 10/min until minute 60, then nothing. No unscored series at all",
                    "(a worker that never stored a conversation unscored does not export it): the rule must still fire.",
                ],
                closing,
                seg(M3, [(1, 60, 10)]),
                None,
                [
                    (70, False, "nothing scored for 10m only: the 15m window still holds scores"),
                    (80, False, "condition true since minute 75: pending"),
                    (100, True, "stalled since minute 75, for 10m: fires"),
                ],
            ),
            _stall_test(
                "pipeline not stalled: the judge is down and every conversation is stored unscored",
                ["Unscored conversations are finished work (the judge-errors alert covers them); no scored series at all."],
                closing,
                None,
                seg(M3, [(1, M3, 10)]),
                [(100, False, "unscored counts as progress")],
            ),
            _stall_test(
                "pipeline not stalled: at a low sampling rate no conversation was judged for a while",
                ["Every conversation closing from minute 60 on is left unsampled (counted, not judged): finished work."],
                closing,
                seg(M3, [(1, 59, 10)]),
                None,
                [(100, False, "unsampled counts as progress")],
                unsampled=seg(M3, [(60, M3, 10)]),
            ),
            _stall_test(
                "pipeline not stalled: no conversation closes",
                ["Turns arrive (long conversations) but none closes, and nothing is scored: nothing to score, no alert."],
                seg(M3, []),
                seg(M3, []),
                None,
                [(100, False, "quiet is not stalled")],
            ),
        ]
    )


def _dead_letter_test(
    name: str, comments: list[str], accepted: Increments, invalid: Increments, checks: list[tuple[int, bool, str]]
) -> str:
    out = [
        header(name, comments),
        series("convowatch_events_total", accepted, type="turn", outcome="accepted"),
        series("convowatch_events_total", invalid, type="invalid", outcome="dead_letter"),
        series("convowatch_dead_letters_total", invalid, reason="not_json"),
    ]

    def events(t: int) -> float:
        return window(accepted, t, SHORT) + window(invalid, t, SHORT)

    def surging(t: int) -> bool:
        return events(t) >= DL_MIN and window(invalid, t, SHORT) / events(t) > DL_RATIO

    out.append("    alert_rule_test:\n")
    for t, firing, comment in checks:
        assert (state_at(surging, t, SHORT) == "firing") == firing, (name, t)
        alerts = (
            [
                {
                    "labels": {"severity": "ticket"},
                    "summary": "Dead letters surging",
                    "description": f"Dead letters over the last 10m: {pct(window(invalid, t, SHORT) / events(t))} of the {count(events(t))} "
                    "consumed events (threshold 5%, for 10m). Producers may be sending events that break the contract.",
                    "runbook_url": "docs/runbooks.md#convowatchdeadlettersurge",
                }
            ]
            if firing
            else []
        )
        out.append(alert_test(t, "ConvowatchDeadLetterSurge", alerts, comment))
    return "".join(out)


def dead_letter_tests() -> str:
    return "".join(
        [
            _dead_letter_test(
                "dead-letter surge: 10 bad events per minute among 100 good ones from minute 31",
                [
                    "Every bad event is counted twice: in convowatch_events_total (type invalid, outcome dead_letter) and in",
                    "convowatch_dead_letters_total by reason.",
                ],
                seg(M3, [(1, M3, 100)]),
                seg(M3, [(31, M3, 10)]),
                [(30, False, "no dead letters yet"), (40, False, "above 5 % since minute 36: pending"), (60, True, "fires")],
            ),
            _dead_letter_test(
                "dead letters at low volume: half the events are bad, but only 100 events in 10m",
                ["5 good and 5 bad events per minute: the ratio is 50 % but 100 events < 200."],
                seg(M3, [(1, M3, 5)]),
                seg(M3, [(1, M3, 5)]),
                [(60, False, "low volume cannot alert")],
            ),
        ]
    )


# --- broker lost data ------------------------------------------------------------------------------


def _one_finding_tests(
    name: str,
    comments: list[str],
    metric: str,
    found: Increments,
    labels: dict[str, str],
    quiet: dict[str, str],
    alertname: str,
    alert: Callable[[float], Alert],
    checks: list[tuple[int, bool, str]],
) -> str:
    """A counter that grows at one moment (``found``) under ``labels`` and never under ``quiet``; ``alertname`` fires
    from ``for`` after it until the increase has left its 1h window, ``alert`` gives its payload from the increase."""
    out = [
        header(name, comments),
        series(metric, found, **labels),
        series(metric, seg(M3, []), **quiet),
        "    alert_rule_test:\n",
    ]
    for t, firing, note in checks:
        assert (state_at(lambda u: window(found, u, LOST) > 0, t, 0) == "firing") == firing, (name, t)
        out.append(alert_test(t, alertname, [alert(window(found, t, LOST))] if firing else [], note))
    return "".join(out)


def lost_data_tests() -> str:
    """The sink finds the scores topic's log shorter than its position at minute 31 (a broker restart)."""
    return _one_finding_tests(
        "broker lost data: the sink finds the scores topic shorter than its position at minute 31",
        [
            "The counter exists at 0 from the start (the sink creates it for every topic it reads), so the",
            "first finding is an increase Prometheus can see.",
        ],
        "convowatch_broker_lost_data_total",
        seg(M3, [(31, 31, 1)]),
        {"topic": "convowatch.scores", "instance": "sink-1:9465"},
        {"topic": "convowatch.events"},
        "ConvowatchBrokerLostData",
        lambda n: {
            "labels": {"severity": "page", "topic": "convowatch.scores"},
            "summary": "The Kafka broker lost records of convowatch.scores",
            "description": "A worker or the sink found the log of convowatch.scores shorter than what it had "
            f"consumed ({count(n)} time(s) over the last 1h): the broker lost records (a restart without durable storage, "
            "or a lost disk). Conversations and scores from before the loss that were not yet processed are gone; "
            "reconcile and replay from the source (runbook).",
            "runbook_url": "docs/runbooks.md#convowatchbrokerlostdata",
        },
        [
            (30, False, "nothing lost yet"),
            (35, False, "found at minute 31: pending"),
            (45, True, "fires"),
            (80, True, "keeps firing within the hour after the finding"),
            (100, False, "resolved an hour later; the events topic never fired"),
        ],
    )


def quarantine_tests() -> str:
    """The assemble stage quarantines two records at minute 31 (a bug on one kind of event); score never does."""
    return _one_finding_tests(
        "records quarantined: the assemble stage dead-letters 2 records it failed on at minute 31",
        ["Each stage creates its counter at 0 when it starts, so the first quarantine is an increase Prometheus sees."],
        "convowatch_quarantined_records_total",
        seg(M3, [(31, 31, 2)]),
        {"stage": "assemble", "instance": "worker-1:9464"},
        {"stage": "score", "instance": "worker-1:9464"},
        "ConvowatchRecordsQuarantined",
        lambda n: {
            "labels": {"severity": "ticket", "stage": "assemble"},
            "summary": "The assemble stage quarantined records",
            "description": f"The assemble stage failed twice on {count(n)} record(s) over the last 1h and sent them to "
            "the dead-letter topic (reason quarantined) so its partitions go on: a bug, or a record no bound of the "
            "event contract caught. Those records are not monitored; the dead letters say which error (runbook).",
            "runbook_url": "docs/runbooks.md#convowatchrecordsquarantined",
        },
        [
            (30, False, "nothing quarantined yet"),
            (35, False, "quarantined at minute 31: pending"),
            (45, True, "fires"),
            (100, False, "resolved an hour later; the score stage never fired"),
        ],
    )


# --- a process that does nothing while records wait ------------------------------------------------

STUCK_FROM, STUCK_UNTIL = 31, 79  # worker-1 consumes nothing in these minutes, while 500 records wait


def _gauge(values: list[tuple[int, float]], until: int) -> str:
    """promtool notation for a gauge: ``value`` from each (minute, value) on, to ``until``."""
    parts = []
    for i, (start, value) in enumerate(values):
        end = values[i + 1][0] - 1 if i + 1 < len(values) else until
        parts.append(f"{_num(value)}x{end - start}")
    return " ".join(parts)


def stuck_tests() -> str:
    consumed = seg(M3, [(1, STUCK_FROM - 1, 100), (STUCK_UNTIL + 1, M3, 100)])
    lag = [(0, 0.0), (STUCK_FROM, 500.0), (STUCK_UNTIL + 11, 0.0)]

    def lag_at(t: int) -> float:
        return [v for start, v in lag if start <= t][-1]

    out = [
        header(
            "worker stuck: worker-1 consumes nothing from minute 31 to 79 while 500 records wait",
            [
                "worker-1 consumes 100 events a minute, nothing in minutes 31-79, then catches up (lag 0 from minute 90).",
                "The sink has 5 records waiting at every scrape and writes 100 rows a minute: busy, not stuck.",
                "worker-2 owns nothing to read (lag 0) and consumes nothing: idle, not stuck.",
            ],
        ),
        series("convowatch_events_total", consumed, type="turn", outcome="accepted"),
        f'      - series: \'convowatch_consumer_lag{{job="convowatch", instance="worker-1:9464", topic="convowatch.events", partition="0"}}\'\n'
        f"        values: '{_gauge(lag, M3)}'\n",
        f'      - series: \'convowatch_consumer_lag{{job="convowatch", instance="worker-1:9464", '
        f'topic="convowatch-conversations-changelog", partition="0"}}\'\n        values: \'{_gauge([(0, 27.0)], M3)}\'\n',
        f'      - series: \'convowatch_consumer_lag{{job="convowatch", instance="sink-1:9465", topic="convowatch.scores", partition="0"}}\'\n'
        f"        values: '{_gauge([(0, 5.0)], M3)}'\n",
        series("convowatch_sink_rows_total", seg(M3, [(1, M3, 100)]), instance="sink-1:9465", table="conversation_scores"),
        f'      - series: \'convowatch_consumer_lag{{job="convowatch", instance="worker-2:9464", topic="convowatch.events", partition="1"}}\'\n'
        f"        values: '{_gauge([(0, 0.0)], M3)}'\n",
        "    alert_rule_test:\n",
    ]

    def stuck(t: int) -> bool:
        return lag_at(t) > 0 and window(consumed, t, STALL) == 0

    for t, firing, comment in [
        (40, False, "records wait, but it consumed within the last 15m"),
        (50, False, "nothing consumed for 15m: pending"),
        (56, True, "fires 10m later"),
        (79, True, "still stuck"),
        (81, False, "consumes again: resolved"),
    ]:
        assert (state_at(stuck, t, 0) == "firing") == firing, t
        alerts = (
            [
                {
                    "labels": {"severity": "page", "instance": "worker-1:9464"},
                    "summary": "convowatch process worker-1:9464 does nothing while records wait",
                    "description": "500 records wait in a partition worker-1:9464 reads, and over the last 15m it consumed no "
                    "event, retried no judge call, waited for no budget and wrote nothing (for 10m). A worker the consumer "
                    "group evicted can stay stuck; restart it: nothing is lost, it resumes from its committed offsets (runbook).",
                    "runbook_url": "docs/runbooks.md#convowatchworkerstuck",
                }
            ]
            if firing
            else []
        )
        out.append(alert_test(t, "ConvowatchWorkerStuck", alerts, comment))
    return "".join(out)


# --- judge budget --------------------------------------------------------------------------------

BUDGET_WAITS = {  # (limit, instance) -> seconds waited per minute
    ("tokens_per_day", "worker-1:9464"): seg(M3, [(31, M3, 45)]),
    ("calls_per_minute", "worker-1:9464"): seg(M3, [(1, M3, 20)]),
    ("calls_per_minute", "worker-2:9464"): seg(M3, [(1, M3, 20)]),
    ("tokens_per_minute", "worker-2:9464"): seg(M3, [(31, 38, 60)]),
}


def budget_share(limit: str, t: int) -> float:
    """The worker held back most for ``limit``: its waited seconds over the short window, per second."""
    return max(window(w, t, SHORT) / (SHORT * 60) for (lim, _), w in BUDGET_WAITS.items() if lim == limit)


def _budget_held(limit: str, t: int) -> bool:
    return budget_share(limit, t) > BUDGET_WAIT_SHARE


def budget_tests() -> str:
    out = [
        header(
            "judge budget exhausted: a worker waits for the budget more than half the time",
            [
                "Seconds each worker's scoring waited for a budget limit, per minute:",
                "  tokens_per_day     worker-1 45 s/min from minute 31 (75 %)              -> fires",
                "  calls_per_minute   worker-1 and worker-2 20 s/min each (33 %; 67 % if summed) -> nothing: a share per worker",
                "  tokens_per_minute  worker-2 60 s/min for minutes 31-38 only: above 50 % for 7m < for (10m) -> nothing",
            ],
        )
    ]
    out += [
        series("convowatch_judge_budget_wait_seconds_total", w, instance=instance, limit=limit)
        for (limit, instance), w in BUDGET_WAITS.items()
    ]
    limits = list(dict.fromkeys(limit for limit, _ in BUDGET_WAITS))
    out.append("    alert_rule_test:\n")
    for t, expected, comment in (
        (30, [], "nothing waits for more than a third of the time yet"),
        (40, [], "tokens_per_day above 50 % since minute 37, tokens_per_minute since 36: pending"),
        (60, ["tokens_per_day"], "tokens_per_day fires; tokens_per_minute's burst ended, calls_per_minute stays at 33 %"),
        (M3, ["tokens_per_day"], "still firing"),
    ):
        firing = [lim for lim in limits if state_at(partial(_budget_held, lim), t, SHORT) == "firing"]
        assert firing == expected, (t, firing)
        out.append(
            alert_test(
                t,
                "ConvowatchJudgeBudgetExhausted",
                [
                    {
                        "labels": {"severity": "ticket", "limit": lim},
                        "summary": f"Judge budget {lim} is holding scoring back",
                        "description": f"A worker waited for the judge budget ({lim}) {pct(budget_share(lim, t))} of the last 10m "
                        "(threshold 50%, for 10m). Conversations wait in the closed topic: none is lost, but scores "
                        "arrive late and the closed topic's lag grows.",
                        "runbook_url": "docs/runbooks.md#convowatchjudgebudgetexhausted",
                    }
                    for lim in firing
                ],
                comment,
            )
        )
    assert "firing" not in states(lambda u: budget_share("tokens_per_minute", u) > BUDGET_WAIT_SHARE, SHORT, M3).values()
    assert "pending" in states(lambda u: budget_share("tokens_per_minute", u) > BUDGET_WAIT_SHARE, SHORT, M3).values()
    return "".join(out)


HEADER = """\
# promtool unit tests for the committed rules (default AlertWindows): fire and not-fire for every alert,
# low-volume cases, a burst shorter than `for`, and the same-time-yesterday variant.
# Run: promtool test rules dashboards/alerts/tests/convowatch.rules.test.yml
# Counters go up by the stated amount every minute; `a+bxn` is promtool's notation for n steps of b from a.
# Written by make_unit_tests.py: expected alerts and values come from its model of the rules (per-minute sums
# over each window), not from promtool.
rule_files:
  - ../convowatch.rules.yml
evaluation_interval: 1m
tests:
"""


def text() -> str:
    return (
        HEADER
        + dissatisfaction_tests()
        + uncertain_and_judge_tests()
        + quiet_judge_tests()
        + behaviour_tests()
        + stall_tests()
        + dead_letter_tests()
        + budget_tests()
        + lost_data_tests()
        + quarantine_tests()
        + stuck_tests()
    )


def agreement_text() -> str:
    return (
        HEADER.replace("every minute;", "every hour;")
        .replace("(per-minute sums", "(per-hour sums")
        .replace("evaluation_interval: 1m", "evaluation_interval: 1h")
        .replace("convowatch.rules.test.yml", AGREEMENT_OUT.name)
        .replace(
            "for every alert,\n# low-volume cases, a burst shorter than `for`, and the same-time-yesterday variant.",
            "for the alert on the\n# scorer's agreement with its users, whose windows are days.",
        )
        + agreement_tests()
    )


def files() -> dict[Path, str]:
    """Each promtool test file and the text the model writes for it."""
    return {OUT: text(), AGREEMENT_OUT: agreement_text()}


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        stale = [path.name for path, text_ in files().items() if path.read_text(encoding="utf-8") != text_]
        print(f"stale: {', '.join(stale)} (run make_unit_tests.py)" if stale else "current")
        sys.exit(1 if stale else 0)
    for path, text_ in files().items():
        path.write_text(text_, encoding="utf-8")
        print(f"wrote {path}")
