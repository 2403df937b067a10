"""Pair and single-text assembly from cached token ids, with Hugging Face truncation semantics.

Texts are tokenized once without special tokens (``tokenizers`` fast tokenizer from
``tokenizer.json``; torch and transformers are not needed). The special-token template (e.g.
BERT's ``[CLS] A [SEP] B [SEP]`` with token types 0/1, RoBERTa's ``<s> A </s></s> B </s>``) is read
from the tokenizer's post-processor once. Pairs are then assembled from cached ids with exactly the
``longest_first`` truncation of the Rust ``tokenizers`` library (which the fast Hugging Face
tokenizers use): when ``len(a) + len(b)`` exceeds the room left by the special tokens, the shorter
side is kept whole if it fits in half of the room and the longer takes the rest; otherwise the
longer side gets ``ceil(room / 2)`` and the shorter ``floor(room / 2)`` (on a tie the second side
gets the larger half).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "TokenizerPlan",
    "IdStore",
    "longest_first",
    "assemble_pairs",
    "assemble_single",
    "check_encodable",
    "check_texts",
]


def longest_first(la: np.ndarray, lb: np.ndarray, room: int) -> tuple[np.ndarray, np.ndarray]:
    """Lengths kept of the two sides of each pair (vectorized over pairs)."""
    la = np.asarray(la, dtype=np.int64)
    lb = np.asarray(lb, dtype=np.int64)
    if room < 0:
        raise ValueError(f"max_length leaves no room for the text (room {room})")
    over = la + lb > room
    half = room // 2
    short = np.minimum(la, lb)
    a_longer = la > lb  # on a tie b counts as the longer side
    # shorter side fits in half of the room: it is kept, the longer side takes the rest
    fits = short <= half
    ta = np.where(a_longer, room - lb, la)
    tb = np.where(a_longer, lb, room - la)
    # both sides longer than half: the longer gets ceil(room/2), the shorter floor(room/2)
    ta2 = np.where(a_longer, room - half, half)
    tb2 = room - ta2
    ta = np.where(fits, ta, ta2)
    tb = np.where(fits, tb, tb2)
    return np.where(over, ta, la), np.where(over, tb, lb)


@dataclass(frozen=True)
class _Template:
    prefix: np.ndarray  # special ids before A
    mid: np.ndarray  # between A and B (empty for single)
    suffix: np.ndarray  # after the last segment
    type_prefix: np.ndarray
    type_mid: np.ndarray
    type_suffix: np.ndarray
    type_a: int
    type_b: int

    @property
    def n_special(self) -> int:
        return len(self.prefix) + len(self.mid) + len(self.suffix)


def _split_template(enc, pair: bool) -> _Template:
    seq = enc.sequence_ids
    ids = np.asarray(enc.ids, dtype=np.int64)
    types = np.asarray(enc.type_ids, dtype=np.int64)
    pos_a = [i for i, s in enumerate(seq) if s == 0]
    pos_b = [i for i, s in enumerate(seq) if s == 1]
    if len(pos_a) != 1 or (pair and len(pos_b) != 1):
        raise ValueError(
            "unexpected tokenizer post-processor: cannot read its special-token template"
        )
    a = pos_a[0]
    b = pos_b[0] if pair else a
    empty = np.zeros(0, dtype=np.int64)
    return _Template(
        prefix=ids[:a],
        mid=ids[a + 1 : b] if pair else empty,
        suffix=ids[b + 1 :],
        type_prefix=types[:a],
        type_mid=types[a + 1 : b] if pair else empty,
        type_suffix=types[b + 1 :],
        type_a=int(types[a]),
        type_b=int(types[b]) if pair else 0,
    )


class IdStore:
    """Token ids of many texts in one flat array (CSR), kept up to ``cap`` tokens per text.

    ``lengths`` are the full (untruncated) lengths: truncation of a pair depends on them. (Texts
    tokenized up to a word, :meth:`TokenizerPlan.encode` with ``min_tokens``: a length above
    every bound the truncation compares it with, so that it decides as with the full length.)
    """

    __slots__ = ("flat", "offsets", "lengths", "cap")

    def __init__(self, ids: list[list[int]], cap: int) -> None:
        kept = [min(len(x), cap) for x in ids]
        self.cap = cap
        self.lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
        self.offsets = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(kept, out=self.offsets[1:])
        self.flat = np.empty(int(self.offsets[-1]), dtype=np.int64)
        for i, x in enumerate(ids):
            self.flat[self.offsets[i] : self.offsets[i + 1]] = x[: kept[i]]

    def __len__(self) -> int:
        return len(self.lengths)

    @classmethod
    def concat(cls, stores: list[IdStore]) -> IdStore:
        """One store holding the texts of ``stores`` in order (all of the same ``cap``)."""
        caps = {s.cap for s in stores}
        if len(caps) != 1:
            raise ValueError(f"stores of different caps cannot be joined: {sorted(caps)}")
        out = cls.__new__(cls)
        out.cap = caps.pop()
        out.lengths = np.concatenate([s.lengths for s in stores])
        out.flat = np.concatenate([s.flat for s in stores])
        if all(len(s.lengths) == 1 for s in stores):  # one query each (serve's merged batches)
            sizes = np.fromiter((s.flat.size for s in stores), dtype=np.int64, count=len(stores))
        else:
            sizes = np.concatenate([np.diff(s.offsets) for s in stores])
        out.offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=out.offsets[1:])
        return out

    def get(self, i: int, n: int) -> np.ndarray:
        """The first ``n`` ids of text ``i`` (``n`` <= cap)."""
        start = self.offsets[i]
        return self.flat[start : start + n]


# tokenizers whose ids of a text cut at a plain space are a prefix of the whole text's: the
# pre-tokenizer splits words at spaces; the normalizer maps characters one by one (no merging
# across a space)
_SPACE_SPLITTING = frozenset({"BertPreTokenizer", "Whitespace", "WhitespaceSplit"})
_CHAR_NORMALIZERS = frozenset(
    {"NoneType", "BertNormalizer", "Lowercase", "NFC", "NFD", "NFKC", "NFKD", "StripAccents"}
)


class TokenizerPlan:
    """A fast tokenizer without truncation/padding plus its single and pair templates."""

    def __init__(self, path: str | os.PathLike) -> None:
        # tokenizers: about 10 ms to import, kept off ``import crossknn``
        from tokenizers import Tokenizer

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"missing file {path}")
        tok = Tokenizer.from_file(str(path))
        # what the ids depend on besides the texts (crossknn.ce.token_cache's key)
        self.digest = hashlib.sha256(path.read_bytes()).hexdigest()
        tok.no_truncation()
        tok.no_padding()
        self._tok = tok
        # the same ids without the character offsets nothing here reads (tokenizers >= 0.20;
        # 10% faster on SciFact abstracts); older releases: encode_batch
        self._batch = getattr(tok, "encode_batch_fast", tok.encode_batch)
        probe = tok.encode("a", add_special_tokens=False)
        if len(probe.ids) != 1:
            raise ValueError(
                f"{path}: unexpected tokenizer (the probe 'a' gave {len(probe.ids)} ids)"
            )
        # (Tokenizer.post_process loses the sequence ids of the first segment: encode the probe)
        self.single = _split_template(tok.encode("a", add_special_tokens=True), False)
        self.pair = _split_template(tok.encode("a", "a", add_special_tokens=True), True)
        pad = tok.token_to_id("[PAD]")
        if pad is None:
            pad = tok.token_to_id("<pad>")
        self.pad_id = int(pad) if pad is not None else 0
        # the ids of a text cut at a plain space are a prefix of the whole text's ids when the
        # pre-tokenizer splits words at spaces and the normalizer works character by character
        self.prefix_safe = (
            type(tok.pre_tokenizer).__name__ in _SPACE_SPLITTING
            and type(tok.normalizer).__name__ in _CHAR_NORMALIZERS
        )

    def encode(self, texts: list[str], min_tokens: int | None = None) -> list[list[int]]:
        """Token ids of each text, without special tokens and without truncation.

        ``min_tokens``: only the ids a truncation to fewer tokens can keep or compare are needed.
        A text of more than ``min_tokens`` space-separated words is then tokenized up to that
        word: its ids are a prefix of the whole text's (:attr:`prefix_safe` tokenizers only),
        at least ``min_tokens`` of them (each word gives one or more; where one did not, the
        whole text is tokenized), so the first ``min_tokens`` ids are the same and the length
        exceeds any bound below ``min_tokens``. A long document costs its first words, not its
        whole length."""
        if not texts:
            return []
        check_encodable(texts, "text")  # a single query (rank, score) comes here unchecked
        if min_tokens is None or not self.prefix_safe:
            return [e.ids for e in self._batch(texts, add_special_tokens=False)]
        cut, parts = [], []
        for t in texts:
            words = t.split(" ", min_tokens)
            if len(words) > min_tokens:  # cut before the space after word min_tokens
                parts.append(len(cut))
                t = t[: len(t) - len(words[-1]) - 1]
            cut.append(t)
        ids = [e.ids for e in self._batch(cut, add_special_tokens=False)]
        short = [i for i in parts if len(ids[i]) < min_tokens]  # empty words: the whole text
        if short:
            whole = self._batch([texts[i] for i in short], add_special_tokens=False)
            for i, e in zip(short, whole, strict=True):
                ids[i] = e.ids
        return ids


def _blank(lengths: np.ndarray, pad_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Input ids (all padding), token types and attention mask (zeros), padded to the longest."""
    shape = (len(lengths), int(lengths.max()))
    return (
        np.full(shape, pad_id, dtype=np.int64),
        np.zeros(shape, dtype=np.int64),
        np.zeros(shape, dtype=np.int64),
    )


