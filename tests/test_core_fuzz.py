"""Bounded, seeded fuzz test of crossknn.core and the bindings under it (issue 10).

Random shapes (0 and 1 included), dtypes (float64/float32/float16/int/bool/object/complex/str),
values (nan, inf, huge, denormal, float16 edge), exclusion lists (duplicates, out of range,
negative, -1 padding, ragged, wrong count), storage types and scalar parameters of every type.
Every call must either return a well-formed result (shapes, dtypes, ids in range and distinct,
excluded ids never returned, sorted scores/keys, top-k equal to a float64 numpy top-k within the
kernel's error) or raise ValueError, TypeError or IndexError: never another exception, never a
pybind11 "incompatible function arguments" dump, never a crash. The cases run in a subprocess, so
a segfault or abort fails the test with the seed of the case that caused it.

Run one case by hand: python tests/test_core_fuzz.py --seed SEED --cases 1
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import traceback
import warnings

import numpy as np

ALLOWED = (ValueError, TypeError, IndexError)
BASE_SEED = int(os.environ.get("CROSSKNN_FUZZ_SEED", "20240610"))
SECONDS = float(os.environ.get("CROSSKNN_FUZZ_SECONDS", "16"))


class CaseFailure(AssertionError):
    pass


def _pick(rng, options):
    """One of `options` as it is (rng.choice would make an array of mixed types)."""
    return options[int(rng.integers(len(options)))]


def _check(cond, what):
    if not cond:
        raise CaseFailure(what)


# --------------------------------------------------------------------------------- generators
SPECIAL = [np.nan, np.inf, -np.inf, 1e38, 3.4e38, -3e38, 1e39, 1e300, 1e-40, -5e-324, 0.0,
           65504.0, 65519.0, 65520.0, -7e4, 1e5]  # fmt: skip


def _values(rng, shape):
    mode = rng.integers(0, 6)
    if mode == 0:
        a = rng.standard_normal(shape)
    elif mode == 1:
        a = rng.integers(-3, 4, shape).astype(np.float64)  # ties
    elif mode == 2:
        a = rng.standard_normal(shape) * 10.0 ** rng.integers(-320, 309)
    elif mode == 3:
        a = np.zeros(shape)
    else:
        a = rng.standard_normal(shape)
        if a.size:
            m = rng.integers(1, min(a.size, 4) + 1)
            a.flat[rng.choice(a.size, m, replace=False)] = rng.choice(SPECIAL, m)
    return a


def _as_dtype(rng, a):
    kind = _pick(rng, ["f64", "f64", "f64", "f32", "f16", "int", "bool", "object", "complex",
                       "str", "list"])  # fmt: skip
    with np.errstate(all="ignore"):
        if kind == "f64":
            return a
        if kind == "f32":
            return a.astype(np.float32)
        if kind == "f16":
            return a.astype(np.float16)
        if kind == "int":
            return np.nan_to_num(a, posinf=1e9, neginf=-1e9).clip(-1e9, 1e9).astype(np.int64)
        if kind == "bool":
            return a > 0
        if kind == "object":
            return a.astype(object)
        if kind == "complex":
            return a.astype(np.complex128)
        if kind == "str":
            return a.astype(str)
        return a.tolist()


def _ids(rng, n, m, *, padding):
    lo = -3 if padding else -2
    a = rng.integers(lo, n + 3, m)
    if m and rng.random() < 0.7:  # mostly valid ids, with duplicates
        a = rng.integers(0, max(n, 1), m) if n else a
    if padding and m and rng.random() < 0.3:
        a[rng.integers(0, m)] = -1
    form = rng.integers(0, 8)
    if form == 0:
        return a.tolist()
    if form == 1:
        return a.astype(np.int32)
    if form == 2:
        return a.astype(np.uint64) if (a >= 0).all() else a
    if form == 3:
        return a.astype(np.float64)
    if form == 4:
        return [int(x) for x in a] + [_pick(rng, [2**63, 2**64, -(2**63) - 1, 2**70])]
    return a


def _exclude(rng, n, Q):
    """None, a single list, or a batch form (list of arrays / (Q, m) array / wrong count)."""
    r = rng.random()
    if r < 0.25:
        return None
    if Q is None or r < 0.4:
        return _ids(rng, n, int(rng.integers(0, 6)), padding=True)
    q = Q if rng.random() < 0.85 else Q + int(_pick(rng, [-1, 1]))
    if rng.random() < 0.5:
        return [
            np.asarray(_ids(rng, n, int(rng.integers(0, 5)), padding=True))
            for _ in range(max(q, 0))
        ]
    m = int(rng.integers(0, 5))
    return rng.integers(-1, n + (1 if rng.random() < 0.2 else 0), (max(q, 0), m)) if n else None


def _int_param(rng, good):
    return _pick(
        rng,
        [good, good, good, 0, 1, -1, 2**31, 2**63, 2**64, 1.0, True, "2", np.int64(good), None],
    )


def _k(rng, n):
    if rng.random() < 0.75:
        return int(rng.integers(0, n + 1)) if n else 0
    return _int_param(rng, n + 1)


def _excluded_sets(exclude, Q):
    """The set of ids excluded per query row (for results that were accepted)."""
    if exclude is None:
        return [set() for _ in range(Q)]
    if Q == 1 and not (
        isinstance(exclude, np.ndarray)
        and exclude.ndim == 2
        or isinstance(exclude, list)
        and len(exclude)
        and np.ndim(exclude[0]) >= 1
    ):
        return [{int(x) for x in np.asarray(exclude, dtype=object).ravel()}]
    return [{int(x) for x in np.asarray(row).ravel()} for row in exclude]


# ----------------------------------------------------------------------------- result checks
def _check_ids(idx, n, k, excluded):
    _check(idx.dtype == np.int64, f"ids dtype {idx.dtype}")
    for q, row in enumerate(idx.reshape(-1, k) if k else idx.reshape(len(excluded), 0)):
        _check(((row >= 0) & (row < n)).all(), f"ids out of range: {row}")
        _check(len(set(row.tolist())) == len(row), f"duplicate ids: {row}")
        _check(not (set(row.tolist()) & excluded[q]), f"excluded id returned: {row}")


def _check_topk(f, U, k, s, idx, excluded):
    V = f.rows(np.arange(f.n_items))
    vmax = np.abs(V).max()
    for q in range(U.shape[0]):
        u = U[q].astype(np.float64)
        e = int(np.frexp(np.abs(u).max())[1]) if u.size else 0
        un = np.ldexp(u, -e)
        sc = V @ un  # in units of 2^e
        tol = 2e-4 * vmax * np.abs(un).sum() + 1e-300
        chosen = idx[q]
        rest = np.ones(f.n_items, bool)
        rest[chosen] = False
        rest[[i for i in excluded[q] if 0 <= i < f.n_items]] = False
        if chosen.size and rest.any():
            _check(sc[chosen].min() >= sc[rest].max() - tol, f"not the top-{k} (query {q})")
        if len(chosen) > 1:
            _check(np.all(np.diff(sc[chosen]) <= tol), f"not sorted by score (query {q})")
        _check(not np.isnan(s[q]).any(), "NaN score")
        _check(np.all(s[q][:-1] >= s[q][1:]), "scores not non-increasing")


def _run_features_ops(rng, f, V32, log):
    n, d = f.n_items, f.dim
    for _ in range(int(rng.integers(1, 7))):
        op = rng.integers(0, 6)
        single = rng.random() < 0.5
        Q = None if single else int(_pick(rng, [0, 1, 2, 3]))
        shape = (d,) if single else (Q, d)
        if rng.random() < 0.1:
            shape = (d + 1,) if single else (Q, max(d - 1, 0))
        u = _as_dtype(rng, _values(rng, shape)) if rng.random() < 0.3 else _values(rng, shape)
        if rng.random() < 0.5 and not isinstance(u, list):
            u = np.nan_to_num(np.asarray(u, dtype=np.float64), nan=0.0, posinf=1.0, neginf=-1.0)
        k = _k(rng, n)
        exclude = _exclude(rng, n, Q)
        log(f"op {op} single={single} Q={Q} k={k!r}")
        try:
            if op in (0, 1):
                s, idx = f.top_k(u, k, exclude=exclude)
                Uq = np.asarray(u, dtype=np.float64).reshape(-1, d)
                ex = _excluded_sets(exclude, Uq.shape[0])
                _check(s.dtype == np.float32, "scores dtype")
                _check(idx.shape == ((k,) if single else (Uq.shape[0], k)), f"shape {idx.shape}")
                _check_ids(idx, n, k, ex)
                _check_topk(f, Uq, k, s.reshape(-1, k), idx.reshape(-1, k), ex)
            elif op == 2:
                T = _pick(rng, [1.0, 0.5, 1e-6, 1e-40, 1e-300, 5e-324, 1e300, 0.0, -1.0, np.nan,
                                np.inf, "1", 10**400, np.float32(2)])  # fmt: skip
                seed = _pick(rng, [0, 7, -1, 2**64 - 1, 2**64, 1.5, np.uint64(5)])
                keys, idx = f.sample_softmax(u, k, exclude=exclude, temperature=T, seed=seed)
                Qn = np.asarray(u).reshape(-1, d).shape[0]
                ex = _excluded_sets(exclude, Qn)
                _check(keys.dtype == np.float32 and keys.shape == idx.shape, "keys")
                _check(idx.shape == ((k,) if single else (Qn, k)), f"shape {idx.shape}")
                _check_ids(idx, n, k, ex)
                _check(np.isfinite(keys).all(), f"keys not finite: {keys}")
                _check(np.all(np.diff(keys.reshape(-1, k), axis=1) <= 0), "keys not sorted")
            elif op == 3:
                seed = _pick(rng, [0, 3, -5, 2**64 - 1, 2**64, "1"])
                nq = None if rng.random() < 0.6 else _int_param(rng, 2)
                exr = _exclude(rng, n, None if nq is None and rng.random() < 0.5 else 2)
                out = f.sample_random(k, exclude=exr, seed=seed, n_queries=nq)
                rows = out.reshape(-1, k) if k else out.reshape(-1, 0) if out.ndim == 2 else None
                Qr = 1 if out.ndim == 1 else out.shape[0]
                _check(out.ndim in (1, 2) and out.shape[-1] == k, f"shape {out.shape}")
                _check_ids(out, n, k, _excluded_sets(exr, Qr))
                del rows
            elif op == 4:
                items = _ids(rng, n, int(rng.integers(0, 5)), padding=False)
                r = f.rows(items)
                m = np.asarray(items, dtype=object).size
                _check(r.shape == (m, d) and r.dtype == np.float64, f"rows shape {r.shape}")
                _check(np.isfinite(r).all(), "rows not finite")
                if f.storage == "float32":
                    _check(np.array_equal(r, V32[np.asarray(items, np.int64)]), "rows differ")
            else:
                items = _ids(rng, n, int(rng.integers(0, 5)), padding=False)
                sc = f.scores(u, items)
                _check(sc.dtype == np.float64 and sc.ndim == 1, "scores shape")
                _check(not np.isnan(sc).any(), f"NaN in scores {sc}")
        except ALLOWED as e:
            _check("incompatible function arguments" not in str(e), f"pybind11 dump: {e}")


def _run_state_ops(rng, f, log):
    from crossknn.core import RoundState

    n, d = f.n_items, f.dim
    ridge = _pick(rng, [0.0, 0.0, 1e-3, 1.0, -1.0, np.nan, "0", 10**400, 1e300])
    prior = None if rng.random() < 0.6 else _values(rng, (d,) if rng.random() < 0.9 else (d + 1,))
    mix = _pick(rng, [0.0, 0.3, 1.0, 1.5, "x"]) if prior is not None else 0.0
    refine = _int_param(rng, 3)
    log(f"state ridge={ridge!r} mix={mix!r} refine={refine!r}")
    try:
        st = RoundState(f, ridge=ridge, prior=prior, mix=mix, refine=refine)
    except ALLOWED as e:
        _check("incompatible function arguments" not in str(e), f"pybind11 dump: {e}")
        return
    for _ in range(int(rng.integers(1, 5))):
        m = int(rng.integers(0, 4))
        items = _ids(rng, n, m, padding=False)
        targets = _values(rng, (np.asarray(items, dtype=object).size,))
        if rng.random() < 0.6:
            targets = np.nan_to_num(targets, nan=0.0, posinf=1e300, neginf=-1e300)
        if rng.random() < 0.2:
            targets = _as_dtype(rng, targets)
        size0 = st.size
        try:
            st.append(items, targets)
        except ALLOWED as e:
            _check("incompatible function arguments" not in str(e), f"pybind11 dump: {e}")
            _check(st.size == size0, "a failed append changed the state")
        try:
            u = st.solve()
            _check(u.shape == (d,) and u.dtype == np.float64, "solve shape")
            _check(np.isfinite(u).all(), f"solve not finite: {u}")
        except ALLOWED as e:
            _check("overflows float64" in str(e), f"solve raised {e!r}")
        _check(len(set(st.items.tolist())) == st.size, "state items not distinct")


def run_case(seed: int, log) -> None:
    from crossknn.core import ItemFeatures

    rng = np.random.default_rng(seed)
    big = rng.random() < 0.06  # large enough for the threaded kernels
    n = int(_pick(rng, [20_000, 70_001])) if big else int(_pick(rng, [0, 1, 2, 3, 5, 17, 64, 200]))
    d = int(_pick(rng, [8, 33])) if big else int(_pick(rng, [0, 1, 2, 3, 8, 17]))
    shape = (n, d) if rng.random() < 0.95 else _pick(rng, [(n,), (n, d, 1), ()])
    V = _values(rng, shape) if not big else rng.standard_normal(shape)
    if rng.random() < 0.25:
        V = _as_dtype(rng, V)
    storage = _pick(rng, ["float32", "float16", "int8", "float32", "bfloat16", 16])
    threads = _int_param(rng, int(rng.integers(0, 3)))
    log(f"seed {seed}: V {np.shape(V)} storage={storage!r} threads={threads!r}")
    try:
        f = ItemFeatures(V, storage=storage, threads=threads)
    except ALLOWED as e:
        _check("incompatible function arguments" not in str(e), f"pybind11 dump: {e}")
        return
    with np.errstate(all="ignore"):
        V32 = np.asarray(V, dtype=np.float64).astype(np.float32)
    _check((f.n_items, f.dim) == (n, d), "n_items/dim")
    _check(np.isfinite(V32).all(), "non-finite V was accepted")
    if storage == "float16":
        _check((np.abs(V32) < 65520).all(), "float16 overflow was accepted")
    if rng.random() < 0.2:
        try:
            f.threads = _int_param(rng, 2)
        except ALLOWED as e:
            _check("incompatible function arguments" not in str(e), f"pybind11 dump: {e}")
    _run_features_ops(rng, f, V32, log)
    _run_state_ops(rng, f, log)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=BASE_SEED)
    ap.add_argument("--cases", type=int, default=100_000)
    ap.add_argument("--seconds", type=float, default=SECONDS)
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")  # casts of the fuzzer's own inputs
    end = time.monotonic() + args.seconds
    done = 0
    for seed in range(args.seed, args.seed + args.cases):
        print(f"case {seed}", flush=True)  # the last line names the case of a crash
        lines = []
        try:
            run_case(seed, lines.append)
        except Exception:
            print("\n".join(lines))
            print(f"FAILED case seed {seed}:\n{traceback.format_exc()}", flush=True)
            return 1
        done += 1
        if time.monotonic() > end:
            break
    print(f"ok {done} cases from seed {args.seed}", flush=True)
    return 0


def test_fuzz_bindings_no_crash_and_well_formed_results():
    proc = subprocess.run(
        [sys.executable, "-X", "faulthandler", __file__, "--seed", str(BASE_SEED)],
        capture_output=True,
        text=True,
        timeout=SECONDS + 120,
    )
    tail = (proc.stdout[-3000:] + "\n" + proc.stderr[-3000:]).strip()
    last = [ln for ln in proc.stdout.splitlines() if ln.startswith("case ")]
    if proc.returncode != 0:
        where = last[-1] if last else "before the first case"
        raise AssertionError(
            f"fuzz failed (rc={proc.returncode}, last {where}; base seed {BASE_SEED}); "
            f"rerun: python {__file__} --seed SEED --cases 1\n{tail}"
        )
    done = int(proc.stdout.strip().splitlines()[-1].split()[1])
    assert done >= 200, f"only {done} fuzz cases ran in {SECONDS} s\n{tail}"


if __name__ == "__main__":
    sys.exit(main())
