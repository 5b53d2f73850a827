"""The learner's side of the grader: the program a learner process runs, and the framing both
sides share (memlab.course.grading.sandbox is the grader's side).

It imports only the standard library and, where tensors cross, torch: never memlab. The grader
starts it as a zygote (``python -I wire.py zygote``: it imports torch once, then forks one learner
process per exercise file; it runs no learner code itself). A forked learner process drops to the
unprivileged user (on Gradescope), sets its limits, writes its file into its own folder, imports
it and answers the grader's requests on a socket.

What crosses: one message is a JSON header and raw byte blobs (tensors' bytes); nothing is ever
unpickled. A value is JSON's own for None, bools, ints, floats and str, else a list whose first
item is a tag. The grader's lists, dicts, sets and tensor storages are mirrored here by identity
("R": a grader object by its id), and what changes in place on either side is sent back before
the other side runs again; everything this side sends the grader is data it rebuilds (tensors from
bytes) or a handle ("h": an object of the learner's code, which the grader can only call).
"""

from __future__ import annotations

import builtins
import json
import mmap
import os
import signal
import socket
import struct
import sys
import traceback

# header bytes, blob count; then each blob: 8 bytes of length
HEAD = struct.Struct("<QI")
LEN = struct.Struct("<Q")
MAX_DEPTH = 64
DTYPES = (
    "bool uint8 int8 int16 int32 int64 uint16 uint32 uint64 float16 bfloat16 float32 float64 "
    "complex64 complex128"
).split()
EXC_BASES = {
    n: c
    for n, c in vars(builtins).items()
    if isinstance(c, type) and issubclass(c, Exception)
}


class WireError(Exception):
    """A message that is not one of this codec's."""


class Closed(WireError):
    """The other side closed the connection."""


class NotData(TypeError):
    """A value that does not cross (the reason in plain words)."""


def send_msg(sock: socket.socket, header, blobs=()) -> None:
    data = json.dumps(header, separators=(",", ":")).encode()
    sock.sendall(HEAD.pack(len(data), len(blobs)) + data)
    for b in blobs:
        sock.sendall(LEN.pack(memoryview(b).nbytes))
        sock.sendall(b)


def _recv(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise Closed("the other side closed the connection")
        got += k
    return buf


def recv_msg(sock: socket.socket, limit: int = 1 << 62):
    """(header, blobs), at most ``limit`` bytes in all (the grader reading a learner)."""
    n, count = HEAD.unpack(_recv(sock, HEAD.size))
    if n > limit or count > 100_000:
        raise WireError(f"a message of {n} bytes and {count} blobs")
    header, blobs, total = _recv(sock, n), [], n
    for _ in range(count):
        (k,) = LEN.unpack(_recv(sock, LEN.size))
        total += k
        if total > limit:
            raise WireError(f"more than {limit >> 20} MiB in one message")
        blobs.append(_recv(sock, k))
    try:
        return json.loads(header), blobs
    except (ValueError, RecursionError) as exc:
        raise WireError(f"a header that is not JSON ({type(exc).__name__})") from None


def error_info(exc: BaseException, path: str | None = None) -> list:
    """[name, builtin bases, text, where, traceback, grader key]: an exception, as it crosses."""
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if path and f.filename == path]
    where = (
        f"{os.path.basename(path)}:{mine[-1].lineno} in {mine[-1].name}" if mine else ""
    )
    try:
        text = str(exc)[:2000]
        tb = "".join(traceback.format_exception(exc, limit=-6))[-4000:]
    except Exception:
        text, tb = f"<{type(exc).__name__}>", ""
    bases = [c.__name__ for c in type(exc).__mro__ if EXC_BASES.get(c.__name__) is c]
    key = getattr(exc, "_memlab_key", None)
    return [type(exc).__name__[:100], bases, text, where, tb, key]


def readable_ranges(u8) -> list[list[int]]:
    """The byte ranges of a CPU storage that can be read: all of it for memory torch allocated;
    for memory it was given (a fenced tensor's mmap), page by page, without touching it."""
    n = u8.numel()
    if n == 0 or u8.device.type != "cpu" or u8.untyped_storage().resizable():
        return [[0, n]]
    import ctypes
    import errno

    page, addr, ranges = mmap.PAGESIZE, u8.data_ptr(), []
    r, w = os.pipe()
    try:
        for p in range(addr - addr % page, addr + n, page):
            lo, hi = max(p, addr) - addr, min(p + page, addr + n) - addr
            try:  # the kernel reads the byte for us: EFAULT where it cannot be read
                os.write(w, (ctypes.c_char * 1).from_address(addr + lo))
                os.read(r, 1)
            except OSError as exc:
                if exc.errno != errno.EFAULT:
                    raise
                continue
            if ranges and ranges[-1][1] == lo:
                ranges[-1][1] = hi
            else:
                ranges.append([lo, hi])
    finally:
        os.close(r)
        os.close(w)
    return ranges


