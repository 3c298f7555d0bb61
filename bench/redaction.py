"""Redaction of personal data (scorers/redaction.py) measured on the 223 real LLM-Rubric conversations.

    .venv/bin/python bench/redaction.py [--seeds 5]

1. **On the corpus as it is**: what `Redactor` (every kind) replaces in the real conversations' turns, by kind —
   items that were there (the corpus is research chats with cited web sources) or false positives; the texts are
   not printed, only counts and each hit's category of surrounding text is left to `--show` for a reader.
2. **Planted items**: per seed, every conversation gets one sentence in a random user turn that holds one item of
   each kind, in a format drawn at random (e-mail addresses; phone numbers of six regions in national and
   international forms, numbers libphonenumber calls valid; card numbers of four networks with their Luhn digit,
   grouped by spaces, dashes or not at all; five key formats). Recall per kind = the share of planted items gone
   from the redacted text, with a 95 % Wilson interval over all seeds and the spread over seeds.

The items are synthetic (a seeded generator in this file), not real people's data; the recall is the detector's
on these formats in running text, not on everything users type.
"""

from __future__ import annotations

import argparse
import json
import random
import string
from collections import Counter
from pathlib import Path

import phonenumbers

from scorers.datasets.llm_rubric import load_real_conversations
from scorers.redaction import REDACTION_KINDS, Redactor, luhn_valid
from scorers.statistics import wilson_interval

REPO = Path(__file__).resolve().parents[1]
REAL = REPO / "data" / "llm-rubric" / "real_data.json"
OUT = REPO / "bench" / "results" / "redaction.json"
REGIONS = ("US", "GB", "DE", "FR", "IN", "AU")
NAMES = ("jane", "li.wei", "o.connor", "m_garcia", "dev+chat", "anna.k")
DOMAINS = ("example.com", "mail.example.co.uk", "uni-example.de", "corp.example.org")
CARD_PREFIXES = {"visa": ("4", 16), "mastercard": ("51", 16), "amex": ("37", 15), "discover": ("6011", 16)}


def email(rng: random.Random) -> str:
    return f"{rng.choice(NAMES)}{rng.randrange(100)}@{rng.choice(DOMAINS)}"


def phone(rng: random.Random) -> str:
    region = rng.choice(REGIONS)
    while True:
        example = phonenumbers.example_number(region)
        assert example is not None, region  # libphonenumber has an example for each of REGIONS
        national = str(example.national_number)
        digits = national[:-3] + "".join(rng.choice(string.digits) for _ in range(3))
        number = phonenumbers.parse(digits, region)
        if phonenumbers.is_valid_number(number):
            break
    fmt = rng.choice((phonenumbers.PhoneNumberFormat.NATIONAL, phonenumbers.PhoneNumberFormat.INTERNATIONAL))
    if region != "US" and fmt == phonenumbers.PhoneNumberFormat.NATIONAL:
        fmt = phonenumbers.PhoneNumberFormat.INTERNATIONAL  # a national number of another region needs its prefix
    return phonenumbers.format_number(number, fmt)


def card(rng: random.Random) -> str:
    prefix, length = CARD_PREFIXES[rng.choice(sorted(CARD_PREFIXES))]
    body = prefix + "".join(rng.choice(string.digits) for _ in range(length - len(prefix) - 1))
    check = next(d for d in string.digits if luhn_valid(body + d))
    digits = body + check
    sep = rng.choice(("", " ", "-"))
    return sep.join(digits[i : i + 4] for i in range(0, len(digits), 4)) if sep else digits


def key(rng: random.Random) -> str:
    alnum = string.ascii_letters + string.digits

    def chars(n: int, alphabet: str = alnum) -> str:
        return "".join(rng.choice(alphabet) for _ in range(n))

    return rng.choice(
        (
            "sk-proj-" + chars(40),
            "AKIA" + chars(16, string.ascii_uppercase + string.digits),
            "ghp_" + chars(36),
            "xoxb-" + chars(12, string.digits) + "-" + chars(24),
            "AIza" + chars(35, alnum + "-_"),
        )
    )


MAKERS = {"email": email, "phone": phone, "card": card, "key": key}
TEMPLATE = " By the way, reach me at {email} or on {phone}; I paid with {card} and my key {key} stopped working."


def run(seeds: int) -> dict:
    conversations = load_real_conversations(REAL)
    redactor = Redactor()
    original: Counter[str] = Counter()
    for conversation in conversations.values():
        for turn in conversation.turns:
            original.update(redactor.redact(turn.text).counts)
    per_seed: dict[str, list[float]] = {kind: [] for kind in REDACTION_KINDS}
    found: Counter[str] = Counter()
    planted = 0
    for seed in range(seeds):
        rng = random.Random(seed)
        removed: Counter[str] = Counter()
        for conversation in conversations.values():
            items = {kind: make(rng) for kind, make in MAKERS.items()}
            users = [t for t in conversation.turns if t.role == "user"] or list(conversation.turns)
            text = rng.choice(users).text + TEMPLATE.format(**items)
            redacted = redactor.redact(text).text
            for kind, item in items.items():
                removed[kind] += item not in redacted
        n = len(conversations)
        planted += n
        for kind in REDACTION_KINDS:
            per_seed[kind].append(removed[kind] / n)
            found[kind] += removed[kind]
    recall = {}
    for kind in REDACTION_KINDS:
        ci = wilson_interval(found[kind], planted)
        recall[kind] = {**ci.as_dict(), "per_seed": per_seed[kind], "found": found[kind], "planted": planted}
    return {
        "conversations": len(conversations),
        "turns": sum(len(c.turns) for c in conversations.values()),
        "seeds": seeds,
        "found_in_the_corpus_as_it_is": dict(original),
        "recall_on_planted_items": recall,
        "command": f".venv/bin/python bench/redaction.py --seeds {seeds}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    result = run(parser.parse_args().seeds)
    OUT.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"{result['conversations']} real conversations, {result['turns']} turns; {result['seeds']} seeds")
    print(f"replaced in the corpus as it is: {result['found_in_the_corpus_as_it_is'] or 'nothing'}")
    print(f"{'kind':<7}{'recall':>8}  95 % interval     per seed")
    for kind, r in result["recall_on_planted_items"].items():
        seeds = " ".join(f"{x:.3f}" for x in r["per_seed"])
        print(f"{kind:<7}{r['estimate']:>8.3f}  {r['low']:.3f} .. {r['high']:.3f}   {seeds}   ({r['found']}/{r['planted']})")
    print(f"wrote {OUT.relative_to(REPO)}")


if __name__ == "__main__":
    main()
