#!/usr/bin/env python
"""Regenerate docs/api.md from the package's docstrings.

The docstrings are the source of truth; this script only lays them out.
It imports asyncdist, walks the sections below, and turns each object's
signature (with ``inspect``) and Google-style docstring (Args, Returns,
Raises, Attributes, Example) into Markdown.

    python docs/gen_api.py            # rewrite docs/api.md
    python docs/gen_api.py --check    # exit 1 if docs/api.md is out of date
    python docs/gen_api.py --stdout   # print instead of writing

It also reports, on stderr, public names of ``asyncdist.__all__`` that no
section lists and documented objects that have no docstring, so that a new
name or an undocumented one is noticed when the page is regenerated.
"""

from __future__ import annotations

import argparse
import enum
import inspect
import re
import sys
import textwrap
from pathlib import Path
from typing import Any, Iterable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import asyncdist  # noqa: E402
from asyncdist.reduce import kernels as ops  # noqa: E402
from asyncdist import errors, gpu, testing
from asyncdist.testing import fake_device  # noqa: E402
from asyncdist.group.process_group import ProcessGroup  # noqa: E402
from asyncdist.rendezvous.store import Store  # noqa: E402
from asyncdist.group.work import Work  # noqa: E402

OUT = ROOT / "docs" / "api.md"
PROBLEMS: list[str] = []

# -- docstring to Markdown ----------------------------------------------------

_ROLE = re.compile(r":(?:func|class|meth|data|mod|attr|exc|obj|ref):`(~?)([^`<]+?)(?:\s*<([^>]+)>)?`")
_LITERAL = re.compile(r"``(.+?)``")
_SECTION = re.compile(r"^(Args|Arguments|Returns|Raises|Attributes|Example|Examples|Note|Notes)(::?)\s*$")
_ITEM = re.compile(r"^([A-Za-z_*][\w*., ]*?)(?:\s*\([^)]*\))?:\s*(.*)$")


def inline(text: str) -> str:
    """reST inline markup to Markdown: roles and double-backquoted literals."""

    def role(m: re.Match) -> str:
        tilde, target, explicit = m.group(1), m.group(2).strip(), m.group(3)
        if explicit:
            return f"`{target}`"
        if tilde:
            target = target.rsplit(".", 1)[-1]
        return f"`{target}`"

    text = _ROLE.sub(role, text)
    return _LITERAL.sub(lambda m: f"`{m.group(1)}`", text)


def _code(lines: list[str]) -> list[str]:
    body = textwrap.dedent("\n".join(lines)).strip("\n").splitlines()
    lang = "pycon" if body and body[0].lstrip().startswith(">>>") else "python"
    return [f"```{lang}", *body, "```", ""]


