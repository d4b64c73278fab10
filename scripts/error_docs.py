"""The troubleshooting page's part on the core's errors, made from the code where they live.

Each error enum of the core (``#[derive(thiserror::Error)]`` under ``crates/trash-panda/src``) is
read from its source: every variant's ``#[error("...")]`` message and its doc comment. A doc
comment's paragraph that starts ``What to do:`` is the advice the page gives; an enum's own doc
comment may hold one for those of its variants that share it. The Python exception each error
becomes is read from the binding's one mapping, ``bindings/python/src/errors.rs``.

A variant with no advice fails the site's build (``check``, run by scripts/docs_hooks.py) unless
``INTERNAL`` names it with the reason no user can act on it; those are listed apart on the page
as bugs to report. So a new error cannot reach a release without a line telling users what to do.
Plain Python (no Markdown or MkDocs), so tests feed it made-up sources.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "crates" / "trash-panda" / "src"
MAPPING = ROOT / "bindings" / "python" / "src" / "errors.rs"
CLASSES = ROOT / "python" / "trash_panda" / "errors.py"
MARKER = "<!-- core-errors -->"
CLASSES_MARKER = "<!-- error-classes -->"
ADVICE = "What to do:"

# Variants a user of the library cannot meet or act on: checks of the library's own bookkeeping
# between its layers. Each is still listed on the page, as a bug to report.
INTERNAL = {
    "IoError::BufferTooSmall": "the engine sizes every buffer it reads into from the plan's layout",
    "OrderError::DuplicateModelBlock": "the model's block list comes from the plan, whose blocks are distinct",
    "OrderError::OutsidePosition": "the positions are recorded by the library while the model runs",
    "OrderError::EmptyOutsideName": "outside modules are named by the library from the model's own names",
    "StreamError::Alignment": "the alignment comes from the engine's configuration (512 bytes on a GPU)",
    "StreamError::UnknownBlock": "the hooks ask only for blocks of the plan the engine was made from",
    "StreamError::UnknownTensor": "the hooks ask only for tensors of the block's own layout",
    "StreamError::AllLeased": "the hooks release each block's lease before staging past the lookahead",
    "StreamError::AlreadyLeased": "the hooks lease a block once per run of it",
    "StreamError::WorkerPanicked": "a panic in a staging worker is a bug in the library",
    "StreamError::WorkersGone": "the workers exit only after a panic, itself reported first",
    "ProfileError::LengthMismatch": "the profile is made by the library from the plan's own blocks",
    "ProfileError::UnknownBlock": "the events are recorded by the library for the plan's own blocks",
    "ProfileError::EndBeforeStart": "the events are timed by the library on one monotonic clock",
    "ProfileError::BadSeconds": "the events are timed by the library on one monotonic clock",
    "ExpandError::NoTensor": "the CPU backend expands only tensors of the block's own layout",
    "ExpandError::WrongSize": "the CPU backend makes each destination from its tensor's shape and the compute dtype",
    "ExpandError::OverlapsStaged": "the CPU backend expands into tensors of its own, apart from the staging buffers",
    "ExpandError::Overlap": "the CPU backend makes a tensor of its own for each destination",
    "ExpandError::NotPlanned": "the binding runs an expansion with the destinations it planned",
    "PipelineError::NoSuchStage": "the pipeline runner offers only its own stages' places",
    "PipelineError::GivesToItself": "the pipeline runner offers every loaded stage but the one needing room",
    "PipelineError::HolderTwice": "the pipeline runner offers each loaded stage once",
}

# Enums the binding's mapping does not name, with the Python exception they reach users as and
# how (None: not listed, because another enum repeats each of its errors).
ELSEWHERE: dict[str, tuple[str | None, str]] = {
    "HeaderError": ("CheckpointError", "inside the checkpoint's error, after the file's name"),
    "GgufError": ("CheckpointError", "inside the checkpoint's error, after the file's name"),
    "UnitsError": ("ArgumentError", "after the argument's name (bindings/python/src/plan.rs)"),
    "ScaleReadError": ("DtypeError", "from a fp8 block's scale (bindings/python/src/stream.rs)"),
    "RuleError": (None, "the stream engine reports each as its own variant of the same name and message"),
}


@dataclass
class Variant:
    name: str
    template: str | None  # None: transparent, the message is the wrapped error's
    doc: list[str]  # paragraphs, advice excluded
    advice: str | None
    line: int


@dataclass
class Enum:
    name: str
    path: Path
    doc: list[str]
    advice: str | None
    variants: list[Variant] = field(default_factory=list)


def _skip_string(text: str, i: int) -> int:
    """The index after the string literal that starts at ``text[i] == '"'``."""
    i += 1
    while text[i] != '"':
        i += 2 if text[i] == "\\" else 1
    return i + 1


def _close(text: str, i: int) -> int:
    """The index after the bracket that closes the one at ``text[i]``; strings and line comments
    are skipped (a brace inside an error message is not code)."""
    pairs = {"{": "}", "(": ")", "[": "]"}
    stack = [pairs[text[i]]]
    i += 1
    while stack:
        c = text[i]
        if c == '"':
            i = _skip_string(text, i)
            continue
        if text.startswith("//", i):
            i = text.index("\n", i)
        elif c in pairs:
            stack.append(pairs[c])
        elif c == stack[-1]:
            stack.pop()
        i += 1
    return i


def _paragraphs(lines: list[str]) -> tuple[list[str], str | None]:
    """Doc comment lines as (paragraphs, advice): rustdoc links become plain code."""
    paragraphs, current = [], []
    for line in [*lines, ""]:
        if line.strip():
            current.append(line.strip())
        elif current:
            paragraphs.append(_plain(" ".join(current)))
            current = []
    advice = next((p[len(ADVICE) :].strip() for p in paragraphs if p.startswith(ADVICE)), None)
    return [p for p in paragraphs if not p.startswith(ADVICE)], advice


def _plain(text: str) -> str:
    text = re.sub(r"\[(`[^`]+`)\]\((?!https?:)[^)]*\)", r"\1", text)  # [`X`](path) -> `X`
    text = re.sub(r"\[(`[^`]+`)\](?!\()", r"\1", text)  # [`X`] -> `X`
    return re.sub(r"\[([^\]`]+)\]\((?!https?:)[^)]*\)", r"\1", text)


def _args(text: str) -> list[str]:
    """The comma-separated arguments of a macro call's inside, brackets and strings kept whole."""
    args, start, i = [], 0, 0
    while i < len(text):
        c = text[i]
        if c == '"':
            i = _skip_string(text, i)
            continue
        if c in "([{":
            i = _close(text, i)
            continue
        if c == ",":
            args.append(text[start:i].strip())
            start = i + 1
        i += 1
    return [a for a in [*args, text[start:].strip()] if a]


