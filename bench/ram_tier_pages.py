"""Can a mapped RAM-tier block give its pages back before the model is released?

Maps a file the way the engine maps the RAM tier (shared, read-only), touches every "block"
(a range of the file), then drops them one at a time and prints the process's file-backed and
private resident memory (RssFile, RssAnon) and the page cache's share of the file after each:

- ``madvise(MADV_DONTNEED)`` on the block's range of the map takes its pages out of the process
  (RssFile falls by the block) but leaves them in the page cache;
- ``posix_fadvise(POSIX_FADV_DONTNEED)`` on the same range of the file then drops them from the
  page cache, which works only once no process maps them.

    python bench/ram_tier_pages.py [--blocks 8] [--block-mb 64]
"""

from __future__ import annotations

import argparse
import mmap
import os
import tempfile


def status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def cached(fd: int, size: int) -> int:
    """Bytes of the file in the page cache (mincore on a fresh private map, never touched)."""
    m = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vec = (ctypes.c_ubyte * pages)()
        buf = (ctypes.c_char * size).from_buffer(m)
        rc = libc.mincore(ctypes.c_void_p(ctypes.addressof(buf)), ctypes.c_size_t(size), vec)
        del buf
        if rc != 0:
            raise OSError(ctypes.get_errno(), "mincore")
        return sum(v & 1 for v in vec) * mmap.PAGESIZE
    finally:
        m.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--block-mb", type=int, default=64)
    args = parser.parse_args()
    block = args.block_mb << 20
    size = block * args.blocks
    with tempfile.NamedTemporaryFile(dir=os.getcwd(), suffix=".bin") as f:
        f.write(os.urandom(1 << 20) * (size >> 20))
        f.flush()
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, size, os.POSIX_FADV_DONTNEED)
        m = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)
        mb = 1 << 20
        print(f"start: RssFile {status('RssFile') // mb} MB, RssAnon {status('RssAnon') // mb} MB")
        for b in range(args.blocks):  # touch every page, as the staging copy does
            sum(m[b * block : (b + 1) * block : mmap.PAGESIZE])
        print(
            f"touched {args.blocks} x {args.block_mb} MB: RssFile {status('RssFile') // mb} MB, "
            f"RssAnon {status('RssAnon') // mb} MB, cached {cached(f.fileno(), size) // mb} MB"
        )
        for b in range(args.blocks):
            m.madvise(mmap.MADV_DONTNEED, b * block, block)
            os.posix_fadvise(f.fileno(), b * block, block, os.POSIX_FADV_DONTNEED)
            print(
                f"dropped block {b}: RssFile {status('RssFile') // mb} MB, RssAnon {status('RssAnon') // mb} MB, "
                f"cached {cached(f.fileno(), size) // mb} MB"
            )
        m.close()


if __name__ == "__main__":
    main()
