"""README.md and docs/ agree with the code.

The README is a map (at most 250 lines) and docs/ holds the rest. These tests fail when the two drift apart:
a link that no longer resolves, a code path or `convowatch` command that no longer exists, a schema field or
setting added, renamed or removed without its doc, a module missing from the module tables. No network, no
servers: they read files and import the settings model and the click command tree.
"""

from __future__ import annotations

import glob
import json
import re
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from pydantic import BaseModel
from pydantic.fields import FieldInfo


def _repo_root() -> Path:
    """The checkout's root, wherever under tests/ this file lives."""
    for parent in Path(__file__).resolve().parents:
        if (parent / "pyproject.toml").is_file() and (parent / "README.md").is_file():
            return parent
    raise RuntimeError("no repository root above " + __file__)


REPO = _repo_root()
README = REPO / "README.md"
DOCS = REPO / "docs"
SCHEMAS = REPO / "stream" / "schemas"
MAX_README_LINES = 250


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


# --- markdown helpers ------------------------------------------------------------------

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.S | re.M)
INLINE_CODE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")


def _prose(markdown: str) -> str:
    """The text without fenced blocks and inline code (where link syntax is not a link)."""
    return INLINE_CODE.sub("", FENCE.sub("", markdown))


def _code(markdown: str) -> list[str]:
    """Fenced blocks and inline code spans."""
    return [m.group(0) for m in FENCE.finditer(markdown)] + INLINE_CODE.findall(FENCE.sub("", markdown))


def _links(markdown: str) -> list[str]:
    return LINK.findall(_prose(markdown))


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: the rendered text, lower case, punctuation but - and _ dropped, spaces to -;
    a repeated anchor gets -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", FENCE.sub("", markdown), flags=re.M):
        text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").replace("*", "")
        slug = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _table_rows(markdown: str) -> list[list[str]]:
    """Cells of every table row outside fenced blocks (header and separator rows included)."""
    rows = []
    for line in FENCE.sub("", markdown).splitlines():
        line = line.strip()
        if line.startswith("|") and line.endswith("|"):
            rows.append([c.strip() for c in line[1:-1].split("|")])
    return rows


def _tables(markdown: str) -> list[list[list[str]]]:
    """Each table outside fenced blocks as its rows of cells, the header row first (the separator row dropped)."""
    tables: list[list[list[str]]] = []
    previous_was_row = False
    for line in FENCE.sub("", markdown).splitlines():
        line = line.strip()
        is_row = line.startswith("|") and line.endswith("|")
        if is_row:
            cells = [c.strip() for c in line[1:-1].split("|")]
            if not previous_was_row:
                tables.append([])
            if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                tables[-1].append(cells)
        previous_was_row = is_row
    return tables


def _section(markdown: str, heading: str) -> str:
    """The text under a `## heading` up to the next heading of the same or a higher level."""
    m = re.search(rf"^(#+) {re.escape(heading)}\s*$", markdown, flags=re.M)
    assert m, f"no heading {heading!r}"
    level = len(m.group(1))
    end = re.search(rf"^#{{1,{level}}} ", markdown[m.end() :], flags=re.M)
    return markdown[m.end() : m.end() + end.start()] if end else markdown[m.end() :]


def _ticked(cell: str) -> list[str]:
    return INLINE_CODE.findall(cell)


# --- the README is a map ---------------------------------------------------------------


def test_readme_is_at_most_250_lines() -> None:
    text = README.read_text(encoding="utf-8")
    lines = text.count("\n") + (0 if text.endswith("\n") else 1)  # what `wc -l` counts, plus an unterminated last line
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; move detail into docs/"


def test_readme_links_every_docs_page() -> None:
    linked = {(REPO / target.split("#")[0]).resolve() for target in _links(README.read_text(encoding="utf-8"))}
    missing = [_rel(p) for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert not missing, f"docs pages the README's map does not link: {missing}"


# --- links and paths resolve -----------------------------------------------------------


def _relative_links() -> Iterator[tuple[Path, str]]:
    for page in _pages():
        for target in _links(page.read_text(encoding="utf-8")):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, flags=re.I):  # http:, https:, mailto:
                continue
            yield page, target