def _prose(lines: list[str]) -> list[str]:
    """Free text, with ``::`` literal blocks and doctest blocks as code."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.rstrip().endswith("::") and not line.strip().startswith(">>>"):
            text = line.rstrip()[:-2].rstrip()
            if text:
                out.append(inline(text) + ":")
                out.append("")
            i += 1
            block = []
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith((" ", "\t"))):
                block.append(lines[i])
                i += 1
            out.extend(_code(block))
            continue
        if line.strip().startswith(">>>"):
            block = []
            while i < len(lines) and lines[i].strip():
                block.append(lines[i])
                i += 1
            out.extend(_code(block))
            continue
        out.append(inline(line))
        i += 1
    return out


def _items(lines: list[str], code_names: bool = True) -> list[str]:
    """An Args/Raises/Attributes section as a bullet list."""
    body = textwrap.dedent("\n".join(lines)).splitlines()
    items: list[list[str]] = []
    for line in body:
        if not line.strip():
            continue
        line = inline(line)
        m = _ITEM.match(line) if not line.startswith((" ", "\t")) else None
        if m:
            names = ", ".join(f"`{n.strip()}`" for n in m.group(1).split(","))
            items.append([f"- {names}: {m.group(2)}".rstrip()])
        elif items:
            items[-1].append(line.strip())
        else:
            items.append([f"- {line.strip()}"])
    return [" ".join(item) for item in items] + [""]


def render_doc(doc: str | None, where: str) -> list[str]:
    if not doc:
        PROBLEMS.append(f"no docstring: {where}")
        return ["*(no docstring)*", ""]
    lines = inspect.cleandoc(doc).splitlines()
    out: list[str] = []
    free: list[str] = []
    i = 0
    while i < len(lines):
        m = _SECTION.match(lines[i])
        if not m:
            free.append(lines[i])
            i += 1
            continue
        out.extend(_prose(free))
        free = []
        name = m.group(1)
        i += 1
        body = []
        while i < len(lines) and (not lines[i].strip() or lines[i].startswith((" ", "\t"))):
            body.append(lines[i])
            i += 1
        if out and out[-1] != "":
            out.append("")
        if name in ("Example", "Examples"):
            out.append("Example:")
            out.append("")
            out.extend(_code(body))
        elif name in ("Returns", "Note", "Notes"):
            text = " ".join(s.strip() for s in body if s.strip())
            out.append(f"**{name}:** {inline(text)}")
            out.append("")
        else:
            title = {"Args": "Arguments", "Arguments": "Arguments"}.get(name, name)
            out.append(f"**{title}:**")
            out.append("")
            out.extend(_items(body))
    out.extend(_prose(free))
    while out and not out[-1].strip():
        out.pop()
    return out + [""]


# -- signatures -----------------------------------------------------------------


def _annotation(value: Any) -> str:
    # With ``from __future__ import annotations`` annotations are strings already.
    return value if isinstance(value, str) else inspect.formatannotation(value)


def _param(p: inspect.Parameter) -> str:
    text = p.name
    if p.kind is p.VAR_POSITIONAL:
        text = "*" + text
    elif p.kind is p.VAR_KEYWORD:
        text = "**" + text
    if p.annotation is not p.empty:
        text += f": {_annotation(p.annotation)}"
    if p.default is not p.empty:
        default = p.default
        shown = f"ReduceOp.{default.name}" if isinstance(default, ops.RedOpType) else repr(default)
        text += (" = " if p.annotation is not p.empty else "=") + shown
    return text


def _signature(obj: Any, name: str, skip_self: bool, returns: bool = True) -> str:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return name
    params = list(sig.parameters.values())
    if skip_self and params and params[0].name in ("self", "cls"):
        params = params[1:]
    parts: list[str] = []
    star_done = False
    for p in params:
        if p.kind is p.KEYWORD_ONLY and not star_done:
            parts.append("*")
        if p.kind in (p.KEYWORD_ONLY, p.VAR_POSITIONAL):
            star_done = True
        parts.append(_param(p))
    ret = "" if sig.return_annotation is sig.empty or not returns else f" -> {_annotation(sig.return_annotation)}"
    text = f"{name}({', '.join(parts)}){ret}"
    if len(text) <= 92:
        return text
    return f"{name}(\n" + "".join(f"    {part},\n" for part in parts) + ")" + ret


def render_function(obj: Any, name: str, level: str = "###", skip_self: bool = False) -> list[str]:
    func = inspect.unwrap(obj)
    asynchronous = inspect.iscoroutinefunction(func) or inspect.isasyncgenfunction(func)
    cm = hasattr(obj, "__wrapped__") and inspect.isasyncgenfunction(func)
    prefix = "async with " if cm else ("async def " if asynchronous else "def ")
    if cm:
        prefix = "@asynccontextmanager\nasync def "
    sig = _signature(func, name.rsplit(".", 1)[-1], skip_self)
    return [f"{level} `{name}`", "", "```python", prefix + sig, "```", "", *render_doc(obj.__doc__, name)]


def render_property(obj: property, name: str, level: str = "####") -> list[str]:
    doc = obj.__doc__
    return [f"{level} `{name}` (property)", "", *render_doc(doc, name)]


def _static(cls: type, member: str) -> Any:
    try:
        return inspect.getattr_static(cls, member)
    except AttributeError:  # a property of the metaclass (GroupMember.WORLD)
        return inspect.getattr_static(type(cls), member)


def render_class(
    cls: type,
    name: str,
    members: Iterable[str] = (),
    level: str = "###",
    constructor: bool = True,
    title: str | None = None,
    doc: bool = True,
) -> list[str]:
    out = [f"{level} `{name}`" if title is None else f"{level} {title}", ""]
    if constructor:
        sig = _signature(cls, name.rsplit(".", 1)[-1], skip_self=False, returns=False)
        bases = [b.__name__ for b in cls.__bases__ if b is not object]
        out += ["```python", f"class {sig}" + (f"  # subclass of {', '.join(bases)}" if bases else ""), "```", ""]
    if doc:
        out += render_doc(cls.__doc__, name)
    if doc and issubclass(cls, enum.Enum):
        out += ["Members: " + ", ".join(f"`{m.name}` ({m.value})" for m in cls), ""]
    sub = level + "#"
    for member in members:
        attr = _static(cls, member)
        qual = f"{name}.{member}"
        if isinstance(attr, property):
            out += render_property(attr, qual, sub)
        elif isinstance(attr, (staticmethod, classmethod)):
            out += render_function(getattr(cls, member), qual, sub, skip_self=isinstance(attr, classmethod))
        elif callable(attr):
            out += render_function(attr, qual, sub, skip_self=True)
        else:
            out += [f"{sub} `{qual}`", "", f"`{qual} == {attr!r}`", ""]
    return out


# -- the page -----------------------------------------------------------------------

HEADER = """\
# API reference

