"""Expand Grafana's template variables and the ClickHouse plugin's macros into text an engine can run.

No Grafana can run here, so tests execute the dashboards' queries directly:
PromQL against a real Prometheus, SQL against chDB. These functions do the
substitutions Grafana (and the plugin) would do first, as they document them,
and refuse anything they do not know (an unknown macro or variable is a bug
in a dashboard, not something to pass through).

PromQL (`expand_promql`):

* template variables ``$name`` / ``${name}`` / ``${name:fmt}`` -> ``.*``
  (the dashboards' "All" value; they only appear inside ``=~"..."``);
* ``$__interval`` -> the step, ``$__range`` -> the dashboard range,
  ``$__rate_interval`` -> ``max($__interval + scrape, 4 * scrape)`` (Grafana's
  definition);
* a variable query ``label_values(selector, label)`` -> the PromQL
  ``count by (label) (last_over_time(selector[range]))``, whose series are
  exactly the label values Grafana would list for the range.

SQL (`expand_sql`), in the plugin's order:

1. ``$__conditionalAll(condition, $var)`` -> ``1=1`` when ``var`` is "All"
   (`ALL`) or empty, else ``condition`` (the plugin's frontend);
2. template variables, each format as Grafana's format registry defines it (scenes'
   ``formatRegistry``; a list is a multi-value selection):
   ``singlequote`` -> ``'v1','v2'`` with ``'`` written ``\\'`` and ``\\`` left alone (so a
   value ending in ``\\`` escapes the closing quote in ClickHouse: never use it for SQL);
   ``doublequote`` the same with ``"``; ``sqlstring`` -> ``'v1','v2'`` with ``'`` doubled and
   ``"`` written ``\\"``; ``percentencode`` -> encodeURIComponent then ``!'()*`` encoded too
   (only ``A-Za-z0-9-_.~%`` remain), a list as the one text ``{v1,v2}``; ``csv`` / ``raw``
   -> the values joined by ``,``; ``$name`` / ``${name}`` -> the value, or ``'v1','v2'``
   for a list (the plugin's default format);
3. the plugin's backend macros, as in its ``pkg/macros``: ``$__timeFilter(c)``
   -> ``c >= toDateTime(from) AND c <= toDateTime(to)`` (whole seconds),
   ``$__timeFilter_ms``, ``$__fromTime``, ``$__toTime``, ``$__fromTime_ms``,
   ``$__toTime_ms``, ``$__dateFilter(c)``, ``$__timeInterval(c)`` ->
   ``toStartOfInterval(toDateTime(c), INTERVAL n second)``,
   ``$__timeInterval_ms(c)``, ``$__interval_s``.
"""

from __future__ import annotations

import math
import re
import urllib.parse
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

ALL = "$__all"  # the value Grafana gives a variable whose "All" option is selected (no custom all value)
PROMQL_ALL = ".*"

_VARIABLE = re.compile(r"\$\{(?P<braced>\w+)(?::(?P<fmt>[\w]+))?\}|\$(?P<bare>\w+)")
_LABEL_VALUES = re.compile(r"^\s*label_values\((?P<selector>.+),\s*(?P<label>\w+)\s*\)\s*$", re.S)
_CONDITIONAL_ALL = "$__conditionalAll("


class MacroError(ValueError):
    """A query uses a macro, variable or format this module does not know, or is malformed."""


# --- PromQL -----------------------------------------------------------------------------------


def expand_promql(expr: str, *, range_s: float, interval_s: float, scrape_interval_s: float = 15.0) -> str:
    """``expr`` as Prometheus can run it: variables -> ``.*``, Grafana's interval/range variables -> durations."""
    builtins = {
        "__interval": duration(interval_s),
        "__range": duration(range_s),
        "__rate_interval": duration(max(interval_s + scrape_interval_s, 4 * scrape_interval_s)),
    }

    def substitute(m: re.Match[str]) -> str:
        name = m.group("braced") or m.group("bare")
        if name.startswith("__"):
            if name not in builtins:
                raise MacroError(f"unknown Grafana variable ${name} in PromQL: {expr!r}")
            return builtins[name]
        return PROMQL_ALL

    text = _VARIABLE.sub(substitute, expr)
    label_values = _LABEL_VALUES.match(text)
    if label_values:
        selector, label = label_values.group("selector").strip(), label_values.group("label")
        return f"count by ({label}) (last_over_time({selector}[{duration(range_s)}]))"
    if "label_values(" in text:
        raise MacroError(f"only label_values(selector, label) is supported: {expr!r}")
    return text


