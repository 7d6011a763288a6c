"""dpinfer.lattice.invariants: kernel lattices, Markov bases, feasible points and fibres, checked against
brute-force enumeration, closed-form Gram determinants (seed 001 §5.3) and Diaconis & Sturmfels'
connectivity criterion."""

import itertools
import math
import shutil
import time
from collections import deque

import numpy as np
import pytest

from dpinfer.lattice import invariants as inv_module
from dpinfer.lattice.invariants import (
    InfeasibleInvariantsError,
    Invariants,
    MarkovBasisUnavailable,
    MoveSet,
)

HAS_4TI2 = shutil.which("markov") is not None or shutil.which("4ti2-markov") is not None
needs_4ti2 = pytest.mark.skipif(not HAS_4TI2, reason="4ti2 (markov / 4ti2-markov) is not installed")

# Seed 001 §9.1: the 3-set Venn reconstruction (2 records per region), rank 3, det(C^T C) = 256.
VENN = [
    [1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 1, 1],
    [0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 1, 1],
    [0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1],
]


# --- helpers ---------------------------------------------------------------------------------


def kernel_vectors_in_box(A, radius=2):
    """All z in {-radius..radius}^d with A z = 0 (brute force)."""
    A = np.asarray(A, dtype=np.int16)
    d = A.shape[1]
    assert d <= 9, "keep the box small"
    side = np.arange(-radius, radius + 1, dtype=np.int16)
    Z = np.stack(np.meshgrid(*[side] * d, indexing="ij"), axis=-1).reshape(-1, d)
    return Z[np.all(Z @ A.T == 0, axis=1)].astype(np.int64)


def representable(C, Z):
    """Whether every row z of Z is C w for an integer w (least squares, rounded, checked exactly)."""
    if Z.shape[0] == 0:
        return True
    W = np.linalg.lstsq(C.astype(float), Z.T.astype(float), rcond=None)[0]
    return np.array_equal(C @ np.round(W).astype(np.int64), Z.T)


def gram_det(C):
    """det(C^T C) exactly (integer Gram matrix, Fraction elimination)."""
    from fractions import Fraction

    G = [[Fraction(int(v)) for v in row] for row in (C.T @ C)]
    n, det = len(G), Fraction(1)
    for i in range(n):
        p = next(r for r in range(i, n) if G[r][i] != 0)
        if p != i:
            G[i], G[p] = G[p], G[i]
            det = -det
        det *= G[i][i]
        for r in range(i + 1, n):
            f = G[r][i] / G[i][i]
            G[r] = [x - f * y for x, y in zip(G[r], G[i])]
    return int(det)


def connected(points, moves):
    """Whether the fibre graph (edges x -> x +- move, staying >= 0) is connected."""
    pts = {tuple(p) for p in points.tolist()}
    Z = moves.dense()
    start = next(iter(pts))
    seen, queue = {start}, deque([start])
    while queue:
        x = np.array(queue.popleft())
        for y in np.concatenate([x + Z, x - Z]):
            if np.all(y >= 0):
                t = tuple(y.tolist())
                assert t in pts, "a move left the fibre"
                if t not in seen:
                    seen.add(t)
                    queue.append(t)
    return len(seen) == len(pts)


def adjacent_moves(r, c):
    """Only the adjacent basic moves (i' = i + 1, j' = j + 1) of an r x c table."""
    cells, steps = [], []
    for i in range(r - 1):
        for j in range(c - 1):
            cells.append([i * c + j, i * c + j + 1, (i + 1) * c + j, (i + 1) * c + j + 1])
            steps.append([1, -1, -1, 1])
    return MoveSet(np.array(cells), np.array(steps), r * c)


