import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from workbench.errors import WorkbenchError
from workbench.kvcache.chunks import encode_chunk
from workbench.kvcache.store import (BOTH, DROPPED, FAILPOINT_ENV, FILE, MEMORY, ChunkRow, ContextRow,
                                     SwapDirInUseError, SwapStore)

SHAPE = (2, 2, 1, 4, 8)
META = {"chunk_size": 4, "model": {"layers": 2, "kv_heads": 1, "head_dim": 8}}


def chunk(seed: int, bits: int):
    return encode_chunk(np.random.default_rng(seed).standard_normal(SHAPE).astype(np.float32), bits)


def context_row(tokens) -> ContextRow:
    n = len(tokens)
    return ContextRow(id="c1", app="a", stub_sha256="digest", system_prompt="Be brief.", tokens=list(tokens),
                      pending=[7], attn_sum=np.linspace(0, 1, n), attn_rows=np.arange(n, 0, -1.0))


def chunk_rows(datas, state=BOTH):
    return [ChunkRow(ctx="c1", idx=i, bits=d.bits, shape=d.shape, state=state, nbytes=d.nbytes, last_tick=3)
            for i, d in enumerate(datas)]


def test_contexts_and_chunks_come_back_after_reopening_and_memory_states_are_reset(tmp_path):
    datas = [chunk(0, 32), chunk(1, 8), chunk(2, 4), chunk(3, 2)]
    with SwapStore(tmp_path, META) as store:
        assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        store.add_app("a")
        store.add_context(context_row(range(16)))
        rows = chunk_rows(datas)
        rows[3].state = MEMORY                                  # changed since its file was written
        store.commit(contexts=[context_row(range(16))], chunks=rows,
                     files={r.key: d for r, d in zip(rows[:3], datas[:3])})
        store.chunk_path("c1", 3).write_bytes(b"stale")
        assert store.verify() == []
    with SwapStore(tmp_path, META) as store:
        [(row, chunks)] = store.load()
        assert (row.app, row.system_prompt, row.tokens, row.pending) == ("a", "Be brief.", list(range(16)), [7])
        assert np.array_equal(row.attn_sum, np.linspace(0, 1, 16)) and np.array_equal(row.attn_rows, np.arange(16, 0, -1.0))
        assert [c.state for c in chunks] == [FILE, FILE, FILE, DROPPED]
        assert [(c.bits, c.shape, c.nbytes) for c in chunks] == [(d.bits, d.shape, d.nbytes) for d in datas]
        for c, d in zip(chunks[:3], datas):
            assert np.array_equal(store.read(c).to_array(), d.to_array())
        assert not store.chunk_path("c1", 3).exists()           # a dropped chunk keeps no stale file
        assert store.apps() == ["a"] and store.verify() == []


def test_only_changes_that_write_nothing_commit_without_waiting_for_the_disk(tmp_path):
    """A drop (memory+file -> file) or a kill is what recovery does by itself, so its commit does not wait for
    the disk (SQLite's synchronous=NORMAL for that transaction, FULL again after); a commit that writes a
    file, or asks to be durable, waits. Catches every commit made lax, or none."""
    datas = [chunk(0, 8), chunk(1, 4)]
    with SwapStore(tmp_path, META) as store:
        store.add_app("a")
        store.add_context(context_row(range(8)))
        statements = []
        store._db.set_trace_callback(statements.append)

        def commit(**kwargs):
            statements.clear()
            store.commit(**kwargs)
            lax = statements.index("PRAGMA synchronous=NORMAL") < statements.index("BEGIN IMMEDIATE") \
                if "PRAGMA synchronous=NORMAL" in statements else False
            return lax, store._db.execute("PRAGMA synchronous").fetchone()[0]

        rows = chunk_rows(datas)
        assert commit(chunks=rows, files={r.key: d for r, d in zip(rows, datas)}, durable=False) == (False, 2)
        for r in rows:
            r.state = FILE
        assert commit(chunks=rows, durable=False) == (True, 2)          # 2: FULL, restored
        assert commit(chunks=rows) == (False, 2)
    with SwapStore(tmp_path, META) as store:
        assert [c.state for c in store.load()[0][1]] == [FILE, FILE]


WRITER = textwrap.dedent("""
    import sys
    from test_store import META, chunk, chunk_rows, context_row
    from workbench.kvcache.store import SwapStore
    store = SwapStore(sys.argv[1], META)
    store.commit(contexts=[context_row(range(8))], chunks=chunk_rows([chunk(10, 4), chunk(11, 8)]),
                 files={("c1", 0): chunk(10, 4), ("c1", 1): chunk(11, 8)})
""")


@pytest.mark.parametrize("point", ["chunk_files_written", "index_committed", "first_file_renamed"])
@pytest.mark.integration
def test_a_process_killed_while_committing_leaves_the_old_or_the_new_state_whole(tmp_path, point):
    with SwapStore(tmp_path, META) as store:
        store.add_app("a")
        store.add_context(context_row(range(4)))
        store.commit(contexts=[context_row(range(4))], chunks=chunk_rows([chunk(0, 8)]), files={("c1", 0): chunk(0, 8)})
    env = {**os.environ, FAILPOINT_ENV: point, "PYTHONPATH": os.path.dirname(__file__)}
    run = subprocess.run([sys.executable, "-c", WRITER, str(tmp_path)], env=env, capture_output=True, text=True)
    assert run.returncode == -9, run.stderr
    with SwapStore(tmp_path, META) as store:
        [(row, chunks)] = store.load()
        if point == "chunk_files_written":                      # killed before the index changed: old state
            assert row.tokens == list(range(4)) and [(c.idx, c.bits) for c in chunks] == [(0, 8)]
            expected = [chunk(0, 8)]
        else:                                                   # index committed: the new files are put in place
            assert row.tokens == list(range(8)) and [(c.idx, c.bits) for c in chunks] == [(0, 4), (1, 8)]
            expected = [chunk(10, 4), chunk(11, 8)]
        for c, d in zip(chunks, expected):
            assert np.array_equal(store.read(c).to_array(), d.to_array())
        assert store.verify() == [] and not list(tmp_path.glob("*/*.next"))