def _fenced(n: int, ranges, base_mod: int):
    """A CPU storage of ``n`` bytes laid out like the grader's (``base_mod`` bytes into a page)
    whose pages outside ``ranges`` cannot be touched: a load past a fenced tensor crashes here
    as it would have there."""
    import ctypes

    import torch

    page = mmap.PAGESIZE
    npages = -(-(base_mod + n) // page)
    region = mmap.mmap(-1, npages * page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for i in range(npages):
        lo, hi = i * page - base_mod, (i + 1) * page - base_mod
        if not any(a < hi and lo < b for a, b in ranges):
            libc.mprotect(base + i * page, page, 0)
    return torch.frombuffer(region, dtype=torch.uint8, count=n, offset=base_mod)


def sig(x):
    """A shallow signature of a list, dict or set: immutables by value, the rest by identity."""

    def token(v):
        t = type(v)
        if v is None or t in (bool, int, str, bytes):
            return (t, v)
        if t is float:
            return (t, v.hex())
        return (tuple, tuple(map(token, v))) if t is tuple else id(v)

    if type(x) is dict:
        return [(token(k), token(v)) for k, v in x.items()]
    return sorted(map(token, x), key=repr) if type(x) is set else list(map(token, x))


# -- the codec, both sides -----------------------------------------------------------------

# Bytes of one tensor storage that crosses: chapter 09's GPU check hands the learner a pool past
# 2^31 elements (4.3 GB), so the bound is well above it.
MAX_STORAGE = 1 << 34


class _Message:
    """One message being written: new objects' definitions, blobs, the memo of one tree; the
    shared ids it names (never forgotten by it) and the snapshots it takes once it is sent."""

    def __init__(self):
        self.defs, self.blobs, self.made, self.memo, self.keep = [], [], [], {}, []
        self.used, self.seen = set(), []

    def blob(self, b) -> int:
        self.blobs.append(b)
        return len(self.blobs) - 1


def storage_key(s) -> tuple:
    """A storage by its identity (its StorageImpl), never by its address: empty storages all
    sit at address 0, and a storage's address changes when it is resized. A shared storage is
    held by its table, so no other storage can take its key while it is shared."""
    return ("S", s._cdata)


def _int(x, lo=0, hi=1 << 62) -> int:
    if type(x) is not int or not lo <= x <= hi:
        raise NotData(f"{str(x)[:20]} where a count or an id belongs")
    return x


def _list(x) -> list:
    if type(x) is not list:
        raise NotData("items that are not a list")
    return x


class Peer:
    """One side's half of the codec. Lists, dicts, sets and tensor storages that cross are
    shared: each side keeps its own object and the other's copy under one id (the grader's
    positive, the learner's negative), sends what changed in place with every message, and
    forgets an id when the grader says so. Everything received is checked before it is used."""

    def __init__(self, sign: int):
        self.sign = sign  # +1 the grader, -1 the learner
        self.entries = {}  # id -> [a list, dict or set, its signature] or [uint8, [ranges, snap]]
        self.sid_of = {}  # id(container), or storage_key of a storage -> id
        self.count = 0
        self.forget, self.release = [], []
        self.tuples, self.tuple_key = {}, {}  # named tuple classes: key <-> class

    # -- writing
    def message(self, kind, value, raw=False, dropping=()) -> tuple[list, list]:
        """The header and blobs of a message; ``dropping``: ids forgotten once it is sent."""
        m = _Message()
        try:
            body = value if raw else self.enc(value, m)
            upd = self.changes(m)
        except BaseException:
            self.drop(m.made)  # nothing of a message that is not sent is known there
            raise
        # Its changes are told: the next message's count from here (not from a message that
        # failed half way and was never sent).
        for where, i, snap in m.seen:
            where[i] = snap
        dropping = [sid for sid in dropping if sid not in m.used]  # it still names them
        self.drop(dropping)
        forget, self.forget = self.forget + dropping, []
        release, self.release = self.release, []
        return [kind, body, [m.defs, upd, forget, release], []], m.blobs

    def enc(self, x, m: _Message, depth=0):
        if depth > MAX_DEPTH:
            raise NotData(f"a value nested more than {MAX_DEPTH} levels deep")
        t = type(x)
        if x is None or t in (bool, int, float):
            return x
        items = lambda v: [self.enc(i, m, depth + 1) for i in v]  # noqa: E731
        key = self.tuple_key.get(t) or self.named(t)
        if key:
            return ["n", key, items(x)]
        # one object twice stays one (pickle sees it)
        if t in (str, bytes, tuple, frozenset):
            if id(x) in m.memo:
                return ["@", m.memo[id(x)]]
            if t in (str, bytes):
                out = x if t is str else ["b", m.blob(x)]
            else:
                out = ["t" if t is tuple else "f", items(x)]
            m.memo[id(x)] = len(m.memo)
            m.keep.append(x)
            return out
        if t in (list, dict, set):
            return ["R", self.share(x, m)]
        if t is bytearray:
            return ["b", m.blob(bytes(x))]
        if t is complex:
            return ["cx", x.real, x.imag]
        if t in (range, slice):
            return ["r" if t is range else "sl", items((x.start, x.stop, x.step))]
        if x is Ellipsis:
            return ["E"]
        torch = sys.modules.get("torch")
        if torch is not None and t in (torch.Tensor, torch.nn.Parameter):
            if x.layout != torch.strided or x.device.type not in ("cpu", "cuda"):
                raise NotData(f"a {x.layout} tensor on {x.device}")
            x = x.detach().resolve_conj().resolve_neg()
            meta = [
                str(x.dtype)[6:],
                list(x.shape),
                list(x.stride()),
                x.storage_offset(),
            ]
            return ["T", self.storage(x, m), *meta]
        if torch is not None and t is torch.dtype:
            return ["dt", str(x)[6:]]
        if torch is not None and t in (torch.device, torch.Size):
            return ["dv", str(x)] if t is torch.device else ["sz", list(x)]
        return self.opaque(x, m)

    def named(self, t):
        """The key of a named tuple class of this side's that crosses as data (the grader's)."""
        return None

    def opaque(self, x, m):
        raise NotImplementedError

    def new_id(self, m) -> int:
        self.count += 1
        m.made.append(self.sign * self.count)
        return self.sign * self.count

    def share(self, x, m) -> int:
        sid = self.sid_of.get(id(x))
        if sid is not None and self.entries[sid][0] is x:
            m.used.add(sid)
            return sid
        sid = self.new_id(m)
        self.entries[sid], self.sid_of[id(x)] = [x, sig(x)], sid
        m.defs.append(
            [sid, {list: "L", dict: "D", set: "S"}[type(x)], self.content(x, m)]
        )
        return sid

    def content(self, x, m) -> list:
        saved, m.memo = m.memo, {}
        try:
            return [self.enc(v, m, 1) for v in (x.items() if type(x) is dict else x)]
        finally:
            m.memo = saved

    def storage(self, x, m) -> int:
        import torch

        s = x.untyped_storage()
        key = storage_key(s)
        sid = self.sid_of.get(key)
        if sid is not None:
            m.used.add(sid)
            return sid
        u8 = torch.empty(0, dtype=torch.uint8, device=x.device).set_(s)
        ranges = readable_ranges(u8)
        sid = self.new_id(m)
        self.entries[sid], self.sid_of[key] = [u8, [ranges, _snap(u8, ranges)]], sid
        mod = s.data_ptr() % mmap.PAGESIZE if ranges != [[0, u8.numel()]] else 0
        parts = _parts(u8, ranges, m)
        m.defs.append([sid, "B", [str(x.device), u8.numel(), ranges, mod, parts]])
        return sid

    def changes(self, m) -> list:
        """[id, content] of every shared object changed in place since the last message."""
        out = []
        for sid, e in list(self.entries.items()):
            x = e[0]
            if sid in m.made:
                continue
            if type(x) in (list, dict, set):
                if sig(x) != e[1]:
                    m.seen.append((e, 1, sig(x)))
                    out.append([sid, self.content(x, m)])
            elif not all(_same(x[a:b], s) for (a, b), s in zip(*e[1])):
                m.seen.append((e[1], 1, _snap(x, e[1][0])))
                out.append([sid, _parts(x, e[1][0], m)])
        return out

    def drop(self, sids):
        for sid in sids:
            x = self.entries.pop(sid, [None])[0]
            if x is None:
                continue
            shared = type(x) in (list, dict, set)
            key = id(x) if shared else storage_key(x.untyped_storage())
            if self.sid_of.get(key) == sid:
                del self.sid_of[key]

    # -- reading: everything checked, nothing trusted
    def receive(self, header, blobs):
        """(kind, body) of a message; the body decoded unless it is an error's record."""
        if not (type(header) is list and len(header) == 4 and type(header[2]) is list):
            raise NotData("a message of the wrong shape")
        kind, body, (defs, upd, forget, release), _ = header
        self.released([_int(h) for h in _list(release)])
        fill = []
        for sid, kind_, content in _list(defs):
            if _int(sid, -(1 << 62)) * self.sign >= 0 or sid in self.entries:
                raise NotData("an object id the other side may not make")
            if kind_ == "B":
                u8 = self.new_storage(_list(content), blobs)
                self.entries[sid] = [u8, [content[2], None]]
                self.sid_of[storage_key(u8.untyped_storage())] = sid
                fill.append([sid, content[4]])
            else:
                x = {"L": list, "D": dict, "S": set}[kind_]()
                self.entries[sid], self.sid_of[id(x)] = [x, None], sid
                fill.append([sid, content])
        for sid, content in fill + _list(upd):
            self.apply(_int(sid, -(1 << 62)), _list(content), blobs)
        # after their last changes
        self.drop([_int(s, -(1 << 62)) for s in _list(forget)])
        if kind == "e":
            return kind, body
        return kind, self.dec(body, blobs, [], 0)

    def released(self, hids):
        pass

    def new_storage(self, content, blobs):
        import torch

        device, n, ranges, mod, parts = content
        n, mod, end = _int(n, 0, MAX_STORAGE), _int(mod, 0, mmap.PAGESIZE - 1), 0
        for r in _list(ranges):
            if not (
                type(r) is list and len(r) == 2 and end <= _int(r[0]) <= _int(r[1]) <= n
            ):
                raise NotData("a tensor storage's readable ranges are out of order")
            end = r[1]
        if len(_list(parts)) != len(ranges):
            raise NotData("a tensor storage of the wrong shape")
        if self.sign < 0 and ranges != [[0, n]] and device == "cpu":
            return _fenced(n, ranges, mod)  # only the learner's side fences
        return torch.zeros(n, dtype=torch.uint8, device=_device(device))

    def apply(self, sid, content, blobs):
        """The other side's new content of a shared object, written into this side's."""
        if sid not in self.entries:
            raise NotData("a change to an object that is not shared")
        e = self.entries[sid]
        x = e[0]
        if type(x) in (list, dict, set):
            memo = []
            got = [self.dec(v, blobs, memo, 1) for v in content]
            if type(x) is dict and not all(
                type(p) is tuple and len(p) == 2 for p in got
            ):
                raise NotData("a dict whose items are not pairs")
            new = type(x)(got)  # a dict of unhashable keys fails here, before x changes
            x.clear()
            x.extend(new) if type(x) is list else x.update(new)
            e[1] = sig(x)
            return
        import torch

        ranges = e[1][0]
        data = [blobs[_int(i)] for i in content]
        if len(data) != len(ranges) or any(
            len(d) != b - a for d, (a, b) in zip(data, ranges)
        ):
            raise NotData("a change to a tensor that does not fit it")
        for d, (a, b) in zip(data, ranges):  # only where this side may write
            if b > a:
                x[a:b].copy_(torch.frombuffer(d, dtype=torch.uint8))
        e[1][1] = _snap(x, ranges)

    def dec(self, v, blobs, memo, depth):
        if depth > MAX_DEPTH:
            raise NotData(f"a value nested more than {MAX_DEPTH} levels deep")
        t = type(v)
        if v is None or t in (bool, int, float):
            return v
        if t is str:
            memo.append(v)
            return v
        if t is not list or not v or type(v[0]) is not str:
            raise NotData("a value the codec does not know")
        tag, a = v[0], v[1:]

        def items(i=0):
            return [self.dec(x, blobs, memo, depth + 1) for x in _list(a[i])]

        if tag == "@":
            return memo[_int(a[0], 0, len(memo) - 1)]
        if tag in ("t", "f", "b"):
            x = bytes(blobs[_int(a[0])]) if tag == "b" else None
            x = x if x is not None else (tuple if tag == "t" else frozenset)(items())
            memo.append(x)
            return x
        if tag == "R":
            x = self.entries[_int(a[0], -(1 << 62))][0]
            if type(x) not in (list, dict, set):
                raise NotData("a storage where a value belongs")
            return x
        if tag == "T":
            return self.tensor(a)
        if tag == "n":
            key = (*_list(a[0])[:2], *_list(a[0][2]))
            return self.tuple_class(key, a[0])(*items(1))
        return self.small(tag, a, items)

    def small(self, tag, a, items):
        import torch

        if tag == "dt" and a[0] in DTYPES:
            return getattr(torch, a[0])
        if tag == "dv":
            return _device(a[0])
        if tag == "sz":
            return torch.Size([_int(i) for i in _list(a[0])])
        if tag == "cx":
            return complex(float(a[0]), float(a[1]))
        if tag in ("r", "sl"):
            got = items()
            if len(got) != 3 or (tag == "r" and not all(type(i) is int for i in got)):
                raise NotData("a range or slice of the wrong shape")
            return (range if tag == "r" else slice)(*got)
        if tag == "E":
            return Ellipsis
        return self.special(tag, a)

    def special(self, tag, a):
        raise NotData(f"a value tagged {str(tag)[:20]!r}")

    def tuple_class(self, key, spec):
        cls = self.tuples.get(key)
        if cls is None:
            raise NotData("a named tuple the grader never sent")
        return cls

    def tensor(self, a):
        """A view of a shared storage, which must lie where this side may read."""
        import torch

        sid, dtype, shape, stride, offset = a
        e = self.entries.get(_int(sid, -(1 << 62)))
        if e is None or type(e[0]) in (list, dict, set) or dtype not in DTYPES:
            raise NotData("a tensor on a storage that is not there")
        if len(_list(shape)) != len(_list(stride)) or len(shape) > 16:
            raise NotData("a tensor of the wrong shape")
        dt, u8 = getattr(torch, dtype), e[0]
        size = [_int(s) for s in shape]
        step = [_int(s) for s in stride]
        first = _int(offset) * dt.itemsize
        last = first + (sum((n - 1) * d for n, d in zip(size, step)) + 1) * dt.itemsize
        if 0 not in size and not any(a <= first and last <= b for a, b in e[1][0]):
            raise NotData("a tensor that reaches past what its storage may read")
        t = torch.empty(0, dtype=dt, device=u8.device)
        return t.set_(u8.untyped_storage(), offset, size, step)


def _snap(u8, ranges):
    return [u8[a:b].clone() for a, b in ranges]


def _same(a, b) -> bool:
    return bool(a.equal(b))


def _parts(u8, ranges, m) -> list[int]:
    return [m.blob(memoryview(u8[a:b].cpu().numpy())) for a, b in ranges]


def _device(name):
    import re

    import torch

    if type(name) is not str or not re.fullmatch(r"cpu|cuda(:\d{1,2})?", name):
        raise NotData(f"a tensor on device {str(name)[:20]!r}")
    return torch.device(name)


# -- the learner's side ---------------------------------------------------------------------


class GraderFunction:
    """A function of the grader's process handed to the learner's code (``free`` in ``evict``)."""

    def __init__(self, learner, fid):
        self._learner, self._fid = learner, fid

    def __call__(self, *args, **kwargs):
        return self._learner.call_grader(self._fid, args, kwargs)

    def __repr__(self):
        return f"<a function of the grader #{self._fid}>"


class _Method:
    """A learner object's bound method: it crosses as its object and name (one round trip)."""

    def __init__(self, obj, name):
        self.obj, self.name = obj, name


class Learner(Peer):
    """The learner's process: its module, its half of the codec, its connection to the grader."""

    def __init__(self, sock, module, path):
        super().__init__(-1)
        self.sock, self.path = sock, path
        self.objects = {0: module}  # handle -> the object the grader holds a handle to
        self.hid_of = {id(module): 0}
        self.callbacks, self.next_hid = {}, 0
        self.seen = []  # what of the course this process touched (told with each answer)

    def opaque(self, x, m):
        t = type(x)
        if t is GraderFunction:
            return ["c", x._fid]
        if t is _Method:
            return ["m", self.handle(x.obj), x.name]
        name = f"{getattr(t, '__module__', '?')}.{getattr(t, '__qualname__', '?')}"
        return ["h", self.handle(x), name[:200]]

    def handle(self, x) -> int:
        hid = self.hid_of.get(id(x))
        if hid is None:
            self.next_hid += 1
            hid = self.hid_of[id(x)] = self.next_hid
            self.objects[hid] = x
        return hid

    def released(self, hids):
        for hid in hids:
            self.hid_of.pop(id(self.objects.pop(hid, None)), None)

    def special(self, tag, a):
        if tag == "h":
            return self.objects[a[0]]
        if tag == "m":
            return getattr(self.objects[a[0]], a[1])
        if tag == "c":
            return self.callbacks.setdefault(a[0], GraderFunction(self, a[0]))
        return super().special(tag, a)

    def tuple_class(self, key, spec):
        if key not in self.tuples:
            import collections

            cls = collections.namedtuple(spec[1].rpartition(".")[2], spec[2])
            self.tuples[key], self.tuple_key[cls] = cls, spec
        return self.tuples[key]

    def send(self, kind, value):
        """An answer ("a"), an error ("e", its error_info) or a callback ("c"); an answer that is
        not data goes as an error, a callback's arguments that are not data raise here."""
        try:
            header, blobs = self.message(kind, value, raw=kind == "e")
        except NotData as exc:
            if kind == "c":
                raise
            info = error_info(exc, self.path)
            header, blobs = self.message("e", ["NotData", *info[1:]], raw=True)
        header[3] = self.seen[:]
        self.seen.clear()
        send_msg(self.sock, header, blobs)

    def receive(self):
        return super().receive(*recv_msg(self.sock))

    def serve(self):
        while True:
            try:
                kind, body = self.receive()
            except Closed:
                return
            self.answer(body)

    def answer(self, body):
        try:
            value = self.run(*body)
        except BaseException as exc:  # noqa: B036 (everything the learner's code raises goes back)
            return self.send("e", error_info(exc, self.path))
        self.send("a", value)

    def run(self, op, obj, *args):
        if op == "getattr":
            value = getattr(obj, args[0])
            if getattr(value, "__self__", None) is obj and hasattr(value, "__func__"):
                # a.method(...) costs one round trip, not two
                return _Method(obj, args[0])
            return value
        if op == "call":
            return obj(*args[0], **dict(args[1]))
        if op == "callmethod":
            return getattr(obj, args[0])(*args[1], **dict(args[2]))
        if op in ("repr", "str"):
            return (repr if op == "repr" else str)(obj)[:2000]
        if op == "dir":
            return tuple(n for n in dir(obj) if type(n) is str)
        ops = {
            "setattr": setattr,
            "delattr": delattr,
            "getitem": lambda o, k: o[k],
            "setitem": lambda o, k, v: o.__setitem__(k, v),
            "delitem": lambda o, k: o.__delitem__(k),
        }
        return ops[op](obj, *args)

    def call_grader(self, fid, args, kwargs):
        """Call a function of the grader (a callback), serving its requests meanwhile."""
        self.send("c", (fid, args, tuple(kwargs.items())))
        while True:
            try:
                kind, body = self.receive()
            except Closed:
                os._exit(0)  # the grader is gone
            if kind == "q":
                self.answer(body)
                continue
            if kind == "a":
                return body
            base = next((EXC_BASES[b] for b in body[1] if b in EXC_BASES), RuntimeError)
            try:
                exc = base(body[2])
            except Exception:
                exc = RuntimeError(body[2])
            # the grader re-raises its own exception if this escapes
            exc._memlab_key = body[5]
            raise exc


# -- one learner process ----------------------------------------------------------------------


def _watch(roots, python, seen):
    """Note (not stop) what this process imports or opens of the course (``roots``, less the
    ``python`` it runs on, which may live in the course's folder): locally the learner owns the
    machine, and this only turns an honest slip into a plain message. On Gradescope the operating
    system keeps the course out of reach."""

    program = os.path.realpath(__file__)  # this file: a warning may quote its lines

    def under(path, dirs):
        return any(path == d or path.startswith(d + os.sep) for d in dirs)

    def hook(event, args):
        if len(seen) > 10:
            return
        if event == "open" and isinstance(args[0], (str, bytes)):
            plain = "".join([args[0]]) if isinstance(args[0], str) else bytes(args[0])
            # a str subclass's methods may lie
            path = os.path.realpath(os.fsdecode(plain))
            if under(path, roots) and not under(path, python) and path != program:
                seen.append(f"reads {path}")
        elif event == "import" and args[0].partition(".")[0] in FORBIDDEN:
            seen.append(f"imports {args[0]}")

    sys.addaudithook(hook)


FORBIDDEN = (
    "memlab",
    "solutions",
    "exercises",
    "tests",
    "memlab_tests",
    "pytest",
    "_pytest",
)


def _isolate(config) -> list[str]:
    """What the operating system can do for the grader, strongest first; what it did."""
    import ctypes
    import resource

    done, libc = [], ctypes.CDLL(None, use_errno=True)
    user = config.get("user")
    # CLONE_NEWNET: no network, where allowed
    if user and libc.unshare(0x40000000) == 0:
        done.append("no network")
    for key, value in (config.get("limits") or {}).items():
        limit = getattr(resource, f"RLIMIT_{key.upper()}")
        resource.setrlimit(limit, (value, value))
        done.append(f"{key} limit")
    if user:
        os.setgroups([])
        os.setgid(user[1])
        os.setuid(user[0])
        done.append(f"user {user[2]}")
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS: no setuid program raises it again
    # PR_SET_PDEATHSIG: it dies with the zygote
    libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)
    return done


def learner(sock: socket.socket, out_fd: int, config: dict) -> None:
    """In a new learner process (forked from the zygote): isolate it, import the file, serve."""
    if os.getsid(0) != os.getpid():  # started afresh, it leads its session already
        os.setsid()  # its own process group, which the grader signals as a whole
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for f in (sys.stdout, sys.stderr):  # the grader reads it as it comes
        f.reconfigure(line_buffering=True, write_through=True)
    os.closerange(3, sock.fileno())
    os.closerange(sock.fileno() + 1, 1 << 16)
    isolation = _isolate(config) if sys.platform.startswith("linux") else []
    os.chdir(config["work"])
    os.umask(0o077)
    os.environ.clear()
    os.environ.update(config["env"])
    import faulthandler

    faulthandler.enable(all_threads=True)
    # where it is, when it hangs
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    path = os.path.join(config["work"], config["name"] + ".py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(config["source"])
    import importlib.util

    spec = importlib.util.spec_from_file_location(config["name"], path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[config["name"]] = (
        module  # dataclasses and Triton look a module up by name
    )
    me = Learner(sock, module, path)
    _watch(config["roots"], config["python"], me.seen)
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # noqa: B036 (a file that does not import says why)
        me.send("e", error_info(exc, path))
        os._exit(0)
    me.send("a", ("ready", tuple(isolation)))
    me.serve()
    os._exit(0)


def zygote(ctl: socket.socket, preload: list[str]) -> None:
    """Import what the exercises need once, then fork a learner process per request. The grader
    asks for each child's exit status (``reap``): until then a finished child stays a zombie, so
    its process id, which the grader signals, can never name another process."""
    for name in preload:
        try:
            __import__(name)
        except Exception:
            pass
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)
    ctl.send(b'["ready"]')
    while True:
        msg, fds, _, _ = socket.recv_fds(ctl, 1 << 24, 2)
        if not msg:
            os._exit(0)  # the grader is gone (its learner processes die with this one)
        req = json.loads(msg)
        if req[0] == "fork":
            pid = os.fork()
            if pid == 0:
                try:
                    ctl.close()
                    learner(socket.socket(fileno=fds[0]), fds[1], req[1])
                except BaseException:  # noqa: B036 (the grader reads it as the crash's cause)
                    traceback.print_exc()
                finally:
                    os._exit(70)
            for fd in fds:
                os.close(fd)
            ctl.send(json.dumps(["pid", pid]).encode())
        else:  # ["reap", pid]
            _, status = os.waitpid(req[1], 0)
            ctl.send(json.dumps(["status", os.waitstatus_to_exitcode(status)]).encode())


if __name__ == "__main__":
    if sys.argv[1] == "zygote":  # zygote CONTROL_FD PRELOAD
        zygote(socket.socket(fileno=int(sys.argv[2])), json.loads(sys.argv[3]))
    else:  # learner SOCK_FD OUT_FD: one process without a zygote (not Linux)
        sock = socket.socket(fileno=int(sys.argv[2]))
        learner(sock, int(sys.argv[3]), recv_msg(sock)[0])
