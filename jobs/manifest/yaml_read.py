"""YAML events to values that keep their lines.

YAML is composed to nodes by the safe loader and turned into values here, not by PyYAML's constructor, so that every
value keeps its line, only plain scalars, mappings and lists get through, and aliases are counted as if expanded: a
"billion laughs" document is refused after a bounded amount of work. Problems go to `report(line, field, message)`.
"""

from __future__ import annotations

from functools import lru_cache

import yaml

from jobs.manifest.values import INVALID, MAX_DEPTH, MAX_NODES, Date, FieldError, Item, Map, Seq, shown

_T = "tag:yaml.org,2002:"
_LIBYAML = hasattr(yaml, "CSafeLoader")
_Parser = yaml.CSafeLoader if _LIBYAML else yaml.SafeLoader
_resolver = yaml.resolver.Resolver()
_construct = yaml.constructor.SafeConstructor()


def _by_node(method):
    return lambda text: method(yaml.ScalarNode("", text))


# The tags a value may carry, explicitly or by YAML 1.1's implicit rules. Nothing that builds objects, and no
# bytes, sets or dates (a bare date becomes Date, for the "quote it" message).
_CONVERT = {
    _T + "str": str,
    _T + "null": lambda text: None,
    _T + "bool": _by_node(_construct.construct_yaml_bool),
    _T + "int": _by_node(_construct.construct_yaml_int),  # 0x1F, 0o17, 1_000 as YAML 1.1 reads them
    _T + "float": _by_node(_construct.construct_yaml_float),  # .inf and .nan too; the field checks refuse them
}
_IMPLICIT_ONLY = {_T + "timestamp": Date, _T + "merge": str, _T + "value": str}
_SKIP, _MERGE = object(), object()  # the pending key of a mapping: drop the next value; a `<<` merge


@lru_cache(maxsize=4096)
def _implicit_tag(text: str) -> str:
    return _resolver.resolve(yaml.ScalarNode, text, (True, False))


def _scalar(tag: str | None, plain: bool, text: str) -> object:
    if tag is None:
        if not plain:
            return text  # quoted or block: always a string
        tag = _implicit_tag(text) if len(text) < 40 else _resolver.resolve(yaml.ScalarNode, text, (True, False))
        if tag in _IMPLICIT_ONLY:
            return _IMPLICIT_ONLY[tag](text)
    elif tag == "!":
        return text  # the non-specific tag: a string, whatever it looks like
    convert = _CONVERT.get(tag)
    if convert is None:
        raise FieldError(f"{_tag_error(tag)} (value {shown(text)})")
    try:
        return convert(text)
    except (ValueError, KeyError, IndexError):  # `!!int abc`, `!!bool maybe`, `!!int ""`, 5,000 digits
        raise FieldError(f"{shown(text)} cannot be read as {tag.removeprefix(_T)}") from None


def _tag_error(tag: str) -> str:
    short = "!!" + tag.removeprefix(_T) if tag.startswith(_T) else tag
    return f"tag {short} is not allowed: a manifest holds only strings, numbers, true/false, mappings and lists"


class _Refused(Exception):
    """A problem that stops reading the YAML: the issue to report."""


class _Frame:
    __slots__ = ("value", "path", "anchor", "start", "bad", "key", "key_line", "merges")

    def __init__(self, value, path, anchor, start, bad):
        self.value, self.path, self.anchor, self.start, self.bad = value, path, anchor, start, bad
        self.key, self.key_line, self.merges = None, 0, []