def lattice_cases():
    rng = np.random.default_rng(7)
    cases = [
        ("total d=4", Invariants.total(4)),
        ("groups", Invariants.groups(["x", "y", "x", "z", "y", "x"])),
        ("2x3 margins", Invariants.margins((2, 3), [(0,), (1,)])),
        ("3x3 margins", Invariants.margins((3, 3), [(0,), (1,)])),
        ("3x3 margins + total (dependent)", Invariants.margins((3, 3), [(), (1,), (0,)])),
        ("2x2x2 margin (0,1): partition", Invariants.margins((2, 2, 2), [(0, 1), (0,)])),
        ("2x2x2 margins (0,1),(0,2): layered", Invariants.margins((2, 2, 2), [(0, 1), (0, 2)])),
        ("2x2x2 all 2-way margins", Invariants.margins((2, 2, 2), [(0, 1), (0, 2), (1, 2)])),
        ("random integer matrix", Invariants.from_matrix(rng.integers(-2, 3, size=(2, 6)))),
        ("non-trivial SNF", Invariants.from_matrix([[2, 4, 6, 0, 1, 3], [0, 3, 3, 6, 0, 3]])),
        ("dependent + zero rows", Invariants.from_matrix([[1, 1, 0, 0, 1], [0, 0, 0, 0, 0],
                                                          [1, 1, 0, 0, 1], [0, 1, 1, 1, 0]])),
    ]
    return cases


# --- kernel lattice --------------------------------------------------------------------------


@pytest.mark.parametrize("name, inv", lattice_cases(), ids=[c[0] for c in lattice_cases()])
def test_kernel_basis_generates_the_integer_kernel(name, inv):
    A = inv.constraint_matrix
    C = inv.kernel_basis()
    m = inv.n_cells - inv.rank
    assert C.dtype == np.int64 and C.shape == (inv.n_cells, m)
    assert inv.rank == np.linalg.matrix_rank(A)
    assert np.all(A @ C == 0)
    assert np.linalg.matrix_rank(C) == m
    Z = kernel_vectors_in_box(A)
    assert Z.shape[0] > 1
    assert representable(C, Z), name
    # the sparse form is the same basis; matrix keeps exactly `rank` independent original rows
    np.testing.assert_array_equal(inv.kernel_basis(sparse=True).toarray(), C)
    assert inv.matrix.shape == (inv.rank, inv.n_cells)
    np.testing.assert_array_equal(inv.matrix, A[inv.independent_rows])
    assert np.linalg.matrix_rank(inv.matrix) == inv.rank


def test_greedy_row_removal_keeps_first_independent_rows():
    inv = Invariants.margins((3, 3), [(), (0,), (1,)])
    # the total is kept, then the first two row sums (the third = total - the other two), ...
    np.testing.assert_array_equal(inv.independent_rows, [0, 1, 2, 4, 5])
    inv = Invariants.from_matrix([[0, 0, 0], [1, 1, 0], [2, 2, 0], [0, 1, 1]])
    np.testing.assert_array_equal(inv.independent_rows, [1, 3])


@pytest.mark.parametrize("d", [2, 5, 10, 31])
def test_gram_determinant_of_one_total_is_d(d):
    assert gram_det(Invariants.total(d).kernel_basis()) == d
    assert gram_det(Invariants.from_matrix(np.ones((1, d), dtype=int)).kernel_basis()) == d


@pytest.mark.parametrize("r, c", [(2, 3), (3, 5), (4, 4)])
def test_gram_determinant_of_two_way_margins(r, c):
    structured = Invariants.margins((r, c), [(0,), (1,)])
    general = Invariants.from_matrix(structured.constraint_matrix)
    want = r ** (c - 1) * c ** (r - 1)  # 4096 for the 4 x 4 table (seed 001 §5.3)
    assert gram_det(structured.kernel_basis()) == want
    assert gram_det(general.kernel_basis()) == want
    # same lattice: each basis represents the other's columns
    assert representable(structured.kernel_basis(), general.kernel_basis().T)
    assert representable(general.kernel_basis(), structured.kernel_basis().T)
    # LLL finds short vectors: entries in {-1, 0, 1} (basic moves for the 4 x 4 table)
    assert np.abs(general.kernel_basis()).max() == 1


