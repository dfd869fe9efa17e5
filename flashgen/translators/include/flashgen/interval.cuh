// Interval arithmetic over one tile's rows and keys: the conservative tile tests a translator writes from a mask
// (flashgen.translators.tiles builds them from the TL expression). An integer expression becomes an interval I that
// holds each of its values over the tile's valid (row, key) pairs; a condition becomes B, whether it may hold (t)
// and whether it may fail (f) somewhere in the tile. `!B.t`: no (row, key) of the tile can be visible, so the tile
// is skipped; `!B.f`: every one is, so it needs no per-element mask. The endpoints are 64-bit: the translator only
// writes an expression whose endpoints stay within 2^62 (positions and sizes are below 2^31), so nothing here
// overflows. Divisors are positive (d.lo >= 1): the translator checks it, as the C of `//` and `%` needs.
// Host-compilable too, with the three qualifiers defined away (tests/host_c.py INTERVALS; tests/test_tile_skipping.py
// runs it under g++ against every element of random tiles).
#pragma once

namespace fg {
namespace iv {

struct I {
  long long lo, hi;
};
struct B {
  bool t, f;
};

__host__ __device__ __forceinline__ long long lmin(long long a, long long b) { return a < b ? a : b; }
__host__ __device__ __forceinline__ long long lmax(long long a, long long b) { return a > b ? a : b; }
// floor(a / d) for d >= 1 (C's / truncates)
__host__ __device__ __forceinline__ long long floor_of(long long a, long long d) {
  return a >= 0 ? a / d : -((-a + d - 1) / d);
}
__host__ __device__ __forceinline__ I hull4(long long a, long long b, long long c, long long d) {
  return I{lmin(lmin(a, b), lmin(c, d)), lmax(lmax(a, b), lmax(c, d))};
}

__host__ __device__ __forceinline__ I pt(long long x) { return I{x, x}; }
// Tile i of `size` positions in a sequence of `len`: its valid positions, i * size .. min((i + 1) * size, len) - 1
// (the rows past seqlen_q are never stored and the keys past seqlen_k are always masked).
__host__ __device__ __forceinline__ I tile(int i, int size, int len) {
  return I{(long long)i * size, lmin((long long)(i + 1) * size, (long long)len) - 1};
}
__host__ __device__ __forceinline__ I add(I a, I b) { return I{a.lo + b.lo, a.hi + b.hi}; }
__host__ __device__ __forceinline__ I sub(I a, I b) { return I{a.lo - b.hi, a.hi - b.lo}; }
__host__ __device__ __forceinline__ I neg(I a) { return I{-a.hi, -a.lo}; }
__host__ __device__ __forceinline__ I mul(I a, I b) {
  return hull4(a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi);
}
// floor(a / d), d >= 1: monotone in a, and in d where a keeps one sign, so the corners bound it
__host__ __device__ __forceinline__ I floor_div(I a, I d) {
  return hull4(floor_of(a.lo, d.lo), floor_of(a.lo, d.hi), floor_of(a.hi, d.lo), floor_of(a.hi, d.hi));
}
// the same for a >= 0 (known to the translator): increasing in a, decreasing in d, so two divisions
__host__ __device__ __forceinline__ I floor_div_nonneg(I a, I d) { return I{a.lo / d.hi, a.hi / d.lo}; }
// ceil(a / d) = -floor(-a / d)
__host__ __device__ __forceinline__ I ceil_div(I a, I d) { return neg(floor_div(neg(a), d)); }
// a - d * floor(a / d) in [0, d - 1]; exact where a stays inside one period of a fixed d, or below every d
__host__ __device__ __forceinline__ I floor_mod(I a, I d) {
  if (a.lo >= 0 && a.hi < d.lo) return a;
  if (d.lo == d.hi && floor_of(a.lo, d.lo) == floor_of(a.hi, d.lo)) {
    const long long r = a.lo - floor_of(a.lo, d.lo) * d.lo;
    return I{r, r + (a.hi - a.lo)};
  }
  return I{0, d.hi - 1};
}
__host__ __device__ __forceinline__ I min_(I a, I b) { return I{lmin(a.lo, b.lo), lmin(a.hi, b.hi)}; }
__host__ __device__ __forceinline__ I max_(I a, I b) { return I{lmax(a.lo, b.lo), lmax(a.hi, b.hi)}; }
__host__ __device__ __forceinline__ I abs_(I a) {
  if (a.lo >= 0) return a;
  if (a.hi <= 0) return neg(a);
  return I{0, lmax(-a.lo, a.hi)};
}

__host__ __device__ __forceinline__ B known(bool v) { return B{v, !v}; }
__host__ __device__ __forceinline__ B unknown() { return B{true, true}; }
__host__ __device__ __forceinline__ B lt(I a, I b) { return B{a.lo < b.hi, a.hi >= b.lo}; }
__host__ __device__ __forceinline__ B le(I a, I b) { return B{a.lo <= b.hi, a.hi > b.lo}; }
__host__ __device__ __forceinline__ B gt(I a, I b) { return lt(b, a); }
__host__ __device__ __forceinline__ B ge(I a, I b) { return le(b, a); }
__host__ __device__ __forceinline__ B eq(I a, I b) {
  return B{a.lo <= b.hi && b.lo <= a.hi, !(a.lo == a.hi && b.lo == b.hi && a.lo == b.lo)};
}
__host__ __device__ __forceinline__ B ne(I a, I b) {
  const B e = eq(a, b);
  return B{e.f, e.t};
}
__host__ __device__ __forceinline__ B and_(B a, B b) { return B{a.t && b.t, a.f || b.f}; }
__host__ __device__ __forceinline__ B or_(B a, B b) { return B{a.t || b.t, a.f && b.f}; }
__host__ __device__ __forceinline__ B not_(B a) { return B{a.f, a.t}; }
// == and != of two conditions
__host__ __device__ __forceinline__ B eq(B a, B b) {
  return B{(a.t && b.t) || (a.f && b.f), (a.t && b.f) || (a.f && b.t)};
}
__host__ __device__ __forceinline__ B ne(B a, B b) { return not_(eq(a, b)); }
// where(c, x, y): x where c holds everywhere, y where it fails everywhere, else either
__host__ __device__ __forceinline__ I where(B c, I x, I y) {
  return !c.f ? x : !c.t ? y : I{lmin(x.lo, y.lo), lmax(x.hi, y.hi)};
}

}  // namespace iv
}  // namespace fg
