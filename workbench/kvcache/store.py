"""The swap store: chunk files per context and a SQLite index that together lose nothing.

Layout of a swap directory::

    index.sqlite3          the index (WAL journal, synchronous=FULL; NORMAL for evictions that write no file)
    lock                   held (flock) by the one service using the directory
    <context id>/<i>.bin   chunk i of a context, as ``swapfile.write_chunk`` writes it
    <context id>/<i>.base  its 8-bit base, for chunks compressed by tolerance

Index tables: ``meta`` (format, chunk size, model shape), ``apps``, ``contexts`` (owner app,
SHA-256 of the stub's secret, system prompt, token ids, pending token, per-token attention sums,
recency) and ``chunks`` (bits, shape, state, bytes in memory, file bytes and CRC-32, recency).

A chunk's state is one of:

* ``memory``: in memory only (its file is missing or older than its data);
* ``memory+file``: in memory, and its file holds the same data;
* ``file``: swapped out, only its file holds it;
* ``dropped``: neither; it is recomputed from the context's tokens when needed.

A full chunk compressed by tolerance also keeps its 8-bit base in ``<i>.base`` (written once, with the
commit that records it), so its level can be assigned anew from the base, up or down, after any call.

Crash safety. Every state change is one SQLite transaction. New chunk data is first written to
``<i>.bin.next`` (fsync, directory fsync), then the transaction that records it (bits, shape, bytes,
CRC) commits, then ``.next`` is renamed over ``.bin``. A process killed anywhere leaves either the
old row with the old file, or the new row with a ``.next`` whose CRC matches it; opening the store
finishes or discards such leftovers, so the index and the files always agree. Memory is empty after
an open: ``memory+file`` rows become ``file`` and ``memory`` rows become ``dropped``.

The index transaction is the commit point, for a crash and for an error alike: an error before it
(a full disk, say) removes the ``.next`` files of that commit and raises, so the caller undoes its
change; after it nothing raises, and a rename that fails is retried later while reads use ``.next``
(``current_path``), so the running service and a restarted one see the same committed state.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import signal
import sqlite3
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np

from workbench.errors import CorruptArtifactError, WorkbenchError
from workbench.kvcache.chunks import LEVELS, ChunkData, ChunkedKV
from workbench.kvcache.swapfile import check_file_size, read_chunk, write_chunk_crc

FORMAT = 2
"""Version of the swap directory; format 1 held values with per-channel scales, as keys still are."""
BASE_BITS = LEVELS[0]
log = logging.getLogger("workbench.kvcache")
INDEX_NAME = "index.sqlite3"
MEMORY, BOTH, FILE, DROPPED = "memory", "memory+file", "file", "dropped"
STATES = (MEMORY, BOTH, FILE, DROPPED)
IN_MEMORY = (MEMORY, BOTH)
HAS_FILE = (BOTH, FILE)
FAILPOINT_ENV = "WORKBENCH_LLMS_FAILPOINT"
"""Names a point in ``SwapStore.commit`` where the process kills itself (SIGKILL), for crash tests:
``chunk_files_written`` (new files durable, index not yet committed) or ``index_committed``."""

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS apps(name TEXT PRIMARY KEY, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS contexts(
    id TEXT PRIMARY KEY,
    app TEXT NOT NULL REFERENCES apps(name),
    stub_sha256 TEXT NOT NULL UNIQUE,
    system_prompt TEXT,
    created REAL NOT NULL,
    last_used REAL NOT NULL,
    last_tick INTEGER NOT NULL,
    calls INTEGER NOT NULL,
    tokens BLOB NOT NULL,
    pending BLOB NOT NULL,
    attn_sum BLOB NOT NULL,
    attn_rows BLOB NOT NULL,
    last_call_id TEXT,
    last_reply TEXT);
CREATE TABLE IF NOT EXISTS chunks(
    ctx TEXT NOT NULL REFERENCES contexts(id) ON DELETE CASCADE,
    idx INTEGER NOT NULL,
    bits INTEGER NOT NULL,
    shape TEXT NOT NULL,
    state TEXT NOT NULL CHECK(state IN ({", ".join(repr(s) for s in STATES)})),
    nbytes INTEGER NOT NULL,
    file_bytes INTEGER,
    crc32 INTEGER,
    last_tick INTEGER NOT NULL,
    base_crc32 INTEGER,
    PRIMARY KEY(ctx, idx));
"""


