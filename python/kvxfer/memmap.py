"""Resolve a host pointer of this process to the shared mapping behind it.

kvxferd is another process: it can only reach the scheduler's KV and aux
buffers through a file both can map. /proc/self/maps says which file (and at
what offset) backs an address; only a MAP_SHARED mapping of a file that still
exists works. Anything else gets a MemoryError that says what kvxfer needs.
"""

import os


class UnsupportedMemory(RuntimeError):
    """A KVArgs buffer kvxferd cannot reach (private, anonymous, unlinked host
    memory; device memory that cannot be exported by CUDA IPC)."""


NEEDS = ("kvxferd, a separate process, must map the same pages: the plug-in allocates SGLang's host "
         "pools (aux metadata, CPU KV and state pools) in shared memory through its allocation hooks, "
         "and this buffer was not allocated through them (a pool class or allocation path the hooks "
         "do not know); otherwise use a shared, file-backed mapping (MAP_SHARED of a file under "
         "/dev/shm). GPU (VRAM) buffers go by CUDA IPC handle (docs/vram.md). To run SGLang's own "
         "NIXL prefill instead, set KVXFER_DISABLE=1")


class Mapping:
    __slots__ = ("start", "end", "perms", "offset", "path")

    def __init__(self, start, end, perms, offset, path):
        self.start, self.end, self.perms, self.offset, self.path = start, end, perms, offset, path


def read_maps(pid="self"):
    out = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.rstrip("\n").split(None, 5)
            if len(parts) < 5:
                continue
            lo, hi = parts[0].split("-")
            path = parts[5].strip() if len(parts) == 6 else ""
            out.append(Mapping(int(lo, 16), int(hi, 16), parts[1], int(parts[2], 16), path))
    out.sort(key=lambda m: m.start)
    return out


def resolve(ptr, length, what="buffer", maps=None):
    """(path, file offset, length) of [ptr, ptr+length), or UnsupportedMemory."""
    if length <= 0:
        raise UnsupportedMemory(f"{what}: length {length}")
    maps = read_maps() if maps is None else maps
    i = next((k for k, m in enumerate(maps) if m.start <= ptr < m.end), None)
    if i is None:
        raise UnsupportedMemory(
            f"{what} at {ptr:#x} (+{length}) is not host memory of this process "
            f"(a GPU pointer?): {NEEDS}")
    m = maps[i]
    kind = _unsupported(m)
    if kind:
        raise UnsupportedMemory(f"{what} at {ptr:#x} (+{length}) is in {kind}: {NEEDS}")
    # The buffer may span adjacent mappings of the same file at contiguous offsets.
    end, j = m.end, i
    while end < ptr + length:
        j += 1
        if j >= len(maps):
            break
        n = maps[j]
        if n.start != end or n.path != m.path or _unsupported(n) or \
                n.offset != m.offset + (n.start - m.start):
            break
        end = n.end
    if end < ptr + length:
        raise UnsupportedMemory(f"{what} at {ptr:#x} (+{length}) runs past its mapping of {m.path}: {NEEDS}")
    return m.path, m.offset + (ptr - m.start), length


def _unsupported(m):
    if not m.path or m.path.startswith("["):
        return "private anonymous memory" if "p" in m.perms else "anonymous shared memory (no file to map)"
    if m.path.endswith(" (deleted)"):
        return f"a mapping of a deleted file ({m.path})"
    if "s" not in m.perms:
        return f"a private (copy-on-write) mapping of {m.path}"
    if not os.path.isabs(m.path):
        return f"a mapping without a file path ({m.path})"
    return None
