"""The one error type for bad user input.

Every check of a scenario, a spec or a command-line value raises :class:`ConfigError`
with the dotted path of the offending field and the reason. The CLI turns it into one
line on stderr and exit code 2 (never a traceback). Layouts that are well-formed but
cannot run (out of memory) are *results* with ``infeasible_reason``, not errors.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """Bad input: names the field (dotted path) and the reason."""

    def __init__(self, field: str, reason: str):
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}" if field else reason)


def did_you_mean(name: object, known) -> str:
    """``"; did you mean 'x'?"`` when one of ``known`` is a close spelling of ``name`` (difflib's ratio
    >= 0.75, the closest first; up to two), else "". Said before the list of known names, so a typo in
    a 60-name catalog (``resnet51``) or a 32-key section (``micro_bach_size``) is answered at the start
    of the line, not by reading the list. With no close spelling, up to three names that contain what was
    typed (three characters or more, the shortest first): ``cluster.node: h100`` is answered with
    'dgx-h100', 'h100-pcie-8', 'p5-h100-efa' (difflib's ratio finds none of them), ``batch`` with the
    two batch sizes."""
    if not isinstance(name, str) or not name:
        return ""
    import difflib  # only on an error: the default run's start-up imports stay as tests/test_startup.py lists

    names = [str(k) for k in known]
    close = difflib.get_close_matches(name, names, n=2, cutoff=0.75)
    if not close and len(name) >= 3:
        close = sorted((k for k in names if name.lower() in k.lower() and k != name), key=lambda k: (len(k), k))[:3]
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def from_pydantic(exc, prefix: str = "", drop_tags: bool = False, schema=None,
                  hints: dict[str, str] | None = None) -> ConfigError:
    """Turn a pydantic ``ValidationError`` into one ConfigError: it names the first bad field, and
    the reason lists every other bad field of the input too (one line, so a file is fixed in one go).
    ``drop_tags``: the error came from a tagged union, whose tag pydantic puts first in the path.
    ``schema``: the model validated; an unknown key's reason then lists the keys known at that level.
    ``hints``: unknown key (dotted path) -> where that setting lives instead.

    A field whose type is a union (``cluster.node: str | dict``, ``parallelism.dp: int | "auto"``) fails once per
    member, and pydantic puts each member's tag in the path (``cluster.node.str``, ``cluster.node.dict[str,any]``):
    the tags are taken out (:func:`union_tag`), and the members' errors become one, ``expected a node name or a
    mapping of node fields, got 5`` (:func:`_accepted`); where the value had a member's shape and failed inside it
    (a mapping with a bad field), that inner error is the one said."""
    problems: list[tuple[str, str]] = []
    unions: dict[tuple, int] = {}   # a union field's path -> its problem's index
    errors = [_untagged(err, drop_tags) for err in exc.errors()]
    inside = {e["union"] for e in errors if e["union"] is not None and e["depth"] > 0}
    for e in errors:
        err, parts = e["err"], e["parts"]
        loc = ".".join(str(p) for p in parts if p != "__root__")
        field = ".".join(p for p in (prefix, loc) if p)
        if e["union"] is not None and e["depth"] == 0:   # a member the value did not have the shape of
            if e["union"] in inside:
                continue                                 # another member's inner error says what is wrong
            if e["union"] in unions:
                merged = problems[unions[e["union"]]]
                problems[unions[e["union"]]] = (merged[0], merged[1] + [(e["tag"], err)])
                continue
            unions[e["union"]] = len(problems)
            problems.append((field or prefix or "input", [(e["tag"], err)]))
            continue
        if err.get("type") == "union_tag_invalid" and (key := _TAG_KEYS.get(str(err.get("ctx", {}).get("discriminator")))):
            # "Input tag '' found using _fabric_kind() does not match any of the expected tags": the key that holds the
            # tag named, and what it takes
            problems.append((f"{field or prefix or 'input'}.{key}", f"expected one of {err['ctx'].get('expected_tags')}, "
                                                                    f"got {err['ctx'].get('tag')!r}"))
            continue
        problems.append((field or prefix or "input", _reason(err, parts, loc, schema, hints)))
    problems = [(f, m if isinstance(m, str) else _accepted(f, m)) for f, m in problems]
    field, reason = problems[0]
    others = [f"{f}: {m}" for f, m in problems[1:]]
    if others:
        reason += f" (and {len(others)} more: " + "; ".join(others) + ")"
    return ConfigError(field, reason)


#: A discriminated union's tag function (as pydantic names it) -> the key whose value is the tag.
_TAG_KEYS = {"_fabric_kind()": "topology"}


def _reason(err: dict, parts: list, loc: str, schema, hints: dict[str, str] | None) -> str:
    """One pydantic error's reason in the project's words (``parts``/``loc``: its path, union tags taken out)."""
    msg = err.get("msg", "invalid value")
    if err.get("type") == "extra_forbidden":
        msg = "unknown key"
        known = _known_keys(schema, parts[:-1]) if schema is not None else None
        if hints and loc in hints:
            msg += f": {hints[loc]}"
        elif known and parts:
            msg += did_you_mean(str(parts[-1]), known)
        if known:
            msg += f" (known here: {', '.join(known)})"
    elif err.get("type") == "value_error":  # a validator's own ValueError: its words, without pydantic's "Value error, "
        msg = str(msg).removeprefix("Value error, ")
    elif err.get("type") == "string_too_short" and (err.get("ctx") or {}).get("min_length") == 1:
        msg = "must not be empty"  # pydantic: "String should have at least 1 character"
    elif err.get("type") == "missing":
        msg = "required field is missing"
    elif err.get("type") == "model_type":  # "a valid dictionary or instance of TrainingSpec": a class name
        msg = (f"expected a mapping of its fields ({loc or 'section'}: {{key: value, ...}}, or --set "
               f"{loc or 'section'}.key=value), got {err.get('input')!r}")
    elif err.get("type") in ("float_parsing", "int_parsing") and isinstance(err.get("input"), str):
        msg += unit_hint(err["input"], str(parts[-1]) if parts else "", err.get("type") == "int_parsing")
    return msg


#: Union members' tags with no brackets, as pydantic-core names them in an error's path.
_PLAIN_TAGS = frozenset({"str", "int", "float", "bool", "none", "bytes", "any", "list", "dict", "set", "tuple",
                         "decimal", "date", "datetime", "time", "timedelta", "uuid", "url", "callable"})


def union_tag(part: object) -> bool:
    """Whether a part of a pydantic error's path is a union member's tag, not a field, key or index: a type name
    (``str``, ``int``), a bracketed schema (``dict[str,any]``, ``literal['auto']``, ``function-after[f(), int]``,
    ``list[int]``) or a pydantic model's class name (``NodeSpec``: the member a mapping was tried as)."""
    import re

    if not isinstance(part, str):
        return False
    if part in _PLAIN_TAGS or re.fullmatch(r"[a-z][a-z-]*\[.*\]", part):
        return True
    return part.isidentifier() and part in _model_names()


def _model_names() -> set[str]:
    from pydantic import BaseModel

    names, todo = set(), [BaseModel]
    while todo:
        for cls in todo.pop().__subclasses__():
            names.add(cls.__name__)
            todo.append(cls)
    return names


def _untagged(err: dict, drop_tags: bool) -> dict:
    """An error's path without union tags: ``union`` is the path up to its first tag (None: no union),
    ``tag`` that tag and ``depth`` how many parts follow it (0: the value did not have the member's shape)."""
    raw = list(err.get("loc", ()))[1 if drop_tags else 0:]
    first = next((i for i, p in enumerate(raw) if union_tag(p)), None)
    parts = [p for p in raw if not union_tag(p)]
    if first is None:
        return {"err": err, "parts": parts, "union": None, "tag": None, "depth": 0}
    union = tuple(raw[:first])
    return {"err": err, "parts": parts, "union": union, "tag": raw[first],
            "depth": len([p for p in raw[first + 1:] if not union_tag(p)])}


#: A union field's accepted values in words, by the field's name: a catalog name or the entry spelt out.
ACCEPTED = {"node": "a node name (clustersim specs list --kind node) or a mapping of node fields",
            "fabric": "a fabric name (clustersim specs list --kind fabric) or a mapping of fabric fields",
            "model": "a model name (clustersim specs list --kind model) or a mapping of model fields"}


def _tag_words(tag: str) -> str:
    """A union member's tag in words: ``int`` -> an integer, ``literal['auto']`` -> 'auto'."""
    import re

    if (inner := re.fullmatch(r"function-\w+\[[^,\]]*, (.*)\]", tag)) is not None:
        return _tag_words(inner.group(1))   # a validator around a type: the type
    if (literal := re.fullmatch(r"literal\[(.*)\]", tag)) is not None:
        return literal.group(1).replace(",", " or ")
    head = re.split(r"[\[-]", tag, maxsplit=1)[0]
    words = {"str": "a string", "int": "an integer", "float": "a number", "bool": "true or false", "none": "null",
             "list": "a list", "tuple": "a list", "set": "a list", "dict": "a mapping"}
    return words.get(head) or ("a mapping of its fields" if tag in _model_names() else f"a {tag}")


def _accepted(field: str, members: list[tuple[str, dict]]) -> str:
    """One reason for a union field whose every member refused the value: what it accepts (:data:`ACCEPTED`
    by the field's name, else each member in words) and what it got; a number with a unit says what to write."""
    words = ACCEPTED.get(field.rsplit(".", 1)[-1]) or " or ".join(dict.fromkeys(_tag_words(t) for t, _ in members))
    value = members[0][1].get("input")
    hint = next((unit_hint(e["input"], field.rsplit(".", 1)[-1], e.get("type") == "int_parsing")
                 for _, e in members if e.get("type") in ("float_parsing", "int_parsing")
                 and isinstance(e.get("input"), str)), "")
    return f"expected {words}, got {value!r}{hint}"


#: A field name's unit suffix -> the unit its number is in (the project's rule: units in field names).
_FIELD_UNITS = (("_gib", "GiB"), ("_gb", "GB"), ("_mb", "MB"), ("_gb_per_s", "GB/s"), ("_gbit_per_s", "Gb/s"),
                ("_us", "microseconds"), ("_ms", "milliseconds"), ("_s", "seconds"), ("_minutes", "minutes"),
                ("_min", "minutes"), ("_hours", "hours"), ("_watts", "W"), ("_usd", "USD"), ("_tflops", "TFLOP/s"))
#: Magnitude suffixes people write on counts (``tokens: 300B``, ``seq_length: 8k``): their powers of ten.
_MAGNITUDES = {"k": 3, "K": 3, "M": 6, "B": 9, "G": 9, "T": 12}


def unit_hint(text: str, field_name: str, integer: bool = False) -> str:
    """``": '300B' has a unit; write the plain number 300e9"`` for a number written with a magnitude or unit
    where the field takes a plain number; pydantic's "unable to parse string as a number" alone did not say
    what to write (``training.tokens: 300B``, ``simulation.hbm_reserve_gib: 2GiB``, ``training.seq_length:
    8k``: an integer field, so the digits, and 8192 beside 8000 since a "k" of tokens is often 1024)."""
    import re

    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z/]+)\s*", text)
    if not match:
        return ""
    number, suffix = match.groups()
    unit = next((u for end, u in sorted(_FIELD_UNITS, key=lambda e: -len(e[0])) if field_name.endswith(end)), None)
    if suffix in _MAGNITUDES and unit is None:
        exponent = _MAGNITUDES[suffix]
        if not integer:
            return f": {text!r} has a unit; write the plain number {number}e{exponent}"
        value = float(number) * 10 ** exponent
        binary = float(number) * 1024 if suffix in "kK" else None
        return f": {text!r} has a unit; write the plain number {value:.0f}" + (
            f" (or {binary:.0f} if k meant 1024)" if binary is not None and binary.is_integer() else "")
    if unit is not None:
        return f": {text!r} has a unit; write the plain number {number} (the field is in {unit}, as its name says)"
    return f": {text!r} has a unit; write the plain number"