def duration(seconds: float) -> str:
    """A Prometheus duration: whole seconds as ``Ns``, else milliseconds."""
    if seconds <= 0 or not math.isfinite(seconds):
        raise MacroError(f"duration must be positive, got {seconds}")
    if float(seconds).is_integer():
        return f"{int(seconds)}s"
    return f"{max(1, round(seconds * 1000))}ms"


# --- SQL (ClickHouse plugin) ------------------------------------------------------------------


def expand_sql(
    sql: str, *, start: datetime, end: datetime, variables: Mapping[str, str | Sequence[str]], interval_s: float = 60.0
) -> str:
    """``sql`` as ClickHouse can run it: conditionalAll, template variables, then the plugin's macros."""
    text = _conditional_all(sql, variables)
    text = _template_variables(text, variables)
    return _macros(text, _utc(start), _utc(end), interval_s)


def _is_all(value: str | Sequence[str]) -> bool:
    values = [value] if isinstance(value, str) else list(value)
    return values in ([], [""], [ALL])


def _conditional_all(sql: str, variables: Mapping[str, str | Sequence[str]]) -> str:
    # Like the plugin's applyConditionalAll: innermost (last) first, replacing the exact "macro(arg0,arg1)" text.
    while (index := sql.rfind(_CONDITIONAL_ALL)) != -1:
        args = _macro_args(sql, index + len(_CONDITIONAL_ALL) - 1)
        if len(args) != 2:
            raise MacroError(f"$__conditionalAll needs 2 arguments, got {len(args)}: {sql[index : index + 120]!r}")
        condition, variable = args
        m = re.fullmatch(r"\s*\$\{?(\w+)\}?\s*", variable)
        if not m:
            raise MacroError(f"$__conditionalAll's second argument must be a plain $variable, got {variable!r}")
        name = m.group(1)
        if name not in variables:
            raise MacroError(f"no value given for variable ${name} (used in $__conditionalAll)")
        phrase = "1=1" if _is_all(variables[name]) else condition
        sql = sql.replace(f"{_CONDITIONAL_ALL}{condition},{variable})", phrase, 1)
    return sql


def _macro_args(text: str, open_paren: int) -> list[str]:
    """Arguments of the call whose "(" is at ``open_paren``: split at top-level commas, up to the matching ")"."""
    depth, start, args = 0, open_paren + 1, []
    for i in range(open_paren, len(text)):
        ch = text[i]
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                args.append(text[start:i])
                return args
        elif ch == "," and depth == 1:
            args.append(text[start:i])
            start = i + 1
    raise MacroError(f"unbalanced parentheses after {text[max(0, open_paren - 30) : open_paren + 1]!r}")


def singlequote(value: str) -> str:
    """Grafana's ``singlequote`` format of one value."""
    return "'" + value.replace("'", "\\'") + "'"


def doublequote(value: str) -> str:
    """Grafana's ``doublequote`` format of one value: ``"`` written ``\\"``, nothing else escaped."""
    return '"' + value.replace('"', '\\"') + '"'


def sqlstring(value: str) -> str:
    """Grafana's ``sqlstring`` format of one value: ``'`` doubled, ``"`` written ``\\"``, ``\\`` left alone."""
    return "'" + value.replace("'", "''").replace('"', '\\"') + "'"


