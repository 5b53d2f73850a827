"""The grader's sandbox wire: a safe codec for data between two processes, and the learner's side.

Learner code runs in a process of its own (memlab.course.grading.sandbox starts it); the graded
tests, the comparisons, the points and the event log stay in the grader's process. This file is
both sides' codec, and it is the program the learner's process runs (``python -I wire.py``): so
it imports only the standard library, and torch where tensors cross; never memlab.

What crosses is data, decoded by this codec and nothing else (JSON for the structure, raw bytes
for tensors; nothing is ever unpickled): None, bools, ints, floats, complex, str, bytes, tuples,
lists, dicts, sets, frozensets, ranges, slices, Ellipsis, torch tensors (dtype, shape, strides,
storage offset, device and the bytes of their storage), torch dtypes, devices and sizes, named
tuples the tests build, and handles: to an object living in the learner's process (a learner
object, function or class, driven through a proxy on the grader's side), or to a function of
the grader's process (a callback such as ``free``, called back during a call; the learner's side
can call it and nothing else).

Lists, dicts, sets and tensors are mirrored by identity: the same object always maps to the
same object on the other side, and whatever one side changes in place (a kernel writing into an
output buffer, a caller reusing its tensor) is sent across before the other side runs again.
Tensors are mirrored by storage, so views keep sharing memory (a store past a view's end lands
in the guard band around it), and pages of a storage that cannot be read (a fenced tensor) cannot
be read on the other side either.
"""

from __future__ import annotations

import builtins
import errno
import json
import math
import mmap
import os
import signal
import socket
import struct
import sys
import traceback
import weakref

# -- framing ----------------------------------------------------------------------------------------
# A message: 8 bytes of header length, 4 bytes of blob count, the JSON header, then each blob as
# 8 bytes of length and its bytes.

_HEAD = struct.Struct("<QI")
_LEN = struct.Struct("<Q")
MAX_DEPTH = 64  # nesting of containers in one value
MAX_DIMS = 16


class WireError(Exception):
    """The other side sent something that is not a message of this codec (or nothing: EOF)."""


class Closed(WireError):
    """The other side closed the connection (its process ended)."""


class NotData(TypeError):
    """A value that the codec does not carry across (with the reason in plain words)."""