def _value_name(arg: str) -> str:
    """What a positional argument of a message stands for: ``path.display()`` is the path."""
    arg = arg.lstrip("&*.")
    if m := re.match(r"(\w+)\.", arg):
        return m.group(1)
    if m := re.match(r"(?:\w+::)*(\w+)\(\.?(\w*)\)", arg):
        return m.group(2) or m.group(1)
    return "…"


def template(attribute: str) -> str | None:
    """The message of an ``#[error(...)]`` attribute with each value as ``<name>``; None for
    ``transparent``."""
    inside = attribute[attribute.index("(") + 1 : attribute.rindex(")")].strip()
    if inside == "transparent":
        return None
    args = _args(inside)
    literal = args[0][1:-1]
    text = re.sub(r"\\\n\s*", "", literal).replace('\\"', '"').replace("\\\\", "\\")
    positional = iter(args[1:])

    def value(m: re.Match[str]) -> str:
        if m.group(0) in ("{{", "}}"):
            return m.group(0)[0]
        name = m.group(1).split(":")[0]
        if name == "":
            name = _value_name(next(positional, ""))
        return f"<{'message' if name.isdigit() else name.lstrip('.')}>"

    return re.sub(r"\{\{|\}\}|\{([^{}]*)\}", value, text)


def parse(source: str, path: Path) -> list[Enum]:
    """Every ``thiserror`` enum of a Rust source file, with its variants."""
    enums = []
    for derive in re.finditer(r"#\[derive\([^)]*thiserror::Error[^)]*\)\]", source):
        head = re.compile(r"enum\s+(\w+)\s*\{").search(source, derive.end())
        assert head is not None, f"{path}: no enum after {derive.group(0)}"
        above = source[: derive.start()].rstrip("\n").split("\n")
        doc_lines: list[str] = []
        for line in reversed(above):
            if not line.strip().startswith(("///", "#[")):
                break
            if line.strip().startswith("///"):
                doc_lines.insert(0, line.strip()[3:])
        doc, advice = _paragraphs(doc_lines)
        enum = Enum(head.group(1), path, doc, advice)
        end = _close(source, head.end() - 1) - 1
        enum.variants = _variants(source, head.end(), end)
        enums.append(enum)
    return enums


