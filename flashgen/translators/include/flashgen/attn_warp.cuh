// The two warp-level GEMMs of attention, per input type. A warp owns MT 16-row tiles of the query block
// (rows row0 .. row0 + 16*MT), all BN keys of the current key tile and all D output columns.
//   qk: S[MT][BN/8] (+)= Q[rows, :] K[tile, :]^T       (K is stored [key][d]: the "col" operand as is)
//   pv: O[MT][D/8] += P V[tile, :]                       (P = the S accumulator, kept in registers)
// The shared tiles are DP >= D columns wide, DP a multiple of the k-step: the columns past D are zeros (the tile
// loaders write them), so Q K^T runs over all DP columns and P V over the D real ones only.
#pragma once
#include "flashgen/mma.cuh"

namespace fg {
namespace warp {

// fp16 / bf16: ldmatrix.x4 fragments, m16n8k16 (two m16n8k8 on Turing). P goes from C-fragment to
// A-fragment layout in registers: the accumulator pair (g, 2t..2t+1) is exactly A's (g, 2t..2t+1).
template <typename T, int MT, int D, int DP, int BN, bool Q_IN_REGS, int QROWS>
struct attn_mma16 {
  static_assert(D % 8 == 0 && DP % 16 == 0 && D <= DP && DP < D + 16, "D_PAD: D rounded up to the k-step (16)");
  using QL = st_layout<QROWS, DP, 2>;
  using KL = st_layout<BN, DP, 2>;
  static constexpr int KSTEPS = DP / 16;
  uint32_t q[Q_IN_REGS ? MT : 1][Q_IN_REGS ? KSTEPS : 1][4];

  __device__ __forceinline__ static void load_q_frag(uint32_t (&a)[4], const T* sQ, int row0, int kk, int lane) {
    const int mi = lane >> 3;
    ldsm_x4(a, sQ + QL::chunk_offset(row0 + (mi & 1) * 8 + (lane & 7), kk * 2 + (mi >> 1)));
  }

  __device__ __forceinline__ void load_q(const T* sQ, int row0, int lane) {
    if constexpr (Q_IN_REGS) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int kk = 0; kk < KSTEPS; ++kk) load_q_frag(q[mt][kk], sQ, row0 + mt * 16, kk, lane);
    }
  }

  __device__ __forceinline__ void qk(float (&s)[MT][BN / 8][4], const T* sQ, const T* sK, int row0, int lane) const {
    const int mi = lane >> 3;
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if constexpr (Q_IN_REGS) {
#pragma unroll
          for (int i = 0; i < 4; ++i) a[mt][i] = q[mt][kk][i];
        } else {
          load_q_frag(a[mt], sQ, row0 + mt * 16, kk, lane);
        }
      }
#pragma unroll
      for (int np = 0; np < BN / 16; ++np) {
        uint32_t b[4];
        ldsm_x4(b, sK + KL::chunk_offset(np * 16 + (mi >> 1) * 8 + (lane & 7), kk * 2 + (mi & 1)));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<T>(s[mt][2 * np], a[mt], b[0], b[1]);
          mma_16816<T>(s[mt][2 * np + 1], a[mt], b[2], b[3]);
        }
      }
    }
  }

  // P as m16n8k16 A fragments: p16[mt][kk] covers keys 16kk..16kk+15 of the warp's rows mt*16 .. mt*16+15.
  using p_frags = uint32_t[MT][BN / 16][4];

  // Where score (nt, c) of a C fragment goes in p_frags: a pair (c, c+1), c even, is one register.
  __device__ __forceinline__ static uint32_t& p_slot(p_frags& p16, int mt, int nt, int half) {
    return p16[mt][nt / 2][(nt & 1) * 2 + half];
  }

  __device__ __forceinline__ static void pv(float (&o)[MT][D / 8][4], const p_frags& p16, const T* sV, int lane) {
    const int mi = lane >> 3;
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t b[4];
        ldsm_x4_trans(b, sV + KL::chunk_offset(kk * 16 + (mi & 1) * 8 + (lane & 7), dp * 2 + (mi >> 1)));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<T>(o[mt][2 * dp], p16[mt][kk], b[0], b[1]);
          mma_16816<T>(o[mt][2 * dp + 1], p16[mt][kk], b[2], b[3]);
        }
      }
      if constexpr (D % 16 != 0) {  // the last 8 columns alone: the padding columns are never multiplied
        uint32_t b[2];
        ldsm_x2_trans(b, sV + KL::chunk_offset(kk * 16 + (mi & 1) * 8 + (lane & 7), D / 8 - 1));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) mma_16816<T>(o[mt][D / 8 - 1], p16[mt][kk], b[0], b[1]);
      }
    }
  }

  // P still in fp32 C fragments (norms other than the online softmax, Turing's rescaled tiles).
  __device__ __forceinline__ static void pv(float (&o)[MT][D / 8][4], const float (&p)[MT][BN / 8][4], const T* sV,
                                            int lane) {
    p_frags p16;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
        for (int half = 0; half < 2; ++half)
          p_slot(p16, mt, nt, half) = pack2<T>(p[mt][nt][2 * half], p[mt][nt][2 * half + 1]);
    pv(o, p16, sV, lane);
  }
};