def assemble_pairs(
    t: _Template, pad_id: int, A: IdStore, ia, ta, B: IdStore, ib, tb
) -> dict[str, np.ndarray]:
    """Model inputs of one batch of pairs (A[ia[r]] kept to ta[r] tokens, B[ib[r]] to tb[r]).

    Padded to the longest pair of the batch. ``pool_mask`` is 1 on the first segment's tokens,
    2 on the second's, 0 on special tokens and padding (the joint CE pools with it).
    """
    ids, types, mask = _blank(np.asarray(ta) + np.asarray(tb) + t.n_special, pad_id)
    n = len(ia)
    pool = np.zeros_like(mask)
    p, mid, suf = len(t.prefix), len(t.mid), len(t.suffix)
    for r in range(n):
        na, nb = int(ta[r]), int(tb[r])
        row, trow, prow = ids[r], types[r], pool[r]
        row[:p] = t.prefix
        trow[:p] = t.type_prefix
        s = p
        row[s : s + na] = A.get(ia[r], na)
        trow[s : s + na] = t.type_a
        prow[s : s + na] = 1
        s += na
        row[s : s + mid] = t.mid
        trow[s : s + mid] = t.type_mid
        s += mid
        row[s : s + nb] = B.get(ib[r], nb)
        trow[s : s + nb] = t.type_b
        prow[s : s + nb] = 2
        s += nb
        row[s : s + suf] = t.suffix
        trow[s : s + suf] = t.type_suffix
        mask[r, : s + suf] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types, "pool_mask": pool}