def test_relative_links_are_found() -> None:
    """The link extraction works (otherwise the next test would pass on nothing)."""
    by_page: dict[Path, int] = {}
    for page, _ in _relative_links():
        by_page[page] = by_page.get(page, 0) + 1
    assert by_page.get(README, 0) >= 10
    assert by_page.get(DOCS / "event-contract.md", 0) >= 1
    assert any(t.endswith(".png") for _, t in _relative_links())


def test_every_relative_link_resolves_to_a_file_and_anchor() -> None:
    broken = []
    for page, target in _relative_links():
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page.resolve()
        where = f"{_rel(page)}: ({target})"
        if not dest.is_relative_to(REPO) or not dest.exists():
            broken.append(f"{where}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest.read_text(encoding="utf-8")):
            broken.append(f"{where}: no heading with anchor #{anchor}")
    assert not broken, "\n".join(broken)


CODE_PATH_PREFIXES = ("stream/", "scorers/", "dashboards/", "deploy/", "bench/", "tests/", "docs/", "data/")


def test_repository_paths_named_in_code_exist() -> None:
    """Paths such as `stream/delivery.py` in code spans and blocks name files that exist. A test file is found by
    its name anywhere under tests/ (the tests may be regrouped into sub-directories)."""
    missing = []
    checked = 0
    for page in _pages():
        for code in _code(page.read_text(encoding="utf-8")):
            for token in re.split(r"[\s(),;:\"'=\[\]<>|`]+", code):
                if not token.startswith(CODE_PATH_PREFIXES):
                    continue
                token = token.split("#")[0].rstrip(".")
                checked += 1
                if (REPO / token).exists():
                    continue
                if any(c in token for c in "*{"):
                    if glob.glob(str(REPO / re.sub(r"\{[^}]*\}", "*", token))):
                        continue
                if token.startswith("tests/") and any((REPO / "tests").rglob(Path(token).name)):
                    continue
                missing.append(f"{_rel(page)}: {token}")
    assert checked >= 50
    assert not missing, "\n".join(missing)


# --- the event contract: linked, not embedded, and its field table is the schema's --------

SCHEMA_FILE = SCHEMAS / "events.schema.json"
CONTRACT_DOC = DOCS / "event-contract.md"
RECORDS = ("turn", "end", "feedback", "rating", "deadLetter")


def _schema() -> dict[str, Any]:
    return json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))


def test_event_contract_links_every_schema_file_and_nothing_embeds_one() -> None:
    doc = CONTRACT_DOC.read_text(encoding="utf-8")
    targets = {(CONTRACT_DOC.parent / t.split("#")[0]).resolve() for t in _links(doc)}
    schema_files = sorted(SCHEMAS.glob("*.json"))
    assert schema_files
    for f in schema_files:
        assert f.resolve() in targets, f"{_rel(CONTRACT_DOC)} does not link {_rel(f)}"
    readme_targets = {(REPO / t.split("#")[0]).resolve() for t in _links(README.read_text(encoding="utf-8"))}
    assert SCHEMA_FILE.resolve() in readme_targets, "the README's map does not link the event schema"
    for f in schema_files:
        schema_id = json.loads(f.read_text(encoding="utf-8"))["$id"]
        for page in _pages():
            assert schema_id not in page.read_text(encoding="utf-8"), f"{_rel(page)} embeds {_rel(f)}: link it instead"


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = schema["$defs"][node["$ref"].removeprefix("#/$defs/")]
    return node


def _contract_fields() -> dict[str, dict[str, tuple[str, str]]]:
    """record -> field -> (required cell, value cell), from the doc's field table."""
    table: dict[str, dict[str, tuple[str, str]]] = {}
    for cells in _table_rows(_section(CONTRACT_DOC.read_text(encoding="utf-8"), "Fields")):
        if len(cells) != 4 or not cells[0].startswith("`"):
            continue
        (record,), (field,) = _ticked(cells[0]), _ticked(cells[1])
        assert field not in table.setdefault(record, {}), f"{record}.{field} listed twice"
        table[record][field] = (cells[2], cells[3])
    return table


