"""The optional disk tier: one file per KV block in a directory, LRU, bounded in bytes.

File layout (little-endian)::

    magic b"JPKVBLK2" | format tag (32) | key length (u8) | key | salt length (u32) | salt (UTF-8)
        | sha256 of salt + payload (32) | payload

The salt is the block chain's cache salt (empty: none), read only by a
tenant's reset (:meth:`DiskKVCache.drop_namespace`), which deletes the files in
its namespace; a lookup needs no salt, the key already commits to it.

The format tag commits to the pool's dtype and block shape and to the engine's
identity (model config, weights fingerprint, block size, KV dtype, fp8 scales,
hash function), so a block written by another model, other weights or under
other scales is a miss. On load the key
and the payload digest are checked; a missing, truncated or corrupt file is a
miss (and is deleted), never wrong data. Files survive the process: block
hashes are deterministic, so a later engine with the same format reuses them.

Faults: a write that fails (read-only or vanished directory, full disk) logs
one warning, is counted in `num_write_errors`, and disables the tier (every
later store and load is a no-op miss) so serving continues without it. Several
engines, in several processes, may share one directory: each writes through a
temporary file of its own (pid + random suffix) renamed atomically into place,
and a file another engine deleted is a miss.

KV events (:meth:`DiskKVCache.attach_events`): the tier holds the block files
it indexes while it is usable (format tag set, not disabled). A file written
is a disk ``BlockStored``; one deleted (capacity, or found vanished or corrupt
on load) a disk ``BlockRemoved``; disabling the tier an ``AllBlocksCleared``.
Files written or deleted by other engines sharing the directory are seen only
when this engine next touches them. A block's parent hash is known for files
this process wrote (files carry no parent), its tokens only in the event that
announces the write.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import os
import uuid
from pathlib import Path

import numpy as np

from jaxpaged.cache.events import (
    DISK_TIER,
    AllBlocksCleared,
    KVEventLog,
    stored_in_chain_order,
)
from jaxpaged.cache.namespaces import Namespace, salt_in_namespace

logger = logging.getLogger(__name__)

_MAGIC = b"JPKVBLK2"
_SUFFIX = ".kvblk"
_TAG_END = len(_MAGIC) + 32  # the format tag's end; the key's length byte follows


def format_tag(dtype: np.dtype, block_shape: tuple[int, ...], identity: bytes) -> bytes:
    """32-byte digest of everything a block's bytes depend on besides its tokens.

    `identity` is the engine's identity digest (`jaxpaged.snapshot.identity_digest`).
    """
    text = f"{np.dtype(dtype).name}|{tuple(block_shape)}|".encode()
    return hashlib.sha256(text + identity).digest()


class DiskKVCache:
    """Block files under ``directory``, at most ``capacity_bytes`` of them, least recently used deleted first."""

    def __init__(self, directory: str | os.PathLike, capacity_bytes: int, block_bytes: int,
                 dtype: np.dtype, block_shape: tuple[int, ...]) -> None:
        if capacity_bytes < block_bytes:
            raise ValueError(f"disk_cache_bytes={capacity_bytes} is smaller than one KV block "
                             f"({block_bytes} bytes)")
        self.directory = Path(directory)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ValueError(f"disk_cache_dir {str(directory)!r} cannot be created: {err}") from None
        self.capacity_bytes = capacity_bytes
        self.dtype = np.dtype(dtype)
        self.block_shape = tuple(block_shape)
        self._tag: bytes | None = None  # unset (e.g. before fp8 calibration): every lookup misses
        self._events: KVEventLog | None = None
        self._block_size = 0  # tokens per block, for events
        self._parents: dict[bytes, bytes] = {}  # parent hash of indexed files this process wrote (for events)
        self._salts: dict[bytes, str | None] = {}  # cache salt of indexed files written or read (namespaces)
        self.num_corrupt = 0
        self.num_vanished = 0  # indexed files gone when read (another engine evicted them)
        self.num_write_errors = 0
        self.disabled = False  # set by the first failed write
        self._sizes: collections.OrderedDict[bytes, int] = collections.OrderedDict()
        self.used_bytes = 0  # bytes of the block files indexed
        for block_hash, size in self._existing_files():  # oldest first: the LRU order survives a restart
            self._add(block_hash, size)
        self._shrink()

    def _existing_files(self) -> list[tuple[bytes, int]]:
        """(hash, size) of the block files in the directory, oldest first; files vanishing meanwhile skipped."""
        found = []
        for path in self.directory.glob(f"*{_SUFFIX}"):
            try:
                block_hash = bytes.fromhex(path.stem)
                info = path.stat()
            except (ValueError, OSError):  # not one of ours, or deleted by another engine just now
                continue
            found.append((info.st_mtime, block_hash, info.st_size))
        return [(block_hash, size) for _, block_hash, size in sorted(found)]

    def __len__(self) -> int:
        return len(self._sizes)

    def __contains__(self, block_hash: bytes) -> bool:
        """Whether a file for ``block_hash`` is indexed (it is checked only when loaded)."""
        return self.usable and block_hash in self._sizes

    @property
    def tag(self) -> bytes | None:
        """The format tag files must carry (``format_tag``); None: every lookup misses."""
        return self._tag

    @tag.setter
    def tag(self, tag: bytes | None) -> None:
        was_usable = self.usable
        self._tag = tag
        if self._events is None or was_usable == self.usable:
            return
        if self.usable:
            self._announce_contents(self._events)
        else:
            self._events.append(AllBlocksCleared(DISK_TIER))

    @property
    def usable(self) -> bool:
        """Whether lookups can hit: the format tag is set and no write has failed."""
        return self._tag is not None and not self.disabled

    def cached_hashes(self) -> list[bytes]:
        """The hashes of the blocks this tier holds (its indexed files), least recently used first; none
        while it is not :attr:`usable`."""
        return list(self._sizes) if self.usable else []

    def attach_events(self, log: KVEventLog | None, block_size: int) -> None:
        """Record this tier's events in ``log`` from now on (None: stop), starting with every block it holds."""
        self._events, self._block_size = log, block_size
        if log is not None and self.usable:
            self._announce_contents(log)

    def _announce_contents(self, log: KVEventLog) -> None:
        entries = [(h, self._parents.get(h), None) for h in self._sizes]
        for event in stored_in_chain_order(entries, self._block_size, DISK_TIER,
                                           include_token_ids=log.include_token_ids):
            log.append(event)

    def _path(self, block_hash: bytes) -> Path:
        return self.directory / f"{block_hash.hex()}{_SUFFIX}"

    def store(self, block_hash: bytes, data: np.ndarray, parent_hash: bytes | None = None,
              token_ids: tuple[int, ...] | None = None, cache_salt: str | None = None) -> None:
        """Write one block (atomically: temp file then rename), evicting old files beyond capacity.

        ``parent_hash`` and ``token_ids`` (the block's hash inputs, when known) go only into KV events;
        ``cache_salt`` (its chain's) into the file, for :meth:`drop_namespace`.
        """
        if not self.usable or block_hash in self._sizes:
            return
        payload = np.ascontiguousarray(data, self.dtype).tobytes()
        salt = (cache_salt or "").encode("utf-8", "surrogatepass")
        blob = b"".join([_MAGIC, self.tag, bytes([len(block_hash)]), block_hash, len(salt).to_bytes(4, "little"),
                         salt, hashlib.sha256(salt + payload).digest(), payload])
        path = self._path(block_hash)
        tmp = path.with_name(f"{path.name}.{os.getpid()}-{uuid.uuid4().hex[:12]}.tmp")
        try:
            tmp.write_bytes(blob)
            os.replace(tmp, path)
        except OSError as err:
            self._disable(err)
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
            return
        self._add(block_hash, len(blob))
        self._salts[block_hash] = cache_salt or None
        if parent_hash is not None:
            self._parents[block_hash] = parent_hash
        if self._events is not None:
            self._events.store(block_hash, parent_hash, token_ids, self._block_size, DISK_TIER)
        self._shrink()

    def load(self, block_hash: bytes) -> np.ndarray | None:
        """The block's data if its file exists and checks out; otherwise None (a bad file is deleted)."""
        if not self.usable or block_hash not in self._sizes:
            return None
        try:
            blob = self._path(block_hash).read_bytes()
        except OSError:  # deleted by another engine sharing the directory (or unreadable): a miss
            self.num_vanished += 1
            self._drop(block_hash)
            return None
        data = self._parse(block_hash, blob)
        if data is None:
            self.num_corrupt += 1
            self._drop(block_hash)
            return None
        self._sizes.move_to_end(block_hash)
        return data

    def salt_of(self, block_hash: bytes) -> str | None:
        """The cache salt of an indexed block's file (None: none, or unknown because unreadable)."""
        return self._salts.get(block_hash)

    def drop_namespace(self, namespace: Namespace) -> int:
        """Delete the indexed block files whose salt is in ``namespace`` (a tenant's reset), whatever their
        format tag; returns how many. The salts of files indexed at start are read from their headers once."""
        for block_hash in self._sizes:
            if block_hash not in self._salts:
                self._salts[block_hash] = self._read_salt(block_hash)
        doomed = [h for h in self._sizes if salt_in_namespace(self._salts[h], namespace)]
        for block_hash in doomed:
            self._drop(block_hash)
        return len(doomed)

    def _read_salt(self, block_hash: bytes) -> str | None:
        """The salt in an indexed file's header (None: none, or the file is not a readable one of ours)."""
        try:
            with open(self._path(block_hash), "rb") as f:
                head = f.read(_TAG_END + 1)
                if len(head) < _TAG_END + 1 or head[:len(_MAGIC)] != _MAGIC:
                    return None
                f.seek(head[-1], os.SEEK_CUR)  # past the key
                salt = f.read(int.from_bytes(f.read(4), "little"))
            return salt.decode("utf-8", "surrogatepass") or None
        except (OSError, UnicodeDecodeError):
            return None

    def _parse(self, block_hash: bytes, blob: bytes) -> np.ndarray | None:
        head = _TAG_END
        if blob[:len(_MAGIC)] != _MAGIC or blob[len(_MAGIC):head] != self.tag or len(blob) <= head:
            return None
        key_len = blob[head]
        key_end = head + 1 + key_len
        if blob[head + 1:key_end] != block_hash:
            return None
        salt_end = key_end + 4 + int.from_bytes(blob[key_end:key_end + 4], "little")
        salt, digest, payload = blob[key_end + 4:salt_end], blob[salt_end:salt_end + 32], blob[salt_end + 32:]
        expected = int(np.prod(self.block_shape)) * self.dtype.itemsize
        if len(payload) != expected or hashlib.sha256(salt + payload).digest() != digest:
            return None
        try:
            salt = salt.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            return None
        self._salts[block_hash] = salt or None
        return np.frombuffer(payload, self.dtype).reshape(self.block_shape).copy()

    def _add(self, block_hash: bytes, size: int) -> None:
        self._sizes[block_hash] = size
        self.used_bytes += size

    def _disable(self, err: OSError) -> None:
        self.num_write_errors += 1
        if not self.disabled:
            logger.warning("disk KV tier %s disabled after a failed write (%s); serving continues without it",
                           self.directory, err)
            if self._events is not None and self.usable:
                self._events.append(AllBlocksCleared(DISK_TIER))
        self.disabled = True

    def _drop(self, block_hash: bytes) -> None:
        self.used_bytes -= self._sizes.pop(block_hash, 0)
        self._parents.pop(block_hash, None)
        self._salts.pop(block_hash, None)
        if self._events is not None and self.usable:
            self._events.remove(block_hash, DISK_TIER)
        try:
            self._path(block_hash).unlink(missing_ok=True)
        except OSError:
            pass  # a read-only or vanished directory: the index no longer lists it, which is what matters

    def _shrink(self) -> None:
        while self.used_bytes > self.capacity_bytes and self._sizes:
            self._drop(next(iter(self._sizes)))