<!-- Generated by docs/gen_api.py from the docstrings. Edit the docstrings
     and run `python docs/gen_api.py`; do not edit this file by hand. -->

Every public name, with its signature and its docstring. Two faces share one
core (see [architecture.md](architecture.md)):

* the **blocking facade**, `import asyncdist as dist`, with torch.distributed's
  names and arguments. Its functions block the calling thread; calling one on
  asyncdist's own event-loop thread raises `WrongThreadError`. In the facade,
  `src`/`dst`/`peer` are *global* ranks and `group_src`/`group_dst`/`group_peer`
  ranks *within* `group`.
* the **await API**: `await asyncdist.init_world(...)` returns the world
  `ProcessGroup`, whose methods are coroutines (or, for `isend`/`irecv`, plain
  functions that return a `Work`) and must run on the loop that created the
  group. In the await API every rank argument is a rank *within the group*.

In signatures, `Group` stands for `ProcessGroup | int | None`: a group, the
int `GroupMember.NON_GROUP_MEMBER` that `new_group` returns on non-members,
or None for the world.

The guide ([guide.md](guide.md)) shows them in use; [migration.md](migration.md)
lists where they differ from torch.distributed.

Contents:

"""

Section = tuple[str, str, list[tuple[str, Any, dict]]]


def fn(name: str, obj: Any | None = None, **kw: Any) -> tuple[str, Any, dict]:
    return (name, obj if obj is not None else getattr(asyncdist, name.rsplit(".", 1)[-1]), kw)


def cls(name: str, obj: Any, members: Iterable[str] = (), **kw: Any) -> tuple[str, Any, dict]:
    return (name, obj, {"members": list(members), **kw})


_STORE_METHODS = [
    "set", "get", "add", "compare_set", "wait", "check", "delete_key", "num_keys",
    "timeout", "set_timeout", "close",
    "async_set", "async_get", "async_add", "async_compare_set", "async_wait",
    "async_check", "async_delete_key", "async_num_keys",
]  # fmt: skip

_PG_P2P = ["global_rank", "group_rank", "send", "recv", "isend", "irecv"]
_PG_COLLECTIVES = [
    "barrier", "broadcast", "all_reduce", "all_reduce_coalesced", "reduce",
    "all_gather", "all_gather_into_tensor", "gather", "scatter",
    "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
    "monitored_barrier",
]  # fmt: skip
_PG_OBJECTS = [
    "broadcast_object_list", "all_gather_object", "gather_object",
    "scatter_object_list", "send_object_list", "recv_object_list",
]  # fmt: skip
_PG_LIFETIME = ["new_group", "partition", "split", "channel", "on_close", "close"]

SECTIONS: list[Section] = [
    (
        "Facade: setup and queries",
        "",
        [
            fn("init_process_group"),
            fn("destroy_process_group"),
            fn("is_initialized"),
            fn("is_available"),
            fn("get_backend"),
            fn("get_rank"),
            fn("get_world_size"),
        ],
    ),
    (
        "Facade: point to point",
        "Messages match on (group, source, tag) in the order they were sent; "
        "see the guide's *Point-to-point semantics*.",
        [
            fn("send"),
            fn("recv"),
            fn("isend"),
            fn("irecv"),
            fn("batch_isend_irecv"),
            cls("P2POp", asyncdist.P2POp),
        ],
    ),
    (
        "Facade: collectives",
        "Every rank of `group` must make the same collective calls in the same "
        "order. With `async_op=True` a call returns a `Work` at once; otherwise it "
        "blocks and returns None. A rank that is not in `group` returns None and "
        "touches nothing.",
        [
            fn("broadcast"),
            fn("all_reduce"),
            fn("all_reduce_coalesced"),
            fn("reduce"),
            fn("all_gather"),
            fn("all_gather_into_tensor"),
            fn("all_gather_single"),
            fn("gather"),
            fn("scatter"),
            fn("reduce_scatter"),
            fn("reduce_scatter_tensor"),
            fn("reduce_scatter_single"),
            fn("all_to_all"),
            fn("all_to_all_single"),
            fn("barrier"),
            fn("monitored_barrier"),
        ],
    ),
    (
        "Facade: object collectives",
        "These pickle Python objects (see the security note in "
        "[architecture.md](architecture.md)). They block; there is no `async_op`.",
        [
            fn("broadcast_object_list"),
            fn("all_gather_object"),
            fn("gather_object"),
            fn("scatter_object_list"),
            fn("send_object_list"),
            fn("recv_object_list"),
        ],
    ),
    (
        "Facade: groups",
        "Groups are created without communication, so every rank of the job "
        "must create the same groups in the same order, members or not.",
        [
            fn("new_group"),
            fn("new_subgroups"),
            fn("new_subgroups_by_enumeration"),
            cls("GroupMember", asyncdist.GroupMember, ["WORLD", "NON_GROUP_MEMBER"], constructor=False),
            cls("group", asyncdist.group, ["WORLD"], constructor=False),
            fn("get_group_rank"),
            fn("get_global_rank"),
            fn("get_process_group_ranks"),
            fn("get_node_local_rank"),
            fn("is_torchelastic_launched"),
        ],
    ),
    (
        "Reduction operators",
        "`ReduceOp` is importable as `asyncdist.ReduceOp`; `make_premul_sum` "
        "lives in `asyncdist.reduce.kernels`. Which op applies to which dtype is listed in "
        "the guide's *Supported dtypes*.",
        [
            cls("ReduceOp", ops.ReduceOp, ["factor"]),
            cls("asyncdist.reduce.kernels.RedOpType", ops.RedOpType, constructor=False),
            fn("asyncdist.reduce.kernels.make_premul_sum", ops.make_premul_sum),
        ],
    ),
    (
        "Work",
        "Returned by `isend`/`irecv`, by the facade's collectives with "
        "`async_op=True` and by `batch_isend_irecv`; the await API's "
        "`ProcessGroup.isend`/`irecv` return one too.",
        [
            cls(
                "Work",
                Work,
                ["wait", "is_completed", "is_success", "exception", "value", "result",
                 "source_rank", "get_future", "__await__"],
                constructor=False,
            ),
        ],
    ),
    (
        "Await API: init_world",
        "",
        [fn("init_world", asyncdist.init_world)],
    ),
    (
        "Await API: ProcessGroup",
        "All methods run on the event loop that created the group (\"loop thread "
        "only\"). Ranks are group ranks. Where a method's docstring is one line, "
        "its arguments, checks and errors are those of the facade function of the "
        "same name, with group ranks in place of global ones.",
        [
            cls("ProcessGroup", ProcessGroup, _PG_P2P, constructor=True),
            cls("ProcessGroup", ProcessGroup, _PG_COLLECTIVES, constructor=False, doc=False,
                title="ProcessGroup: collectives"),
            cls("ProcessGroup", ProcessGroup, _PG_OBJECTS, constructor=False, doc=False,
                title="ProcessGroup: object collectives"),
            cls("ProcessGroup", ProcessGroup, _PG_LIFETIME, constructor=False, doc=False,
                title="ProcessGroup: subgroups and lifetime"),
        ],
    ),
    (
        "Stores",
        "Key-value stores with torch.distributed's `Store` API, importable from "
        "`asyncdist` (`asyncdist.TCPStore`, ...). Pass one as "
        "`init_process_group(store=...)` or `init_world(store=...)`. torch's own "
        "store objects are not accepted: use these (same constructors).",
        [
            cls("Store", Store, _STORE_METHODS),
            cls("TCPStore", asyncdist.TCPStore, ["host", "port"]),
            cls("FileStore", asyncdist.FileStore, ["path"]),
            cls("HashStore", asyncdist.HashStore),
            cls("PrefixStore", asyncdist.PrefixStore, ["underlying_store"]),
        ],
    ),
    (
        "asyncdist.gpu",
        "CUDA tensors and CuPy arrays ([gpu.md](gpu.md)). Every operation of the "
        "facade and of `ProcessGroup` takes them directly; this package is for "
        "choosing NCCL in the await API, plugging in another array library, and "
        "inspecting the pinned pool.",
        [
            fn("asyncdist.gpu.use_nccl", gpu.use_nccl),
            cls("asyncdist.gpu.DeviceAdapter", gpu.DeviceAdapter, constructor=False),
            fn("asyncdist.gpu.register_adapter", gpu.register_adapter),
            fn("asyncdist.gpu.pool_for", gpu.pool_for),
            cls("asyncdist.gpu.PinnedPool", gpu.PinnedPool, ["acquire", "release", "cached_bytes"]),
        ],
    ),
    (
        "asyncdist.testing",
        "Helpers for testing distributed code. The pytest plugin that asyncdist "
        "installs (the `world_size` marker, the `local_ranks` and `spawn_ranks` "
        "fixtures) is described in [testing.md](testing.md).",
        [
            fn("asyncdist.testing.local_world", testing.local_world),
            fn("asyncdist.testing.spawn", testing.spawn),
            cls("asyncdist.testing.RemoteTraceback", testing.RemoteTraceback, constructor=False),
            cls("asyncdist.testing.fake_device.FakeDevice", fake_device.FakeDevice,
                ["stream", "new_stream", "empty", "array", "launch", "fill", "hold", "run_stream", "probe", "read"]),
            fn("asyncdist.testing.fake_device.install", fake_device.install),
        ],
    ),
]


def _anchor(title: str) -> str:
    slug = re.sub(r"[^\w\- ]", "", title.lower()).strip().replace(" ", "-")
    return slug


def _error_tree() -> list[str]:
    classes = [getattr(errors, n) for n in errors.__all__]
    children: dict[type, list[type]] = {}
    for c in classes:
        parent = next((b for b in c.__mro__[1:] if b in classes), None)
        children.setdefault(parent, []).append(c)  # type: ignore[arg-type]
    lines: list[str] = []

    def walk(node: type | None, depth: int) -> None:
        for c in children.get(node, []):  # type: ignore[arg-type]
            extra = [b.__name__ for b in c.__bases__ if b is not node and b is not object]
            note = f"  (also {', '.join(extra)})" if extra else ""
            lines.append("    " * depth + c.__name__ + note)
            walk(c, depth + 1)

    walk(None, 0)
    return ["```text", *lines, "```", ""]


def render_errors() -> list[str]:
    out = [
        "## asyncdist.errors",
        "",
        "Every exception asyncdist raises is an `AsyncDistError`, a `RuntimeError`; "
        "the caller's mistakes are also `ValueError`s and timeouts also "
        "`TimeoutError`s, so `except RuntimeError` / `except ValueError` / "
        "`except TimeoutError` written for torch keep working. The guide's "
        "*Errors* section shows the messages. The hierarchy:",
        "",
        *_error_tree(),
    ]
    for name in errors.__all__:
        out += render_class(getattr(errors, name), name, level="###", constructor=False)
    return out


def build() -> str:
    covered: set[str] = {"errors"}
    body: list[str] = []
    toc: list[str] = []
    for title, intro, entries in SECTIONS:
        toc.append(f"* [{title}](#{_anchor(title)})")
        body += [f"## {title}", ""]
        if intro:
            body += [intro, ""]
        for name, obj, kw in entries:
            covered.add(name.rsplit(".", 1)[-1])
            covered.add(getattr(obj, "__name__", ""))
            if inspect.isclass(obj):
                body += render_class(
                    obj,
                    name,
                    kw.get("members", ()),
                    constructor=kw.get("constructor", True),
                    title=kw.get("title"),
                    doc=kw.get("doc", True),
                )
            else:
                body += render_function(obj, name)
    toc.append("* [asyncdist.errors](#asyncdisterrors)")
    body += render_errors()
    for name in asyncdist.__all__:
        if name not in covered:
            PROBLEMS.append(f"asyncdist.__all__ has {name!r}, which no section of docs/gen_api.py lists")
    text = HEADER + "\n".join(toc) + "\n\n" + "\n".join(body)
    text = re.sub(r"\n{3,}", "\n\n", text).rstrip() + "\n"
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/api.md is out of date")
    parser.add_argument("--stdout", action="store_true", help="print the page instead of writing it")
    args = parser.parse_args()
    text = build()
    for problem in PROBLEMS:
        print(f"gen_api: {problem}", file=sys.stderr)
    if args.stdout:
        sys.stdout.write(text)
        return 0
    if args.check:
        current = OUT.read_text() if OUT.exists() else ""
        if current != text:
            print("gen_api: docs/api.md is out of date; run python docs/gen_api.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