def test_event_contract_field_table_is_the_schemas() -> None:
    schema = _schema()
    table = _contract_fields()
    assert set(table) == set(RECORDS)
    for record in RECORDS:
        definition = schema["$defs"][record]
        documented = table[record]
        assert list(documented) == list(definition["properties"]), f"{record}: the doc's fields differ from the schema's"
        for field, (required, value) in documented.items():
            assert required == ("yes" if field in definition["required"] else "no"), f"{record}.{field}: required"
            prop = _resolve(schema, definition["properties"][field])
            values = [prop["const"]] if "const" in prop else prop.get("enum", [])
            for v in values:
                assert f"`{v}`" in value, f"{record}.{field}: the doc's value does not name `{v}`"


def test_event_contract_reason_codes_are_the_schemas() -> None:
    doc = CONTRACT_DOC.read_text(encoding="utf-8")
    codes = [_ticked(cells[0])[0] for cells in _table_rows(_section(doc, "Reason codes")) if cells and cells[0].startswith("`")]
    assert codes == _schema()["$defs"]["deadLetterReason"]["enum"]


# --- the settings reference is the settings model --------------------------------------

CONFIG_DOC = DOCS / "configuration.md"
ENV_DEPENDENT_DEFAULTS = {"cache_dir": "XDG_CACHE_HOME"}  # computed from the environment at import


def _model_in(annotation: Any) -> tuple[type[BaseModel] | None, str]:
    args = typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, "section"
    if typing.get_origin(annotation) is list and args and isinstance(args[0], type) and issubclass(args[0], BaseModel):
        return args[0], "list"
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        if models:
            return models[0], "optional"
    return None, ""


def _settings_fields(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, FieldInfo]]:
    """Every setting as a dotted path; a section is not a setting, an optional model or a list of models is one
    (with a default of its own) and so is each of its fields (`rules[].rate`)."""
    for name, field in model.model_fields.items():
        path = prefix + name
        sub, kind = _model_in(field.annotation)
        if kind != "section":
            yield path, field
        if sub is not None:
            yield from _settings_fields(sub, path + ("[]." if kind == "list" else "."))


def _render(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, str):
        return value or '""'
    if isinstance(value, list):
        return "[" + ", ".join(_render(v) for v in value) + "]"
    return str(value)


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    return _render(field.default_factory() if field.default_factory is not None else field.default)  # type: ignore[call-arg]


def _documented_settings() -> dict[str, list[str]]:
    rows: dict[str, list[str]] = {}
    for cells in _table_rows(_section(CONFIG_DOC.read_text(encoding="utf-8"), "Settings reference")):
        if len(cells) == 4 and cells[0].startswith("`"):
            (path,) = _ticked(cells[0])
            assert path not in rows, f"{path} listed twice"
            rows[path] = cells
    return rows


def test_settings_reference_lists_exactly_the_settings_model() -> None:
    from stream.settings import Settings

    model = [path for path, _ in _settings_fields(Settings)]
    documented = _documented_settings()
    assert len(model) > 50
    assert not set(model) - set(documented), f"settings missing from {_rel(CONFIG_DOC)}: {sorted(set(model) - set(documented))}"
    assert not set(documented) - set(model), (
        f"{_rel(CONFIG_DOC)} lists settings the model lacks: {sorted(set(documented) - set(model))}"
    )


def test_settings_reference_defaults_environment_names_and_choices_match_the_model() -> None:
    from stream.settings import Settings

    documented = _documented_settings()
    wrong = []
    for path, field in _settings_fields(Settings):
        if path not in documented:
            continue  # reported by the test above
        _, env, default, meaning = documented[path]
        expected_env = "—" if "[]" in path else f"`CONVOWATCH_{path.upper().replace('.', '__')}`"
        if env != expected_env:
            wrong.append(f"{path}: environment variable {env}, expected {expected_env}")
        if path in ENV_DEPENDENT_DEFAULTS:
            if ENV_DEPENDENT_DEFAULTS[path] not in default:
                wrong.append(f"{path}: the default should say it comes from {ENV_DEPENDENT_DEFAULTS[path]}")
        elif default != f"`{_default(field)}`":
            wrong.append(f"{path}: default {default}, the model's is `{_default(field)}`")
        if typing.get_origin(field.annotation) is typing.Literal:
            for choice in typing.get_args(field.annotation):
                if f"`{choice}`" not in meaning:
                    wrong.append(f"{path}: the meaning does not name the choice `{choice}`")
    assert not wrong, "\n".join(wrong)


