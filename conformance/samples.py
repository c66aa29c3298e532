"""Inputs the checks use: hostile ids, prefix traps, near-identical ids, sized values.

Each list is chosen to catch a known way stores go wrong: path traversal and
separators in file or object names, glob and LIKE wildcards, Redis hash-tag
braces, NUL in C strings, case-insensitive or padding collations, Unicode
normalization, surrogate-pair handling of astral characters.
"""

from __future__ import annotations

import hashlib
from typing import Final

__all__ = [
    "HOSTILE_IDS",
    "NEAR_IDENTICAL_IDS",
    "PREFIX_TRAPS",
    "SORT_SAMPLE",
    "WILDCARDS",
    "id_of_bytes",
    "pattern_bytes",
]

# Characters that mean something to LIKE, glob, fnmatch, regex, Redis, paths or keys.
WILDCARDS: Final = ("%", "_", "*", "?", "[", "\\", ":", "{}", "{", "}", "]", "^", ".", "/")

# Ids and keys that must round-trip unchanged and never collide with each other.
HOSTILE_IDS: Final[tuple[str, ...]] = (
    "../",
    "../../etc/passwd",
    "..",
    ".",
    "a/b",
    "a\\b",
    "/abs",
    "\x00",
    "a\x00b",
    "trailing\x00",
    "{",
    "}",
    "{tag}",
    "{}",
    "*",
    "?",
    "[a-z]",
    "%",
    "%00",
    "%2e%2e%2f",
    "_",
    ":",
    "::",
    " ",
    " lead",
    "trail ",
    "tab\there",
    "new\nline",
    "CON",
    "nul",
    "COM1.txt",
    "quote'\"`",
    "semi;colon",
    "$dollar",
    "dollar.$sign",
    "null\u0000mid",
    "\u200bzero-width",
    "\u202eright-to-left",
    "\ufeffbom",
    "\U0001f600",
    "\U0010fffd",
    "\U0010ffff",
    "e\u0301",
    "\u00e9",
    "\u65e5\u672c\u8a9e",
    "\x7f",
    "~user",
    "+plus",
    "a b+c",
)

# Pairs that some stores merge (case folding, NFC/NFD, padding, width): all distinct.
NEAR_IDENTICAL_IDS: Final[tuple[str, ...]] = (
    "k",
    "K",
    "k ",
    "k  ",
    " k",
    "k\x00",
    "k\t",
    "\u00e9",  # é precomposed (NFC)
    "e\u0301",  # é decomposed (NFD)
    "\u00c9",  # É
    "\uff4b",  # fullwidth k
    "\u212a",  # Kelvin sign (folds to k)
    "ss",
    "\u00df",  # ß (folds to ss)
    "i",
    "\u0131",  # dotless i
    "\U0001d55c",  # mathematical double-struck k (NFKC folds to k)
)

# (prefix, keys that start with it, keys that do not). A LIKE, glob or regex
# built from the prefix without escaping matches some of the "not" keys.
PREFIX_TRAPS: Final[tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...]] = (
    ("p%", ("p%", "p%z", "p%%"), ("pz", "p", "pa%", "q%")),
    ("p_", ("p_", "p_z", "p__"), ("pz", "pa", "p", "pz_")),
    ("p*", ("p*", "p*z"), ("pz", "p", "pa*")),
    ("p?", ("p?", "p?z"), ("pz", "pa", "p")),
    ("p[", ("p[", "p[a]", "p[z"), ("pa", "p", "p]")),
    ("p[a]", ("p[a]", "p[a]z"), ("pa", "pa]", "p[b]")),
    ("p\\", ("p\\", "p\\z", "p\\\\"), ("pz", "p", "p/")),
    ("p\\%", ("p\\%", "p\\%z"), ("p%", "p\\z", "p\\")),
    ("p:", ("p:", "p:z", "p::"), ("pz", "p", "p;")),
    ("p{}", ("p{}", "p{}z"), ("p{", "pz", "p{x}")),
    ("p{", ("p{", "p{x}", "p{}"), ("p}", "pz")),
    ("p}", ("p}", "p}z"), ("p{", "pz")),
    ("p.", ("p.", "p.z"), ("pz", "p")),
    ("p^", ("p^", "p^z"), ("pz", "p")),
    ("p$", ("p$", "p$z"), ("pz", "p")),
    ("p", ("p", "p%", "pz", "p\U0001f600"), ("P", "P%", "q", "o\U0010ffff")),
    ("P", ("P", "Pz"), ("p", "pz")),
    ("p ", ("p ", "p z"), ("p", "pz")),
    ("p\x00", ("p\x00", "p\x00z"), ("p", "pz", "p\x01")),
    ("\U0001f600", ("\U0001f600", "\U0001f600z"), ("\U0001f601", "\ufffd", "\uffff")),
    ("\U0010ffff", ("\U0010ffff", "\U0010ffffz"), ("\U0010fffe", "\U0010fffez")),
    ("\u00e9", ("\u00e9", "\u00e9z"), ("e\u0301", "e", "\u00c9")),
)

# Keys whose Python (= UTF-8 byte) order differs from UTF-16, collation or case order.
SORT_SAMPLE: Final[tuple[str, ...]] = (
    "A",
    "B",
    "Z",
    "_",
    "a",
    "b",
    "z",
    "~",
    "\x00",
    "\x01",
    "\x7f",
    "\u00e9",
    "\u00ff",
    "\u0100",
    "\ufb01",
    "\uff61",
    "\uffff",
    "\U00010000",
    "\U0001f600",
    "\U0010ffff",
    "a\x00",
    "a\x00b",
    "ab",
    "a b",
    "a-b",
    "a.b",
    "a/b",
    "a:b",
    "a;b",
    "10",
    "9",
    "09",
    "checkpoint:r:10:pre_llm",
    "checkpoint:r:9:pre_llm",
    "checkpoint:r:latest",
)


def id_of_bytes(size: int, seed: str = "") -> str:
    """A string of exactly ``size`` UTF-8 bytes mixing 1-, 2-, 3- and 4-byte characters.

    Unique per ``seed`` (its hash leads), so two long ids never share a prefix.
    """
    if size < 1:
        raise ValueError("size must be at least 1")
    head = hashlib.sha256(seed.encode("utf-8")).hexdigest()[:16]
    parts: list[str] = []
    used = 0
    cycle = ("a", "\u00e9", "\u65e5", "\U0001f600", "/", "\x00", "%", "{")
    for ch in head:
        if used + 1 > size:
            break
        parts.append(ch)
        used += 1
    i = 0
    while used < size:
        ch = cycle[i % len(cycle)]
        width = len(ch.encode("utf-8"))
        if used + width > size:
            ch, width = "z", 1
        parts.append(ch)
        used += width
        i += 1
    text = "".join(parts)
    assert len(text.encode("utf-8")) == size
    return text


def pattern_bytes(size: int, seed: int = 0) -> bytes:
    """``size`` deterministic bytes covering every byte value (cheap to build at 8 MiB)."""
    block = bytes((i * 167 + seed * 31 + (i >> 8)) & 0xFF for i in range(65536))
    digest = hashlib.sha256(str(seed).encode()).digest()
    whole, rest = divmod(size, len(block))
    data = bytearray(block * whole + block[:rest])
    # Make each value distinct at the start and end, where truncation would show.
    for i, b in enumerate(digest):
        if i < size:
            data[i] = b
        if size - 1 - i >= 0:
            data[size - 1 - i] = b
    return bytes(data)
