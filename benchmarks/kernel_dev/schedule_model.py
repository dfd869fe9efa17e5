"""Makespan of the static persistent schedule (the grid_groups order) against the snake walk, causal rows: each
work tile costs its key tiles plus `a` for its fill and drain (NOTES.md, session 11; docs/translators.md).

    python benchmarks/kernel_dev/schedule_model.py"""

import math

SMS = 132


def coords(tile, m_tiles, pairs, group_pairs):
    """(pair, query block) of a work tile in grid_groups' order: groups of group_pairs pairs, the query block
    outermost within a group, longest rows first."""
    gp = min(pairs, group_pairs)
    group = tile // (gp * m_tiles)
    in_group = tile - group * gp * m_tiles
    size = min(gp, pairs - group * gp)
    pair = group * gp + in_group % size
    m_index = in_group // size
    return pair, m_tiles - 1 - m_index


def length(m_block, block_m, block_n, n):
    """Key tiles of a causal query block, N == M: keys 0 .. (m_block + 1) * block_m - 1."""
    return math.ceil(min((m_block + 1) * block_m, n) / block_n)


def makespan(n, d, block_m, block_n, snake, a=2.0, ctas_per_sm=1):
    """(max / mean of the CTAs' loads, max load) over the grid-suite shape of N and D (B * N = 16k, H * D = 2048)."""
    batch, heads = 16384 // n, 2048 // d
    pairs = batch * heads
    m_tiles = math.ceil(n / block_m)
    tiles = m_tiles * pairs
    grid = min(tiles, SMS * ctas_per_sm)
    load = [0.0] * grid
    for r in range(math.ceil(tiles / grid)):
        for c in range(grid):
            t = r * grid + ((grid - 1 - c) if (snake and r % 2) else c)
            if t >= tiles:
                continue
            _, m = coords(t, m_tiles, pairs, grid)
            load[c] += a + length(m, block_m, block_n, n)
    return max(load) / (sum(load) / grid), max(load)


if __name__ == "__main__":
    for d, block_m, block_n in ((64, 192, 128), (128, 128, 128), (256, 128, 64)):
        for n in (512, 1024, 2048, 4096, 8192, 16384):
            cur, cur_max = makespan(n, d, block_m, block_n, False)
            snake, snake_max = makespan(n, d, block_m, block_n, True)
            print(f"d{d} {block_m}x{block_n} N={n}: cur max/mean {cur:.3f}  snake {snake:.3f}  "
                  f"gain {cur_max / snake_max - 1:+.1%}")