def percentencode(value: str | Sequence[str]) -> str:
    """Grafana's ``percentencode`` format: encodeURIComponent with ``!'()*`` encoded too; a list as ``{v1,v2}``.

    What stays unencoded is exactly ``A-Z a-z 0-9 - _ . ~`` (Python's ``quote`` with nothing safe); a lone
    surrogate, which JavaScript's encodeURIComponent refuses with a URIError, is refused here too.
    """
    text = value if isinstance(value, str) else "{" + ",".join(value) + "}"
    try:
        return urllib.parse.quote(text, safe="", encoding="utf-8", errors="strict")
    except UnicodeEncodeError as exc:
        raise MacroError(f"percentencode cannot encode {text!r} (Grafana's encodeURIComponent raises URIError)") from exc


_LIST_FORMATS = {"singlequote": singlequote, "doublequote": doublequote, "sqlstring": sqlstring}


def _template_variables(sql: str, variables: Mapping[str, str | Sequence[str]]) -> str:
    def substitute(m: re.Match[str]) -> str:
        name, fmt = m.group("braced") or m.group("bare"), m.group("fmt")
        if name.startswith("__"):
            return m.group(0)  # a macro: the backend expands it
        if name not in variables:
            raise MacroError(f"no value given for variable ${name}")
        value = variables[name]
        values = [value] if isinstance(value, str) else list(value)
        if ALL in values:
            raise MacroError(f"${name} is 'All' outside $__conditionalAll; give the test concrete values")
        if fmt in _LIST_FORMATS:
            return ",".join(_LIST_FORMATS[fmt](v) for v in values)
        if fmt == "percentencode":
            return percentencode(value)
        if fmt in ("csv", "raw"):
            return ",".join(values)
        if fmt is not None:
            raise MacroError(f"variable format {fmt!r} of ${name} is not supported here")
        return value if isinstance(value, str) else "'" + "','".join(values) + "'"

    return _VARIABLE.sub(substitute, sql)


def _utc(t: datetime) -> datetime:
    if t.tzinfo is None:
        raise MacroError(f"time {t!r} has no timezone; pass an aware datetime")
    return t.astimezone(UTC)


def _macros(sql: str, start: datetime, end: datetime, interval_s: float) -> str:
    seconds = max(int(interval_s), 1)
    millis = max(int(interval_s * 1000), 1)

    def dt(t: datetime) -> str:
        return f"toDateTime({math.floor(t.timestamp())})"

    def dt64(t: datetime) -> str:
        return f"fromUnixTimestamp64Milli({math.floor(t.timestamp() * 1000)})"

    def date(t: datetime) -> str:
        return f"toDate('{t.strftime('%Y-%m-%d')}')"

    def between(column: str, low: str, high: str) -> str:
        return f"{column} >= {low} AND {column} <= {high}"

    with_column = {
        "timeFilter": lambda c: between(c, dt(start), dt(end)),
        "timeFilter_ms": lambda c: between(c, dt64(start), dt64(end)),
        "dateFilter": lambda c: between(c, date(start), date(end)),
        "timeInterval": lambda c: f"toStartOfInterval(toDateTime({c}), INTERVAL {seconds} second)",
        "timeInterval_ms": lambda c: f"toStartOfInterval(toDateTime64({c}, 3), INTERVAL {millis} millisecond)",
    }
    plain = {
        "fromTime": dt(start),
        "toTime": dt(end),
        "fromTime_ms": dt64(start),
        "toTime_ms": dt64(end),
        "interval_s": str(seconds),
    }
    out, pos = [], 0
    for m in re.finditer(r"\$__(\w+)", sql):
        if m.start() < pos:
            continue
        name = m.group(1)
        out.append(sql[pos : m.start()])
        if name in with_column:
            if m.end() >= len(sql) or sql[m.end()] != "(":
                raise MacroError(f"$__{name} needs a column argument: {sql[m.start() : m.start() + 60]!r}")
            args = _macro_args(sql, m.end())
            if len(args) != 1:
                raise MacroError(f"$__{name} takes 1 argument, got {len(args)}")
            out.append(with_column[name](args[0].strip()))
            pos = m.end() + len(args[0]) + 2
        elif name in plain:
            out.append(plain[name])
            pos = m.end()
        else:
            raise MacroError(f"unknown ClickHouse-plugin macro $__{name}")
    out.append(sql[pos:])
    return "".join(out)