def _recv_exactly(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise Closed("the other side closed the connection")
        got += k
    return buf


def send_msg(sock: socket.socket, header, blobs=()) -> None:
    data = json.dumps(header, separators=(",", ":"), allow_nan=True).encode()
    parts = [_HEAD.pack(len(data), len(blobs)), data]
    for b in blobs:
        parts.append(_LEN.pack(memoryview(b).nbytes))
        parts.append(b)
    small = [p for p in parts if not isinstance(p, memoryview) and len(p) < 65536]
    if len(small) == len(parts):
        sock.sendall(b"".join(parts))
    else:
        for p in parts:
            sock.sendall(p)


def recv_msg(sock: socket.socket, limit: int | None = None):
    """(header, blobs); ``limit`` caps the bytes a message may hold (the grader reading the learner)."""
    n, count = _HEAD.unpack(_recv_exactly(sock, _HEAD.size))
    total = n
    if limit is not None and (n > limit or count > 1_000_000):
        raise WireError(
            f"a message of {n} bytes and {count} blobs, more than the grader reads"
        )
    raw = _recv_exactly(sock, n)
    blobs = []
    for _ in range(count):
        (k,) = _LEN.unpack(_recv_exactly(sock, _LEN.size))
        total += k
        if limit is not None and total > limit:
            raise WireError(f"more than {limit >> 20} MiB in one message")
        blobs.append(_recv_exactly(sock, k))
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise WireError(f"a message that is not JSON ({type(exc).__name__})") from None
    return header, blobs


# -- torch, only where tensors cross ------------------------------------------------------------

_DTYPES = (
    "bool",
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "complex128",
    "float8_e4m3fn",
    "float8_e5m2",
)


def _torch():
    return sys.modules.get("torch")


def _dtype(name):
    import torch

    if name not in _DTYPES or not hasattr(torch, name):
        raise NotData(f"a tensor of dtype {name!r}")
    return getattr(torch, name)


def _device(name):
    import torch

    if not isinstance(name, str) or not (
        name == "cpu"
        or name == "cuda"
        or (name.startswith("cuda:") and name[5:].isdigit())
    ):
        raise NotData(f"a tensor on device {name!r}")
    return torch.device(name)


def _use_count(u8) -> int | None:
    """References to the storage under ``u8`` (None when torch cannot say)."""
    import torch

    f = getattr(torch._C, "_storage_Use_Count", None)
    if f is None:
        return None
    s = u8.untyped_storage()
    return f(s._cdata)


def _readable_ranges(u8) -> list[list[int]]:
    """The byte ranges of a CPU storage that can be read: all of it for memory torch allocated;
    for memory it was given (an mmap, a buffer), page by page, so a fenced tensor stays fenced."""
    n = u8.numel()
    if n == 0 or u8.device.type != "cpu" or u8.untyped_storage().resizable():
        return [[0, n]]
    import ctypes

    page = mmap.PAGESIZE
    addr = u8.data_ptr()
    r, w = os.pipe()
    ranges: list[list[int]] = []
    try:
        p = addr - addr % page
        while p < addr + n:
            lo, hi = max(p, addr) - addr, min(p + page, addr + n) - addr
            try:
                os.write(w, (ctypes.c_char * 1).from_address(addr + lo))
                os.read(r, 1)
                ok = True
            except OSError as exc:
                if exc.errno != errno.EFAULT:
                    raise
                ok = False
            if ok:
                if ranges and ranges[-1][1] == lo:
                    ranges[-1][1] = hi
                else:
                    ranges.append([lo, hi])
            p += page
    finally:
        os.close(r)
        os.close(w)
    return ranges


def _fenced_u8(nbytes: int, ranges, base_mod: int):
    """A CPU storage of ``nbytes`` whose pages outside ``ranges`` cannot be read (PROT_NONE), laid
    out like the original: it starts ``base_mod`` bytes into a page."""
    import ctypes

    import torch

    page = mmap.PAGESIZE
    npages = -(-(base_mod + nbytes) // page)
    region = mmap.mmap(-1, npages * page)
    u8 = (
        torch.frombuffer(region, dtype=torch.uint8, count=nbytes, offset=base_mod)
        if nbytes
        else torch.empty(0, dtype=torch.uint8)
    )
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    return u8, region, base, npages


def _protect(base: int, npages: int, base_mod: int, ranges) -> None:
    import ctypes

    page = mmap.PAGESIZE
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for i in range(npages):
        lo, hi = i * page - base_mod, (i + 1) * page - base_mod
        if not any(a < hi and lo < b for a, b in ranges):
            libc.mprotect(base + i * page, page, 0)


# -- the codec ------------------------------------------------------------------------------------


def _token(x):
    """A shallow signature of one element: immutables by value, everything else by identity."""
    t = type(x)
    if x is None or t in (bool, int, str, bytes):
        return (t.__name__, x)
    if t is float:
        return ("float", x.hex())
    if t is tuple:
        return ("tuple",) + tuple(_token(v) for v in x)
    return ("id", id(x))


def _sig(kind, obj):
    if kind == "l":
        return tuple(_token(v) for v in obj)
    if kind == "d":
        return tuple((_token(k), _token(v)) for k, v in obj.items())
    if kind == "s":
        return frozenset(_token(v) for v in obj)
    raise AssertionError(kind)


class _Entry:
    __slots__ = ("sid", "kind", "obj", "sig", "u8", "ranges", "snap", "region", "key")

    def __init__(self, sid, kind, obj=None):
        self.sid, self.kind, self.obj = sid, kind, obj
        self.sig = self.u8 = self.ranges = self.snap = self.region = self.key = None


class Context:
    """One message being written: the new shared objects, the blobs."""

    def __init__(self):
        self.defs: list = []
        self.blobs: list = []
        self.made: list = []  # ("shared" | "handle" | "callable", key) registered while writing it
        self.commits: list = []  # what the other side will know once the message is sent
        self.memo: dict = {}  # id -> index of the str, bytes, tuples and frozensets of the current tree
        self.keep: list = []  # (what the memo's ids belong to, alive while the message is written)

    def blob(self, b) -> int:
        self.blobs.append(b)
        return len(self.blobs) - 1


class _Memo:
    """The decoding side of a tree's memo: its str, bytes, tuples and frozensets, in order."""

    __slots__ = ("items",)

    def __init__(self):
        self.items: list = []


_EXC_BASES = {
    n: getattr(builtins, n)
    for n in dir(builtins)
    if isinstance(getattr(builtins, n), type)
    and issubclass(getattr(builtins, n), Exception)
}


def exception_info(
    exc: BaseException, learner_file: str | None = None, parent_id=None
) -> tuple:
    """What crosses for an exception: (name, builtin bases, str, where, traceback text, parent id)."""
    bases = [
        c.__name__
        for c in type(exc).__mro__
        if c.__module__ == "builtins" and c.__name__ in _EXC_BASES
    ]
    where = ""
    tb = exc.__traceback__
    frames = traceback.extract_tb(tb) if tb is not None else []
    if learner_file:
        mine = [f for f in frames if f.filename == learner_file]
        if mine:
            f = mine[-1]
            where = f"{os.path.basename(f.filename)}:{f.lineno} in {f.name}"
    try:
        text = str(exc)
    except Exception:
        text = f"<{type(exc).__name__}>"
    try:
        tb_text = "".join(traceback.format_exception(type(exc), exc, tb, limit=-6))[
            -4000:
        ]
    except Exception:
        tb_text = ""
    return (
        type(exc).__name__[:100],
        tuple(bases),
        text[:2000],
        where,
        tb_text,
        parent_id,
    )


class Peer:
    """One side's half of the codec: the shared (mirrored) objects, the handles, the callables.

    ``side`` is "grader" or "learner". Shared ids made by the grader are positive, by the learner
    negative; handles are made by the learner's side, callables by the grader's.
    """

    def __init__(self, side: str):
        assert side in ("grader", "learner")
        self.side = side
        self.shared: dict[int, _Entry] = {}
        self.by_key: dict = {}
        self._next = 1
        # learner side: handle -> object and back; grader side: handle -> proxy (weak),
        # set by sandbox
        self.handles: dict[int, object] = {}
        self.handle_of: dict[int, int] = {}
        self.callables: dict[int, object] = {}
        self.callable_of: dict[int, int] = {}
        self.released: list[
            int
        ] = []  # handles (grader side) or callables (learner side) no longer held
        self.forgotten: list[int] = []
        self.dropping: list[
            int
        ] = []  # shared objects to forget once this message is written
        self.namedtuples: dict = {}
        self.make_proxy = None  # grader side: (hid, info) -> proxy
        self.proxy_handle = None  # grader side: proxy -> hid or None
        self.make_callback = None  # learner side: fid -> callable
        self.make_method = None  # grader side: (proxy, name) -> method proxy
        self.special = (
            None  # (x, ctx, depth) -> encoded value or None, for proxies and methods
        )
        self.learner_file = None

    # -- ids -----------------------------------------------------------------------------------
    def _new_id(self) -> int:
        n = self._next
        self._next += 1
        return n if self.side == "grader" else -n

    def _own(self, sid) -> bool:
        return (sid > 0) == (self.side == "grader")

    # -- encoding --------------------------------------------------------------------------------
    def tree(self, x, ctx: Context):
        """Encode one tree (a message's body, a shared object's content) with a memo of its own:
        a str, bytes or tuple that occurs twice in it is one object on the other side too (pickle,
        and so a hash of pickled data, sees the difference)."""
        saved, ctx.memo = ctx.memo, {}
        try:
            return self.enc(x, ctx)
        finally:
            ctx.memo = saved

    def _memo(self, x, ctx):
        k = len(ctx.memo)
        ctx.memo[id(x)] = k
        ctx.keep.append(x)

    def enc(self, x, ctx: Context, depth: int = 0):
        if depth > MAX_DEPTH:
            raise NotData(f"a value nested more than {MAX_DEPTH} levels deep")
        t = type(x)
        if t in (str, bytes, tuple, frozenset):
            k = ctx.memo.get(id(x))
            if k is not None:
                return ["@", k]
            out = self._enc_immutable(x, t, ctx, depth)
            self._memo(x, ctx)
            return out
        if x is None or t is bool:
            return x
        if t is int:
            if x.bit_length() > 4096:
                raise NotData(f"an int of {x.bit_length()} bits")
            return x
        if t is float:
            return x
        if t is list:
            return ["l", self._share(x, "l", ctx, depth)]
        if t is dict:
            return ["d", self._share(x, "d", ctx, depth)]
        if t is set:
            return ["s", self._share(x, "s", ctx, depth)]
        if t is bytearray:
            return ["ba", ctx.blob(bytes(x))]
        if t is complex:
            return ["c", x.real, x.imag]
        if t is range:
            return ["r", x.start, x.stop, x.step]
        if t is slice:
            return [
                "sl",
                [self.enc(v, ctx, depth + 1) for v in (x.start, x.stop, x.step)],
            ]
        if x is Ellipsis:
            return ["E"]
        torch = _torch()
        if torch is not None:
            if isinstance(x, torch.Tensor) and t in (torch.Tensor, torch.nn.Parameter):
                return ["T", self._share_tensor(x, ctx)]
            if t is torch.dtype:
                return ["dt", str(x).removeprefix("torch.")]
            if t is torch.device:
                return ["dv", str(x)]
            if t is torch.Size:
                return ["sz", [int(v) for v in x]]
        if (
            isinstance(x, tuple)
            and hasattr(t, "_fields")
            and self._is_plain_namedtuple(t)
        ):
            key = [t.__module__, t.__qualname__, list(t._fields)]
            self.namedtuples[tuple(key[:2]) + tuple(key[2])] = t
            return ["nt", key, [self.enc(v, ctx, depth + 1) for v in x]]
        special = self.special(x, ctx, depth) if self.special else None
        if special is not None:
            return special
        return self.opaque(x, ctx, depth)

    def _enc_immutable(self, x, t, ctx, depth):
        if t is str:
            return x
        if t is bytes:
            return ["b", ctx.blob(x)]
        if t is tuple:
            return ["t", [self.enc(v, ctx, depth + 1) for v in x]]
        return ["fs", [self.enc(v, ctx, depth + 1) for v in x]]

    def _is_plain_namedtuple(self, t) -> bool:
        # The grader's named tuples cross as data; the learner's own classes stay handles.
        if self.side == "grader":
            return True
        return getattr(t, "_memlab_wire_namedtuple", False)

    def opaque(self, x, ctx, depth):
        if self.side == "grader":
            if callable(x) and not isinstance(x, type):
                fid = self.callable_of.get(id(x))
                if fid is None:
                    fid = self._new_id()
                    self.callables[fid] = x
                    self.callable_of[id(x)] = fid
                    ctx.made.append(("callable", fid))
                return ["f", fid]
            raise NotData(
                f"the grader cannot hand {_kind(x)} to your code (only data, your own objects and "
                "functions cross)"
            )
        # learner side: a handle to the object (GraderFunction and _Method are special, above)
        hid = self.handle_of.get(id(x))
        if hid is None:
            hid = self._new_id()
            self.handles[hid] = x
            self.handle_of[id(x)] = hid
            ctx.made.append(("handle", hid))
        try:
            h = hash(x)
        except Exception:
            h = None
        info = [
            h,
            f"{getattr(type(x), '__module__', '?')}.{getattr(type(x), '__qualname__', '?')}",
            "class" if isinstance(x, type) else "callable" if callable(x) else "object",
        ]
        if isinstance(x, type) or callable(x):
            info.append(
                getattr(x, "__name__", "?")
                if isinstance(getattr(x, "__name__", None), str)
                else "?"
            )
        return ["h", hid, info]

    def _share(self, x, kind, ctx, depth):
        sid = self.by_key.get(id(x))
        if sid is not None and self.shared[sid].obj is x:
            return sid
        sid = self._new_id()
        e = _Entry(sid, kind, x)
        e.key = id(x)
        self.shared[sid] = e
        self.by_key[id(x)] = sid
        ctx.made.append(("shared", sid))
        ctx.defs.append([sid, kind, self._content(e, ctx, depth)])
        e.sig = _sig(kind, x)
        return sid

    def _content(self, e, ctx, depth=0):
        x = e.obj
        if e.kind == "T":
            return self._tensor_meta(x, ctx)
        saved, ctx.memo = ctx.memo, {}
        try:
            if e.kind in ("l", "s"):
                return [self.enc(v, ctx, depth + 1) for v in x]
            return [
                [self.enc(k, ctx, depth + 1), self.enc(v, ctx, depth + 1)]
                for k, v in x.items()
            ]
        finally:
            ctx.memo = saved

    def _tensor_meta(self, x, ctx):
        if (
            x.is_sparse
            or x.is_quantized
            or getattr(x, "is_nested", False)
            or x.layout != _torch().strided
        ):
            raise NotData("a sparse, quantized or nested tensor")
        if x.device.type not in ("cpu", "cuda"):
            raise NotData(f"a tensor on device {x.device}")
        if x.is_conj() or x.is_neg():
            x = x.resolve_conj().resolve_neg()
        storage = self._share_storage(x, ctx) if x.untyped_storage().nbytes() else None
        return [
            storage,
            str(x.dtype).removeprefix("torch."),
            [int(s) for s in x.shape],
            [int(s) for s in x.stride()],
            int(x.storage_offset()),
            bool(x.requires_grad),
            str(x.device),
        ]

    def _share_tensor(self, x, ctx):
        sid = self.by_key.get(id(x))
        if sid is not None and self.shared[sid].obj is x:
            return sid
        sid = self._new_id()
        e = _Entry(sid, "T", x)
        e.key = id(x)
        self.shared[sid] = e
        self.by_key[id(x)] = sid
        ctx.made.append(("shared", sid))
        meta = self._tensor_meta(x, ctx)
        e.sig = meta
        ctx.defs.append([sid, "T", meta])
        return sid

    def _share_storage(self, x, ctx):
        import torch

        s = x.untyped_storage()
        key = ("S", str(x.device), s.data_ptr())
        sid = self.by_key.get(key)
        if sid is not None:
            return sid
        sid = self._new_id()
        e = _Entry(sid, "S")
        e.key = key
        e.u8 = torch.empty(0, dtype=torch.uint8, device=x.device).set_(s)
        e.ranges = _readable_ranges(e.u8)
        self.shared[sid] = e
        self.by_key[key] = sid
        ctx.made.append(("shared", sid))
        base_mod = (
            s.data_ptr() % mmap.PAGESIZE if e.ranges != [[0, e.u8.numel()]] else 0
        )
        ctx.defs.append(
            [
                sid,
                "S",
                [
                    str(x.device),
                    e.u8.numel(),
                    e.ranges,
                    base_mod,
                    self._storage_blobs(e, ctx),
                ],
            ]
        )
        e.snap = [e.u8[a:b].clone() for a, b in e.ranges]
        return sid

    def _storage_blobs(self, e, ctx):
        out = []
        for a, b in e.ranges:
            part = e.u8[a:b]
            if part.device.type != "cpu":
                part = part.cpu()
            out.append(ctx.blob(memoryview(part.numpy()) if b > a else b""))
        return out

    # -- what changed since the last message -------------------------------------------------------
    def updates(self, ctx: Context) -> list:
        """Every shared object changed in place since the last sync, as [sid, content]."""
        torch = _torch()
        out = []
        made = {key for what, key in ctx.made if what == "shared"}
        for sid, e in list(self.shared.items()):
            if sid in made:
                continue  # defined in this very message
            if e.kind == "S":
                if all(
                    torch.equal(e.u8[a:b], s) for (a, b), s in zip(e.ranges, e.snap)
                ):
                    continue
                out.append([sid, self._storage_blobs(e, ctx)])
                ctx.commits.append(
                    lambda e=e: setattr(
                        e, "snap", [e.u8[a:b].clone() for a, b in e.ranges]
                    )
                )
            elif e.kind == "T":
                meta = self._tensor_meta(e.obj, ctx)
                if meta != e.sig:
                    out.append([sid, meta])
                    ctx.commits.append(lambda e=e, meta=meta: setattr(e, "sig", meta))
            else:
                sig = _sig(e.kind, e.obj)
                if sig != e.sig:
                    out.append([sid, self._content(e, ctx)])
                    ctx.commits.append(lambda e=e, sig=sig: setattr(e, "sig", sig))
        return out

    def collect_garbage(self) -> None:
        """Grader side: forget the shared objects nothing else in this process refers to any more
        (the learner's side is told in the next message; neither side can see the difference)."""
        for sid, e in list(self.shared.items()):
            if e.kind == "S":
                continue
            if sys.getrefcount(e.obj) <= 2:  # the entry's reference and the argument's
                self.dropping.append(sid)
        drop = set(self.dropping)
        used = {
            e.sig[0] for s, e in self.shared.items() if e.kind == "T" and s not in drop
        }
        for sid, e in list(self.shared.items()):
            if e.kind == "S" and sid not in used:
                n = _use_count(e.u8)
                if (
                    n is not None and n <= 2
                ):  # our u8 view and the wrapper asked for the count
                    self.dropping.append(sid)

    def _forget(self, sid) -> None:
        e = self.shared.pop(sid, None)
        if e is not None:
            if self.by_key.get(e.key) == sid:
                del self.by_key[e.key]
            self.forgotten.append(sid)

    def encode_message(self, kind: str, values: list) -> tuple:
        """The header and blobs of one message: the values, and everything shared that changed.
        Nothing is registered when a value cannot be encoded (NotData): the message is not sent."""
        if self.side == "grader":
            self.collect_garbage()
        ctx = Context()
        try:
            body = self.tree(tuple(values), ctx)[1]
            upd = self.updates(ctx)
        except BaseException:
            self._rollback(ctx)
            self.dropping = []
            raise
        for commit in ctx.commits:
            commit()
        for sid in (
            self.dropping
        ):  # changed in place just before it was dropped: sent, then forgotten
            self._forget(sid)
        self.dropping = []
        forgotten, self.forgotten = self.forgotten, []
        released, self.released = self.released, []
        return [kind, body, [ctx.defs, upd, forgotten, released]], ctx.blobs

    def _rollback(self, ctx: Context) -> None:
        for what, key in reversed(ctx.made):
            if what == "shared":
                e = self.shared.pop(key, None)
                if e is not None and self.by_key.get(e.key) == key:
                    del self.by_key[e.key]
            elif what == "handle":
                obj = self.handles.pop(key, None)
                if obj is not None:
                    self.handle_of.pop(id(obj), None)
            else:
                fn = self.callables.pop(key, None)
                if fn is not None:
                    self.callable_of.pop(id(fn), None)

    # -- decoding --------------------------------------------------------------------------------
    def decode_message(self, header, blobs):
        if not (
            isinstance(header, list)
            and len(header) == 3
            and isinstance(header[0], str)
            and isinstance(header[1], list)
            and isinstance(header[2], list)
            and len(header[2]) == 4
        ):
            raise WireError("a message of the wrong shape")
        kind, body, (defs, upd, forgotten, released) = header
        self._apply(defs, upd, forgotten, released, blobs)
        memo = _Memo()
        out = self.dec(["t", body], blobs, 0, memo)
        return kind, list(out)

    def _check_peer_sid(self, sid):
        if type(sid) is not int or sid == 0 or self._own(sid):
            raise WireError(f"a shared id {sid!r} the other side may not make")

    def _apply(self, defs, upd, forgotten, released, blobs):
        if not all(isinstance(x, list) for x in (defs, upd, forgotten, released)):
            raise WireError("a sync section of the wrong shape")
        for hid in released:
            if self.side == "learner":
                obj = self.handles.pop(hid, None) if type(hid) is int else None
                if obj is not None and self.handle_of.get(id(obj)) == hid:
                    del self.handle_of[id(obj)]
            else:
                fn = self.callables.pop(hid, None) if type(hid) is int else None
                if fn is not None and self.callable_of.get(id(fn)) == hid:
                    del self.callable_of[id(fn)]
        fill = []
        order = {"S": 0, "T": 1, "l": 2, "d": 2, "s": 2}
        for d in sorted(
            defs,
            key=lambda d: (
                order.get(d[1], 9) if isinstance(d, list) and len(d) == 3 else 9
            ),
        ):
            if not (isinstance(d, list) and len(d) == 3 and d[1] in order):
                raise WireError("a shared object of the wrong shape")
            sid, kind, content = d
            self._check_peer_sid(sid)
            if sid in self.shared:
                raise WireError(f"shared id {sid} defined twice")
            e = _Entry(sid, kind)
            if kind == "S":
                self._new_storage(e, content, blobs)
            elif kind == "T":
                e.obj = self._new_tensor(content)
                e.sig = self._meta_sig(content)
                e.key = id(e.obj)
            else:
                e.obj = [] if kind == "l" else {} if kind == "d" else set()
                e.key = id(e.obj)
                fill.append((e, content))
            self.shared[sid] = e
            self.by_key[e.key] = sid
        for e, content in fill:
            self._fill(e, content, blobs)
        for u in upd:
            if not (isinstance(u, list) and len(u) == 2 and type(u[0]) is int):
                raise WireError("an update of the wrong shape")
            e = self.shared.get(u[0])
            if e is None:
                raise WireError(f"an update of unknown shared id {u[0]}")
            if e.kind == "S":
                self._write_storage(e, u[1], blobs)
            elif e.kind == "T":
                self._reset_tensor(e.obj, u[1])
                e.sig = self._meta_sig(u[1])
            else:
                self._fill(e, u[1], blobs)
        for sid in forgotten:
            e = self.shared.pop(sid, None) if type(sid) is int else None
            if e is not None and self.by_key.get(e.key) == sid:
                del self.by_key[e.key]

    def _fill(self, e, content, blobs):
        if not isinstance(content, list):
            raise WireError("container content of the wrong shape")
        x = e.obj
        memo = _Memo()
        if e.kind == "l":
            x[:] = [self.dec(v, blobs, 1, memo) for v in content]
        elif e.kind == "s":
            x.clear()
            x.update(self.dec(v, blobs, 1, memo) for v in content)
        else:
            items = []
            for kv in content:
                if not (isinstance(kv, list) and len(kv) == 2):
                    raise WireError("a dict item of the wrong shape")
                items.append(
                    (self.dec(kv[0], blobs, 1, memo), self.dec(kv[1], blobs, 1, memo))
                )
            x.clear()
            x.update(items)
        e.sig = _sig(e.kind, x)

    def _blob(self, blobs, i):
        if type(i) is not int or not 0 <= i < len(blobs):
            raise WireError("a blob that is not there")
        return blobs[i]

    def _new_storage(self, e, content, blobs):
        import torch

        if not (isinstance(content, list) and len(content) == 5):
            raise WireError("a storage of the wrong shape")
        device, nbytes, ranges, base_mod, parts = content
        dev = _device(device)
        if (
            type(nbytes) is not int
            or nbytes < 0
            or type(base_mod) is not int
            or not 0 <= base_mod < mmap.PAGESIZE
        ):
            raise WireError("a storage of the wrong size")
        if not (
            isinstance(ranges, list)
            and isinstance(parts, list)
            and len(parts) == len(ranges)
        ):
            raise WireError("a storage of the wrong shape")
        last = 0
        for r in ranges:
            if not (
                isinstance(r, list)
                and len(r) == 2
                and all(type(v) is int for v in r)
                and last <= r[0] < r[1] <= nbytes
                or r == [0, 0] == [0, nbytes]
            ):
                raise WireError("a storage's readable ranges are out of order")
            last = r[1]
        e.ranges = ranges
        if ranges == [[0, nbytes]] or dev.type != "cpu":
            e.u8 = torch.empty(nbytes, dtype=torch.uint8, device=dev)
            self._write_storage(e, parts, blobs)
        else:  # some pages cannot be read: neither can they here
            e.u8, e.region, base, npages = _fenced_u8(nbytes, ranges, base_mod)
            self._write_storage(e, parts, blobs)
            _protect(base, npages, base_mod, ranges)
        e.key = ("S", str(e.u8.device), e.u8.untyped_storage().data_ptr())

    def _write_storage(self, e, parts, blobs):
        import torch

        if not (isinstance(parts, list) and len(parts) == len(e.ranges)):
            raise WireError("a storage update of the wrong shape")
        snaps = []
        for (a, b), i in zip(e.ranges, parts):
            data = self._blob(blobs, i)
            if len(data) != b - a:
                raise WireError("a storage update of the wrong size")
            if b > a:
                e.u8[a:b].copy_(torch.frombuffer(data, dtype=torch.uint8))
            snaps.append(e.u8[a:b].clone())
        e.snap = snaps

    def _meta_sig(self, meta):
        return list(meta)

    def _check_meta(self, meta):
        if not (isinstance(meta, list) and len(meta) == 7):
            raise WireError("a tensor of the wrong shape")
        sid, dtype, size, stride, offset, rg, device = meta
        dt = _dtype(dtype)
        dev = _device(device)
        if not (
            isinstance(size, list)
            and isinstance(stride, list)
            and len(size) == len(stride) <= MAX_DIMS
            and all(type(v) is int and v >= 0 for v in size + stride)
            and type(offset) is int
            and offset >= 0
            and type(rg) is bool
        ):
            raise WireError("a tensor's shape, strides or offset are not valid")
        import torch

        item = torch.empty(0, dtype=dt).element_size()
        numel = math.prod(size)
        if sid is None:
            if numel:
                raise WireError("a tensor with values but no storage")
            return None, dt, dev
        st = self.shared.get(sid) if type(sid) is int else None
        if st is None or st.kind != "S":
            raise WireError("a tensor on a storage that is not there")
        if numel:
            end = (offset + sum((s - 1) * d for s, d in zip(size, stride)) + 1) * item
            if end > st.u8.numel():
                raise WireError("a tensor that reaches past the end of its storage")
        if st.u8.device != dev:
            raise WireError("a tensor on another device than its storage")
        return st, dt, dev

    def _new_tensor(self, meta):
        import torch

        st, dt, dev = self._check_meta(meta)
        t = torch.empty(0, dtype=dt, device=dev)
        self._set(t, st, meta)
        return t

    def _reset_tensor(self, t, meta):
        st, dt, dev = self._check_meta(meta)
        if t.dtype != dt or t.device != dev:
            raise WireError("a tensor changed its dtype or device in place")
        self._set(t, st, meta)

    @staticmethod
    def _set(t, st, meta):
        import torch

        _, _, size, stride, offset, rg, _ = meta
        with torch.no_grad():
            if st is None:
                t.set_(
                    torch.empty(0, dtype=t.dtype, device=t.device).untyped_storage(),
                    0,
                    size,
                    stride,
                )
            else:
                t.set_(st.u8.untyped_storage(), offset, size, stride)
        if t.requires_grad != rg and t.is_leaf:
            t.requires_grad_(rg)

    def dec(self, v, blobs, depth: int = 0, memo: _Memo | None = None):
        if depth > MAX_DEPTH + 1:
            raise WireError(f"a value nested more than {MAX_DEPTH} levels deep")
        t = type(v)
        if t is str:
            memo.items.append(v)
            return v
        if v is None or t in (bool, int, float):
            return v
        if t is not list or not v or type(v[0]) is not str:
            raise WireError(f"a value of the wrong shape ({t.__name__})")
        tag = v[0]
        n = len(v)
        if tag == "@" and n == 2:
            if type(v[1]) is not int or not 0 <= v[1] < len(memo.items):
                raise WireError("a back-reference that is not there")
            return memo.items[v[1]]
        if tag == "t" and n == 2 and isinstance(v[1], list):
            out = tuple([self.dec(x, blobs, depth + 1, memo) for x in v[1]])
            memo.items.append(out)
            return out
        if tag in ("l", "d", "s", "T") and n == 2:
            e = self.shared.get(v[1]) if type(v[1]) is int else None
            if e is None or e.kind != tag:
                raise WireError(
                    f"a reference to a shared object that is not there ({tag} {v[1]!r})"
                )
            return e.obj
        if tag == "b" and n == 2:
            out = bytes(self._blob(blobs, v[1]))
            memo.items.append(out)
            return out
        if tag == "ba" and n == 2:
            return bytearray(self._blob(blobs, v[1]))
        if tag == "fs" and n == 2 and isinstance(v[1], list):
            out = frozenset([self.dec(x, blobs, depth + 1, memo) for x in v[1]])
            memo.items.append(out)
            return out
        if tag == "c" and n == 3 and all(type(x) in (int, float) for x in v[1:]):
            return complex(v[1], v[2])
        if tag == "r" and n == 4 and all(type(x) is int for x in v[1:]):
            return range(v[1], v[2], v[3])
        if tag == "sl" and n == 2 and isinstance(v[1], list) and len(v[1]) == 3:
            return slice(*[self.dec(x, blobs, depth + 1, memo) for x in v[1]])
        if tag == "E" and n == 1:
            return Ellipsis
        if tag == "dt" and n == 2:
            return _dtype(v[1])
        if tag == "dv" and n == 2:
            return _device(v[1])
        if (
            tag == "sz"
            and n == 2
            and isinstance(v[1], list)
            and all(type(x) is int for x in v[1])
        ):
            import torch

            return torch.Size(v[1])
        if tag == "nt" and n == 3:
            return self._namedtuple(
                v[1], [self.dec(x, blobs, depth + 1, memo) for x in v[2]]
            )
        if tag == "h":
            return self.handle(v)
        if tag == "f" and n == 2 and type(v[1]) is int:
            return self.callback(v[1])
        if tag == "m" and n == 3 and isinstance(v[2], str):
            obj = self.dec(v[1], blobs, depth + 1, memo)
            if self.side == "learner":
                return getattr(obj, v[2])
            return self.make_method(obj, v[2])
        raise WireError(f"a value of the wrong shape (tag {tag!r})")

    def _namedtuple(self, key, items):
        if not (
            isinstance(key, list)
            and len(key) == 3
            and all(isinstance(k, str) for k in key[:2])
            and isinstance(key[2], list)
            and all(isinstance(f, str) and f.isidentifier() for f in key[2])
            and len(key[2]) == len(items)
        ):
            raise WireError("a named tuple of the wrong shape")
        k = tuple(key[:2]) + tuple(key[2])
        cls = self.namedtuples.get(k)
        if cls is None:
            if (
                self.side == "grader"
            ):  # a named tuple the grader never sent: a plain tuple
                return tuple(items)
            import collections

            cls = collections.namedtuple(key[1].rsplit(".", 1)[-1], key[2])
            cls.__module__ = key[0]
            cls.__qualname__ = key[1]
            cls._memlab_wire_namedtuple = True
            self.namedtuples[k] = cls
        return cls(*items)

    def handle(self, v):
        if self.side == "learner":
            if len(v) != 2 or v[1] not in self.handles:
                raise WireError("a handle that is not there")
            return self.handles[v[1]]
        if not (
            len(v) == 3 and type(v[1]) is int and v[1] < 0 and isinstance(v[2], list)
        ) and not (len(v) == 2 and type(v[1]) is int):
            raise WireError("a handle of the wrong shape")
        return self.make_proxy(v[1], v[2] if len(v) == 3 else None)

    def callback(self, fid):
        if self.side == "grader":
            fn = self.callables.get(fid)
            if fn is None:
                raise WireError("a callback that is not there")
            return fn
        return self.make_callback(fid)


def _kind(x) -> str:
    t = type(x)
    return f"a {t.__module__}.{t.__qualname__}".replace("a builtins.", "a ")


# -- the learner's side ---------------------------------------------------------------------------
# Everything below runs in the learner's process only.

MODULE = -1  # the handle of the learner's module


class Learner:
    """The learner's process: its module, its half of the codec, its connection to the grader."""

    def __init__(self, sock, module, learner_file):
        self.sock = sock
        self.module = module
        self.file = learner_file
        self.peer = Peer("learner")
        self.peer.learner_file = learner_file
        self.peer.make_callback = self._callback
        self.peer.special = self._special
        self.peer.handles[MODULE] = module
        self.peer.handle_of[id(module)] = MODULE
        self.peer._next = 2
        self.callbacks: dict[int, weakref.ref] = {}

    def _special(self, x, ctx, depth):
        if type(x) is _Method:
            return ["m", self.peer.enc(x.obj, ctx, depth + 1), x.name]
        if type(x) is GraderFunction:
            return ["f", x._memlab_wire_callback]
        return None

    def _callback(self, fid):
        ref = self.callbacks.get(fid)
        fn = ref() if ref is not None else None
        if fn is None:
            fn = GraderFunction(self, fid)
            self.callbacks[fid] = weakref.ref(fn)
            while (
                fid in self.peer.released
            ):  # it died and came back before the grader heard of it
                self.peer.released.remove(fid)
        return fn

    def send(self, kind, values):
        header, blobs = self.peer.encode_message(kind, values)
        send_msg(self.sock, header, blobs)

    def reply(self, fn):
        """Run ``fn`` and send its result, or the exception it raised."""
        try:
            value = fn()
        except BaseException as exc:
            self.send_error(exc)
            return
        try:
            self.send("a", [value])
        except NotData as exc:
            self.send_error(exc, not_data=True)

    def send_error(self, exc, not_data=False):
        info = exception_info(
            exc, self.file, getattr(exc, "_memlab_grader_error", None)
        )
        if not_data:
            info = ("NotData",) + info[1:]
        try:
            self.send("e", [info])
        except NotData:
            self.send(
                "e",
                [
                    (
                        "RuntimeError",
                        ("RuntimeError", "Exception"),
                        "an error that cannot be sent",
                        "",
                        "",
                        None,
                    )
                ],
            )

    def serve(self):
        """Answer the grader's requests until it hangs up."""
        while True:
            try:
                header, blobs = recv_msg(self.sock)
            except Closed:
                return
            self.handle(header, blobs)

    def handle(self, header, blobs):
        try:
            kind, body = self.peer.decode_message(header, blobs)
        except BaseException as exc:
            self.send_error(exc)
            return
        if kind != "q" or not body or not isinstance(body[0], str):
            self.send_error(WireError(f"a request of the wrong shape ({kind})"))
            return
        op, args = body[0], body[1:]
        self.reply(lambda: self.run(op, args))

    def run(self, op, args):
        import copy

        if op == "getattr":
            obj, name = args
            value = getattr(obj, name)
            if (
                getattr(value, "__self__", None) is obj
                and hasattr(value, "__func__")
                and not isinstance(obj, type)
                and obj is not self.module
            ):
                return _Method(
                    obj, name
                )  # a.method(...) then costs one round trip, not two
            return value
        if op == "setattr":
            setattr(args[0], args[1], args[2])
            return None
        if op == "delattr":
            delattr(args[0], args[1])
            return None
        if op == "call":
            fn, a, kw = args
            return fn(*a, **dict(kw))
        if op == "callmethod":
            obj, name, a, kw = args
            return getattr(obj, name)(*a, **dict(kw))
        if op == "dir":
            return tuple(sorted(n for n in dir(args[0]) if isinstance(n, str)))
        if op == "iter":
            return iter(args[0])
        if op == "next":
            return next(args[0])
        if op == "isinstance":
            return isinstance(args[0], args[1])
        if op == "issubclass":
            return issubclass(args[0], args[1])
        if op == "deepcopy":
            return copy.deepcopy(args[0])
        if op == "copy":
            return copy.copy(args[0])
        if op == "repr":
            return repr(args[0])[:10_000]
        if op == "str":
            return str(args[0])[:10_000]
        if op == "format":
            return format(args[0], args[1])[:10_000]
        if op in _OPS:
            return _OPS[op](*args)
        raise WireError(f"unknown request {op!r}")

    def call_grader(self, fid, args, kwargs):
        """Call a function of the grader's process (a callback); serve its requests meanwhile."""
        self.send(
            "q", ["call", self._callback(fid), tuple(args), tuple(kwargs.items())]
        )
        while True:
            try:
                header, blobs = recv_msg(self.sock)
            except Closed:
                os._exit(0)  # the grader is gone
            if isinstance(header, list) and header and header[0] == "q":
                self.handle(header, blobs)
                continue
            kind, body = self.peer.decode_message(header, blobs)
            if kind == "a" and len(body) == 1:
                return body[0]
            if kind == "e" and len(body) == 1:
                raise _error_from(body[0])
            raise WireError(f"an answer of the wrong shape ({kind})")


class _Method:
    """A bound method of a learner object: crosses as its object and name."""

    __slots__ = ("obj", "name")

    def __init__(self, obj, name):
        self.obj, self.name = obj, name


_OPS = {
    "len": len,
    "bool": bool,
    "hash": hash,
    "contains": lambda a, b: b in a,
    "getitem": lambda a, k: a[k],
    "setitem": lambda a, k, v: a.__setitem__(k, v),
    "delitem": lambda a, k: a.__delitem__(k),
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "neg": lambda a: -a,
    "int": int,
    "float": float,
    "index": lambda a: a.__index__(),
    "enter": lambda a: a.__enter__(),
    "exit": lambda a, t, v, tb: a.__exit__(t, v, tb),
}


class GraderFunction:
    """A function of the grader's process handed to the learner's code (``free`` in ``evict``)."""

    def __init__(self, learner, fid):
        self._memlab_wire_callback = fid
        self._learner = weakref.ref(learner)

    def __call__(self, *args, **kwargs):
        return self._learner().call_grader(self._memlab_wire_callback, args, kwargs)

    def __repr__(self):
        return f"<a function of the grader #{self._memlab_wire_callback}>"

    def __del__(self):
        learner = self._learner()
        if learner is not None:
            learner.peer.released.append(self._memlab_wire_callback)


def _error_from(info):
    """An exception of the same builtin kind as the one ``info`` describes (a grader callback's)."""
    if not (isinstance(info, tuple) and len(info) == 6 and isinstance(info[1], tuple)):
        return WireError("an error of the wrong shape")
    base = next((_EXC_BASES[b] for b in info[1] if b in _EXC_BASES), RuntimeError)
    try:
        exc = base(info[2])
    except Exception:
        exc = RuntimeError(info[2])
    exc._memlab_grader_error = info[5]
    return exc


# -- the learner's process: set-up, hooks, the module, the zygote ----------------------------------

FORBIDDEN = (
    "memlab",
    "solutions",
    "exercises",
    "tests",
    "pytest",
    "_pytest",
    "pluggy",
    "xdist",
    "exercise_refs",
    "conftest",
    "loading",
    "bug_zoo",
)


def _audit_hook(blocked, allowed, own_files, report, cpu_only):
    """The audit hook: refuses (and reports) opening or listing the course's files, importing
    the course's modules, starting programs (when kernels run in the interpreter; on a GPU Triton
    runs its compiler) and signalling other processes. Everything it uses is bound now, so the
    learner's code cannot patch it away (it cannot remove an audit hook either)."""
    import pathlib

    _readlink, _getcwd, _fsdecode, _getpid, _getpgid = (
        os.readlink,
        os.getcwd,
        os.fsdecode,
        os.getpid,
        os.getpgid,
    )
    _str, _bytes, _int, _isinstance, _len, _type = (
        str,
        bytes,
        int,
        isinstance,
        len,
        type,
    )
    _PermissionError, _ModuleNotFoundError = PermissionError, ModuleNotFoundError
    path_types = (pathlib.PurePosixPath, pathlib.PosixPath)
    roots = sorted(
        [(r, True) for r in blocked] + [(a, False) for a in allowed],
        key=lambda rb: -_len(rb[0]),
    )
    own = frozenset(own_files)
    busy = [False]

    def absolute(p):
        """The path with every symbolic link followed (a link cannot hide where it points)."""
        if not p.startswith("/"):
            p = _getcwd() + "/" + p
        parts, out, hops = p.split("/"), [], 0
        while parts:
            c = parts.pop(0)
            if c in ("", "."):
                continue
            if c == "..":
                if out:
                    out.pop()
                continue
            cand = "/" + "/".join(out + [c])
            try:
                target = _readlink(cand)
            except (OSError, ValueError):
                out.append(c)
                continue
            hops += 1
            if hops > 40:
                return cand
            if target.startswith("/"):
                out = []
            parts = target.split("/") + parts
        return "/" + "/".join(out)

    def verdict(path):
        if _isinstance(path, _int):
            return None
        if _type(path) in path_types:
            path = _str(path)
        elif _isinstance(path, _bytes):
            path = _fsdecode(path)
        elif not _isinstance(path, _str):
            return "a path given as an object the grader cannot check"  # its __fspath__ could change its mind
        real = absolute(path)
        if real.startswith("/proc/"):
            head = real[6:].split("/", 1)[0]
            if head.isdigit() and _int(head) != _getpid():
                return f"{path} (another process's files)"
        if real in own:
            return None
        for root, bad in roots:
            if real == root or real.startswith(root + "/"):
                return f"{path} (the course's own files)" if bad else None
        return None

    reads = {
        "open": 1,
        "os.listdir": 1,
        "os.scandir": 1,
        "glob.glob": 1,
        "os.chdir": 1,
        "os.symlink": 2,
        "os.link": 2,
        "os.rename": 2,
        "shutil.copyfile": 2,
        "shutil.copytree": 2,
    }
    spawns = {
        "subprocess.Popen",
        "os.system",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "os.fork",
        "os.forkpty",
        "pty.spawn",
    }

    def hook(event, args):
        if busy[0]:
            return
        n = reads.get(event)
        if n:
            busy[0] = True
            try:
                for a in args[:n]:
                    if a is None and event in ("os.listdir", "os.scandir"):
                        a = "."
                    why = verdict(a)
                    if why is not None:
                        report(
                            f"reads {why}"
                            if event != "os.chdir"
                            else f"moves into {why}"
                        )
                        raise _PermissionError(
                            f"the grader does not let your code read {why}"
                        )
            finally:
                busy[0] = False
        elif event in spawns:
            if cpu_only:
                report(f"starts another program ({event})")
                raise _PermissionError(
                    "the grader does not let your code start other programs"
                )
        elif event in ("os.kill", "os.killpg"):
            pid = args[0]
            if (
                _isinstance(pid, _int)
                and pid not in (0, _getpid())
                and not (event == "os.killpg" and pid == _getpgid(0))
            ):
                report(f"sends a signal to another process (pid {pid})")
                raise _PermissionError(
                    "the grader does not let your code signal other processes"
                )
        elif event == "import":
            name = args[0] if _isinstance(args[0], _str) else ""
            if name.split(".")[0] in FORBIDDEN:
                report(f"imports {name}")
                raise _ModuleNotFoundError(
                    f"the grader does not let your code import {name}: write it yourself"
                )

    return hook


class _Blocker:
    """A meta-path finder that refuses the course's own modules (memlab, the solutions, the tests,
    pytest and the grader) before any other finder sees them."""

    def __init__(self, report):
        self.report = report

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in FORBIDDEN:
            self.report(f"imports {fullname}")
            raise ModuleNotFoundError(
                f"the grader does not let your code import {fullname}: write it yourself",
                name=fullname,
            )
        return None


def _limits(spec: dict) -> None:
    import resource

    names = {
        "memory": "RLIMIT_AS",
        "data": "RLIMIT_DATA",
        "cpu": "RLIMIT_CPU",
        "fsize": "RLIMIT_FSIZE",
        "nofile": "RLIMIT_NOFILE",
        "nproc": "RLIMIT_NPROC",
    }
    for key, value in spec.items():
        if key in names and value and hasattr(resource, names[key]):
            resource.setrlimit(getattr(resource, names[key]), (int(value), int(value)))


def start_learner(sock, config: dict) -> None:
    """In a new learner process: set it up, import the learner's file, answer the grader."""
    work, file, name = config["work"], config["file"], config["name"]
    os.chdir(work)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    out = os.open(
        os.path.join(work, "output.txt"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644
    )
    os.dup2(out, 1)
    os.dup2(out, 2)
    for s in (sys.stdout, sys.stderr):
        try:
            s.reconfigure(line_buffering=True, write_through=True)
        except (AttributeError, ValueError):
            pass
    import faulthandler

    faulthandler.enable(file=sys.stderr, all_threads=True)
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    os.environ.clear()
    os.environ.update(config["env"])
    _limits(config.get("limits") or {})
    torch = _torch()
    if torch is not None:
        torch.set_num_threads(1)

    def report(what: str) -> None:
        try:
            send_msg(sock, ["v", [what[:500]], [[], [], [], []]])
        except OSError:
            pass

    real = os.path.realpath
    blocked = [real(p) for p in config["blocked"]]
    allowed = sorted({real(p) for p in config["allowed"]} | {real(work)})

    def keep(p):
        r = real(p)
        inside = lambda roots: any(r == x or r.startswith(x + "/") for x in roots)  # noqa: E731
        return p and (not inside(blocked) or inside(allowed))

    sys.path[:] = [p for p in sys.path if keep(p)]
    for mod in list(sys.modules):
        if mod.split(".")[0] in FORBIDDEN:
            del sys.modules[mod]
    sys.meta_path.insert(0, _Blocker(report))
    sys.addaudithook(
        _audit_hook(
            blocked, allowed, {real(file)}, report, config.get("cpu_only", True)
        )
    )

    import importlib.util

    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    learner = Learner(sock, module, file)
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        learner.send_error(exc)
        sock.close()
        os._exit(0)
    learner.send("a", [("ready", os.getpid())])
    learner.serve()
    os._exit(0)


def _zygote(control_fd: int, preload: list) -> None:
    """The zygote: imports torch (and what else the exercises need) once, then forks one learner
    process per exercise file on request. It runs no learner code itself. Its control socket
    carries one small JSON message per packet, and the learner's socket as an attached fd."""
    ctl = socket.socket(fileno=control_fd)
    for mod in preload:
        try:
            __import__(mod)
        except Exception:
            pass
    torch = _torch()
    if torch is not None:
        torch.set_num_threads(1)
    children: dict[int, int | None] = {}
    ctl.send(json.dumps(["ready", os.getpid()]).encode())

    def reap():
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            children[pid] = status

    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(ctl, 1 << 20, 4)
        except OSError:
            msg, fds = b"", []
        if not msg:  # the grader is gone: so are the learner processes
            for pid, status in children.items():
                if status is None:
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except OSError:
                        pass
            os._exit(0)
        req = json.loads(msg)
        reap()
        if req[0] == "fork":
            pid = os.fork()
            if pid == 0:
                try:
                    ctl.close()
                    os.setpgid(0, 0)
                    start_learner(socket.socket(fileno=fds[0]), req[1])
                finally:
                    os._exit(70)
            for fd in fds:
                os.close(fd)
            children[pid] = None
            ctl.send(json.dumps(["forked", pid]).encode())
        elif req[0] == "wait":
            import time

            pid, end = req[1], time.monotonic() + req[2]
            reap()
            while children.get(pid, 0) is None and time.monotonic() < end:
                time.sleep(0.01)
                reap()
            status = children.get(pid)
            if status is not None:
                del children[pid]
            code = (
                None
                if status is None
                else (
                    -os.WTERMSIG(status)
                    if os.WIFSIGNALED(status)
                    else os.WEXITSTATUS(status)
                )
            )
            ctl.send(json.dumps(["status", code]).encode())


def main(argv: list) -> None:
    if argv[:1] == ["--zygote"]:
        _zygote(int(argv[1]), json.loads(argv[2]))
    elif argv[:1] == ["--learner"]:
        for mod in json.loads(argv[3]):
            try:
                __import__(mod)
            except Exception:
                pass
        start_learner(socket.socket(fileno=int(argv[1])), json.loads(argv[2]))
    else:
        raise SystemExit(
            "usage: wire.py --zygote FD PRELOAD | --learner FD CONFIG PRELOAD"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