def _variants(source: str, i: int, end: int) -> list[Variant]:
    found, docs, attributes = [], [], []
    while i < end:
        if source[i] in " \t\n,":
            i += 1
        elif source.startswith("///", i):
            stop = source.index("\n", i)
            docs.append(source[i + 3 : stop])
            i = stop
        elif source.startswith("//", i):
            i = source.index("\n", i)
        elif source.startswith("#[", i):
            stop = _close(source, i + 1)
            attributes.append(source[i:stop])
            i = stop
        else:
            m = re.compile(r"\w+").match(source, i)
            assert m is not None, f"unexpected {source[i : i + 20]!r} in an error enum"
            line = source.count("\n", 0, i) + 1
            i = m.end()
            while source[i] in " \t\n":
                i += 1
            if source[i] in "({":
                i = _close(source, i)
            errors = [a for a in attributes if re.match(r"#\[error\s*\(", a)]
            assert errors, f"variant {m.group(0)} at line {line} has no #[error(...)]"
            paragraphs, advice = _paragraphs(docs)
            found.append(Variant(m.group(0), template(errors[0][2:-1]), paragraphs, advice, line))
            docs, attributes = [], []
    return found


def core_enums(root: Path = CORE) -> list[Enum]:
    enums = []
    for path in sorted(root.rglob("*.rs")):
        source = path.read_text(encoding="utf-8")
        if "thiserror::Error" in source:
            enums.extend(parse(source, path))
    return enums


def python_classes(mapping: str) -> dict[str, tuple[str | None, dict[str, str | None]]]:
    """For each enum the mapping converts: (the Python class of its variants not named, {variant:
    its class}); a class of None for a variant handed on to the error it wraps (``e.to_py()``)."""
    kinds = dict(re.findall(r'Kind::(\w+) => "(\w+)"', mapping))
    result: dict[str, tuple[str | None, dict[str, str | None]]] = {}
    for impl in re.finditer(r"impl ToPyErr for (\w+) \{", mapping):
        name = impl.group(1)
        body = mapping[impl.end() : _close(mapping, impl.end() - 1)]
        named: dict[str, str | None] = {}
        for m in re.finditer(rf"{name}::(\w+)", body):
            arm = body[body.index("=>", m.end()) :]
            kind = re.search(r"Kind::(\w+)", arm)
            handed_on = ".to_py()" in arm[: kind.start() if kind else len(arm)]
            named[m.group(1)] = None if handed_on or kind is None else kinds[kind.group(1)]
        other = re.search(r"\bother\s*=>[^\n]*?Kind::(\w+)", body)
        single = set(re.findall(r"Kind::(\w+)", body))
        default = kinds[other.group(1)] if other else kinds[single.pop()] if len(single) == 1 else None
        result[name] = (default, named)
    return result


def problems(enums: list[Enum], mapping: str, internal: dict[str, str] = INTERNAL) -> list[str]:
    """What keeps the page from being complete: each a sentence naming the variant and file."""
    found = []
    classes = python_classes(mapping)
    names = {f"{e.name}::{v.name}": (e, v) for e in enums for v in e.variants}
    for e in enums:
        if ELSEWHERE.get(e.name, ("",))[0] is None:
            continue  # another enum repeats its errors, and is checked
        if e.name not in classes and e.name not in ELSEWHERE:
            found.append(f"{e.name} ({e.path.name}): no Python exception: map it in errors.rs or ELSEWHERE")
        for v in e.variants:
            key = f"{e.name}::{v.name}"
            if v.template is not None and key not in internal and not (v.advice or e.advice):
                found.append(f"{key} ({e.path.name}:{v.line}): no '{ADVICE}' paragraph in its doc comment")
            if key in internal and v.advice:
                found.append(f"{key}: has advice, so it is not internal: take it out of INTERNAL")
    found += [f"{key}: in INTERNAL but no such variant" for key in internal if key not in names]
    found += [f"{name}: in ELSEWHERE but mapped in errors.rs" for name in ELSEWHERE if name in classes]
    return found