_CONTEXT_COLUMNS = ("id", "app", "stub_sha256", "system_prompt", "created", "last_used", "last_tick", "calls",
                    "tokens", "pending", "attn_sum", "attn_rows", "last_call_id", "last_reply")
UPSERT_CONTEXT = (f"INSERT INTO contexts VALUES ({', '.join('?' * len(_CONTEXT_COLUMNS))}) ON CONFLICT(id) DO UPDATE SET "
                  + ", ".join(f"{c} = excluded.{c}" for c in _CONTEXT_COLUMNS[1:]))


class SwapDirInUseError(WorkbenchError):
    """Another live service holds the swap directory."""


@dataclass(kw_only=True, eq=False)
class ContextRow:
    """A context as the index keeps it: everything but its chunks' data."""
    id: str
    app: str
    stub_sha256: str
    system_prompt: str | None = None
    created: float = field(default_factory=time.time)
    last_used: float = 0.0
    last_tick: int = 0
    calls: int = 0
    tokens: list[int] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)
    attn_sum: np.ndarray = field(default_factory=lambda: np.zeros(0))
    attn_rows: np.ndarray = field(default_factory=lambda: np.zeros(0))
    last_call_id: str | None = None        # the client's id of the last call committed, so a retry is not run again
    last_reply: str | None = None          # that call's request and reply (JSON)


@dataclass(kw_only=True, eq=False)
class ChunkRow:
    """One chunk's entry: level, shape, where it lives, its bytes and its last use (the service's clock)."""
    ctx: str
    idx: int
    bits: int
    shape: tuple[int, ...]
    state: str
    nbytes: int
    file_bytes: int | None = None
    crc32: int | None = None
    last_tick: int = 0
    base_crc32: int | None = None     # CRC-32 of the chunk's 8-bit base file, None while it has none

    @property
    def key(self) -> tuple[str, int]:
        return self.ctx, self.idx


@dataclass(eq=False)
class ServedContext:
    """A context as the service holds it in memory: its index row, its chunks (``kv.chunks[i]`` None while
    chunk i is not in memory) with their rows, and each chunk's information density."""
    row: ContextRow
    kv: ChunkedKV
    chunks: list[ChunkRow]
    density: np.ndarray = field(default_factory=lambda: np.zeros(0))