def test_venn_reconstruction_lattice():
    inv = Invariants.from_matrix(VENN)
    C = inv.kernel_basis()
    assert inv.rank == 3 and C.shape == (14, 11)
    assert gram_det(C) == 256
    assert np.abs(C).max() == 1


def test_closed_form_bases_are_the_documented_moves():
    C = Invariants.groups(["a", "b", "a", "b", "a"]).kernel_basis()
    want = np.zeros((5, 3), dtype=np.int64)
    for col, (i, first) in enumerate([(2, 0), (3, 1), (4, 0)]):
        want[i, col], want[first, col] = 1, -1
    np.testing.assert_array_equal(C, want)
    C = Invariants.margins((2, 3), [(0,), (1,)]).kernel_basis()
    np.testing.assert_array_equal(C.T, [[1, -1, 0, -1, 1, 0], [1, 0, -1, -1, 0, 1]])


def test_structured_constructors_scale_to_thousands_of_cells():
    labels = np.repeat(np.arange(50), 100)  # 5000 counties in 50 states
    t = time.perf_counter()
    inv = Invariants.groups(labels)
    C = inv.kernel_basis(sparse=True)
    x = inv.feasible_point(np.full(50, 1000))
    assert time.perf_counter() - t < 2.0
    assert C.shape == (5000, 4950) and C.nnz == 2 * 4950
    assert np.all(inv.values(x) == 1000)
    table = Invariants.margins((60, 70), [(0,), (1,)])
    assert table.kernel_basis(sparse=True).shape == (4200, 59 * 69)
    big = Invariants.groups(np.zeros(1000, dtype=int))
    assert len(big.markov_basis()) == 1000 * 999 // 2


def test_general_path_on_a_4x4x4_table_with_all_two_way_margins():
    inv = Invariants.margins((4, 4, 4), [(0, 1), (0, 2), (1, 2)])
    C = inv.kernel_basis()
    assert inv.rank == 37 and C.shape == (64, 27)  # m = (4 - 1)^3
    assert np.all(inv.constraint_matrix @ C == 0)
    assert np.abs(C).max() == 1  # LLL returns short moves
    structured = Invariants.margins((4, 4, 4), [(0, 1), (0, 2)])
    assert structured.rank == 4 * 7  # layered two-way tables
    assert representable(structured.kernel_basis(), C.T)  # a sub-lattice of the layered one


def test_kernel_basis_is_cached_and_read_only():
    inv = Invariants.from_matrix(VENN)
    C = inv.kernel_basis()
    assert inv.kernel_basis() is C
    with pytest.raises(ValueError):
        C[0, 0] = 5


# --- Markov bases ----------------------------------------------------------------------------


def test_adjacent_moves_do_not_connect_but_all_basic_moves_do():
    """Inference notes §3: row sums (1, 1), column sums (1, 0, 1) has a two-point fibre."""
    inv = Invariants.margins((2, 3), [(0,), (1,)])
    fib = inv.fibre([1, 1, 1, 0, 1])
    assert sorted(map(tuple, fib.tolist())) == [(0, 0, 1, 1, 0, 0), (1, 0, 0, 0, 0, 1)]
    assert not connected(fib, adjacent_moves(2, 3))
    assert connected(fib, inv.markov_basis())


@pytest.mark.parametrize("rows, cols", [
    ((1, 1, 1), (1, 1, 1)),
    ((2, 1, 1), (1, 2, 1)),
    ((2, 0, 2), (1, 2, 1)),
    ((3, 2, 1), (2, 2, 2)),
    ((0, 3, 1), (0, 1, 3)),
    ((1, 0, 2), (2, 1, 0)),
])
def test_markov_basis_connects_3x3_fibres(rows, cols):
    inv = Invariants.margins((3, 3), [(0,), (1,)])
    fib = inv.fibre(rows + cols)
    assert len(fib) >= 1
    assert connected(fib, inv.markov_basis())


