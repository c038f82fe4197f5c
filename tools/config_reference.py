#!/usr/bin/env python3
"""docs/configuration.md, generated from the typed config and the annotated config file, so it cannot drift.

    python3 tools/config_reference.py           # print it
    python3 tools/config_reference.py --write   # write docs/configuration.md
    python3 tools/config_reference.py --check   # exit 1 if docs/configuration.md differs (tests/test_docs.py)

The keys, their types and defaults come from ``slurm_gpueff/config.py`` (each ``Section`` class and its
docstring); what each key does comes from the comments above it in ``etc/gpueff.toml``. A key one of them
has and the other lacks, or a default the file shows otherwise than the code, stops the generator with a
line naming it: the annotated file documents every key with its default.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tomllib
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from slurm_gpueff.config import SECTIONS, Config  # noqa: E402

ANNOTATED = os.path.join(ROOT, "etc", "gpueff.toml")
OUT = os.path.join(ROOT, "docs", "configuration.md")
KEY = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\s*=")
SECTION = re.compile(r"^\[([a-z_]+)\]\s*$")


class Drift(Exception):
    """The typed config and the annotated file disagree."""


@dataclass
class Group:
    """A comment block of the annotated file and the keys that follow it (no comment in between)."""

    comment: list[str] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)


@dataclass
class Part:
    groups: list[Group] = field(default_factory=list)


def parse(text: str) -> tuple[list[str], dict[str, Part]]:
    """The file's header comment, and per section its groups."""
    header: list[str] = []
    parts: dict[str, Part] = {}
    section: str | None = None
    pending: list[str] = []
    for line in text.splitlines():
        s = line.strip()
        if m := SECTION.match(s):
            if section is None:
                header, pending = header + pending, []
            elif pending:  # comments after a section's last key: the section's closing words
                parts[section].groups.append(Group(pending))
                pending = []
            section = m.group(1)
            parts[section] = Part()
        elif s.startswith("#"):
            pending.append(s[1:][1:] if s[1:].startswith(" ") else s[1:])
        elif m := KEY.match(s):
            if section is None:
                raise Drift(f"etc/gpueff.toml: key {m.group(1)} before any [section]")
            groups = parts[section].groups
            if pending or not groups:
                groups.append(Group(pending))
                pending = []
            groups[-1].keys.append(m.group(1))
        elif not s and pending and section is None:
            header, pending = header + pending + [""], []
    if pending and section is not None:
        parts[section].groups.append(Group(pending))
    return header, parts


def type_name(tp: object) -> str:
    names = {str: "string", float: "number", int: "integer", bool: "boolean"}
    if tp in names:
        return names[tp]
    args = getattr(tp, "__args__", ())
    if getattr(tp, "__origin__", None) is list:
        return f"list of {type_name(args[0])}s"
    if getattr(tp, "__origin__", None) is dict:
        return f"table of {type_name(args[1])}s"
    return str(tp)


def toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(toml(v) for v in value) + "]"
    if isinstance(value, float):
        return repr(value)
    return json.dumps(value)


def prose(lines: list[str]) -> list[str]:
    """Comment lines as Markdown: indented lines (aligned tables, examples) as a code block, the rest as
    text with what Markdown would take for markup escaped."""
    out: list[str] = []
    code: list[str] = []

    def flush() -> None:
        if code:
            out.extend(["", "```", *code, "```", ""])
            code.clear()

    in_span = False  # inside a `code span`, which may run over a line end: nothing in it is markup
    for line in lines:
        if line.startswith("  ") or re.match(r"^[a-z_]+ = ", line):
            code.append(line)
            continue
        flush()
        pieces = line.split("`")
        for i in range(len(pieces)):
            if (i % 2 == 1) == in_span:
                pieces[i] = pieces[i].replace("&", "&amp;").replace("<", "&lt;").replace("*", "\\*")
        in_span ^= (len(pieces) - 1) % 2 == 1
        text = "`".join(pieces)
        out.append("\\" + text if text.startswith("[") else text)  # not a link reference definition
    flush()
    return out