def _code(text: str) -> str:
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _exception(name: str | None) -> str:
    return f"[`{name}`][trash_panda.errors.{name}]" if name else "the wrapped error"


def markdown(enums: list[Enum], mapping: str, internal: dict[str, str] = INTERNAL) -> str:
    """The page's part: a heading per enum, then each variant's message and what to do."""
    classes = python_classes(mapping)
    out, bugs = [], []
    for e in enums:
        default, named = classes.get(e.name, (None, {}))
        if e.name in ELSEWHERE:
            default, how = ELSEWHERE[e.name]
            if default is None:
                continue
        where = e.path.relative_to(ROOT).as_posix() if e.path.is_relative_to(ROOT) else e.path.name
        if default is None:
            intro = "In Python: the exception given with each."
        else:
            intro = f"In Python: {_exception(default)}" + (f", {how}" if e.name in ELSEWHERE else "") + "."
        entries = []
        for v in e.variants:
            if v.template is None:
                continue
            if f"{e.name}::{v.name}" in internal:
                bugs.append(f"- {_code(v.template)} ({e.name}): {internal[f'{e.name}::{v.name}']}.")
                continue
            exception = named.get(v.name, default)
            other = f" In Python: {_exception(exception)}." if exception != default else ""
            advice = f" **{ADVICE}** {v.advice}" if v.advice else ""
            entries.append(f"- {_code(v.template)}: {' '.join(v.doc)}{other}{advice}")
        if not entries:
            continue
        out += [f"### {e.name}", "", f"{' '.join(e.doc)} {intro} Source: `{where}`.", ""]
        if e.advice:
            out += [f"**{ADVICE}** {e.advice}", ""]
        out += [*entries, ""]
    if bugs:
        out += [
            "### Errors that mean a bug",
            "",
            "These check the library's own bookkeeping; no call of yours should meet them. If one is",
            "raised, report it with the traceback and the message.",
            "",
            *bugs,
            "",
        ]
    return "\n".join(out)


def checked(enums: list[Enum], mapping: str, internal: dict[str, str] = INTERNAL) -> str:
    """``markdown``, or a failure (SystemExit, which stops the site's build) naming each variant
    the page would leave without advice."""
    missing = problems(enums, mapping, internal)
    if missing:
        raise SystemExit("troubleshooting: errors with nothing to tell users:\n  " + "\n  ".join(missing))
    return markdown(enums, mapping, internal)


def section() -> str:
    """The page's part, from the repository's sources."""
    return checked(core_enums(), MAPPING.read_text(encoding="utf-8"))


def classes_table(errors_py: str, enums: list[Enum], mapping: str) -> str:
    """The table of the Python exceptions (``trash_panda/errors.py``): each class, the builtin a
    caller may catch it as, what it means, and the core's errors raised as it."""
    raised_as: dict[str, set[str]] = {}
    classes = python_classes(mapping)
    for e in enums:
        default, named = classes.get(e.name, (ELSEWHERE.get(e.name, (None, ""))[0], {}))
        for v in e.variants:
            shown = v.template is not None and f"{e.name}::{v.name}" not in INTERNAL
            name = named.get(v.name, default) if shown else None
            if name is not None:
                raised_as.setdefault(name, set()).add(e.name)
    lines = ["| exception | also a | means | the core's errors raised as it |", "|---|---|---|---|"]
    for node in ast.parse(errors_py).body:
        if not isinstance(node, ast.ClassDef):
            continue
        bases = [ast.unparse(b) for b in node.bases if ast.unparse(b) != "TrashPandaError"]
        doc = " ".join((ast.get_docstring(node) or "").split()).replace("``", "`")
        core = ", ".join(f"[{n}](#{n.lower()})" for n in sorted(raised_as.get(node.name, ())))
        cells = [f"[`{node.name}`][trash_panda.errors.{node.name}]", ", ".join(f"`{b}`" for b in bases), doc, core]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def classes_section() -> str:
    return classes_table(CLASSES.read_text(encoding="utf-8"), core_enums(), MAPPING.read_text(encoding="utf-8"))