def test_markov_basis_move_counts_and_uniqueness():
    inv = Invariants.margins((4, 5), [(0,), (1,)])
    Z = inv.markov_basis().dense()
    assert Z.shape == (math.comb(4, 2) * math.comb(5, 2), 20)
    assert np.all(inv.constraint_matrix @ Z.T == 0)
    keys = {tuple(z) for z in Z.tolist()} | {tuple(z) for z in (-Z).tolist()}
    assert len(keys) == 2 * len(Z)  # every move once, never with its negative
    labels = ["s1", "s2", "s1", "s1", "s3", "s2"]
    moves = Invariants.groups(labels).markov_basis()
    assert moves.cells.shape == (3 + 1, 2)
    np.testing.assert_array_equal(moves.cells, [[0, 2], [0, 3], [2, 3], [1, 5]])
    np.testing.assert_array_equal(moves.steps, np.tile([1, -1], (4, 1)))


@pytest.mark.parametrize("inv, a_list", [
    (Invariants.total(5), [[0], [1], [3]]),
    (Invariants.groups(["a", "b", "a", "b", "a", "c"]), [[2, 0, 1], [0, 0, 0], [3, 2, 0]]),
    (Invariants.margins((2, 2, 2), [(0, 1)]), [[1, 0, 2, 1], [0, 0, 0, 3]]),
    (Invariants.margins((2, 2, 3), [(0, 1), (0, 2)]),  # a from tables with zeros
     [Invariants.margins((2, 2, 3), [(0, 1), (0, 2)]).values(x) for x in
      ([1, 0, 0, 0, 1, 1, 0, 2, 0, 1, 0, 0], [0, 0, 2, 1, 0, 0, 0, 0, 0, 0, 1, 1])]),
])
def test_markov_basis_connects_structured_fibres(inv, a_list):
    for a in a_list:
        fib = inv.fibre(a)
        assert len(fib) >= 1
        assert np.all(inv.values(fib) == a)
        assert connected(fib, inv.markov_basis())


@needs_4ti2
def test_4ti2_markov_basis_connects_2x2x2_no_three_way_interaction():
    inv = Invariants.margins((2, 2, 2), [(0, 1), (0, 2), (1, 2)])
    moves = inv.markov_basis()
    Z = moves.dense()
    np.testing.assert_array_equal(np.abs(Z), np.ones((1, 8)))  # the single degree-4 move
    rng = np.random.default_rng(3)
    for _ in range(5):
        x = rng.integers(0, 3, size=8)
        fib = inv.fibre(inv.values(x))
        assert connected(fib, moves)


@needs_4ti2
def test_4ti2_markov_basis_for_a_general_matrix():
    # the twisted cubic: a lattice basis is not a Markov basis, degree-2 moves are needed
    inv = Invariants.from_matrix([[1, 1, 1, 1], [0, 1, 2, 3]])
    moves = inv.markov_basis()
    assert np.all(inv.matrix @ moves.dense().T == 0)
    for a in ([2, 3], [3, 3], [4, 6], [5, 7]):
        assert connected(inv.fibre(a), moves)
    venn = Invariants.from_matrix(VENN)
    for a in ([1, 1, 1], [2, 1, 2]):
        assert connected(venn.fibre(a), venn.markov_basis())


def test_markov_basis_unavailable_without_4ti2(monkeypatch):
    monkeypatch.setattr(inv_module.shutil, "which", lambda name: None)
    inv = Invariants.from_matrix([[1, 1, 1, 1], [0, 1, 2, 3]])  # twisted cubic: distinct columns, m = 2
    with pytest.raises(MarkovBasisUnavailable, match="apt install 4ti2") as err:
        inv.markov_basis()
    # 2x2x2 with all two-way margins has a one-dimensional kernel: its generator, no 4ti2
    assert len(Invariants.margins((2, 2, 2), [(0, 1), (0, 2), (1, 2)]).markov_basis()) == 1
    assert "connect" in str(err.value)
    assert isinstance(err.value, RuntimeError)
    # structured cases never need 4ti2
    assert len(Invariants.margins((3, 3), [(0,), (1,)]).markov_basis()) == 9


