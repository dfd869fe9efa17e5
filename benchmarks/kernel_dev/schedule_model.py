# makespan of the static persistent schedule (current grid_groups order) vs snake, causal
import math
SMS=132
def coords(tile, m_tiles, pairs, G):
    gp=min(pairs,G); group=tile//(gp*m_tiles); ing=tile-group*gp*m_tiles
    gs=min(gp,pairs-group*gp); pair=group*gp+ing%gs; mi=ing//gs
    return pair, m_tiles-1-mi
def length(m_block, BM, BN, N):
    # causal, N==M: keys 0 .. (m_block+1)*BM-1
    return math.ceil(min((m_block+1)*BM, N)/BN)
def makespan(N,D,BM,BN,snake,a=2.0,ctas_per_sm=1):
    B=16384//N; H=2048//D; pairs=B*H; m_tiles=math.ceil(N/BM); tiles=m_tiles*pairs
    G=min(tiles, SMS*ctas_per_sm)
    load=[0.0]*G
    rounds=math.ceil(tiles/G)
    for r in range(rounds):
        for c in range(G):
            t = r*G + ((G-1-c) if (snake and r%2) else c)
            if t>=tiles: continue
            _,m=coords(t,m_tiles,pairs,G)
            load[c]+=a+length(m,BM,BN,N)
    mean=sum(load)/G
    return max(load)/mean, max(load)
for D,BM,BN in ((64,192,128),(128,128,128),(256,128,64)):
    for N in (512,1024,2048,4096,8192,16384):
        cur,mc=makespan(N,D,BM,BN,False); sn,ms=makespan(N,D,BM,BN,True)
        print(f"d{D} {BM}x{BN} N={N}: cur max/mean {cur:.3f}  snake {sn:.3f}  gain {mc/ms-1:+.1%}")