def _failpoint(name: str) -> None:
    if os.environ.get(FAILPOINT_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


def _move_into_place(src: Path, dst: Path) -> None:
    os.replace(src, dst)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_crc(path: Path) -> int:
    return zlib.crc32(Path(path).read_bytes())


def _chunk_index(name: str) -> int | None:
    head = name.split(".")[0]
    return int(head) if head.isdigit() else None


def _ints(blob: bytes) -> list[int]:
    return np.frombuffer(blob, dtype=np.int64).tolist()


def _floats(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype=np.float64).copy()


class SwapStore:
    """Chunk files and their index in one directory; see the module docstring for the guarantees.

    ``meta`` (chunk size, model shape) is recorded on first use and must match on every later open,
    since chunks of another size or model cannot be served. Opening recovers from any crash."""

    def __init__(self, root: Path, meta: Mapping[str, object] | None = None):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._lock_handle = open(self.root / "lock", "a+")
        try:
            fcntl.flock(self._lock_handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_handle.close()
            raise SwapDirInUseError(f"swap directory {self.root} is in use by another LLM service; "
                                    f"stop it or choose another swap directory") from None
        self._lock = threading.RLock()                     # one connection, shared by the service's threads
        self._db = sqlite3.connect(self.root / INDEX_NAME, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.executescript(SCHEMA)
        for table, column, kind in (("chunks", "base_crc32", "INTEGER"), ("contexts", "last_call_id", "TEXT"),
                                    ("contexts", "last_reply", "TEXT")):      # an index made before these columns
            if column not in [r[1] for r in self._db.execute(f"PRAGMA table_info({table})")]:
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
        self._check_meta({"format": FORMAT, **(meta or {})})
        self.recovery_notes: list[str] = []
        self._pending_renames: set[tuple[str, int]] = set()
        self._recover()

    # ------------------------------------------------------------------ paths and transactions

    def context_dir(self, ctx: str) -> Path:
        return self.root / ctx

    def chunk_path(self, ctx: str, idx: int) -> Path:
        return self.root / ctx / f"{idx}.bin"

    def _transaction(self, statements: Iterable[tuple[str, tuple]], durable: bool = True) -> None:
        """Run ``statements`` as one transaction; ``durable=False`` commits it to the journal without waiting
        for the disk (SQLite's ``synchronous=NORMAL`` for this one: a crash may lose it, never corrupt)."""
        with self._lock:
            cur = self._db.cursor()
            if not durable:
                cur.execute("PRAGMA synchronous=NORMAL")
            try:
                cur.execute("BEGIN IMMEDIATE")
                try:
                    for sql, args in statements:
                        cur.execute(sql, args)
                    cur.execute("COMMIT")
                except BaseException:
                    cur.execute("ROLLBACK")
                    raise
            finally:
                if not durable:
                    cur.execute("PRAGMA synchronous=FULL")

    def _rows(self, sql: str) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql).fetchall()

    def _check_meta(self, meta: Mapping[str, object]) -> None:
        stored = {k: json.loads(v) for k, v in self._rows("SELECT key, value FROM meta")}
        clash = {k: (stored[k], v) for k, v in meta.items() if k in stored and stored[k] != v}
        if clash:
            details = ", ".join(f"{k} is {old!r} there, {new!r} here" for k, (old, new) in clash.items())
            raise WorkbenchError(f"swap directory {self.root} was made by another setup ({details}); "
                                 f"use another swap directory or the same settings")
        missing = [(k, json.dumps(v)) for k, v in meta.items() if k not in stored]
        if missing:
            self._transaction(("INSERT INTO meta VALUES (?, ?)", row) for row in missing)

    # ------------------------------------------------------------------ rows

    @staticmethod
    def _context_args(row: ContextRow) -> tuple:
        return (row.id, row.app, row.stub_sha256, row.system_prompt, row.created, row.last_used,
                row.last_tick, row.calls, np.asarray(row.tokens, np.int64).tobytes(),
                np.asarray(row.pending, np.int64).tobytes(), np.asarray(row.attn_sum, np.float64).tobytes(),
                np.asarray(row.attn_rows, np.float64).tobytes(), row.last_call_id, row.last_reply)

    @staticmethod
    def _chunk_args(row: ChunkRow) -> tuple:
        return (row.ctx, row.idx, row.bits, json.dumps(list(row.shape)), row.state, row.nbytes,
                row.file_bytes, row.crc32, row.last_tick, row.base_crc32)

    def add_app(self, name: str) -> None:
        self._transaction([("INSERT OR IGNORE INTO apps VALUES (?, ?)", (name, time.time()))])

    def add_context(self, row: ContextRow) -> None:
        self._transaction([(UPSERT_CONTEXT, self._context_args(row))])
        self.context_dir(row.id).mkdir(exist_ok=True)
        _fsync_dir(self.root)

    def delete_context(self, ctx: str) -> None:
        """Rows first (one transaction), then the files; a crash in between leaves an orphan
        directory that the next open removes."""
        self._transaction([("DELETE FROM chunks WHERE ctx = ?", (ctx,)), ("DELETE FROM contexts WHERE id = ?", (ctx,))])
        self._pending_renames = {k for k in self._pending_renames if k[0] != ctx}
        shutil.rmtree(self.context_dir(ctx), ignore_errors=True)

    def load(self) -> list[tuple[ContextRow, list[ChunkRow]]]:
        """Every context with its chunk rows (in chunk order)."""
        chunks: dict[str, list[ChunkRow]] = {}
        for r in self._rows("SELECT ctx, idx, bits, shape, state, nbytes, file_bytes, crc32, last_tick, base_crc32 "
                            "FROM chunks ORDER BY ctx, idx"):
            chunks.setdefault(r[0], []).append(ChunkRow(ctx=r[0], idx=r[1], bits=r[2], shape=tuple(json.loads(r[3])),
                                                        state=r[4], nbytes=r[5], file_bytes=r[6], crc32=r[7],
                                                        last_tick=r[8], base_crc32=r[9]))
        out = []
        for r in self._rows("SELECT * FROM contexts ORDER BY created, id"):
            row = ContextRow(id=r[0], app=r[1], stub_sha256=r[2], system_prompt=r[3], created=r[4], last_used=r[5],
                             last_tick=r[6], calls=r[7], tokens=_ints(r[8]), pending=_ints(r[9]),
                             attn_sum=_floats(r[10]), attn_rows=_floats(r[11]), last_call_id=r[12],
                             last_reply=r[13])
            out.append((row, chunks.get(row.id, [])))
        return out

    def apps(self) -> list[str]:
        return [r[0] for r in self._rows("SELECT name FROM apps ORDER BY name")]

    # ------------------------------------------------------------------ the one write path

    def commit(self, *, contexts: Iterable[ContextRow] = (), chunks: Iterable[ChunkRow] = (),
               files: Mapping[tuple[str, int], ChunkData] | None = None,
               bases: Mapping[tuple[str, int], ChunkData] | None = None, durable: bool = True) -> int:
        """Record a state change: write ``files`` (keyed by (context, chunk)) beside their
        final names and ``bases`` (a full chunk's 8-bit base, written once, never replaced), commit
        ``contexts`` and ``chunks`` (whose rows get the new files' bytes and CRC) in one transaction,
        then move the files into place. Returns the bytes written.

        ``durable=False``, for a change recovery would make by itself (chunks leaving memory without a
        write: memory+file -> file, memory -> dropped), does not wait for the disk; a crash that loses it
        leaves rows recovery moves the same way. Files or bases always commit durably."""
        with self._lock:
            return self._commit(list(contexts), {row.key: row for row in chunks}, dict(files or {}),
                                dict(bases or {}), durable or bool(files) or bool(bases))

    def _commit(self, contexts: list[ContextRow], rows: dict[tuple[str, int], ChunkRow],
                files: dict[tuple[str, int], ChunkData], bases: dict[tuple[str, int], ChunkData],
                durable: bool = True) -> int:
        """The index transaction is the one commit point: a failure before it removes every file this
        commit wrote and raises (nothing changed); after it nothing raises, and a rename that fails is
        retried before the next commit or read of that chunk (``current_path`` serves it meanwhile)."""
        self._retry_renames(keys=files)
        written = 0
        dirs = set()
        made: list[Path] = []
        old = {key: (rows[key].file_bytes, rows[key].crc32) for key in files if key in rows}
        try:
            for key, data in bases.items():
                row = rows.get(key)
                if row is None or row.base_crc32 is not None or data.bits != BASE_BITS:
                    raise WorkbenchError(f"chunk {key} gets one {BASE_BITS}-bit base file, with its row")
                path = self.base_path(*key)
                path.parent.mkdir(exist_ok=True)
                made.append(path)
                size, row.base_crc32 = write_chunk_crc(path, data)
                written += size
                dirs.add(path.parent)
            for key, data in files.items():
                row = rows.get(key)
                if row is None or row.state not in HAS_FILE:
                    raise WorkbenchError(f"chunk {key} is written to its file but its row does not say so")
                nxt = self._next_path(*key)
                nxt.parent.mkdir(exist_ok=True)
                made.append(nxt)
                row.file_bytes, row.crc32 = write_chunk_crc(nxt, data)
                written += row.file_bytes
                dirs.add(nxt.parent)
            for d in dirs:
                _fsync_dir(d)
            _failpoint("chunk_files_written")
            self._transaction([*((UPSERT_CONTEXT, self._context_args(c)) for c in contexts),
                               *(("INSERT OR REPLACE INTO chunks VALUES (?,?,?,?,?,?,?,?,?,?)", self._chunk_args(r))
                                 for r in rows.values())], durable)
        except BaseException:
            for path in made:
                path.unlink(missing_ok=True)
                path.with_name(path.name + ".tmp").unlink(missing_ok=True)
            for key, (file_bytes, crc) in old.items():
                rows[key].file_bytes, rows[key].crc32 = file_bytes, crc
            for key in bases:
                if key in rows:
                    rows[key].base_crc32 = None
            raise
        _failpoint("index_committed")
        self._pending_renames.update(files)
        self._retry_renames(keys=files, strict=False)
        return written

    def _retry_renames(self, keys=None, strict: bool = True) -> None:
        """Move committed ``.next`` files over their chunk files (those of ``keys``, or all pending).
        ``strict``: a rename that still fails raises (before a commit that would overwrite that ``.next``)."""
        pending = [k for k in self._pending_renames if keys is None or k in keys]
        dirs = set()
        for n, key in enumerate(pending):
            try:
                _move_into_place(self._next_path(*key), self.chunk_path(*key))
            except OSError as exc:
                log.warning("llms swap store: could not move chunk %s of context %s into place (%s); "
                            "its committed data stays in %s and is served from there", key[1], key[0], exc,
                            self._next_path(*key))
                if strict:
                    raise
                continue
            self._pending_renames.discard(key)
            dirs.add(self.context_dir(key[0]))
            if n == 0:
                _failpoint("first_file_renamed")
        for d in dirs:
            try:
                _fsync_dir(d)
            except OSError:
                pass

    def base_path(self, ctx: str, idx: int) -> Path:
        return self.root / ctx / f"{idx}.base"

    def read_base(self, row: ChunkRow) -> ChunkData | None:
        """The chunk's 8-bit base, checked against its CRC-32; None when it has none or it is damaged
        (logged), so the caller keeps the chunk's current level."""
        if row.base_crc32 is None:
            return None
        path = self.base_path(row.ctx, row.idx)
        try:
            data = path.read_bytes()
            check_file_size(path, data, BASE_BITS, row.shape)
        except (OSError, CorruptArtifactError) as exc:
            log.warning("llms swap store: the base file of chunk %s of context %s cannot be used (%s)",
                        row.idx, row.ctx, exc)
            return None
        if zlib.crc32(data) != row.base_crc32:
            log.warning("llms swap store: %s fails its CRC-32 check; the chunk keeps its level", path)
            return None
        return read_chunk(path, BASE_BITS, row.shape)

    def remove_file(self, ctx: str, idx: int) -> None:
        """Remove a chunk's file (and a pending ``.next``) once its row no longer points to one."""
        self._pending_renames.discard((ctx, idx))
        for path in (self.chunk_path(ctx, idx), self._next_path(ctx, idx)):
            path.unlink(missing_ok=True)

    def current_path(self, ctx: str, idx: int) -> Path:
        """Where the chunk's committed data is now: its file, or its ``.next`` while a rename is pending."""
        return self._next_path(ctx, idx) if (ctx, idx) in self._pending_renames else self.chunk_path(ctx, idx)

    def _next_path(self, ctx: str, idx: int) -> Path:
        return self.root / ctx / f"{idx}.bin.next"

    def read(self, row: ChunkRow) -> ChunkData:
        if row.state not in HAS_FILE:
            raise WorkbenchError(f"chunk {row.idx} of context {row.ctx} has no file (state {row.state})")
        return read_chunk(self.current_path(row.ctx, row.idx), row.bits, row.shape)

    # ------------------------------------------------------------------ recovery and checks

    def _recover(self) -> None:
        """Finish or discard what a killed process left: temporary files, ``.next`` files, directories
        of deleted contexts; then mark every chunk as out of memory (one transaction)."""
        contexts = self.load()
        known = {row.id: {c.idx: c for c in chunks} for row, chunks in contexts}
        for tmp in self.root.glob("*/*.tmp"):
            tmp.unlink()
        for d in [p for p in self.root.iterdir() if p.is_dir()]:
            if d.name not in known:
                shutil.rmtree(d, ignore_errors=True)
                self.recovery_notes.append(f"removed the files of deleted context {d.name}")
        for nxt in self.root.glob("*/*.bin.next"):
            row = known.get(nxt.parent.name, {}).get(_chunk_index(nxt.name))
            if row is not None and row.state in HAS_FILE and nxt.stat().st_size == row.file_bytes \
                    and file_crc(nxt) == row.crc32:
                os.replace(nxt, self.chunk_path(row.ctx, row.idx))
                self.recovery_notes.append(f"finished writing chunk {row.idx} of context {row.ctx}")
            else:
                nxt.unlink()
        for base in self.root.glob("*/*.base"):                 # written before a commit that never came
            row = known.get(base.parent.name, {}).get(_chunk_index(base.name))
            if row is None or row.base_crc32 is None:
                base.unlink()
        changed = []
        for _, chunks in contexts:
            for c in chunks:
                path = self.chunk_path(c.ctx, c.idx)
                state = c.state
                if state in HAS_FILE and (not path.exists() or path.stat().st_size != c.file_bytes):
                    self.recovery_notes.append(f"chunk {c.idx} of context {c.ctx} lost its file; it will be recomputed")
                    state = DROPPED
                elif state == BOTH:
                    state = FILE
                elif state == MEMORY:
                    state = DROPPED
                if state == DROPPED and path.exists():
                    path.unlink()
                if state != c.state:
                    c.state = state
                    changed.append(c)
        if changed:
            self._transaction(("UPDATE chunks SET state = ? WHERE ctx = ? AND idx = ?", (c.state, c.ctx, c.idx))
                              for c in changed)
        for d in {p.parent for p in self.root.glob("*/*")} | {self.root}:
            _fsync_dir(d)

    def verify(self) -> list[str]:
        """Problems found (empty when sound): SQLite's integrity check, every file a row points to
        present with its size and CRC, no file without a row, no leftover temporary file."""
        problems = [r[0] for r in self._rows("PRAGMA integrity_check") if r[0] != "ok"]
        rows = {(c.ctx, c.idx): c for _, chunks in self.load() for c in chunks}
        for (ctx, idx), c in rows.items():
            if c.state in HAS_FILE:
                path = self.current_path(ctx, idx)
                if not path.exists():
                    problems.append(f"{path} is missing")
                elif path.stat().st_size != c.file_bytes or file_crc(path) != c.crc32:
                    problems.append(f"{path} does not match its index row (size or CRC-32)")
        for path in self.root.glob("*/*"):
            key = (path.parent.name, _chunk_index(path.name))
            pending = path.name.endswith(".bin.next") and key in self._pending_renames
            base = path.name.endswith(".base") and key in rows and rows[key].base_crc32 is not None
            if not (path.name.endswith(".bin") or pending or base) or key not in rows:
                problems.append(f"{path} belongs to no index row")
        for (ctx, idx), c in rows.items():
            if c.base_crc32 is not None:
                path = self.base_path(ctx, idx)
                if not path.exists() or file_crc(path) != c.base_crc32:
                    problems.append(f"{path} is missing or does not match its index row (CRC-32)")
        return problems

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
                self._lock_handle.close()

    def __enter__(self) -> SwapStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

