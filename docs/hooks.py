"""MkDocs hooks: the reference pages are generated from the code as the site is built, so
they cannot go stale: the option table from ``notebook_elastic/backends/options.py`` (each option declared
on the field it fills: ``JobSpec``, ``KubernetesOptions``, ``SlurmOptions``, ``Launching``) and the event
table from ``notebook_elastic/contract/event_types.py`` (each kind's fields) and ``contract/events.py``
(each kind's sentence, for a sample event)."""

from __future__ import annotations

import re
from typing import Any

OPTIONS_MARK = "<!-- options -->"
EVENTS_MARK = "<!-- events -->"
#: A note for whoever reads the page in the repository, where the table is not: left out of the site.
REPO_ONLY = re.compile(r"<!-- repo-only -->.*?<!-- /repo-only -->\n?", re.S)


def _fields(schema: dict[str, Any]) -> tuple[str, str]:
    required = set(schema.get("required", []))
    props = schema.get("properties", {})
    shown = [f"`{k}`" for k in props if k in required], [f"`{k}`" for k in props if k not in required]
    return ", ".join(shown[0]) or "—", ", ".join(shown[1]) or "—"


def events_table() -> str:
    from notebook_elastic.contract.event_types import Kind, event_schemas

    rows = ["| kind | always | when known |", "|---|---|---|"]
    for kind in Kind:
        schema = event_schemas().get(kind)
        if schema is None:
            continue
        always, sometimes = _fields(schema)
        rows.append(f"| `{kind.value}` | {always} | {sometimes} |")
    return "\n".join(rows) + "\n"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    markdown = REPO_ONLY.sub("", markdown)
    if OPTIONS_MARK in markdown:
        from notebook_elastic.backends.options import markdown_table

        markdown = markdown.replace(OPTIONS_MARK, markdown_table())
    if EVENTS_MARK in markdown:
        markdown = markdown.replace(EVENTS_MARK, events_table())
    return markdown
