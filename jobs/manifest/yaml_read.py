"""YAML events to values that keep their lines.

YAML is composed to nodes by the safe loader and turned into values here, not by PyYAML's constructor, so that every
value keeps its line, only plain scalars, mappings and lists get through, and aliases are counted as if expanded: a
"billion laughs" document is refused after a bounded amount of work. Problems go to `report(line, field, message)`.
"""

from __future__ import annotations

import re

import yaml

from jobs.manifest.read import raw_control_message
from jobs.manifest.scalars import plain_scalar, tagged_scalar
from jobs.manifest.values import INVALID, MAX_DEPTH, MAX_NODES, FieldError, Item, Map, Seq, shown

_T = "tag:yaml.org,2002:"
_LIBYAML = hasattr(yaml, "CSafeLoader")
_Parser = yaml.CSafeLoader if _LIBYAML else yaml.SafeLoader

# The tags a value may carry explicitly, each read by its YAML 1.2 core-schema rule (jobs.manifest.scalars). Nothing
# that builds objects, and no bytes, sets or dates.
_SCALAR_TAGS = {_T + name for name in ("str", "null", "bool", "int", "float")}
_SKIP, _MERGE = object(), object()  # the pending key of a mapping: drop the next value; a `<<` merge


def _scalar(tag: str | None, plain: bool, text: str) -> object:
    if tag is None:
        return plain_scalar(text) if plain else text  # quoted or block: always a string
    if tag == "!":
        return text  # the non-specific tag: a string, whatever it looks like
    if tag not in _SCALAR_TAGS:
        raise FieldError(f"{_tag_error(tag)} (value {shown(text)})")
    return tagged_scalar(tag.removeprefix(_T), text)


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

    def __init__(self, report, markers: dict[str, str] | None = None):
        self.report = report
        self.markers = markers or {}  # private-use character -> the control character it stands for
        self.marked = 0
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
        if self.markers and any(m in ev.value for m in self.markers):
            self.raw_control(ev, line, top)
            return
        if top is not None and top.key is None and isinstance(top.value, Map):  # a field name
            if ev.tag is None and ev.implicit[0] and ev.value == "<<":
                top.key = _MERGE
            elif ev.tag not in (None, "!") and ev.tag not in _SCALAR_TAGS:
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

    def raw_control(self, ev: yaml.ScalarEvent, line: int, top: _Frame | None) -> None:
        """A value or field name holding a character YAML refuses (swapped for a marker; see _compose_marked)."""
        self.marked += 1
        text = "".join(self.markers.get(ch, ch) for ch in ev.value)
        message = raw_control_message(text, next(self.markers[ch] for ch in ev.value if ch in self.markers))
        if top is not None and top.key is None and isinstance(top.value, Map):
            self.report(line, top.path or "(top level)", f"field name {message}")
            top.key = _SKIP
            return
        self.report(line, self.child_path() or "(top level)", message)
        self.emit(Item(INVALID, line, text))

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
        self.emit(Item(value, line, text, ev.anchor))

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


_FAILED = Item(INVALID, 0)
# What YAML's reader refuses in a file (PyYAML's Reader.NON_PRINTABLE, from the YAML spec's c-printable).
_NON_PRINTABLE = re.compile("[^\x09\x0a\x0d\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _compose_marked(text: str, error: yaml.reader.ReaderError, report) -> Item | None:
    """Read the file again with each character YAML refuses swapped for a private-use character the file lacks, so
    that each value holding one is reported with its field and value (as a JSON line's is); the reader's own message
    when none is in a value (a comment, a field name)."""
    bad = sorted(set(_NON_PRINTABLE.findall(text)))
    free = (chr(c) for c in range(0xE000, 0xF900) if chr(c) not in text)
    markers = dict(zip(bad, free))
    if len(markers) < len(bad):  # a file using the whole private-use area: no spare character to mark with
        _report_error(text, error, report)
        return _FAILED
    composer = _Composer(report, {m: ch for ch, m in markers.items()})
    try:
        top = composer.compose(_NON_PRINTABLE.sub(lambda m: markers[m.group()], text))
    except (yaml.YAMLError, _Refused) as exc:
        _report_error(text, exc, report)
        return _FAILED
    if not composer.marked:
        _report_error(text, error, report)
        return _FAILED
    return top


def _report_error(text: str, exc: Exception, report) -> None:
    if isinstance(exc, _Refused):
        report(*exc.args)
    elif isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        lines = text.split("\n", mark.line + 1)
        near = lines[mark.line].strip() if mark.line < len(lines) else ""
        context = f" ({exc.context})" if exc.context and exc.problem else ""
        report(mark.line + 1, "(syntax)", f"{exc.problem or exc.context}{context} at column {mark.column + 1}: "
                                          f"{shown(near)}")
    else:  # the reader: a control character
        position = getattr(exc, "position", 0)
        # libyaml counts the position in UTF-8 bytes, PyYAML's own reader in characters.
        head = text.encode("utf-8")[:position].decode("utf-8", "replace") if _LIBYAML else text[:position]
        report(head.count("\n") + 1, "(syntax)", str(exc).split("\n")[0])


def load_yaml(text: str, report) -> Map | None:
    # Held back until the reading ends: a control character met late means reading again, and reporting once.
    held: list[tuple] = []
    try:
        top = _Composer(lambda *issue: held.append(issue)).compose(text)
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow in a file: say which value holds it
        held.clear()
        top = _compose_marked(text, exc, report)
    except (yaml.YAMLError, _Refused) as exc:
        _report_error(text, exc, lambda *issue: held.append(issue))
        top = _FAILED
    for issue in held:
        report(*issue)
    if top is _FAILED:
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