class _Composer:
    """YAML events -> Items with lines; PyYAML's composer and constructor are not used.

    Reading events keeps the work linear and the memory bounded: every node is counted as if aliases were
    expanded, and reading stops past MAX_NODES, so a "billion laughs" document, or a merely huge one, is refused
    early. An aliased value is built once and shared, never copied.
    """

    def __init__(self, report):
        self.report = report
        self.anchors: dict[str, tuple[object, str | None, int]] = {}  # name -> (value, text, expanded count)
        self.open: set[str] = set()  # anchors of collections still being read: an alias to one recurses
        self.stack: list[_Frame] = []
        self.total = 0
        self.root: Item | None = None

    def compose(self, text: str) -> Item | None:
        documents = 0
        for ev in yaml.parse(text, Loader=_Parser):
            kind = type(ev)
            if kind is yaml.ScalarEvent:
                self.scalar(ev)
            elif kind is yaml.MappingStartEvent or kind is yaml.SequenceStartEvent:
                self.start(ev, Map if kind is yaml.MappingStartEvent else Seq)
            elif kind is yaml.MappingEndEvent or kind is yaml.SequenceEndEvent:
                self.end()
            elif kind is yaml.AliasEvent:
                self.alias(ev)
            elif kind is yaml.DocumentStartEvent:
                documents += 1
                if documents > 1:
                    raise _Refused(ev.start_mark.line + 1, "(syntax)",
                                   "holds a second YAML document ('---'): a manifest is one document")
        return self.root

    def count(self, n: int, line: int, alias: str | None = None) -> None:
        self.total += n
        if self.total > MAX_NODES:
            at = f" (at alias *{alias}, worth {n:,})" if alias else ""
            raise _Refused(line, "(file)", f"expands to more than {MAX_NODES:,} values{at}; refused, as a "
                                           "'billion laughs' document would be")

    def child_path(self) -> str:
        if not self.stack:
            return ""
        top = self.stack[-1]
        if isinstance(top.value, Seq):
            return f"{top.path}[{len(top.value.items)}]"
        if isinstance(top.key, str):
            return f"{top.path}.{top.key}" if top.path else top.key
        return top.path

    def scalar(self, ev: yaml.ScalarEvent) -> None:
        line = ev.start_mark.line + 1
        self.count(1, line)
        top = self.stack[-1] if self.stack else None
        if top is not None and top.key is None and isinstance(top.value, Map):  # a field name
            if ev.tag is None and ev.implicit[0] and ev.value == "<<":
                top.key = _MERGE
            elif ev.tag not in (None, "!") and ev.tag not in _CONVERT:
                self.report(line, top.path or "(top level)", f"field name {ev.value!r}: {_tag_error(ev.tag)}")
                top.key = _SKIP
            else:
                top.key, top.key_line = ev.value, line
            return
        try:
            value = _scalar(ev.tag, ev.implicit[0], ev.value)
        except FieldError as exc:
            self.report(line, self.child_path() or "(top level)", str(exc))
            value = INVALID
        if ev.anchor:
            self.anchors[ev.anchor] = (value, ev.value, 1)
        self.emit(Item(value, line, ev.value))

    def start(self, ev, cls) -> None:
        line = ev.start_mark.line + 1
        self.count(1, line)
        path = self.child_path()
        if len(self.stack) >= MAX_DEPTH:
            raise _Refused(line, path, f"is nested more than {MAX_DEPTH} levels deep")
        bad = ev.tag not in (None, "!", _T + ("map" if cls is Map else "seq"))
        if bad:
            self.report(line, path or "(top level)", _tag_error(ev.tag))
        if ev.anchor:
            self.open.add(ev.anchor)
        self.stack.append(_Frame(cls(line, {} if cls is Map else []), path, ev.anchor, self.total - 1, bad))

    def end(self) -> None:
        frame = self.stack.pop()
        value = frame.value
        for merged in frame.merges:  # keys set here win, then earlier merges over later ones
            sources = merged.value.items if isinstance(merged.value, Seq) else [merged]
            for source in sources:
                if isinstance(source.value, Map):
                    for name, item in source.value.items.items():
                        value.items.setdefault(name, item)
                elif source.value is not INVALID:
                    self.report(source.line, frame.path, f"'<<' must merge a mapping, got {shown(source.value)}")
        if frame.bad:
            value = INVALID
        if frame.anchor:
            self.open.discard(frame.anchor)
            self.anchors[frame.anchor] = (value, None, self.total - frame.start)
        self.emit(Item(value, frame.value.line))

    def alias(self, ev: yaml.AliasEvent) -> None:
        line = ev.start_mark.line + 1
        entry = self.anchors.get(ev.anchor)
        if ev.anchor in self.open or entry is None:
            why = "is inside the value it names (a recursive alias)" if ev.anchor in self.open else "is not defined above"
            self.report(line, self.child_path() or "(top level)", f"alias *{ev.anchor} {why}")
            entry = (INVALID, None, 1)
        value, text, n = entry
        self.count(n, line, ev.anchor)
        self.emit(Item(value, line, text))

    def emit(self, item: Item) -> None:
        if not self.stack:
            self.root = item
            return
        top = self.stack[-1]
        if isinstance(top.value, Seq):
            top.value.items.append(item)
            return
        key = top.key
        if key is None:  # a mapping or alias where a field name belongs
            self.report(item.line, top.path or "(top level)", f"a field name must be plain text, got {shown(item.value)}")
            top.key = _SKIP
            return
        top.key = None
        if key is _MERGE:
            top.merges.append(item)
        elif key in top.value.items:
            field = f"{top.path}.{key}" if top.path else key
            self.report(top.key_line, field, f"duplicate field {key!r} (first at line {top.value.items[key].line})")
        elif key is not _SKIP:
            item.line = top.key_line  # point at the key: where a reader looks for a field
            top.value.items[key] = item


def load_yaml(text: str, report) -> Map | None:
    try:
        top = _Composer(report).compose(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        lines = text.split("\n", mark.line + 1)
        near = lines[mark.line].strip() if mark.line < len(lines) else ""
        context = f" ({exc.context})" if exc.context and exc.problem else ""
        report(mark.line + 1, "(syntax)", f"{exc.problem or exc.context}{context} at column {mark.column + 1}: "
                                          f"{shown(near)}")
        return None
    except yaml.YAMLError as exc:  # the reader: a control character
        position = getattr(exc, "position", 0)
        # libyaml counts the position in UTF-8 bytes, PyYAML's own reader in characters.
        head = text.encode("utf-8")[:position].decode("utf-8", "replace") if _LIBYAML else text[:position]
        report(head.count("\n") + 1, "(syntax)", str(exc).split("\n")[0])
        return None
    except _Refused as exc:
        report(*exc.args)
        return None
    if top is None:
        report(1, "(file)", "is empty (or only comments): a manifest needs name and videos")
        return None
    if top.value is INVALID:
        return None
    if not isinstance(top.value, Map):
        hint = "; a list of videos goes under 'videos:'" if isinstance(top.value, Seq) else ""
        report(top.line, "(top level)", f"must be a mapping with name and videos, got "
                                        f"{shown(top.value, top.text)}{hint}")
        return None
    return top.value


def yaml_scalar(raw: str) -> tuple[object, str]:
    """A `--set` VALUE read as YAML reads a plain value: `8` is an integer, `"8"` a string."""
    messages: list[str] = []
    try:
        item = _Composer(lambda line, field, message: messages.append(message)).compose(raw)
    except (yaml.YAMLError, _Refused) as exc:
        raise FieldError(f"VALUE is not valid YAML ({str(exc).splitlines()[0]})") from None
    if messages:
        raise FieldError(messages[0])
    if item is None:
        return None, raw
    if isinstance(item.value, (Map, Seq)):
        raise FieldError("VALUE must be a single value; quote it")
    return item.value, item.text