#if FG_ARCH >= 80
// fp32 inputs through tf32 m16n8k8 (10-bit mantissa products, fp32 accumulation). Fragments are read with
// scalar shared loads: ldmatrix cannot transpose 32-bit elements. For P V the k index is relabelled
// (k = t <-> key 2t, k = t+4 <-> key 2t+1) so that P's accumulator registers are A's registers as they are.
template <int MT, int D, int BN, bool Q_IN_REGS, int QROWS>
struct attn_mma_tf32 {
  using QL = st_layout<QROWS, D, 4>;
  using KL = st_layout<BN, D, 4>;
  static constexpr int KSTEPS = D / 8;
  uint32_t q[Q_IN_REGS ? MT : 1][Q_IN_REGS ? KSTEPS : 1][4];

  __device__ __forceinline__ static void load_q_frag(uint32_t (&a)[4], const float* sQ, int row0, int kk, int lane) {
    const int g = lane >> 2, t = lane & 3;
    a[0] = to_tf32(sQ[QL::offset(row0 + g, kk * 8 + t)]);
    a[1] = to_tf32(sQ[QL::offset(row0 + g + 8, kk * 8 + t)]);
    a[2] = to_tf32(sQ[QL::offset(row0 + g, kk * 8 + t + 4)]);
    a[3] = to_tf32(sQ[QL::offset(row0 + g + 8, kk * 8 + t + 4)]);
  }
  __device__ __forceinline__ void load_q(const float* sQ, int row0, int lane) {
    if constexpr (Q_IN_REGS) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int kk = 0; kk < KSTEPS; ++kk) load_q_frag(q[mt][kk], sQ, row0 + mt * 16, kk, lane);
    }
  }
  __device__ __forceinline__ void qk(float (&s)[MT][BN / 8][4], const float* sQ, const float* sK, int row0,
                                     int lane) const {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if constexpr (Q_IN_REGS) {
#pragma unroll
          for (int i = 0; i < 4; ++i) a[mt][i] = q[mt][kk][i];
        } else {
          load_q_frag(a[mt], sQ, row0 + mt * 16, kk, lane);
        }
      }
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) {
        const uint32_t b0 = to_tf32(sK[KL::offset(nt * 8 + g, kk * 8 + t)]);
        const uint32_t b1 = to_tf32(sK[KL::offset(nt * 8 + g, kk * 8 + t + 4)]);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) mma_1688_tf32(s[mt][nt], a[mt], b0, b1);
      }
    }
  }
  __device__ __forceinline__ static void pv(float (&o)[MT][D / 8][4], const float (&p)[MT][BN / 8][4],
                                            const float* sV, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        a[mt][0] = to_tf32(p[mt][nt][0]);
        a[mt][1] = to_tf32(p[mt][nt][2]);
        a[mt][2] = to_tf32(p[mt][nt][1]);
        a[mt][3] = to_tf32(p[mt][nt][3]);
      }
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        const uint32_t b0 = to_tf32(sV[KL::offset(nt * 8 + 2 * t, dt * 8 + g)]);
        const uint32_t b1 = to_tf32(sV[KL::offset(nt * 8 + 2 * t + 1, dt * 8 + g)]);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) mma_1688_tf32(o[mt][dt], a[mt], b0, b1);
      }
    }
  }
};
#endif

}  // namespace warp
}  // namespace fg