def assemble_single(t: _Template, pad_id: int, A: IdStore, ia, ta) -> dict[str, np.ndarray]:
    """Model inputs of one batch of single texts (A[ia[r]] kept to ta[r] tokens)."""
    ids, types, mask = _blank(np.asarray(ta) + t.n_special, pad_id)
    n = len(ia)
    p, suf = len(t.prefix), len(t.suffix)
    for r in range(n):
        na = int(ta[r])
        ids[r, :p] = t.prefix
        types[r, :p] = t.type_prefix
        ids[r, p : p + na] = A.get(ia[r], na)
        types[r, p : p + na] = t.type_a
        ids[r, p + na : p + na + suf] = t.suffix
        types[r, p + na : p + na + suf] = t.type_suffix
        mask[r, : p + na + suf] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def check_encodable(texts: list[str], what: str) -> None:
    """ValueError naming the first text that is not valid Unicode (a lone surrogate: an
    undecodable byte of a command line, kept by Python as U+DC80-U+DCFF, or ``"\\ud800"``
    in JSON), its position in the list and the character's; the tokenizer cannot take it."""
    for i, t in enumerate(texts):
        if t.isascii():
            continue
        try:
            t.encode("utf-8")
        except UnicodeEncodeError as exc:
            c = ord(t[exc.start])
            kind = (
                f"undecodable byte 0x{c - 0xDC00:02x}"
                if 0xDC80 <= c <= 0xDCFF
                else f"a lone surrogate U+{c:04X}"
            )
            where = f"{what}[{i}]" if len(texts) > 1 or what.endswith("s") else what
            shown = t if len(t) <= 40 else t[:37] + "..."
            raise ValueError(
                f"{where} is not valid UTF-8 text: {kind} at character {exc.start} of "
                f"{ascii(shown)}"
            ) from None


def check_texts(texts, what: str) -> list[str]:
    """A list of strings, or TypeError naming the first bad entry (ValueError for a string
    that is not valid Unicode: see :func:`check_encodable`)."""
    if isinstance(texts, (str, bytes)):
        raise TypeError(f"{what} must be a list of strings, got a single {type(texts).__name__}")
    try:
        texts = list(texts)
    except TypeError:
        raise TypeError(f"{what} must be a list of strings, got {type(texts).__name__}") from None
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(
                f"{what} must be a list of strings; got {type(t).__name__} at position {i}"
            )
    check_encodable(texts, what)
    return texts
