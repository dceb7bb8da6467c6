"""Read a registry entry's literal fields from its module's source, without importing the module.

``clustersim --help`` lists the strategy kinds and the ``plan`` command's planners with their
one-line summaries (``clustersim plan --help``: with their options); importing the modules that define them would load simpy, numpy and pydantic
(about 0.5 s of a 2-core machine's time) only to print a page. Each such module registers itself
with a call like ``register(StrategyKind(name="spmd", summary="...", ...))``; this module finds
that call in the source (Python's ``ast``) and returns its literal keyword values. A call whose
values are not literals gives None, and the caller imports the module instead (the slow path).
"""

from __future__ import annotations

import ast
import importlib.util


def _call_sources(text: str, call: str):
    """The source of each ``call(...)`` in ``text``, in order: from its name to the bracket that
    closes it (found with ``tokenize``, which knows strings and comments), so that only the call is
    parsed. An occurrence inside a comment or a string may give text that is no call: the caller
    parses each and keeps the first that is one."""
    import io
    import tokenize

    at = text.find(f"{call}(")
    while at >= 0:
        if at == 0 or not (text[at - 1].isalnum() or text[at - 1] == "_"):  # not part of a longer name
            depth = 0
            lines = text[at:].splitlines(keepends=True)
            try:
                for token in tokenize.generate_tokens(io.StringIO(text[at:]).readline):
                    if token.type == tokenize.OP and token.string in "([{":
                        depth += 1
                    elif token.type == tokenize.OP and token.string in ")]}":
                        depth -= 1
                        if depth == 0:
                            row, col = token.end
                            yield "".join(lines[:row - 1]) + lines[row - 1][:col]
                            break
            except (tokenize.TokenError, SyntaxError, IndentationError):
                pass
        at = text.find(f"{call}(", at + 1)


def _assigned_literal(text: str, name: str) -> ast.expr | None:
    """The value of the module-level assignment ``name = <literal>`` in ``text`` (parsed from the
    ``=`` to the end of its statement, found with ``tokenize``), or None."""
    import io
    import re
    import tokenize

    found = re.search(rf"^{re.escape(name)}\s*(?::[^=\n]*)?=(?!=)", text, re.MULTILINE)
    if found is None:
        return None
    rest = text[found.end():].lstrip(" \t")
    lines = rest.splitlines(keepends=True)
    try:
        for token in tokenize.generate_tokens(io.StringIO(rest).readline):
            if token.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
                row, col = token.start
                node = ast.parse("".join(lines[:row - 1]) + lines[row - 1][:col], mode="eval").body
                ast.literal_eval(node)
                return node
    except (tokenize.TokenError, SyntaxError, IndentationError, ValueError, IndexError):
        return None
    return None


def literal_call_fields(module: str, call: str, keys: tuple[str, ...],
                        names: bool = False) -> dict[str, object] | None:
    """The literal values of ``keys`` in the first ``call(...)`` of ``module``'s source that has them
    all, or None when the module, the call or a literal value is missing. ``names``: a value that is a
    bare name is read from the module's own ``NAME = <literal>`` assignment (a planner's ``options=OPTIONS``).
    Only the module's parent packages are imported (to find it)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    with open(spec.origin, encoding="utf-8") as source:
        text = source.read()
    for code in _call_sources(text, call):
        try:
            node = ast.parse(code, mode="eval").body
        except SyntaxError:
            continue
        if not isinstance(node, ast.Call):
            continue
        fields = {k.arg: k.value for k in node.keywords if k.arg in keys}
        if set(fields) != set(keys):
            continue
        if names:
            for key, value in fields.items():
                if isinstance(value, ast.Name):
                    fields[key] = _assigned_literal(text, value.id) or value
        try:
            return {key: ast.literal_eval(value) for key, value in fields.items()}
        except ValueError:
            return None  # the registering call, with a value that is not a literal: import the module
    return None
