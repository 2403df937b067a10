"""What the commands print: text safe for a terminal, hits as a table, which provider and
precision each model runs on, a quantized CE's recorded fidelity."""

from __future__ import annotations

import argparse
import logging
import re
import sys

from crossknn.ce.fidelity import fidelity_record

__all__ = [
    "fidelity_line",
    "plan_text",
    "plural",
    "print_hits",
    "provider_line",
    "query_line",
    "quiet_notes",
    "say_fidelity",
    "say_providers",
    "terminal_safe",
]

# C0 and C1 control characters (ESC, BEL, CSI ...) and DEL; newlines and tabs included: one hit
# is one line. Also the bidirectional controls (U+061C, U+200E/F, U+202A-202E, U+2066-2069: a
# U+202E makes the rest of a line read right to left, so a printed id or score can lie) and lone
# surrogates (undecodable bytes of a command line, which a UTF-8 terminal cannot print)
_CONTROL = re.compile(
    r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)


def terminal_safe(text: str) -> str:
    """``text`` with every control character shown as an escape (``\\x1b``, ``\\u202e``), so a
    hostile corpus cannot move the cursor, clear the screen, retitle the window or reorder what
    is printed after it."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(text))


def fidelity_line(ce) -> str | None:
    """What the export measured for a quantized CE (its manifest's fidelity record), one line;
    None for fp32 (``--verbose``)."""
    precision = ce.precision  # a crossknn.ce.interface.CrossEncoder
    if precision == "fp32":
        return None

    try:
        rec = fidelity_record(ce.model_dir, precision)
    except ValueError as exc:
        return f"# {precision}: {exc}"
    f = rec.get("fidelity")
    if not f:
        return f"# {precision} = {rec['recipe']}: no fidelity measured at export"
    cal = rec.get("calibration", {})
    kept = rec.get("fp32_groups")
    return (
        f"# {precision} = {rec['recipe']} vs fp32 on {cal.get('pairs', '?')} calibration pairs "
        f"({cal.get('queries', '?')} queries): top-10 agreement {f['top10_agreement']:.3f}, "
        f"Spearman on the top candidates {f['spearman_top']:.3f}, max |diff| "
        f"{f['max_abs_diff']:.4f}" + (f"; fp32 groups {', '.join(kept)}" if kept else "")
    )


def say_fidelity(args: argparse.Namespace, ce) -> None:
    """With ``--verbose``: :func:`fidelity_line` on stderr (nothing for fp32)."""
    if args.verbose and (line := fidelity_line(ce)):
        print(terminal_safe(line), file=sys.stderr)


def provider_line(*models) -> str:
    """Which execution provider and precision each model runs on, one line for stderr (with
    ``--provider auto`` the provider is the first whose session opened)."""
    parts = []
    for m in models:
        if m is None or not hasattr(m, "provider"):
            continue
        role = "DE" if getattr(m, "kind", "") == "dual-encoder" else "CE"
        parts.append(f"{role} {getattr(m, 'model_id', '?')} ({m.precision}) on {m.provider}")
    return "# " + "; ".join(parts)


def say_providers(args: argparse.Namespace, *models) -> None:
    """:func:`provider_line` on stderr, unless ``--quiet`` (which also silences the models'
    notes: :func:`quiet_notes`)."""
    if not args.quiet:
        print(terminal_safe(provider_line(*models)), file=sys.stderr)
    quiet_notes(args)


class _NoTruncationNote(logging.Filter):
    """Drops the CE's once-per-scorer note that inputs were truncated to its maximum length
    (``build`` states the maximum length and how many items are longer)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "longer than max_length" not in str(record.msg)


_QUIET = _NoTruncationNote()


def quiet_notes(args: argparse.Namespace | None = None) -> None:
    """With ``--quiet`` (or ``args`` None: always): the models' notes (the truncation note of
    ``crossknn.ce``) are not printed for the rest of the command; errors still are."""
    if args is None or getattr(args, "quiet", False):
        logger = logging.getLogger("crossknn.ce")
        if _QUIET not in logger.filters:
            logger.addFilter(_QUIET)


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """``1 item``, ``2 items``: a count with its noun (``nouns``: an irregular plural)."""
    return f"{n:,} {noun if n == 1 else nouns or noun + 's'}"


def plan_text(plan: dict) -> str:
    """What a search ran, in a few words: ``auto, 30 rounds (10 + 29 x 3 CE calls)``: the
    method, its rounds and the CE calls each round asked for (``Searcher.plan_info``)."""
    sizes = [int(n) for n in plan.get("plan", [])]
    runs: list[list[int]] = []
    for n in sizes:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    steps = " + ".join(f"{c} x {n}" if c > 1 else f"{n}" for n, c in runs)
    rounds = int(plan.get("rounds", len(sizes)))
    return f"{plan['method']}, {plural(rounds, 'round')} ({steps} CE calls)"


def query_line(query: str, qid: str | None = None) -> str:
    """The line that heads a query's hits: ``query [qid] text``."""
    tag = f"[{terminal_safe(qid)}] " if qid is not None else ""
    return f"\nquery {tag}{terminal_safe(query)}"


def print_hits(
    hits, *, texts: bool = True, file=None, width: int = 70, header: bool = True
) -> None:
    """Hits as aligned columns: rank (``*`` = not in the exact top-k), CE score, id, a snippet
    of ``width`` characters (whitespace folded, control characters escaped); each query's
    :func:`query_line` first (``header=False``: the caller printed it)."""
    file = file or sys.stdout
    for h in hits:
        if header:
            print(query_line(h.query, getattr(h, "qid", None)), file=file)
        ids = [terminal_safe(i) for i in h.ids]
        id_width = min(max(map(len, ids), default=2), 32)
        for r, (i, s, t) in enumerate(zip(ids, h.scores, h.texts, strict=False), start=1):
            mark = ""
            if h.exact_ids is not None:
                mark = " " if h.ids[r - 1] in h.exact_ids else "*"
            text = " ".join(t.split())
            text = text if len(text) <= width else text[: width - 3] + "..."
            tail = "  " + terminal_safe(text) if texts else ""
            print(f"  {r:>3}{mark} {s:+9.4f}  {i:<{id_width}}{tail}", file=file)
        ran = f"{plan_text(h.plan)}; " if getattr(h, "plan", None) else ""
        line = (
            f"  {ran}CE calls {h.ce_calls}; time CE {h.seconds_ce:.2f} s, "
            f"other {h.seconds_other:.2f} s"
        )
        if h.recall is not None:
            line += f"; Top-{len(h.exact_ids)}-Recall vs exact CE: {h.recall:.2f}"
            line += " (* = not in the exact top-k)"
        if getattr(h, "allowed", None) is not None:
            line += f"; {h.allowed} items allowed"
            if h.allowed <= len(h.ids):
                line += " (every one of them is here)"
        print(line, file=file)