def test_deleted_contexts_leave_no_files_and_damage_is_reported(tmp_path):
    with SwapStore(tmp_path, META) as store:
        store.add_app("a")
        store.add_context(context_row(range(4)))
        store.commit(chunks=chunk_rows([chunk(0, 8)]), files={("c1", 0): chunk(0, 8)})
        path = store.chunk_path("c1", 0)
        data = bytearray(path.read_bytes())
        data[5] ^= 0xFF
        path.write_bytes(bytes(data))
        assert any("does not match" in p for p in store.verify())
        store.delete_context("c1")
        assert store.load() == [] and not (tmp_path / "c1").exists()
    (tmp_path / "orphan").mkdir()
    (tmp_path / "orphan" / "0.bin").write_bytes(b"x")
    with SwapStore(tmp_path, META) as store:
        assert not (tmp_path / "orphan").exists() and store.verify() == []
        assert any("orphan" in note for note in store.recovery_notes)


def test_one_service_per_swap_directory_and_the_same_setup_each_time(tmp_path):
    store = SwapStore(tmp_path, META)
    with pytest.raises(SwapDirInUseError, match="in use by another LLM service"):
        SwapStore(tmp_path, META)
    store.close()
    with pytest.raises(WorkbenchError, match="chunk_size is 4 there, 16 here"):
        SwapStore(tmp_path, {**META, "chunk_size": 16})
    SwapStore(tmp_path, META).close()


def test_a_commit_that_fails_before_the_index_leaves_no_next_files_and_the_old_state(tmp_path, monkeypatch):
    """A full disk at the second of two files: the first file's ``.next`` and the second's ``.tmp`` are
    removed, the rows keep their old file size and CRC, and the index and files still agree."""
    from workbench.kvcache import store as store_module

    with SwapStore(tmp_path, META) as store:
        store.add_app("a")
        store.add_context(context_row(range(4)))
        old_rows = chunk_rows([chunk(0, 8)])
        store.commit(contexts=[context_row(range(4))], chunks=old_rows, files={("c1", 0): chunk(0, 8)})
        real_write, writes = store_module.write_chunk_crc, []

        def write_chunk(path, data):
            writes.append(path)
            if len(writes) == 2:
                path.with_name(path.name + ".tmp").write_bytes(b"half")
                raise OSError(28, "No space left on device", str(path))
            return real_write(path, data)

        monkeypatch.setattr(store_module, "write_chunk_crc", write_chunk)
        rows = chunk_rows([chunk(10, 4), chunk(11, 8)])
        rows[0].file_bytes, rows[0].crc32 = old_rows[0].file_bytes, old_rows[0].crc32
        with pytest.raises(OSError, match="No space left"):
            store.commit(contexts=[context_row(range(8))], chunks=rows,
                         files={("c1", 0): chunk(10, 4), ("c1", 1): chunk(11, 8)})
        assert not [p.name for p in tmp_path.glob("*/*") if p.name.endswith((".next", ".tmp"))]
        assert (rows[0].file_bytes, rows[0].crc32) == (old_rows[0].file_bytes, old_rows[0].crc32)
        assert store.verify() == []
        [(row, chunks)] = store.load()
        assert row.tokens == list(range(4)) and np.array_equal(store.read(chunks[0]).to_array(), chunk(0, 8).to_array())


def test_a_rename_that_fails_after_the_commit_is_served_from_next_and_finished_later(tmp_path, monkeypatch):
    from workbench.kvcache import store as store_module

    real_move = store_module._move_into_place
    failing = {"on": True}

    def move(src, dst):
        if failing["on"]:
            raise OSError(5, "Input/output error", str(dst))
        real_move(src, dst)

    monkeypatch.setattr(store_module, "_move_into_place", move)
    with SwapStore(tmp_path, META) as store:
        store.add_app("a")
        store.add_context(context_row(range(4)))
        rows = chunk_rows([chunk(0, 8)])
        store.commit(contexts=[context_row(range(4))], chunks=rows, files={("c1", 0): chunk(0, 8)})   # no raise
        assert store.current_path("c1", 0).name == "0.bin.next" and store.verify() == []
        assert np.array_equal(store.read(rows[0]).to_array(), chunk(0, 8).to_array())
        failing["on"] = False
        rows = chunk_rows([chunk(1, 4)])
        store.commit(chunks=rows, files={("c1", 0): chunk(1, 4)})          # retries the pending rename first
        assert store.current_path("c1", 0).name == "0.bin" and not list(tmp_path.glob("*/*.next"))
        assert np.array_equal(store.read(rows[0]).to_array(), chunk(1, 4).to_array()) and store.verify() == []