# --- commands named in the docs exist, and the command table lists them all ------------


def _cli_commands() -> set[tuple[str, ...]]:
    from stream.commands.cli import cli

    out: set[tuple[str, ...]] = set()

    def walk(group: click.Group, prefix: tuple[str, ...]) -> None:
        for name, command in group.commands.items():
            out.add((*prefix, name))
            if isinstance(command, click.Group):
                walk(command, (*prefix, name))

    walk(cli, ())
    return out


def _groups(commands: set[tuple[str, ...]]) -> set[tuple[str, ...]]:
    return {c[:-1] for c in commands if len(c) > 1}


def _named_commands(text: str) -> Iterator[list[str]]:
    """`convowatch word [word ...]` in code: the words after the program name (arguments included)."""
    for code in _code(text):
        for m in re.finditer(r"(?<![\w./-])convowatch((?:[ \t]+[a-z][a-z0-9-]*)+)", code):
            yield m.group(1).split()


def test_every_convowatch_command_named_in_the_docs_exists() -> None:
    commands = _cli_commands()
    groups = _groups(commands)
    unknown = []
    named = 0
    for page in _pages():
        for words in _named_commands(page.read_text(encoding="utf-8")):
            named += 1
            path: tuple[str, ...] = ()
            for word in words:
                if path and path not in groups:
                    break  # the rest are the command's arguments
                path = (*path, word)
                if path not in commands:
                    unknown.append(f"{_rel(page)}: convowatch {' '.join(path)}")
                    break
    assert named >= 20
    assert not unknown, "\n".join(unknown)


def test_command_table_lists_every_command() -> None:
    section = _section(CONFIG_DOC.read_text(encoding="utf-8"), "Command line")
    listed = {tuple(words) for cells in _table_rows(section) for words in _named_commands("|".join(cells))}
    commands = _cli_commands()
    leaves = commands - _groups(commands)
    missing = sorted(" ".join(c) for c in leaves if c not in listed)
    assert not missing, f"commands missing from the table in {_rel(CONFIG_DOC)}: {missing}"


# --- the module tables name every module -----------------------------------------------


@pytest.mark.parametrize(("package", "page"), [("stream", "service.md"), ("scorers", "scorers.md")])
def test_module_table_names_exactly_the_packages_modules(package: str, page: str) -> None:
    tables = [table for table in _tables((DOCS / page).read_text(encoding="utf-8")) if table[0][0] == "module"]
    assert tables, f"docs/{page} has no module table"
    documented = {name for table in tables for cells in table[1:] for name in _ticked(cells[0])}
    root = REPO / package
    modules = {p.name for p in root.glob("*.py") if p.name != "__init__.py"}
    modules |= {p.name + "/" for p in root.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    missing = sorted(modules - documented)
    assert not missing, f"{package}/ modules missing from docs/{page}: {missing}"
    gone = sorted(name for name in documented if not (root / name).exists())
    assert not gone, f"docs/{page} names {package}/ entries that do not exist: {gone}"


# --- the metrics table is the service's metrics ----------------------------------------


def _expand_braces(name: str) -> list[str]:
    """`a{,_b}_c` -> [`a_c`, `a_b_c`]."""
    m = re.search(r"\{([^{}]*)\}", name)
    if not m:
        return [name]
    return [x for option in m.group(1).split(",") for x in _expand_braces(name[: m.start()] + option + name[m.end() :])]


def test_metrics_table_lists_exactly_the_services_metrics() -> None:
    from stream.metrics import ServiceMetrics

    exposed = set()
    for family in ServiceMetrics().registry.collect():
        exposed.add(family.name + ("_total" if family.type == "counter" else ""))
    section = _section((DOCS / "service.md").read_text(encoding="utf-8"), "Metrics (`/metrics` on every worker and the sink)")
    (table,) = [table for table in _tables(section) if table[0][0] == "metric"]
    documented = {
        expanded
        for cells in table[1:]
        for name in _ticked(cells[0])
        if name.startswith("convowatch_")
        for expanded in _expand_braces(name)
    }
    assert len(exposed) > 20
    assert not exposed - documented, f"metrics missing from docs/service.md: {sorted(exposed - documented)}"
    assert not documented - exposed, f"docs/service.md lists metrics the service lacks: {sorted(documented - exposed)}"