def generate() -> str:
    with open(ANNOTATED) as fh:
        text = fh.read()
    header, parts = parse(text)
    shown = tomllib.loads(text)
    if set(parts) - {*SECTIONS, "leads"}:
        raise Drift(f"etc/gpueff.toml: sections the config does not have: {sorted(set(parts) - {*SECTIONS, 'leads'})}")
    defaults = Config()
    out = [
        "# Configuration reference",
        "",
        "<!-- Generated by tools/config_reference.py from slurm_gpueff/config.py and etc/gpueff.toml: do not",
        "     edit here. Change those two, then run `python3 tools/config_reference.py --write`. -->",
        "",
        "Every key of `/etc/slurm-gpueff/gpueff.toml`, with its type, its default and what it does. The keys, types",
        "and defaults are the code's (`slurm_gpueff/config.py`); the text is the annotated file's",
        "(`etc/gpueff.toml`); this page is made from both, so it says what the installed version accepts. The",
        "files to start from, one per role, are in `etc/`",
        "([site guide](site-guide.md#3-the-config-file-of-each-role)).",
        "",
        *prose(header),
        "",
        "Sections: " + " · ".join(f"[[{name}]](#{name})" for name in [*SECTIONS, "leads"]),
        "",
    ]
    for name in [*SECTIONS, "leads"]:
        part = parts.get(name)
        if part is None:
            raise Drift(f"etc/gpueff.toml has no [{name}] section")
        out += [f"## {name}", ""]
        if name == "leads":
            out += ["A table of its own: its keys are the site's Slurm accounts, each a non-empty list of user "
                    "names. Default: empty.", ""]
        else:
            cls = SECTIONS[name]
            out += [*prose([(cls.__doc__ or "").replace("``", "`").strip()]), ""]
            documented = [k for g in part.groups for k in g.keys]
            missing = [k for k in cls.KEYS if k not in documented]
            extra = [k for k in documented if k not in cls.KEYS]
            if missing or extra:
                raise Drift(f"etc/gpueff.toml [{name}]: " + "; ".join(
                    ([f"keys not documented: {', '.join(missing)}"] if missing else []) +
                    ([f"keys the config does not have: {', '.join(extra)}"] if extra else [])))
        section_defaults = getattr(defaults, name)
        for group in part.groups:
            for key in group.keys:
                value = section_defaults[key] if isinstance(section_defaults, dict) else getattr(section_defaults, key)
                written = shown.get(name, {}).get(key)
                if written != value:
                    raise Drift(f"etc/gpueff.toml shows {name}.{key} = {toml(written)}, the default is {toml(value)}")
                tp = SECTIONS[name].KEYS[key][0]
                out.append(f"- `{key} = {toml(value)}` ({type_name(tp)})")
            if group.keys:
                out.append("")
            body = prose(group.comment)
            if body:
                out += [*body, ""]
    return "\n".join(_squeeze(out)).rstrip("\n") + "\n"


def _squeeze(lines: list[str]) -> list[str]:
    """No two blank lines in a row."""
    out: list[str] = []
    for line in lines:
        if line == "" and out and out[-1] == "":
            continue
        out.append(line)
    return out


def main(argv: list[str]) -> int:
    try:
        text = generate()
    except Drift as exc:
        print(f"config_reference: {exc}", file=sys.stderr)
        return 1
    if "--write" in argv:
        with open(OUT, "w") as fh:
            fh.write(text)
        return 0
    if "--check" in argv:
        with open(OUT) as fh:
            if fh.read() != text:
                print("docs/configuration.md differs from what slurm_gpueff/config.py and etc/gpueff.toml make: "
                      "run python3 tools/config_reference.py --write", file=sys.stderr)
                return 1
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