def _known_keys(schema, parents: list) -> list[str] | None:
    """The field names of the pydantic model at ``parents`` inside ``schema`` (None where the path
    leaves the models: a dict, a union of several models)."""
    import typing

    from pydantic import BaseModel

    model = schema
    for part in parents:
        if isinstance(part, int):
            continue  # a list item: its model is the list's element type, unwrapped below
        field = model.model_fields.get(part) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if field is None:
            return None
        candidates, todo = [], [field.annotation]
        while todo:
            a = todo.pop()
            if isinstance(a, type) and issubclass(a, BaseModel):
                candidates.append(a)
            else:
                todo.extend(typing.get_args(a))
        if len(candidates) != 1:
            return None
        model = candidates[0]
    if isinstance(model, type) and issubclass(model, BaseModel):
        return list(model.model_fields)
    return None


def _accepts_bool(annotation) -> bool:
    import types
    import typing

    if annotation is bool or annotation is typing.Any:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_accepts_bool(a) for a in typing.get_args(annotation))
    return False


def no_bool_numbers(cls, value, info):
    """A pydantic ``field_validator("*", mode="before")``: ``true``/``false`` where a number is meant
    is an error (pydantic's lax mode would read ``tp: true`` as tp 1)."""
    if isinstance(value, bool) and info.field_name in cls.model_fields:
        if not _accepts_bool(cls.model_fields[info.field_name].annotation):
            raise ValueError("expected a number, got true/false")
    elif isinstance(value, list) and info.field_name in cls.model_fields and any(isinstance(v, bool) for v in value):
        # a list of numbers too (swarm's `peers_per_stage: [true, 4, ...]` counted true as 1 peer)
        if not _list_items_accept_bool(cls.model_fields[info.field_name].annotation):
            first = next(i for i, v in enumerate(value) if isinstance(v, bool))
            raise ValueError(f"expected numbers, got true/false at item {first}")
    return value


def _list_items_accept_bool(annotation) -> bool:
    """Whether a list the annotation allows may hold true/false: True where it allows no list of numbers (pydantic
    answers a list of strings)."""
    import types
    import typing

    members = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else (annotation,)
    lists = [a for a in members if typing.get_origin(a) in (list, tuple)
             and any(item in (int, float) for item in typing.get_args(a))]
    return not lists or any(_accepts_bool(item) for a in lists for item in typing.get_args(a))


def _own_signature(function):
    """``function`` with its signature computed once and kept (``__signature__``, which
    ``inspect.signature`` returns as is): pydantic inspects a field validator's signature once per field
    it applies to, and ``no_bool_numbers`` applies to every field of every spec (~380 fields on a
    default ``simulate``: ~8 ms of start-up)."""
    import inspect

    function.__signature__ = inspect.signature(function)
    return function


_own_signature(no_bool_numbers)