# --- feasible points -------------------------------------------------------------------------


@pytest.mark.parametrize("inv", [case[1] for case in lattice_cases()] + [Invariants.from_matrix(VENN)],
                         ids=[case[0] for case in lattice_cases()] + ["venn"])
def test_feasible_point_reproduces_values_of_random_tables(inv):
    rng = np.random.default_rng(11)
    for _ in range(5):
        a = inv.values(rng.integers(0, 4, size=inv.n_cells))
        y = inv.feasible_point(a)
        assert y.dtype == np.int64 and np.all(y >= 0)
        np.testing.assert_array_equal(inv.values(y), a)
        assert inv.is_feasible(a)


def test_feasible_point_closed_forms():
    np.testing.assert_array_equal(Invariants.groups(["a", "b", "a"]).feasible_point([4, 2]), [4, 2, 0])
    # north-west corner rule with zeros in the margins
    inv = Invariants.margins((3, 3), [(0,), (1,)])
    np.testing.assert_array_equal(inv.feasible_point([2, 0, 3, 1, 0, 4]).reshape(3, 3),
                                  [[1, 0, 1], [0, 0, 0], [0, 0, 3]])
    np.testing.assert_array_equal(inv.feasible_point([0] * 6), np.zeros(9))


@pytest.mark.parametrize("inv, a, match", [
    (Invariants.margins((2, 3), [(0,), (1,)]), [1, 1, 1, 0, 2], r"margins \(0,\) and \(1,\) disagree: they sum to 2 and 3"),
    (Invariants.margins((2, 2, 2), [(0, 1), (0, 2)]), [1, 1, 1, 1, 2, 0, 1, 2], r"disagree on the slice \(1,\) of axes \(0,\)"),
    (Invariants.total(3), [-1], "non-negative"),
    (Invariants.groups(["a", "b"]), [1, -2], "group 'b'"),
    (Invariants.margins((2, 2), [(0,), (1,)]), [1, -1, 0, 0], "non-negative"),
    (Invariants.from_matrix([[2, 2]]), [3], "integer image"),
    (Invariants.from_matrix([[1, -1], [1, 1]]), [1, 2], "integer image"),
    (Invariants.from_matrix([[1, -1], [1, 1]]), [3, 1], "no non-negative integer solution"),
    (Invariants.from_matrix([[1, 1, 0], [0, 1, 1]]), [-1, 1], "no non-negative"),
    (Invariants.from_matrix([[1, 1], [1, 1]]), [1, 2], "inconsistent"),
    (Invariants.margins((2, 2), [(0,), (1,), ()]), [1, 1, 1, 1, 3], "inconsistent"),
    (Invariants.margins((2, 2, 2), [(0, 1), (0,)]), [1, 1, 1, 1, 2, 3], "inconsistent"),
    (Invariants.total(3), [2.5], "whole numbers"),
])
def test_infeasible_invariants_raise(inv, a, match):
    with pytest.raises(InfeasibleInvariantsError, match=match):
        inv.feasible_point(a)
    assert not inv.is_feasible(a)
    assert len(inv.fibre(a)) == 0


# --- fibres ----------------------------------------------------------------------------------


def test_fibre_counts_match_closed_forms():
    assert len(Invariants.total(3).fibre([4])) == math.comb(4 + 2, 2)
    assert len(Invariants.margins((3, 3), [(0,), (1,)]).fibre([1] * 6)) == 6  # permutations
    assert len(Invariants.margins((2, 2), [(0,), (1,)]).fibre([3, 2, 4, 1])) == 2
    fib = Invariants.groups(["a", "b", "a", "b"]).fibre([2, 1])
    assert len(fib) == 3 * 2 and len({tuple(p) for p in fib.tolist()}) == 6
    # brute force for a random 0/1 matrix
    A = np.array([[1, 1, 0, 1, 0], [0, 1, 1, 0, 1], [1, 0, 1, 1, 1]])
    a = [3, 2, 4]
    brute = [x for x in itertools.product(range(5), repeat=5) if np.array_equal(A @ x, a)]
    assert sorted(map(tuple, Invariants.from_matrix(A).fibre(a).tolist())) == sorted(brute)


def test_fibre_with_mixed_sign_rows_uses_lp_bounds():
    inv = Invariants.from_matrix([[1, -1, 0], [0, 1, 1]])
    fib = inv.fibre([0, 3])
    assert sorted(map(tuple, fib.tolist())) == [(0, 0, 3), (1, 1, 2), (2, 2, 1), (3, 3, 0)]


def test_fibre_rejects_unbounded_and_large():
    with pytest.raises(ValueError, match="unbounded"):
        Invariants.from_matrix([[1, -1]]).fibre([0])
    with pytest.raises(ValueError, match="cell 1 is in no constraint"):
        Invariants.from_matrix([[1, 0]]).fibre([2])
    with pytest.raises(ValueError, match="limit"):
        Invariants.total(6).fibre([10], limit=100)
    assert Invariants.total(3).fibre([1.5]).shape == (0, 3)


# --- evaluation ------------------------------------------------------------------------------


def test_values_satisfied_and_check_release():
    inv = Invariants.margins((2, 3), [(0,), (1,)])
    x = np.arange(6)
    np.testing.assert_array_equal(inv.values(x), [3, 12, 3, 5, 7])
    batch = np.stack([x, x + 1, x])
    assert inv.values(batch).shape == (3, 5)
    assert inv.values(batch.reshape(3, 1, 6)).shape == (3, 1, 5)
    np.testing.assert_array_equal(inv.satisfied(batch, [3, 12, 3, 5, 7]), [True, False, True])
    inv.check_release(x - 10 + np.array([10, 10, 10, 10, 10, 10]), [3, 12, 3, 5, 7])
    with pytest.raises(ValueError, match=r"release index \(1,\).*margin \(0,\) at \(0,\)"):
        inv.check_release(batch, [3, 12, 3, 5, 7])
    neg = np.array([-1, 2, 2, 5, 3, 4])  # negative releases are allowed
    inv.check_release(neg, inv.values(neg))


def test_attributes():
    inv = Invariants.groups(np.array(["IL", "IN", "IL"]))
    assert inv.kind == "groups" and inv.group_names == ("IL", "IN") and inv.rank == 2
    assert inv.n_cells == 3 and inv.constraint_matrix.dtype == np.int64
    assert Invariants.total(3).kind == "total"
    m = Invariants.margins((2, 3), [(1,), (0,)])
    assert m.kind == "margins" and m.shape == (2, 3) and m.margin_axes == [(1,), (0,)]
    np.testing.assert_array_equal(m.values(np.arange(6)), [3, 5, 7, 3, 12])
    assert Invariants.from_matrix([[1, 2]]).kind == "matrix"
    assert "rank=2" in repr(inv)


# --- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize("call, exc, match", [
    (lambda: Invariants.total(0), ValueError, "n_cells"),
    (lambda: Invariants.total(2.5), TypeError, "n_cells"),
    (lambda: Invariants.total(True), TypeError, "n_cells"),
    (lambda: Invariants.groups("abc"), TypeError, "labels"),
    (lambda: Invariants.groups(np.zeros((2, 2))), ValueError, "labels"),
    (lambda: Invariants.groups([]), ValueError, "labels"),
    (lambda: Invariants.groups([[1], [2]]), TypeError, "labels must be hashable"),
    (lambda: Invariants.groups([1.0, float("nan")]), ValueError, "NaN"),
    (lambda: Invariants.margins((2, 0), [(0,)]), ValueError, "shape"),
    (lambda: Invariants.margins((2, 3), [0, 1]), TypeError, "margins"),
    (lambda: Invariants.margins((2, 3), [(2,)]), ValueError, "axes must be whole numbers in"),
    (lambda: Invariants.margins((2, 3), [(0, 0)]), ValueError, "repeated"),
    (lambda: Invariants.margins((2, 3), []), ValueError, "at least one margin"),
    (lambda: Invariants.from_matrix([1, 2, 3]), ValueError, "A must be a 2-D"),
    (lambda: Invariants.from_matrix([[1, 0.5]]), ValueError, "A must hold whole numbers"),
    (lambda: Invariants.from_matrix([["a", "b"]]), TypeError, "A must be numeric"),
    (lambda: Invariants.from_matrix([[0, 0]]), ValueError, "rank 0"),
    (lambda: Invariants.total(3).values([1, 2]), ValueError, "x must have last axis of length"),
    (lambda: Invariants.total(3).values([1, 2, 0.5]), ValueError, "x must hold whole numbers"),
    (lambda: Invariants.total(3).feasible_point([1, 2]), ValueError, "a must be 1-D"),
    (lambda: Invariants.total(3).satisfied([1, 2, 3], [1, 2]), ValueError, "a must have length"),
    (lambda: Invariants.total(3).fibre([2], limit=0), ValueError, "limit"),
    (lambda: MoveSet(np.zeros((1, 2)), np.zeros((1, 3)), 4), ValueError, "cells and steps"),
    (lambda: MoveSet(np.array([[0, 5]]), np.array([[1, -1]]), 4), ValueError, "cells must be indices"),
    (lambda: MoveSet(np.array([[1, 2]]), np.array([[1, 0]]), 4), ValueError, "padding"),
])
def test_bad_input_names_the_argument(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_shape_errors_are_not_reported_as_infeasible():
    inv = Invariants.total(3)
    with pytest.raises(ValueError) as err:
        inv.is_feasible([1, 2])
    assert not isinstance(err.value, InfeasibleInvariantsError)


# --- Markov bases by column classes (no 4ti2) --------------------------------------------------

SEX_BY_AGE = np.array([  # 2 x 4 table: total, first-row total, total of the last 3 columns
    [1, 1, 1, 1, 1, 1, 1, 1],
    [1, 1, 1, 1, 0, 0, 0, 0],
    [0, 1, 1, 1, 0, 1, 1, 1],
])


@pytest.mark.parametrize("A", [
    SEX_BY_AGE,
    np.array([[1, 1, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1], [1, 0, 1, 1, 0, 1]]),  # classes of 2 and 1 cells
    np.array([[1, 1, 1, 1, 1], [1, 2, 0, 0, 0]]),  # one-dimensional kernel after classes
])
def test_class_lifted_markov_basis_connects_fibres_without_4ti2(monkeypatch, A):
    monkeypatch.setattr(inv_module.shutil, "which", lambda name: None)
    inv = Invariants.from_matrix(A)
    moves = inv.markov_basis()
    assert np.all(inv.matrix @ moves.dense().T == 0)
    rng = np.random.default_rng(7)
    for _ in range(6):
        a = inv.values(rng.integers(0, 3, size=inv.n_cells))
        assert connected(inv.fibre(a), moves)


def test_one_dimensional_kernel_gives_its_generator():
    inv = Invariants.from_matrix([[1, 1, 0], [0, 1, 1]])
    np.testing.assert_array_equal(np.abs(inv.markov_basis().dense()), [[1, 1, 1]])


def test_column_classes():
    codes, distinct = inv_module.column_classes(SEX_BY_AGE)
    np.testing.assert_array_equal(codes, [0, 1, 1, 1, 2, 3, 3, 3])
    np.testing.assert_array_equal(distinct[:, codes], SEX_BY_AGE)
